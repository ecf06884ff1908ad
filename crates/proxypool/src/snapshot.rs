//! The pool's whole state as plain, serialisable data: for tests, dashboards and metrics.

use serde::{Deserialize, Serialize};

use crate::decision::Decision;
use crate::health::{HealthState, quarantine};

/// Everything the pool knows at one instant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// When it was taken (ms since the epoch).
    pub at_ms: u64,
    /// One row per address.
    pub addresses: Vec<AddressSnapshot>,
    /// The address × site matrix (P9, P16), one row per pair that has seen traffic.
    pub matrix: Vec<CellSnapshot>,
    /// Per site judgement.
    pub sites: Vec<SiteSnapshot>,
    /// Pool-wide figures.
    pub pool: PoolSnapshot,
    /// The most recent decisions, oldest first.
    pub decisions: Vec<Decision>,
}

impl Snapshot {
    /// The row of an address, by its redacted URL.
    pub fn address(&self, redacted: &str) -> Option<&AddressSnapshot> {
        self.addresses.iter().find(|a| a.address == redacted)
    }

    /// The row of a site.
    pub fn site(&self, name: &str) -> Option<&SiteSnapshot> {
        self.sites.iter().find(|s| s.site == name)
    }
}

/// One address.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AddressSnapshot {
    /// The URL with the password hidden.
    pub address: String,
    /// Hex SipHash of the full URL: tells apart addresses whose redacted URLs are equal.
    pub fingerprint: String,
    /// Sub-pools it belongs to besides the whole pool.
    pub sub_pools: Vec<String>,
    /// Health state.
    pub state: HealthState,
    /// Since when (ms).
    pub state_since_ms: u64,
    /// Why it is in that state.
    pub reason: String,
    /// Current weight in weighted selection (0 when not offered).
    pub weight: f64,
    /// Share of the weight while ramping after quarantine, if ramping.
    pub ramp_share: Option<f64>,
    /// Leases out now.
    pub active_leases: u32,
    /// Session keys bound to it.
    pub bound_keys: u64,
    /// Outcomes in the window.
    pub window_samples: usize,
    /// Success rate over the window.
    pub success_rate: Option<f64>,
    /// Captcha rate over the window.
    pub captcha_rate: Option<f64>,
    /// Latency median over the window's successes.
    pub latency_p50_ms: Option<u32>,
    /// Latency p95 over the window's successes.
    pub latency_p95_ms: Option<u32>,
    /// When its quarantine ends, if quarantined.
    pub quarantined_until_ms: Option<u64>,
    /// Quarantines so far.
    pub quarantine_entries: u32,
    /// `n` of the next quarantine wait `base × 2^n`.
    pub backoff_level: u32,
    /// Failed quarantine cycles in a row.
    pub failed_cycles: u32,
    /// Lifetime outcome counts.
    pub totals: Totals,
}

/// Lifetime counts of outcomes and lease ends.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Leases granted.
    pub leases: u64,
    /// Successes.
    pub successes: u64,
    /// Connection errors, timeouts and blocks.
    pub failures: u64,
    /// Captchas.
    pub captchas: u64,
    /// Rate limits.
    pub rate_limited: u64,
    /// Leases dropped unreleased.
    pub abandoned: u64,
    /// Leases that outlived their TTL.
    pub expired: u64,
}

/// One address × site pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellSnapshot {
    /// The URL with the password hidden.
    pub address: String,
    /// The site (`-` for tickets without one).
    pub site: String,
    /// Outcomes in the pair's window (for the `-` column, the address window's outcomes of
    /// tickets without a site).
    pub window_samples: usize,
    /// Success rate over that window.
    pub success_rate: Option<f64>,
    /// Captcha rate over that window.
    pub captcha_rate: Option<f64>,
    /// The pair alone looks bad: the address is avoided for this site (lowest weight), and if
    /// it does well elsewhere its failures here are not held against it (P9).
    pub avoided: bool,
    /// Until when a rate limit keeps the address away from the site.
    pub cooling_until_ms: Option<u64>,
    /// Lifetime counts for the pair.
    pub totals: Totals,
}

/// One site's judgement (P9).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SiteSnapshot {
    /// The site (`-` for tickets without one).
    pub site: String,
    /// Judged degraded: failures towards it are not held against addresses.
    pub degraded: bool,
    /// Outcomes in the site window.
    pub window_samples: usize,
    /// Failure rate over that window.
    pub failure_rate: Option<f64>,
    /// Captcha rate over that window.
    pub captcha_rate: Option<f64>,
    /// Share of the window's addresses with a bad outcome on this site.
    pub spread: Option<f64>,
}

