use std::process::ExitCode;

// Many small, short-lived allocations per request across worker threads: mimalloc keeps them
// fast and keeps the heap from fragmenting into per-thread arenas (lower RSS).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // No transparent huge pages, decided before the allocator has mapped much: mimalloc advises
    // them on its arenas, and the kernel then backs every touched 2 MiB stretch in full — a third
    // of the resident memory under load was such padding (BENCHMARKS.md, issue 18). Should the
    // call fail, huge pages stay as the system has them and nothing else changes.
    #[cfg(target_os = "linux")]
    let _ = nix::sys::prctl::set_thp_disable(true);
    let cli = shortener::cli::parse();
    service_edge::run_main("SHORTENER_LOG", shortener::run(cli))
}
