//! The upstream file: one proxy URL per line, `#` comments and blank lines. Loaded at start,
//! re-read on SIGHUP and when its modification time changes. A bad line is reported with its
//! number and skipped, never fatal.

use crate::addresses::Registry;
use proxypool::ProxyAddress;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// One line that could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BadLine {
    pub(crate) line: usize,
    pub(crate) message: String,
}

/// What a file holds: usable addresses in file order, and the lines that were skipped.
#[derive(Debug, Default)]
pub(crate) struct Parsed {
    pub(crate) addresses: Vec<ProxyAddress>,
    pub(crate) bad: Vec<BadLine>,
}

/// Schemes the gateway can speak to; the library also accepts `https` (TLS to the proxy),
/// which the gateway does not do.
const GATEWAY_SCHEMES: [&str; 3] = ["http://", "socks5://", "socks5h://"];

pub(crate) fn parse(text: &str) -> Parsed {
    let mut parsed = Parsed::default();
    let mut seen = HashSet::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let bad = |message: String| BadLine {
            line: i + 1,
            message,
        };
        match ProxyAddress::parse(line) {
            Ok(a) if !GATEWAY_SCHEMES.iter().any(|s| a.as_str().starts_with(s)) => {
                parsed.bad.push(bad(format!(
                    "{a}: the gateway speaks to http, socks5 and socks5h proxies only"
                )));
            }
            Ok(a) if !seen.insert(a.clone()) => {
                parsed.bad.push(bad(format!("{a} is listed twice")));
            }
            Ok(a) => parsed.addresses.push(a),
            Err(e) => parsed.bad.push(bad(e.to_string())),
        }
    }
    parsed
}

/// Reads and parses the file, logging every skipped line.
pub(crate) fn load(path: &Path) -> std::io::Result<Parsed> {
    let parsed = parse(&std::fs::read_to_string(path)?);
    for b in &parsed.bad {
        tracing::warn!(
            "upstreams {} line {}: {}; line skipped",
            path.display(),
            b.line,
            b.message
        );
    }
    Ok(parsed)
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Applies the file to the pool now.
pub(crate) async fn apply(path: &Path, registry: &Registry) -> std::io::Result<()> {
    let parsed = load(path)?;
    let (added, removed) = registry.sync_file(&parsed.addresses).await;
    tracing::info!(
        path = %path.display(),
        upstreams = parsed.addresses.len(),
        skipped = parsed.bad.len(),
        added,
        removed,
        "upstreams loaded"
    );
    Ok(())
}

/// Keeps the pool in step with the file until the process ends.
pub(crate) fn spawn_reloader(path: PathBuf, registry: Registry, poll: Duration) {
    tokio::spawn(async move {
        let mut last = modified(&path);
        let mut hangup =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        let mut tick = tokio::time::interval(poll);
        loop {
            let forced = tokio::select! {
                _ = tick.tick() => false,
                Some(()) = async { match hangup.as_mut() { Some(h) => h.recv().await, None => None } } => true,
            };
            let now = modified(&path);
            if !forced && now == last {
                continue;
            }
            last = now;
            if let Err(e) = apply(&path, &registry).await {
                tracing::warn!(path = %path.display(), error = %e, "cannot re-read upstreams; keeping the current ones");
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_blanks_and_bad_lines() {
        let text = "# upstreams\n\nhttp://127.0.0.1:3128\nsocks5://u:p@127.0.0.1:1080 # dante\nftp://x:1\nnot a url\nhttp://127.0.0.1:3128\nhttps://127.0.0.1:443\n";
        let p = parse(text);
        let got: Vec<&str> = p.addresses.iter().map(ProxyAddress::as_str).collect();
        assert_eq!(
            got,
            ["http://127.0.0.1:3128", "socks5://u:p@127.0.0.1:1080"]
        );
        let lines: Vec<usize> = p.bad.iter().map(|b| b.line).collect();
        assert_eq!(lines, [5, 6, 7, 8]);
        assert!(p.bad[2].message.contains("twice"));
    }
}
