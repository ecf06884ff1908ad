//! Where the pool's state lives. Each pool operation is one call on the store, so a shared
//! store can run it as one atomic server-side script (one round trip per acquire or release).
//! Only the in-memory store exists so far; a Redis store implements the same trait.

mod memory;

pub(crate) use memory::MemoryStore;

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;

use crate::address::ProxyAddress;
use crate::clock::Timestamp;
use crate::error::{AcquireError, PoolError};
use crate::lease::{Choice, LeaseId, Outcome};
use crate::snapshot::Snapshot;
use crate::ticket::Ticket;

/// What the store grants for a ticket.
#[derive(Debug, Clone)]
pub(crate) struct Grant {
    pub(crate) lease: LeaseId,
    pub(crate) address: ProxyAddress,
    pub(crate) choice: Choice,
}

/// A lease coming back with its outcome.
#[derive(Debug, Clone)]
pub(crate) struct Release {
    pub(crate) lease: LeaseId,
    pub(crate) address: ProxyAddress,
    pub(crate) site: Option<Arc<str>>,
    pub(crate) outcome: Outcome,
}

/// The state behind a pool. `now` is passed in so that every store runs on the pool's clock.
#[async_trait]
pub(crate) trait Store: Send + Sync + Debug {
    async fn acquire(&self, ticket: &Ticket, now: Timestamp) -> Result<Grant, AcquireError>;
    async fn release(&self, release: Release, now: Timestamp) -> Result<(), PoolError>;
    /// Called from `Drop`, so it cannot await: a networked store queues it, and the lease TTL
    /// (P14) covers a queue lost in a crash.
    fn abandon(&self, lease: LeaseId, now: Timestamp);
    async fn add(
        &self,
        address: ProxyAddress,
        sub_pools: &[String],
        now: Timestamp,
    ) -> Result<(), PoolError>;
    async fn remove(&self, address: &ProxyAddress, now: Timestamp) -> Result<(), PoolError>;
    async fn report_probe(
        &self,
        address: &ProxyAddress,
        passed: bool,
        now: Timestamp,
    ) -> Result<(), PoolError>;
    async fn snapshot(&self, now: Timestamp) -> Snapshot;
}
