//! The `llmlb` binary: the allocator, then the command line (`cli`).

use std::process::ExitCode;

/// The process's allocator: a proxied request makes tens of small, short-lived
/// allocations across two worker threads, which mimalloc's per-thread free
/// lists serve in a fraction of glibc malloc's instructions
/// (docs/BENCHMARKS.md, "Proxy cost"). Built without transparent huge
/// pages (`no_thp`): with them, the first touch of fresh memory zeroed 2 MiB
/// at a time, most of llmlb's CPU in the first seconds of a run
/// (docs/lab/allocator-huge-pages.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    llmlb::cli::main()
}
