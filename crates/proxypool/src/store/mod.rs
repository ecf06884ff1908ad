//! Where the pool's state lives. Each pool operation is one call on the store, so a shared
//! store can run it as one atomic server-side script (one round trip per acquire or release).
//!
//! Backends are the variants of one enum rather than trait objects: a boxed trait future
//! would cost two allocations per acquire + release pair, a visible share of the in-memory
//! path. Only the in-memory backend exists so far; a Redis backend becomes a second variant
//! with the same operations (its calls will await, which is why these are async).

mod memory;

pub(crate) use memory::MemoryStore;

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
pub(crate) enum Store {
    Memory(MemoryStore),
}

impl Store {
    pub(crate) async fn acquire(
        &self,
        ticket: &Ticket,
        now: Timestamp,
    ) -> Result<Grant, AcquireError> {
        match self {
            Self::Memory(m) => m.acquire(ticket, now),
        }
    }

    pub(crate) async fn release(&self, release: Release, now: Timestamp) -> Result<(), PoolError> {
        match self {
            Self::Memory(m) => {
                m.release(&release, now);
                Ok(())
            }
        }
    }

    /// Called from `Drop`, so it cannot await: a networked backend queues it, and the lease TTL
    /// (P14) covers a queue lost in a crash.
    pub(crate) fn abandon(&self, lease: LeaseRef, now: Timestamp) {
        match self {
            Self::Memory(m) => m.abandon(lease, now),
        }
    }

    pub(crate) async fn end_session(&self, key: &str, now: Timestamp) -> bool {
        match self {
            Self::Memory(m) => m.end_session(key, now),
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
        }
    }

    pub(crate) async fn remove(
        &self,
        address: &ProxyAddress,
        now: Timestamp,
    ) -> Result<(), PoolError> {
        match self {
            Self::Memory(m) => m.remove(address, now),
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
        }
    }

    #[cfg(feature = "probe")]
    pub(crate) async fn probe_targets(&self, now: Timestamp) -> Vec<ProbeTarget> {
        match self {
            Self::Memory(m) => m.probe_targets(now),
        }
    }

    pub(crate) async fn snapshot(&self, now: Timestamp) -> Snapshot {
        match self {
            Self::Memory(m) => m.snapshot(now),
        }
    }
}
