//! The in-memory store: the pure engine behind one mutex.

use std::sync::{Mutex, MutexGuard, PoisonError};

#[cfg(feature = "probe")]
use super::ProbeTarget;
use super::{Grant, Release};
use crate::address::ProxyAddress;
use crate::clock::Timestamp;
use crate::error::{AcquireError, PoolError};
use crate::snapshot::Snapshot;
use crate::state::{LeaseRef, PoolState};
use crate::ticket::Ticket;

/// One lock around the whole state: every operation is short and CPU-only, and a single lock
/// makes each acquire or release atomic, exactly like the script of a shared store.
#[derive(Debug)]
pub(crate) struct MemoryStore {
    state: Mutex<PoolState>,
}

impl MemoryStore {
    pub(crate) fn new(state: PoolState) -> Self {
        Self {
            state: Mutex::new(state),
        }
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // A panic inside the engine is a bug; the pool keeps serving rather than poisoning
        // every later caller.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn acquire(&self, ticket: &Ticket, now: Timestamp) -> Result<Grant, AcquireError> {
        self.lock().acquire(ticket, now)
    }

    pub(crate) fn release(&self, release: &Release, now: Timestamp) {
        self.lock().release(release, now);
    }

    pub(crate) fn abandon(&self, lease: LeaseRef, now: Timestamp) {
        self.lock().abandon(lease, now);
    }

    pub(crate) fn end_session(&self, key: &str, now: Timestamp) -> bool {
        self.lock().end_session(key, now)
    }

    pub(crate) fn add(
        &self,
        address: ProxyAddress,
        sub_pools: &[String],
        now: Timestamp,
    ) -> Result<(), PoolError> {
        self.lock().add(vec![(address, sub_pools.to_vec())], now)
    }

    pub(crate) fn remove(&self, address: &ProxyAddress, now: Timestamp) -> Result<(), PoolError> {
        self.lock().remove(address, now)
    }

    pub(crate) fn report_probe(
        &self,
        address: &ProxyAddress,
        passed: bool,
        now: Timestamp,
    ) -> Result<(), PoolError> {
        self.lock().report_probe(address, passed, now)
    }

    #[cfg(feature = "probe")]
    pub(crate) fn probe_targets(&self, now: Timestamp) -> Vec<ProbeTarget> {
        self.lock().probe_targets(now)
    }

    pub(crate) fn snapshot(&self, now: Timestamp) -> Snapshot {
        self.lock().snapshot(now)
    }
}
