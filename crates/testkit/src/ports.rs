//! Ports for the servers tests start, picked below the kernel's ephemeral range (32 768–60 999
//! on Linux): a port found free up there can be taken a moment later as the local end of any
//! test's outgoing connection, and the server meant for it then fails to bind while a check
//! of the port finds someone else's listener (`tests/api.rs` of proxypool-server saw that
//! once, its tinyproxy "refused" mid-test).

use std::ops::Range;

/// Where [`free_port`] and the Redis helpers pick (a cluster's bus port, `port + 10 000`,
/// stays below the ephemeral range too).
pub(crate) const SERVERS: Range<u16> = 20_000..32_000;
/// Where the PostgreSQL helpers pick, apart from [`SERVERS`].
pub(crate) const POSTGRES: Range<u16> = 10_000..19_000;

/// The `attempt`-th candidate in `range`, spread by process and time so that tests starting
/// side by side pick apart.
pub(crate) fn candidate(range: Range<u16>, attempt: u32) -> u16 {
    let seed = std::process::id()
        .wrapping_mul(7919)
        .wrapping_add(attempt.wrapping_mul(104_729));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let span = u32::from(range.end - range.start);
    range.start + u16::try_from((seed ^ nanos) % span).unwrap_or(0)
}

/// A port on `ip` that nothing is bound to, below the ephemeral range.
///
/// ```
/// let port = testkit::free_port("127.0.0.1");
/// assert!((20_000..32_000).contains(&port));
/// std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
/// ```
pub fn free_port(ip: &str) -> u16 {
    (0..)
        .map(|attempt| candidate(SERVERS, attempt))
        .find(|&port| std::net::TcpListener::bind((ip, port)).is_ok())
        .expect("no free port below the ephemeral range")
}
