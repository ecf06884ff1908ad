//! The in-memory store: the pure engine behind one mutex.

use std::sync::{Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;

use super::{Grant, Release, Store};
use crate::address::ProxyAddress;
use crate::clock::Timestamp;
use crate::error::{AcquireError, PoolError};
use crate::lease::LeaseId;
use crate::snapshot::Snapshot;
use crate::state::PoolState;
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
}

#[async_trait]
impl Store for MemoryStore {
    async fn acquire(&self, ticket: &Ticket, now: Timestamp) -> Result<Grant, AcquireError> {
        self.lock().acquire(ticket, now)
    }

    async fn release(&self, release: Release, now: Timestamp) -> Result<(), PoolError> {
        self.lock().release(&release, now);
        Ok(())
    }

    fn abandon(&self, lease: LeaseId, now: Timestamp) {
        self.lock().abandon(lease, now);
    }

    async fn add(
        &self,
        address: ProxyAddress,
        sub_pools: &[String],
        now: Timestamp,
    ) -> Result<(), PoolError> {
        self.lock().add(vec![(address, sub_pools.to_vec())], now)
    }

    async fn remove(&self, address: &ProxyAddress, now: Timestamp) -> Result<(), PoolError> {
        self.lock().remove(address, now)
    }

    async fn report_probe(
        &self,
        address: &ProxyAddress,
        passed: bool,
        now: Timestamp,
    ) -> Result<(), PoolError> {
        self.lock().report_probe(address, passed, now)
    }

    async fn snapshot(&self, now: Timestamp) -> Snapshot {
        self.lock().snapshot(now)
    }
}
