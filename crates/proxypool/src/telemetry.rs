//! P16: metrics through the `metrics` facade. The embedding program installs a recorder
//! (Prometheus in the server) before building the pool: handles are registered once, when an
//! address, an address × site pair or the pool appears, so the hot path only bumps atomics.
//!
//! Per address: `proxypool_address_outcomes_total{address,outcome}`,
//! `proxypool_address_latency_seconds{address}`, `proxypool_address_active_leases{address}`,
//! `proxypool_address_quarantines_total{address}`. Per address × named site:
//! `proxypool_cell_outcomes_total{address,site,outcome}` (tickets without a site count in the
//! address's own). Pool: `proxypool_addresses{state}`,
//! `proxypool_acquires_total{choice}` (throughput), `proxypool_acquire_failures_total{reason}`,
//! `proxypool_leases_lost_total{how}`, `proxypool_quarantine_entries_total`,
//! `proxypool_quarantine_cap_occupancy` (quarantined ÷ cap).

use metrics::{Counter, Gauge, Histogram, SharedString, counter, gauge, histogram};

use crate::error::AcquireError;
use crate::health::HealthState;
use crate::lease::{Choice, Outcome};

const OUTCOMES: [&str; 6] = [
    "success",
    "connect_error",
    "timeout",
    "blocked",
    "captcha",
    "rate_limited",
];
const CHOICES: [&str; 5] = [
    "bound",
    "hashed",
    "round_robin",
    "weighted",
    "least_connections",
];
const FAILURES: [&str; 5] = [
    "no_address",
    "session_broken",
    "bound_busy",
    "bound_cooling",
    "unknown_sub_pool",
];

fn outcome_index(o: &Outcome) -> usize {
    match o {
        Outcome::Success { .. } => 0,
        Outcome::ConnectError => 1,
        Outcome::Timeout => 2,
        Outcome::Blocked => 3,
        Outcome::Captcha => 4,
        Outcome::RateLimited { .. } => 5,
    }
}

fn choice_index(c: Choice) -> usize {
    match c {
        Choice::Bound => 0,
        Choice::Hashed => 1,
        Choice::RoundRobin => 2,
        Choice::Weighted => 3,
        Choice::LeastConnections => 4,
    }
}

/// The handles of one address, those of every acquire + release first (C order: one cache
/// line for the lease gauge, the latency and the success count).
#[derive(Debug)]
#[repr(C)]
pub(crate) struct AddressMetrics {
    active: Gauge,
    latency: Histogram,
    outcomes: [Counter; 6],
    quarantines: Counter,
}

impl AddressMetrics {
    pub(crate) fn new(address: &str) -> Self {
        let label = SharedString::from(address.to_owned());
        Self {
            outcomes: OUTCOMES.map(|o| {
                counter!("proxypool_address_outcomes_total", "address" => label.clone(), "outcome" => o)
            }),
            latency: histogram!("proxypool_address_latency_seconds", "address" => label.clone()),
            active: gauge!("proxypool_address_active_leases", "address" => label.clone()),
            quarantines: counter!("proxypool_address_quarantines_total", "address" => label),
        }
    }

    pub(crate) fn outcome(&self, o: &Outcome) {
        self.outcomes[outcome_index(o)].increment(1);
        if let Outcome::Success { latency } = o {
            self.latency.record(latency.as_secs_f64());
        }
    }

    pub(crate) fn active(&self, n: u32) {
        self.active.set(n);
    }

    pub(crate) fn quarantined(&self) {
        self.quarantines.increment(1);
    }
}

/// The handles of one address × site pair.
#[derive(Debug)]
pub(crate) struct CellMetrics {
    outcomes: [Counter; 6],
}

impl CellMetrics {
    pub(crate) fn new(address: &str, site: &str) -> Self {
        let (address, site) = (
            SharedString::from(address.to_owned()),
            SharedString::from(site.to_owned()),
        );
        Self {
            outcomes: OUTCOMES.map(|o| {
                counter!(
                    "proxypool_cell_outcomes_total",
                    "address" => address.clone(), "site" => site.clone(), "outcome" => o
                )
            }),
        }
    }

    pub(crate) fn outcome(&self, o: &Outcome) {
        self.outcomes[outcome_index(o)].increment(1);
    }
}

/// The pool-wide handles.
#[derive(Debug)]
pub(crate) struct PoolMetrics {
    acquires: [Counter; 5],
    failures: [Counter; 5],
    abandoned: Counter,
    expired: Counter,
    quarantine_entries: Counter,
    states: [Gauge; 5],
    cap_occupancy: Gauge,
}

impl PoolMetrics {
    pub(crate) fn new() -> Self {
        Self {
            acquires: CHOICES.map(|c| counter!("proxypool_acquires_total", "choice" => c)),
            failures: FAILURES.map(|r| counter!("proxypool_acquire_failures_total", "reason" => r)),
            abandoned: counter!("proxypool_leases_lost_total", "how" => "abandoned"),
            expired: counter!("proxypool_leases_lost_total", "how" => "expired"),
            quarantine_entries: counter!("proxypool_quarantine_entries_total"),
            states: HealthState::ALL.map(|s| gauge!("proxypool_addresses", "state" => s.as_str())),
            cap_occupancy: gauge!("proxypool_quarantine_cap_occupancy"),
        }
    }

    pub(crate) fn acquired(&self, choice: Choice) {
        self.acquires[choice_index(choice)].increment(1);
    }

    /// Counted by reason; a store that did not answer is no refusal of the pool's.
    pub(crate) fn acquire_failed(&self, e: &AcquireError) {
        let reason = match e {
            AcquireError::NoAddressAvailable => 0,
            AcquireError::SessionBroken { .. } => 1,
            AcquireError::BoundAddressBusy { .. } => 2,
            AcquireError::BoundAddressCooling { .. } => 3,
            AcquireError::UnknownSubPool(_) => 4,
            AcquireError::StoreUnavailable(_) => return,
        };
        self.failures[reason].increment(1);
    }

    pub(crate) fn abandoned(&self) {
        self.abandoned.increment(1);
    }

    /// `n` leases expired.
    pub(crate) fn expired(&self, n: u64) {
        self.expired.increment(n);
    }

    pub(crate) fn quarantined(&self) {
        self.quarantine_entries.increment(1);
    }

    pub(crate) fn states(&self, by_state: &[usize; 5], quarantined: usize, cap: usize) {
        for (gauge, n) in self.states.iter().zip(by_state) {
            gauge.set(*n as f64);
        }
        self.cap_occupancy
            .set(quarantined as f64 / cap.max(1) as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn indices_match_names() {
        let o = Outcome::RateLimited {
            retry_after: Duration::ZERO,
        };
        assert_eq!(OUTCOMES[outcome_index(&o)], o.as_str());
        assert_eq!(CHOICES[choice_index(Choice::Weighted)], "weighted");
    }
}
