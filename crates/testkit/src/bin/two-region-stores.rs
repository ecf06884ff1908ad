//! `two-region-stores DIR`: starts [`testkit::Regions`] under DIR (which must not exist
//! yet), prints one `NAME=VALUE` line per store and `ready`, and stops everything on SIGINT
//! or SIGTERM. `scripts/two-regions` runs the shortener's instances on top.

use nix::sys::signal::{SigSet, Signal};
use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(dir) = std::env::args_os().nth(1) else {
        eprintln!("usage: two-region-stores DIR");
        return ExitCode::from(2);
    };
    // Blocked before anything starts, so that a signal waits for `wait` below instead of
    // killing the process with its servers still running.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGINT);
    signals.add(Signal::SIGTERM);
    if let Err(e) = signals.thread_block() {
        eprintln!("error: cannot block signals: {e}");
        return ExitCode::FAILURE;
    }
    let regions = match testkit::Regions::start(std::path::Path::new(&dir), "shortener") {
        Ok(regions) => regions,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout();
    let _ = writeln!(out, "PRIMARY_URL={}", regions.primary.url("shortener"));
    let _ = writeln!(out, "REPLICA_URL={}", regions.standby.url("shortener"));
    let _ = writeln!(out, "REDIS_A={}", regions.redis_a.url());
    let _ = writeln!(out, "REDIS_B={}", regions.redis_b.url());
    let _ = writeln!(out, "ready");
    let _ = out.flush();
    let _ = signals.wait();
    drop(regions);
    ExitCode::SUCCESS
}
