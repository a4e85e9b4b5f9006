//! The `llmlb` binary: the allocator, then the command line (`cli`).

use std::process::ExitCode;

/// The process's allocator: a proxied request makes tens of small, short-lived
/// allocations across two worker threads, which mimalloc's per-thread free
/// lists serve in a fraction of glibc malloc's instructions
/// (docs/BENCHMARKS.md, "Proxy overhead").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    llmlb::cli::main()
}
