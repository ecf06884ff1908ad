use std::process::ExitCode;

// Every gateway request allocates a little (heads, buffers, the lease): mimalloc keeps that
// fast across worker threads.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = proxypool_server::cli::parse();
    service_edge::run_main("PROXYPOOL_LOG", proxypool_server::run(cli))
}
