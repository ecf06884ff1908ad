//! Dev-only helpers that start real servers on loopback for tests and clean up after them.
//!
//! Every server is a child process bound to 127.0.0.1; a [`Process`] kills its child when
//! dropped, so a failing test leaves nothing running.
//!
//! ```
//! use std::process::Command;
//! use std::time::Duration;
//! use testkit::Process;
//!
//! let mut cmd = Command::new("sh");
//! cmd.args(["-c", "echo ready at 42; exec sleep 30"]);
//! let mut p = Process::spawn("demo", cmd).unwrap();
//! let line = p.wait_for_line("ready at", Duration::from_secs(10)).unwrap();
//! assert_eq!(line, "ready at 42");
//! p.kill();
//! ```

pub mod browser;
mod ports;
mod postgres;
mod process;
pub mod raw_http;
mod redis;
mod regions;
mod relay;
pub mod schemathesis;

pub use browser::Browser;
pub use ports::free_port;
pub use postgres::Postgres;
pub use process::Process;
pub use redis::{RedisCluster, RedisServer};
pub use regions::Regions;
pub use relay::Relay;
pub use schemathesis::ApiFuzz;

/// Asserts that `--help` output names each `(flag, env var, default)`: the flag's entry carries
/// `[env: VAR=]` and `[default: D]`. Compared with white space collapsed, since clap wraps long
/// entries.
pub fn assert_help_names(help: &str, entries: &[(&str, &str, &str)]) {
    for (flag, env, default) in entries {
        let at = help
            .find(&format!(" {flag} "))
            .unwrap_or_else(|| panic!("{flag} in:\n{help}"));
        let entry = &help[at..];
        let entry = &entry[..entry[2..].find("\n      --").map_or(entry.len(), |i| i + 2)];
        let entry = entry.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(entry.contains(env), "{entry}");
        assert!(entry.contains(&format!("[default: {default}]")), "{entry}");
    }
}
