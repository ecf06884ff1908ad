//! The decision log (P16): every state transition and judgement with its reason, never every
//! request. Each decision goes to `tracing` (target `proxypool::decision`) and to a bounded
//! in-memory log that snapshots carry.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// What a decision is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Subject {
    /// One address (URL with the password hidden).
    Address {
        /// The address.
        address: String,
    },
    /// One target site.
    Site {
        /// The site.
        site: String,
    },
    /// One address for one target site (the address × site matrix).
    Cell {
        /// The address.
        address: String,
        /// The site.
        site: String,
    },
    /// The whole pool.
    Pool,
}

/// One logged decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// When (ms since the epoch).
    pub at_ms: u64,
    /// About what.
    pub subject: Subject,
    /// State before.
    pub from: String,
    /// State after.
    pub to: String,
    /// Why.
    pub reason: String,
}

#[derive(Debug)]
pub(crate) struct DecisionLog {
    recent: VecDeque<Decision>,
    keep: usize,
}

impl DecisionLog {
    pub(crate) fn new(keep: usize) -> Self {
        Self {
            recent: VecDeque::with_capacity(keep.min(1024)),
            keep,
        }
    }

    pub(crate) fn record(&mut self, d: Decision) {
        trace(&d);
        if self.keep == 0 {
            return;
        }
        if self.recent.len() == self.keep {
            self.recent.pop_front();
        }
        self.recent.push_back(d);
    }

    pub(crate) fn recent(&self) -> Vec<Decision> {
        self.recent.iter().cloned().collect()
    }
}

/// Sends a decision to `tracing` (target `proxypool::decision`): `info`, a pool-wide one `warn`.
pub(crate) fn trace(d: &Decision) {
    match &d.subject {
        Subject::Address { address } => tracing::info!(
            target: "proxypool::decision",
            address = %address, from = %d.from, to = %d.to, reason = %d.reason,
            "address {address}: {} -> {}", d.from, d.to
        ),
        Subject::Site { site } => tracing::info!(
            target: "proxypool::decision",
            site = %site, from = %d.from, to = %d.to, reason = %d.reason,
            "site {site}: {} -> {}", d.from, d.to
        ),
        Subject::Cell { address, site } => tracing::info!(
            target: "proxypool::decision",
            address = %address, site = %site, from = %d.from, to = %d.to, reason = %d.reason,
            "address {address} on site {site}: {} -> {}", d.from, d.to
        ),
        Subject::Pool => tracing::warn!(
            target: "proxypool::decision",
            from = %d.from, to = %d.to, reason = %d.reason,
            "pool: {} -> {}", d.from, d.to
        ),
    }
}
