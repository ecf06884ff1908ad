//! The `proxypool` server: a rotating forward-proxy gateway, a JSON API and a dashboard over
//! the `proxypool` library.
//!
//! The library decides which upstream serves a request and judges how it went; this crate does
//! all the network work (HTTP, SOCKS5, sockets, files, signals) and reports outcomes back.
//! The binary is a thin `main` over [`run`]; see ARCHITECTURE.md for the map.

mod addresses;
mod api;
mod auth;
pub mod cli;
pub mod config;
mod dashboard;
mod gateway;
#[cfg(test)]
mod outside_input;
mod server;
mod sessions;
mod site;
mod upstreams;

/// Runs one parsed command to completion.
pub async fn run(cli: cli::Cli) -> anyhow::Result<()> {
    match cli.command {
        cli::Command::Serve(args) => server::serve(config::ServeConfig::resolve(*args)?).await,
    }
}
