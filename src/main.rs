//! The `llmlb` binary: the allocator, then the command line (`cli`).

use std::process::ExitCode;

mod allocator;

#[global_allocator]
static ALLOCATOR: allocator::Allocator = allocator::Allocator;

fn main() -> ExitCode {
    llmlb::cli::main()
}
