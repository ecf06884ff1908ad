//! Command line: `proxypool serve`.

use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;

/// A pool of outbound proxies behind a rotating gateway, a JSON API and a dashboard.
#[derive(Debug, Parser)]
#[command(name = "proxypool", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the gateway (forward proxy) and the API with its dashboard.
    Serve(Box<ServeArgs>),
}

/// Flags of `serve`. Unset flags fall back to the environment (handled by clap), then to the
/// `--config` file, then to the defaults in `config.rs`.
#[derive(Debug, Args, Default)]
pub struct ServeArgs {
    /// TOML file with any of these settings and the pool's tunables (flags and environment
    /// win over it).
    #[arg(long, env = "PROXYPOOL_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Upstream proxies, one URL per line (`http://`, `socks5://`, `socks5h://`, optional
    /// `user:password@`); `#` comments. Re-read on SIGHUP and when it changes.
    #[arg(long, env = "PROXYPOOL_UPSTREAMS", value_name = "FILE")]
    pub upstreams: Option<PathBuf>,
    /// Address of the gateway (the forward proxy clients use) [default: 127.0.0.1:8899].
    #[arg(long, env = "PROXYPOOL_PROXY_LISTEN", value_name = "ADDR")]
    pub proxy_listen: Option<SocketAddr>,
    /// Address of the JSON API and the dashboard [default: 127.0.0.1:8898].
    #[arg(long, env = "PROXYPOOL_API_LISTEN", value_name = "ADDR")]
    pub api_listen: Option<SocketAddr>,
    /// Client credentials, one `user:password` per line. Required when a listen address is
    /// not loopback.
    #[arg(long, env = "PROXYPOOL_AUTH_FILE", value_name = "FILE")]
    pub auth_file: Option<PathBuf>,
    /// Keep the pool in Redis (7.0 or later), shared by every server naming the same pool:
    /// `redis://HOST:PORT[/DB]` or `redis+cluster://HOST:PORT,HOST:PORT,…`.
    #[arg(long, env = "PROXYPOOL_REDIS", value_name = "URL")]
    pub redis: Option<String>,
    /// The pool's name in Redis [default: proxypool].
    #[arg(long, env = "PROXYPOOL_REDIS_POOL", value_name = "NAME")]
    pub redis_pool: Option<String>,
    /// Largest API request body in bytes; larger answers 413 [default: 16384].
    #[arg(long, env = "PROXYPOOL_API_MAX_BODY_BYTES", value_name = "BYTES")]
    pub api_max_body_bytes: Option<usize>,
    /// Limits on clients of the gateway and of the API port (each port its own count).
    #[command(flatten)]
    pub http: HttpArgs,
}

service_edge::http_limit_args!(
    HttpArgs,
    "PROXYPOOL_",
    16777216,
    "Largest request body the gateway forwards, in bytes"
);

/// Parses the command line, or explains the mistake in one line and exits 2.
pub fn parse() -> Cli {
    service_edge::parse_cli()
}