/// Pool-wide figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolSnapshot {
    /// Addresses in the pool.
    pub addresses: usize,
    /// Addresses in each state.
    pub by_state: Vec<(HealthState, usize)>,
    /// Addresses selection may pick.
    pub offered: usize,
    /// Addresses counted against the quarantine cap (quarantined or probing).
    pub quarantined: usize,
    /// The cap.
    pub quarantine_cap: usize,
    /// Quarantine entries since the pool started.
    pub quarantine_entries: u64,
    /// Quarantining frozen because failures point at our side (P9).
    pub frozen: bool,
    /// Leases out now.
    pub active_leases: u64,
    /// Live session bindings.
    pub bindings: usize,
    /// Leases granted since the pool started.
    pub acquired: u64,
    /// Leases released with an outcome.
    pub released: u64,
    /// Leases dropped unreleased.
    pub abandoned: u64,
    /// Leases that outlived their TTL.
    pub expired: u64,
    /// Acquires refused for want of an address.
    pub unavailable: u64,
    /// Sessions reported broken.
    pub sessions_broken: u64,
}

/// The pool-wide counts a store keeps; the rest of [`PoolSnapshot`] follows from the rows.
#[derive(Debug, Default)]
pub(crate) struct PoolCounts {
    pub(crate) quarantine_entries: u64,
    pub(crate) frozen: bool,
    pub(crate) active_leases: u64,
    pub(crate) bindings: usize,
    pub(crate) acquired: u64,
    pub(crate) released: u64,
    pub(crate) abandoned: u64,
    pub(crate) expired: u64,
    pub(crate) unavailable: u64,
    pub(crate) sessions_broken: u64,
}

/// What a store gathers for a snapshot; [`SnapshotParts::build`] is the one place both stores'
/// snapshots are made, so the pool's derived figures (states, offered, the cap) and the
/// matrix's order are computed alike.
#[derive(Debug)]
pub(crate) struct SnapshotParts {
    pub(crate) at_ms: u64,
    pub(crate) addresses: Vec<AddressSnapshot>,
    pub(crate) matrix: Vec<CellSnapshot>,
    pub(crate) sites: Vec<SiteSnapshot>,
    pub(crate) counts: PoolCounts,
    pub(crate) decisions: Vec<Decision>,
}

impl SnapshotParts {
    /// The snapshot, with the quarantine cap at `cap_fraction` of the pool.
    pub(crate) fn build(mut self, cap_fraction: f64) -> Snapshot {
        let mut by_state = [0usize; HealthState::ALL.len()];
        for a in &self.addresses {
            by_state[a.state as usize] += 1;
        }
        let count = |pred: fn(HealthState) -> bool| -> usize {
            HealthState::ALL
                .iter()
                .filter(|s| pred(**s))
                .map(|s| by_state[*s as usize])
                .sum()
        };
        let c = self.counts;
        let total = self.addresses.len();
        self.matrix
            .sort_by(|a, b| (&a.address, &a.site).cmp(&(&b.address, &b.site)));
        Snapshot {
            at_ms: self.at_ms,
            addresses: self.addresses,
            matrix: self.matrix,
            sites: self.sites,
            pool: PoolSnapshot {
                addresses: total,
                by_state: HealthState::ALL
                    .iter()
                    .map(|s| (*s, by_state[*s as usize]))
                    .collect(),
                offered: count(HealthState::is_offered),
                quarantined: count(HealthState::counts_against_cap),
                quarantine_cap: quarantine::cap(total, cap_fraction),
                quarantine_entries: c.quarantine_entries,
                frozen: c.frozen,
                active_leases: c.active_leases,
                bindings: c.bindings,
                acquired: c.acquired,
                released: c.released,
                abandoned: c.abandoned,
                expired: c.expired,
                unavailable: c.unavailable,
                sessions_broken: c.sessions_broken,
            },
            decisions: self.decisions,
        }
    }
}

impl PoolSnapshot {
    /// How many addresses are in `state`.
    pub fn count(&self, state: HealthState) -> usize {
        self.by_state
            .iter()
            .find(|(s, _)| *s == state)
            .map_or(0, |(_, n)| *n)
    }
}
