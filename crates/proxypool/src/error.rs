//! Typed errors of the public API.

use std::time::Duration;

use thiserror::Error;

use crate::address::{AddressError, ProxyAddress};

/// Why `acquire` gave no lease.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AcquireError {
    /// No address can take this ticket now: the pool (or sub-pool) is empty, or every address
    /// is out of service, at its lease cap or cooling down for the site.
    #[error("no proxy address available")]
    NoAddressAvailable,
    /// The key's address was quarantined, found dead or removed: the caller should end the
    /// session. The binding is dropped, so the next acquire for the key starts a new session.
    #[error("session {key:?} is broken: its address {address} is out of service")]
    SessionBroken {
        /// The business-session key.
        key: String,
        /// The address the session was bound to.
        address: ProxyAddress,
    },
    /// The key's address is at its lease cap; the session is kept, try again later.
    #[error("session {key:?}: its address {address} is at its lease cap")]
    BoundAddressBusy {
        /// The business-session key.
        key: String,
        /// The address the session is bound to.
        address: ProxyAddress,
    },
    /// The site rate-limited the key's address; the session is kept, try again later.
    #[error("session {key:?}: its address {address} is rate limited for {retry_in:?}")]
    BoundAddressCooling {
        /// The business-session key.
        key: String,
        /// The address the session is bound to.
        address: ProxyAddress,
        /// How long the cooling lasts.
        retry_in: Duration,
    },
    /// The ticket names a sub-pool that was never declared.
    #[error("unknown sub-pool {0:?}")]
    UnknownSubPool(String),
    /// The shared store (Redis) did not answer within its timeout or refused the call: the
    /// acquire fails at once rather than waiting; retry later or fail the task.
    #[error("pool store unavailable: {0}")]
    StoreUnavailable(String),
}

/// Errors of the pool's management calls (add, remove, release, probe reports).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoolError {
    /// The string is not a proxy address.
    #[error(transparent)]
    Address(#[from] AddressError),
    /// The address is already in the pool.
    #[error("address {0} is already in the pool")]
    Duplicate(ProxyAddress),
    /// The address is not in the pool.
    #[error("address {0} is not in the pool")]
    UnknownAddress(ProxyAddress),
    /// A sub-pool name that was never declared.
    #[error("unknown sub-pool {0:?}")]
    UnknownSubPool(String),
    /// The shared store (Redis) did not answer within its timeout or refused the call.
    #[error("pool store unavailable: {0}")]
    StoreUnavailable(String),
}

/// Why a pool could not be built.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum BuildError {
    /// A configuration value out of its range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The shared store refused this process's configuration: the pool's function library
    /// reads another encoding, or the pool's first process configured it otherwise (every
    /// process of a shared pool judges by one configuration).
    #[error("the shared store refused the configuration: {0}")]
    StoreMismatch(String),
    /// An initial address was rejected.
    #[error(transparent)]
    Pool(#[from] PoolError),
}
