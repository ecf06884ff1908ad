//! The `shortener` service: HTTP API, stores, click pipeline and CLI over `shortener-core`.
//!
//! The binary is a thin `main` over [`run`]; see ARCHITECTURE.md for the map.

mod admin_cli;
mod allocator;
mod analytics;
mod api;
mod bots;
mod breaker;
mod cache;
mod captcha;
mod change_poll;
pub mod cli;
mod clicks;
pub mod config;
mod feeds;
mod http;
mod import;
mod metrics;
mod migrate;
mod new_link;
mod ratelimit;
mod retention;
mod scaleout;
mod server;
pub mod store;
mod token;
mod visits;

use shortener_core::day::UnixSeconds;

/// Runs one parsed command to completion.
pub async fn run(cli: cli::Cli) -> anyhow::Result<()> {
    match cli.command {
        cli::Command::Serve(args) => server::serve(config::ServeConfig::resolve(*args)?).await,
        cli::Command::Aggregate(args) => {
            server::aggregate(config::AggregateConfig::resolve(args)?).await
        }
        cli::Command::Migrate(args) => migrate::run(args).await,
        cli::Command::Token(cli::TokenCommand::Create(args)) => token::create(args).await,
        cli::Command::Token(cli::TokenCommand::List(args)) => token::list(args).await,
        cli::Command::Token(cli::TokenCommand::Revoke(args)) => token::revoke(args).await,
        cli::Command::Link(command) => admin_cli::link(command).await,
        cli::Command::Audit(args) => admin_cli::audit(args).await,
        cli::Command::Import(args) => import::run(config::ImportConfig::resolve(args)?).await,
    }
}

/// The wall clock in Unix seconds (0 before 1970). Read straight from `CLOCK_REALTIME_COARSE`:
/// `SystemTime`'s `duration_since` cost every redirect twice the read itself, and the precise
/// read (the TSC) three times the coarse one, whose ticks (a few ms) are nothing to seconds.
pub(crate) fn now() -> UnixSeconds {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_REALTIME_COARSE)
        .map_or(0, |t| UnixSeconds::from(t.tv_sec()).max(0))
}
