//! P16: metrics through the `metrics` facade. The embedding program installs a recorder
//! (Prometheus in the server); without one these calls cost next to nothing.
//!
//! Per address: `proxypool_address_outcomes_total{address,outcome}`,
//! `proxypool_address_latency_seconds{address}`, `proxypool_address_active_leases{address}`,
//! `proxypool_address_quarantines_total{address}`. Per address × site:
//! `proxypool_cell_outcomes_total{address,site,outcome}`. Pool: `proxypool_addresses{state}`,
//! `proxypool_acquires_total{choice}`, `proxypool_acquire_failures_total{reason}`,
//! `proxypool_leases_lost_total{how}`, `proxypool_quarantine_entries_total`,
//! `proxypool_quarantine_cap_occupancy` (quarantined ÷ cap).

use std::time::Duration;

use metrics::{SharedString, counter, gauge, histogram};

use crate::health::HealthState;
use crate::lease::Choice;

pub(crate) fn acquired(address: &SharedString, choice: Choice, active: u32) {
    let choice = match choice {
        Choice::Bound => "bound",
        Choice::Hashed => "hashed",
        Choice::RoundRobin => "round_robin",
        Choice::Weighted => "weighted",
        Choice::LeastConnections => "least_connections",
    };
    counter!("proxypool_acquires_total", "choice" => choice).increment(1);
    active_leases(address, active);
}

pub(crate) fn acquire_failed(reason: &'static str) {
    counter!("proxypool_acquire_failures_total", "reason" => reason).increment(1);
}

pub(crate) fn active_leases(address: &SharedString, active: u32) {
    gauge!("proxypool_address_active_leases", "address" => address.clone()).set(active);
}

pub(crate) fn lease_lost(how: &'static str) {
    counter!("proxypool_leases_lost_total", "how" => how).increment(1);
}

pub(crate) fn outcome(
    address: &SharedString,
    site: &str,
    outcome: &'static str,
    latency: Option<Duration>,
) {
    counter!("proxypool_address_outcomes_total", "address" => address.clone(), "outcome" => outcome)
        .increment(1);
    counter!(
        "proxypool_cell_outcomes_total",
        "address" => address.clone(), "site" => site.to_owned(), "outcome" => outcome
    )
    .increment(1);
    if let Some(l) = latency {
        histogram!("proxypool_address_latency_seconds", "address" => address.clone())
            .record(l.as_secs_f64());
    }
}

pub(crate) fn quarantined(address: &SharedString) {
    counter!("proxypool_quarantine_entries_total").increment(1);
    counter!("proxypool_address_quarantines_total", "address" => address.clone()).increment(1);
}

pub(crate) fn states(by_state: &[usize; 5], quarantined: usize, cap: usize) {
    for (state, n) in HealthState::ALL.iter().zip(by_state) {
        gauge!("proxypool_addresses", "state" => state.as_str()).set(*n as f64);
    }
    gauge!("proxypool_quarantine_cap_occupancy").set(quarantined as f64 / cap.max(1) as f64);
}
