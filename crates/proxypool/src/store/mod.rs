//! Where the pool's state lives. Each pool operation is one call on the store, so a shared
//! store can run it as one atomic server-side script (one round trip per acquire or release).
//!
//! Backends are the variants of one enum rather than trait objects: a boxed trait future
//! would cost two allocations per acquire + release pair, a visible share of the in-memory
//! path. Two backends: the in-memory engine and, with feature `redis`, the Redis store (whose
//! calls await, which is why these are async).

mod memory;
#[cfg(feature = "redis")]
pub(crate) mod redis;

pub(crate) use memory::MemoryStore;
#[cfg(feature = "redis")]
use std::sync::Arc;

use crate::address::ProxyAddress;
use crate::clock::Timestamp;
use crate::error::{AcquireError, PoolError};
use crate::lease::{Choice, Outcome};
use crate::snapshot::Snapshot;
use crate::state::LeaseRef;
use crate::strategy::Slot;
use crate::ticket::Ticket;

/// What the store grants for a ticket.
#[derive(Debug, Clone)]
pub(crate) struct Grant {
    pub(crate) lease: LeaseRef,
    pub(crate) slot: Slot,
    /// The ticket's site, interned: its release needs no second lookup by name.
    pub(crate) site: u32,
    pub(crate) address: ProxyAddress,
    pub(crate) choice: Choice,
}

/// A lease coming back with its outcome.
#[derive(Debug, Clone)]
pub(crate) struct Release {
    pub(crate) lease: LeaseRef,
    /// The address by its internal id: slots are never reused, so it names one address forever.
    pub(crate) slot: Slot,
    pub(crate) site: u32,
    pub(crate) outcome: Outcome,
}

#[cfg(feature = "probe")]
/// One address as the prober sees it (P12).
#[derive(Debug, Clone)]
pub(crate) struct ProbeTarget {
    pub(crate) address: ProxyAddress,
    pub(crate) state: crate::health::HealthState,
    pub(crate) active_leases: u32,
}

/// The state behind a pool. `now` is passed in so that every backend runs on the pool's clock.
#[derive(Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "one Store per pool, already behind the pool's Arc: boxing the memory store would \
              only add an indirection to its hot path"
)]
pub(crate) enum Store {
    Memory(MemoryStore),
    /// Shared by every process using the same Redis and pool name (P15).
    #[cfg(feature = "redis")]
    Redis(Arc<redis::RedisStore>),
}

impl Store {
    pub(crate) async fn acquire(
        &self,
        ticket: &Ticket,
        now: Timestamp,
    ) -> Result<Grant, AcquireError> {
        match self {
            Self::Memory(m) => m.acquire(ticket, now),
            #[cfg(feature = "redis")]
            Self::Redis(r) => r.acquire_counted(ticket, now).await,
        }
    }

    pub(crate) async fn release(&self, release: Release, now: Timestamp) -> Result<(), PoolError> {
        match self {
            Self::Memory(m) => {
                m.release(&release, now);
                Ok(())
            }
            #[cfg(feature = "redis")]
            Self::Redis(r) => r.release_counted(release, now).await,
        }
    }

    /// Called from `Drop`, so it cannot await: a networked backend queues it, and the lease TTL
    /// (P14) covers a queue lost in a crash.
    pub(crate) fn abandon(&self, lease: LeaseRef, slot: Slot, now: Timestamp) {
        match self {
            // The engine finds the slot from the lease itself.
            Self::Memory(m) => {
                let _ = slot;
                m.abandon(lease, now);
            }
            #[cfg(feature = "redis")]
            Self::Redis(r) => r.abandon_counted(lease, slot, now),
        }
    }

    /// [`Self::abandon`], waiting until a networked backend has it.
    pub(crate) async fn abandon_settled(
        &self,
        lease: LeaseRef,
        slot: Slot,
        now: Timestamp,
    ) -> Result<(), PoolError> {
        match self {
            #[cfg(feature = "redis")]
            Self::Redis(r) => r.abandon_settled_counted(lease, slot, now).await,
            // The engine has it as soon as the call returns.
            Self::Memory(_) => {
                self.abandon(lease, slot, now);
                Ok(())
            }
        }
    }

    pub(crate) async fn end_session(&self, key: &str, now: Timestamp) -> bool {
        match self {
            Self::Memory(m) => m.end_session(key, now),
            #[cfg(feature = "redis")]
            Self::Redis(r) => r.end_session(key, now).await,
        }
    }

    pub(crate) async fn add(
        &self,
        address: ProxyAddress,
        sub_pools: &[String],
        now: Timestamp,
    ) -> Result<(), PoolError> {
        match self {
            Self::Memory(m) => m.add(address, sub_pools, now),
            #[cfg(feature = "redis")]
            Self::Redis(r) => r.add(address, sub_pools, now).await,
        }
    }

    pub(crate) async fn remove(
        &self,
        address: &ProxyAddress,
        now: Timestamp,
    ) -> Result<(), PoolError> {
        match self {
            Self::Memory(m) => m.remove(address, now),
            #[cfg(feature = "redis")]
            Self::Redis(r) => r.remove(address, now).await,
        }
    }

    pub(crate) async fn report_probe(
        &self,
        address: &ProxyAddress,
        passed: bool,
        now: Timestamp,
    ) -> Result<(), PoolError> {
        match self {
            Self::Memory(m) => m.report_probe(address, passed, now),
            #[cfg(feature = "redis")]
            Self::Redis(r) => r.report_probe(address, passed, now).await,
        }
    }

    #[cfg(feature = "probe")]
    pub(crate) async fn probe_targets(&self, now: Timestamp) -> Vec<ProbeTarget> {
        match self {
            Self::Memory(m) => m.probe_targets(now),
            #[cfg(feature = "redis")]
            Self::Redis(r) => r.probe_targets(now).await.unwrap_or_else(|e| {
                // Nothing to probe this round; the next one tries again.
                tracing::warn!(target: "proxypool::redis", error = %e, "probe targets unavailable");
                Vec::new()
            }),
        }
    }

    /// Waits until a networked backend has every operation queued before the call.
    pub(crate) async fn settle(&self) -> Result<(), PoolError> {
        match self {
            // Its calls are done when they return.
            Self::Memory(_) => Ok(()),
            #[cfg(feature = "redis")]
            Self::Redis(r) => r.settle().await,
        }
    }

    pub(crate) async fn snapshot(&self, now: Timestamp) -> Snapshot {
        match self {
            Self::Memory(m) => m.snapshot(now),
            #[cfg(feature = "redis")]
            Self::Redis(r) => r.snapshot(now).await,
        }
    }
}
