use std::process::ExitCode;

// Many small, short-lived allocations per request across worker threads: mimalloc keeps them
// fast and keeps the heap from fragmenting into per-thread arenas (lower RSS).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = shortener::cli::parse();
    service_edge::run_main("SHORTENER_LOG", shortener::run(cli))
}
