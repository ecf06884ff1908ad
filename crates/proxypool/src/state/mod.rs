//! The pool's engine: every acquire, release and transition as synchronous code on plain data.
//! It knows nothing of async, locks, HTTP or where it is stored; a store wraps it (the memory
//! store puts it behind a mutex) and passes in the time. One job per file: `membership`,
//! `selection`, `outcomes`, `judgement`, `sweep`, `snapshot`; this one holds the state they
//! share.

mod judgement;
mod leases;
mod membership;
mod outcomes;
mod record;
mod selection;
mod sessions;
pub(crate) mod sites;
mod snapshot;
mod sub_pool;
mod sweep;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

use rand::rngs::StdRng;

use crate::address::ProxyAddress;
use crate::clock::Timestamp;
use crate::config::{PoolConfig, Strategy};
use crate::decision::{Decision, DecisionLog, Subject};
use crate::health::HealthState;
use crate::strategy::Slot;
use crate::strategy::least_connections::Lookahead;
use crate::telemetry::PoolMetrics;

pub(crate) use leases::LeaseRef;
use leases::Leases;
use record::{AddressRecord, Hot, Records};
use sessions::Sessions;
use sites::Sites;
use sub_pool::SubPool;

/// A time nothing falls due at.
const NEVER: Timestamp = Timestamp::from_millis(u64::MAX);
/// No slot (slots are given from 0 up and never reach this).
const NO_SLOT: Slot = Slot::MAX;

#[derive(Debug, Default)]
struct Counters {
    acquired: u64,
    released: u64,
    abandoned: u64,
    expired: u64,
    unavailable: u64,
    sessions_broken: u64,
    quarantine_entries: u64,
}

#[derive(Debug)]
pub(crate) struct PoolState {
    cfg: PoolConfig,
    rng: Lookahead,
    /// Indexed by slot; a removed address's record stays, marked, so slots are never reused.
    records: Records,
    /// Indexed by slot, like `records`.
    hot: Vec<Hot>,
    by_address: HashMap<ProxyAddress, Slot>,
    sub_pools: Vec<SubPool>,
    sub_pool_index: HashMap<Arc<str>, u32>,
    sessions: Sessions,
    leases: Leases,
    sites: Sites,
    quarantine_ends: BinaryHeap<Reverse<(Timestamp, Slot)>>,
    /// Avoided address × site pairs, by when their oldest outcome ages out: each is judged
    /// again then, so a pair is forgiven when its evidence is gone, not at its next outcome.
    pair_checks: BinaryHeap<Reverse<(Timestamp, Slot, u32)>>,
    /// No lease, binding, pair check or quarantine falls due before this (it may be early,
    /// never late): the sweep of every call is one comparison until then.
    next_due: Timestamp,
    by_state: [usize; 5],
    frozen: bool,
    reference_latency_ms: Option<f64>,
    counters: Counters,
    log: DecisionLog,
    metrics: PoolMetrics,
    /// Reused by the fall judgement, so releases do not allocate.
    scratch_sites: Vec<u32>,
    /// The likely next keyless picks (`NO_SLOT` where none), whose record lines the last pick
    /// hinted: see `hint_upcoming`.
    upcoming: [Slot; 2],
}
impl PoolState {
    pub(crate) fn new(cfg: PoolConfig, sub_pools: &[(String, Strategy)], rng: StdRng) -> Self {
        let mut pools = vec![SubPool::new("".into(), cfg.strategy, cfg.ring_vnodes)];
        let mut index = HashMap::new();
        for (name, strategy) in sub_pools {
            let name: Arc<str> = name.as_str().into();
            index.insert(Arc::clone(&name), pools.len() as u32);
            pools.push(SubPool::new(name, *strategy, cfg.ring_vnodes));
        }
        Self {
            log: DecisionLog::new(cfg.decision_log_len),
            cfg,
            rng: Lookahead::new(rng),
            records: Records::default(),
            hot: Vec::new(),
            by_address: HashMap::new(),
            sub_pools: pools,
            sub_pool_index: index,
            sessions: Sessions::default(),
            leases: Leases::default(),
            sites: Sites::new(),
            quarantine_ends: BinaryHeap::new(),
            pair_checks: BinaryHeap::new(),
            next_due: NEVER,
            by_state: [0; 5],
            frozen: false,
            reference_latency_ms: None,
            counters: Counters::default(),
            metrics: PoolMetrics::new(),
            scratch_sites: Vec::new(),
            upcoming: [NO_SLOT; 2],
        }
    }

    /// Hints what the likely next picks' records point to (their window's next entry, their
    /// address), now that the records' own lines, hinted by the pick a release ago, are in:
    /// a pair's chain of dependent loads then starts a pair early.
    fn hint_upcoming(&mut self) {
        for slot in std::mem::replace(&mut self.upcoming, [NO_SLOT; 2]) {
            self.records.prefetch_pointed(slot);
        }
    }

    fn record(&self, slot: Slot) -> Option<&AddressRecord> {
        self.records.get(slot)
    }

    fn record_mut(&mut self, slot: Slot) -> Option<&mut AddressRecord> {
        self.records.get_mut(slot)
    }

    fn decide(&mut self, at: Timestamp, subject: Subject, from: &str, to: &str, reason: String) {
        self.log.record(Decision {
            at_ms: at.as_millis(),
            subject,
            from: from.into(),
            to: to.into(),
            reason,
        });
    }

    fn quarantined(&self) -> usize {
        self.by_state[HealthState::Quarantined as usize]
            + self.by_state[HealthState::Probing as usize]
    }
}
