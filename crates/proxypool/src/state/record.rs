//! Everything the pool keeps about one address.

use crate::address::ProxyAddress;
use crate::clock::Timestamp;
use crate::health::window::Window;
use crate::health::{Health, HealthState};
use crate::snapshot::Totals;
use crate::telemetry::AddressMetrics;

/// Laid out (C order, cache-line aligned) so that an acquire + release pair touches few
/// lines of a record it reaches at random: the address shares the first line with the metric
/// handles of every pair (lease gauge, latency, successes); then the totals, the
/// state-machine fields of every outcome, the window's header and sums, one line each, and
/// the weighing fields beside the end of the window's histogram.
#[derive(Debug)]
#[repr(C, align(64))]
pub(crate) struct AddressRecord {
    pub(crate) address: ProxyAddress,
    pub(crate) metrics: AddressMetrics,
    pub(crate) totals: Totals,
    pub(crate) health: Health,
    pub(crate) window: Window,
    /// The latency's quality level its weight last followed (see `PoolState::reweigh`), and
    /// the mean and reference latencies it was last taken from (most successes change
    /// neither: no logarithm then). Read by every release: right after the window, on the
    /// line of its histogram's count, which every success touches anyway.
    pub(crate) latency_level: i8,
    /// Its window held a counted bad outcome when last weighed, or got one since: its weight
    /// follows every outcome until the window is clean.
    pub(crate) bad_in_window: bool,
    pub(crate) latency_seen: (Option<f64>, Option<f64>),
    pub(crate) fingerprint: u64,
    pub(crate) bound_keys: u64,
    /// Indices of the sub-pools it belongs to; always includes 0, the whole pool.
    pub(crate) sub_pools: Vec<u32>,
    /// `bound_keys` by the sub-pool that bound them (aligned with `sub_pools`), so a removal
    /// takes exactly its keys out of each sub-pool's mean.
    pub(crate) bound_in: Vec<u64>,
    /// Until when a rate limit keeps it from tickets without a site (they have no cell).
    pub(crate) cooling_unsited: Timestamp,
}

impl AddressRecord {
    /// Reads one word from each cache line an acquire + release pair will touch and folds
    /// them together (for `black_box`). At thousands of addresses a pair reaches its record at
    /// random and the lines are far apart in memory: loaded in one burst, their misses
    /// overlap instead of following one another through the pair.
    pub(crate) fn prefetch(&self) -> u64 {
        (self.health.state as u64)
            ^ self.window.prefetch()
            ^ self.totals.successes
            ^ self.address.as_str().len() as u64
            ^ self.latency_level as u64
    }

    /// Counts one more (`add`) or one fewer key bound through sub-pool `sp` on this address.
    pub(crate) fn count_binding(&mut self, sp: u32, add: bool) {
        let at = self.sub_pools.iter().position(|p| *p == sp);
        if let Some(n) = at.and_then(|i| self.bound_in.get_mut(i)) {
            *n = if add { *n + 1 } else { n.saturating_sub(1) };
        }
        self.bound_keys = if add {
            self.bound_keys + 1
        } else {
            self.bound_keys.saturating_sub(1)
        };
    }

    pub(crate) fn new(
        address: ProxyAddress,
        fingerprint: u64,
        sub_pools: Vec<u32>,
        window: Window,
        now: Timestamp,
    ) -> Self {
        Self {
            bound_in: vec![0; sub_pools.len()],
            metrics: AddressMetrics::new(address.redacted()),
            address,
            fingerprint,
            sub_pools,
            health: Health::slow_start(now),
            window,
            bound_keys: 0,
            cooling_unsited: Timestamp::default(),
            totals: Totals::default(),
            latency_level: 0,
            latency_seen: (None, None),
            bad_in_window: false,
        }
    }
}

/// What selection reads of every candidate, kept apart from the records in one dense array:
/// a pick among thousands of addresses touches one small entry per candidate rather than
/// several cache lines of a record.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hot {
    /// The record's `health.state`, mirrored on every transition; `None` once removed.
    pub(crate) state: Option<HealthState>,
    /// Leases out now (P13).
    pub(crate) active_leases: u32,
    /// The latest end of a rate-limit cooling on any site: before it, eligibility must look
    /// at the site's own cooling; after it, nothing cools and the lookup is skipped.
    pub(crate) cooling_until: Timestamp,
    /// Its quality level for tickets without a site (see `health::weight`), as of its last
    /// outcome that could move it.
    pub(crate) level: i8,
}

impl Hot {
    pub(crate) fn new() -> Self {
        Self {
            state: Some(HealthState::Healthy),
            active_leases: 0,
            cooling_until: Timestamp::default(),
            level: 0,
        }
    }

    pub(crate) fn offered(&self) -> bool {
        self.state.is_some_and(HealthState::is_offered)
    }
}
