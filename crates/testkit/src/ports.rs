//! Ports for the servers tests start, picked below the kernel's ephemeral range (32 768–60 999
//! on Linux): a port found free up there can be taken a moment later as the local end of any
//! test's outgoing connection, and the server meant for it then fails to bind while a check
//! of the port finds someone else's listener (the likely cause of a proxypool-server
//! `tests/api.rs` run whose tinyproxy "refused" mid-test).

use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};

/// Picks made by this process so far: consecutive picks step through the range (7 919 is prime
/// to both spans), so a process gets a port again only after a whole range of picks.
static PICKS: AtomicU32 = AtomicU32::new(0);

/// Where [`free_port`] and the Redis helpers pick (a Redis Cluster node also binds its bus
/// port, `port + 10 000`, which must stay a valid port).
pub(crate) const SERVERS: Range<u16> = 20_000..32_000;
/// Where the PostgreSQL helpers pick, apart from [`SERVERS`].
pub(crate) const POSTGRES: Range<u16> = 10_000..19_000;

/// A candidate in `range`: processes start apart (by id and start time), and each of a
/// process's picks steps on from its last.
pub(crate) fn candidate(range: Range<u16>) -> u16 {
    static BASE: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let base = *BASE.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        std::process::id().wrapping_mul(104_729) ^ nanos
    });
    nth(base, PICKS.fetch_add(1, Ordering::Relaxed), range)
}

/// The `pick`-th candidate in `range` of a process whose picks start at `base`.
fn nth(base: u32, pick: u32, range: Range<u16>) -> u16 {
    let span = u32::from(range.end - range.start);
    let step = pick.wrapping_mul(7919) % span;
    range.start + u16::try_from((base % span + step) % span).unwrap_or(0)
}

/// A port on `ip` that nothing is bound to, below the ephemeral range.
///
/// ```
/// let port = testkit::free_port("127.0.0.1");
/// assert!((20_000..32_000).contains(&port));
/// std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
/// ```
pub fn free_port(ip: &str) -> u16 {
    (0..u32::from(SERVERS.end - SERVERS.start))
        .map(|_| candidate(SERVERS))
        .find(|&port| std::net::TcpListener::bind((ip, port)).is_ok())
        .expect("no free port below the ephemeral range")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_gets_every_port_of_a_range_before_one_again() {
        for (range, base) in [(SERVERS, 0), (SERVERS, 123_456_789), (POSTGRES, u32::MAX)] {
            let span = u32::from(range.end - range.start);
            let mut picked: Vec<u16> = (0..span)
                .map(|pick| nth(base, pick, range.clone()))
                .collect();
            assert!(picked.iter().all(|p| range.contains(p)));
            picked.sort_unstable();
            picked.dedup();
            assert_eq!(picked.len(), span as usize, "{range:?} from {base}");
        }
    }
}
