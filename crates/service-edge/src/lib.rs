//! The binary edges the workspace's two services share, so each binary's `main` and config
//! reading say only what is theirs: logging to stderr under an `EnvFilter` from one variable,
//! a multi-threaded tokio runtime, every error as one `error: …` line with a failure exit
//! code; command-line mistakes in one line with exit code 2; a TOML config file whose errors
//! name the file and the line; SIGTERM or SIGINT as the signal to stop gracefully; JSON
//! request bodies read one way ([`read_json_object`]) and integers as JSON Schema counts them
//! ([`Integer`], [`WholeNumber`]); answers every operation shares added to OpenAPI documents
//! ([`openapi`]); limits on what one HTTP client may hold or send ([`HttpLimits`]) and the accept loop that
//! applies them ([`serve_connections`], [`route`]).
//!
//! ```
//! #[derive(Debug, Default, serde::Deserialize)]
//! struct File {
//!     port: Option<u16>,
//! }
//! let file: File = service_edge::read_toml(None).unwrap();
//! assert_eq!(file.port, None);
//! ```

mod head_watch;
pub mod http_limits;
mod json_body;
pub mod openapi;
mod serve;
mod supervise;
mod whole_number;

pub use http_limits::{ConnectionGate, HttpLimits, HttpLimitsFile, RequestBudget, close_after};
pub use json_body::{BodyRefusal, read_json_object};
pub use serve::{route, serve_connections};
pub use whole_number::{Integer, WholeNumber};

use std::future::Future;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

/// Sets up logging (filter from `log_env`, default `info`), starts a multi-threaded runtime
/// and runs `run` on it; an error ends the process with one line on stderr.
pub fn run_main<F>(log_env: &str, run: F) -> ExitCode
where
    F: Future<Output = anyhow::Result<()>>,
{
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env(log_env)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Parses the command line, or explains the mistake in one line and exits 2 (help and
/// version print as clap prints them).
pub fn parse_cli<C: clap::Parser>() -> C {
    match C::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                e.exit();
            }
            let rendered = e.render().to_string();
            let first = rendered
                .lines()
                .next()
                .unwrap_or("error: invalid arguments");
            eprintln!("{first} (see --help)");
            std::process::exit(2);
        }
    }
}

/// Reads a TOML config file (none: the defaults). toml's own message spans several lines with
/// a source excerpt; the error keeps the gist and the line.
pub fn read_toml<T>(path: Option<&Path>) -> anyhow::Result<T>
where
    T: serde::de::DeserializeOwned + Default,
{
    let Some(path) = path else {
        return Ok(T::default());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    toml::from_str(&text).map_err(|e| {
        let msg = e.message().to_owned();
        let at = e
            .span()
            .map(|s| {
                let line = text[..s.start].matches('\n').count() + 1;
                format!(" at line {line}")
            })
            .unwrap_or_default();
        anyhow::anyhow!("invalid config file {}{at}: {msg}", path.display())
    })
}

/// Resolves at the first SIGTERM or SIGINT (logged), the signal for a graceful shutdown. If
/// the handlers cannot be installed it logs so and never resolves.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[derive(Debug, Default, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        #[allow(dead_code, reason = "only parsed")]
        port: Option<u16>,
    }

    #[test]
    fn a_bad_file_is_named_with_its_line() {
        let dir = std::env::temp_dir().join(format!("service-edge-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bad.toml");
        std::fs::write(&path, "# comment\nport = 80\nprot = 1\n").unwrap();
        let err = read_toml::<File>(Some(&path)).unwrap_err().to_string();
        assert!(err.contains("bad.toml at line 3"), "{err}");
        assert!(!err.contains('\n'), "{err}");
        let missing = read_toml::<File>(Some(&dir.join("none.toml"))).unwrap_err();
        assert!(
            missing.to_string().contains("cannot read config file"),
            "{missing}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
