//! What acquire hands out and release takes back.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::address::ProxyAddress;
use crate::error::PoolError;
use crate::pool::Shared;
use crate::state::LeaseRef;
use crate::store::{Grant, Release};
use crate::strategy::Slot;

/// Identifies one lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LeaseId(pub(crate) u64);

impl LeaseId {
    /// The number behind the id.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Why this address was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Choice {
    /// The key's live session binding (P2).
    Bound,
    /// A new session: the key's place on the consistent-hash ring (P1).
    Hashed,
    /// Keyless, round-robin.
    RoundRobin,
    /// Keyless, smooth weighted.
    Weighted,
    /// Keyless, least connections.
    LeastConnections,
}

/// How the work done through a lease ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// It worked; `latency` is how long the request took.
    Success {
        /// Request latency through the proxy.
        latency: Duration,
    },
    /// The proxy could not be reached or dropped the connection.
    ConnectError,
    /// No answer in time.
    Timeout,
    /// The site refused the address (403-like).
    Blocked,
    /// The site answered with a captcha.
    Captcha,
    /// The site asked to slow down: the address cools for that site only, it is not a ban.
    RateLimited {
        /// How long the site asked to wait.
        retry_after: Duration,
    },
}

impl Outcome {
    /// Lower-case name, as in metrics labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Success { .. } => "success",
            Self::ConnectError => "connect_error",
            Self::Timeout => "timeout",
            Self::Blocked => "blocked",
            Self::Captcha => "captcha",
            Self::RateLimited { .. } => "rate_limited",
        }
    }
}

/// A lease on one address. Release it with the outcome; dropping it unreleased records it as
/// abandoned and frees its slot.
#[must_use = "a lease holds a slot of its address until released or dropped"]
pub struct Lease {
    lease: LeaseRef,
    slot: Slot,
    address: ProxyAddress,
    choice: Choice,
    site: u32,
    /// `None` once released, so that `Drop` knows there is nothing left to do.
    pool: Option<Arc<Shared>>,
}

impl Lease {
    pub(crate) fn new(grant: Grant, pool: Arc<Shared>) -> Self {
        Self {
            lease: grant.lease,
            slot: grant.slot,
            address: grant.address,
            choice: grant.choice,
            site: grant.site,
            pool: Some(pool),
        }
    }

    /// The lease's id.
    pub fn id(&self) -> LeaseId {
        self.lease.id
    }

    /// The address to send the work through.
    pub fn address(&self) -> &ProxyAddress {
        &self.address
    }

    /// Why the pool chose it.
    pub fn choice(&self) -> Choice {
        self.choice
    }

    /// Returns the address with the outcome of the work. Always `Ok` with the in-memory store;
    /// a shared store can fail, and then the lease is recovered by its TTL (P14).
    pub async fn release(mut self, outcome: Outcome) -> Result<(), PoolError> {
        let Some(pool) = self.pool.take() else {
            return Ok(());
        };
        let release = Release {
            lease: self.lease,
            slot: self.slot,
            site: self.site,
            outcome,
        };
        pool.store.release(release, pool.clock.now()).await
    }

    /// Gives the address back without an outcome, as dropping the lease does, and waits until
    /// the store has it. A dropped lease's abandon is queued, and with a shared store a
    /// process that exits at once can take the queue with it, leaving the slot held until the
    /// lease TTL; a process about to exit abandons this way instead.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let pool = proxypool::Pool::builder().address("http://10.0.0.1:8080").build()?;
    /// let lease = pool.acquire(proxypool::Ticket::new()).await?;
    /// lease.abandon().await?;
    /// assert_eq!(pool.snapshot().await.addresses[0].active_leases, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn abandon(mut self) -> Result<(), PoolError> {
        let Some(pool) = self.pool.take() else {
            return Ok(());
        };
        pool.store
            .abandon_settled(self.lease, self.slot, pool.clock.now())
            .await
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.store.abandon(self.lease, self.slot, pool.clock.now());
        }
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("id", &self.lease.id)
            .field("address", &self.address)
            .field("choice", &self.choice)
            .field("released", &self.pool.is_none())
            .finish()
    }
}
