//! Node.js bindings of `proxypool` (napi-rs): the same engine in process, in memory or sharing
//! state with every other process through Redis. Every call returns a promise whose work runs
//! on napi's tokio runtime. `lib.js` wraps this module: typed error classes and `withLease`.
//!
//! Errors reach JavaScript as `Error`s whose `code` names the failure (`NoAddressAvailable`,
//! `SessionBroken`, …) — the same names as the Python package's exception classes.

use std::sync::Mutex;
use std::time::Instant;

mod exit;

// One reading of outcomes and of tunables for both bindings.
#[path = "../../proxypool-py/src/outcome.rs"]
mod outcome;
#[path = "../../proxypool-py/src/redis_url.rs"]
mod redis_url;
#[path = "../../proxypool-py/src/settling.rs"]
mod settling;
#[path = "../../proxypool-py/src/tunables.rs"]
mod tunables;

use napi::bindgen_prelude::*;
use napi_derive::napi;
use proxypool::{AcquireError, BuildError, PoolError, Ticket};
use tokio::runtime::Handle;

fn error(code: &str, message: impl std::fmt::Display) -> Error {
    Error::new(Status::GenericFailure, format!("{code}: {message}"))
}

fn acquire_error(e: AcquireError) -> Error {
    let code = match &e {
        AcquireError::NoAddressAvailable => "NoAddressAvailable",
        AcquireError::SessionBroken { .. } => "SessionBroken",
        AcquireError::BoundAddressBusy { .. } => "BoundAddressBusy",
        AcquireError::BoundAddressCooling { .. } => "BoundAddressCooling",
        AcquireError::UnknownSubPool(_) => "UnknownSubPool",
        AcquireError::StoreUnavailable(_) => "StoreUnavailable",
        _ => "ProxyPoolError",
    };
    error(code, e)
}

fn pool_error(e: PoolError) -> Error {
    let code = match &e {
        PoolError::Address(_) => "InvalidAddress",
        PoolError::Duplicate(_) => "DuplicateAddress",
        PoolError::UnknownAddress(_) => "UnknownAddress",
        PoolError::UnknownSubPool(_) => "UnknownSubPool",
        PoolError::StoreUnavailable(_) => "StoreUnavailable",
        _ => "ProxyPoolError",
    };
    error(code, e)
}

fn build_error(e: BuildError) -> Error {
    match e {
        BuildError::Pool(e) => pool_error(e),
        other => error("InvalidConfig", other),
    }
}

/// `new Pool(...)`'s options.
#[napi(object)]
#[derive(Debug)]
pub struct PoolOptions {
    /// Proxy URLs of the whole pool.
    pub addresses: Vec<String>,
    /// `redis://host:port/db` or `redis+cluster://host:port,host:port,…`: share the pool with
    /// every process using the same `name`.
    pub redis: Option<String>,
    /// The pool's name in Redis (default `"default"`).
    pub name: Option<String>,
    /// Seconds a Redis call may take before it fails with `StoreUnavailable` (default 0.5).
    pub redis_timeout: Option<f64>,
    /// Sub-pools by name, each with its keyless strategy.
    pub sub_pools: Option<std::collections::HashMap<String, String>>,
    /// Seeds the random choices (reproducible runs).
    pub seed: Option<i64>,
    /// Fields of the engine's `PoolConfig` by their Rust names, as in the Python package
    /// (`{strategy: "round_robin", max_leases_per_address: 4, health: {window: 20}}`);
    /// durations in seconds.
    pub tunables: Option<serde_json::Value>,
}

/// What `acquire` asks for.
#[napi(object)]
#[derive(Debug, Default)]
pub struct TicketOptions {
    /// Business-session key: keyed work is sticky.
    pub key: Option<String>,
    /// Target site: reputation is judged per address and site.
    pub site: Option<String>,
    /// A declared sub-pool instead of the whole pool.
    pub sub_pool: Option<String>,
}

/// `release`'s details.
#[napi(object)]
#[derive(Debug, Default)]
pub struct ReleaseOptions {
    /// Seconds the work took (a success's latency; default: since the acquire).
    pub latency: Option<f64>,
    /// Seconds a rate-limiting site asked to wait (default 60).
    pub retry_after: Option<f64>,
}

/// Waits until every settle this process started is done: `lib.js`'s exit hook, after
/// `settleAtExit` on its live pools (see `exit`).
#[napi]
pub fn wait_for_settles() {
    exit::wait_for_settles();
}

/// A pool of proxy addresses behind acquire and release.
#[napi]
#[derive(Debug)]
pub struct Pool {
    inner: proxypool::Pool,
    /// Shared through Redis: what it queued is settled at exit (see `exit`).
    redis: bool,
    /// The runtime its calls run on (napi's): a drop's work is spawned there.
    runtime: Handle,
}

#[napi]
impl Pool {
    /// Builds the pool (connecting to Redis when `redis` is set).
    #[napi(factory)]
    pub async fn create(options: PoolOptions) -> Result<Pool> {
        let mut b = proxypool::Pool::builder()
            .config(
                tunables::pool_config(options.tunables.unwrap_or_else(|| serde_json::json!({})))
                    .map_err(|e| error("InvalidConfig", e))?,
            )
            .addresses(options.addresses);
        for (name, s) in options.sub_pools.unwrap_or_default() {
            b = b.sub_pool(
                name,
                tunables::strategy(&s).map_err(|e| error("InvalidConfig", e))?,
            );
        }
        if let Some(seed) = options.seed {
            b = b.seed(seed as u64);
        }
        let redis = options.redis.is_some();
        if let Some(url) = options.redis {
            let name = options.name.as_deref().unwrap_or("default");
            let redis = redis_url::options(&url, name, options.redis_timeout.unwrap_or(0.5))
                .map_err(|e| error("InvalidConfig", e))?;
            b = b.redis(redis);
        }
        let inner = b.connect().await.map_err(build_error)?;
        Ok(Pool {
            inner,
            redis,
            runtime: Handle::current(),
        })
    }

    /// A lease for the ticket, or why there is none.
    #[napi]
    pub async fn acquire(&self, ticket: Option<TicketOptions>) -> Result<Lease> {
        let t = ticket.unwrap_or_default();
        let mut ticket = Ticket::new();
        if let Some(key) = t.key {
            ticket = ticket.key(key);
        }
        if let Some(site) = t.site {
            ticket = ticket.site(site);
        }
        if let Some(sub_pool) = t.sub_pool {
            ticket = ticket.sub_pool(sub_pool);
        }
        let lease = self.inner.acquire(ticket).await.map_err(acquire_error)?;
        Ok(Lease {
            address: lease.address().as_str().to_owned(),
            id: lease.id().get() as i64,
            choice: serde_json::to_value(lease.choice())
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            acquired: Instant::now(),
            inner: Mutex::new(Some(lease)),
            settle_on_drop: self
                .redis
                .then(|| (self.runtime.clone(), self.inner.clone())),
        })
    }

    /// Resolves once the store has every operation this process queued before the call: with
    /// Redis, the abandons of leases dropped unreleased (collected by the garbage collector),
    /// which travel with the next batch. The process's exit waits for them all the same.
    #[napi]
    pub async fn settle(&self) -> Result<()> {
        self.inner.settle().await.map_err(pool_error)
    }

    /// For `lib.js`'s exit hook: starts settling a Redis pool (what its live leases queue
    /// later is settled by their own drops), which `waitForSettles` then waits for.
    #[napi]
    pub fn settle_at_exit(&self) {
        if self.redis {
            exit::settle_later(&self.runtime, self.inner.clone());
        }
    }

    /// The whole state as plain objects, shaped like `GET /v1/snapshot`'s `snapshot`.
    #[napi]
    pub async fn snapshot(&self) -> Result<serde_json::Value> {
        serde_json::to_value(self.inner.snapshot().await).map_err(|e| error("ProxyPoolError", e))
    }

    /// Adds an address to the whole pool and the named sub-pools.
    #[napi]
    pub async fn add(&self, address: String, sub_pools: Option<Vec<String>>) -> Result<()> {
        let names = sub_pools.unwrap_or_default();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        self.inner
            .add_to(&address, &names)
            .await
            .map_err(pool_error)
    }

    /// Removes an address; sessions bound to it are reported broken on their next acquire.
    #[napi]
    pub async fn remove(&self, address: String) -> Result<()> {
        self.inner.remove(&address).await.map_err(pool_error)
    }

    /// Feeds the result of an active probe of `address` (a check of your own through it): a
    /// probing address needs `rise_successes` passes in a row to return to service, a failure
    /// sends it back to quarantine, and a dead address comes back only this way. Ignored in
    /// other states.
    #[napi]
    pub async fn report_probe(&self, address: String, passed: bool) -> Result<()> {
        self.inner
            .report_probe(&address, passed)
            .await
            .map_err(pool_error)
    }

    /// Ends a key's session now; whether it had one.
    #[napi]
    pub async fn end_session(&self, key: String) -> Result<bool> {
        Ok(self.inner.end_session(&key).await)
    }
}

/// An address leased from the pool; release it with the outcome of the work.
#[napi]
#[derive(Debug)]
pub struct Lease {
    inner: Mutex<Option<proxypool::Lease>>,
    address: String,
    id: i64,
    choice: String,
    acquired: Instant,
    /// Its Redis pool and the runtime it runs on: a drop unreleased settles it (see `exit`).
    settle_on_drop: Option<(Handle, proxypool::Pool)>,
}

#[napi]
impl Lease {
    /// The proxy URL to send the work through, credentials included.
    #[napi(getter)]
    pub fn address(&self) -> String {
        self.address.clone()
    }

    /// The lease's id.
    #[napi(getter)]
    pub fn id(&self) -> i64 {
        self.id
    }

    /// Why the pool chose the address (`bound`, `hashed`, `weighted`, …).
    #[napi(getter)]
    pub fn choice(&self) -> String {
        self.choice.clone()
    }

    /// Returns the address with the outcome (`success`, `connect_error`, `timeout`, `blocked`,
    /// `captcha`, `rate_limited`, as in the JSON API).
    #[napi]
    pub async fn release(&self, outcome: String, options: Option<ReleaseOptions>) -> Result<()> {
        let options = options.unwrap_or_default();
        let outcome = outcome::parse(
            &outcome,
            options.latency,
            options.retry_after,
            self.acquired,
        )
        .map_err(|e| error("InvalidArgument", e))?;
        let lease = self
            .inner
            .lock()
            .map_err(|_| error("ProxyPoolError", "lease lock poisoned"))?
            .take()
            .ok_or_else(|| {
                error(
                    "LeaseReleased",
                    format!("lease {} was released already", self.id),
                )
            })?;
        lease.release(outcome).await.map_err(pool_error)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let lease = self
            .inner
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        // Unreleased: the abandon is queued for the next batch, and the settle after it, which
        // the process's exit waits for, keeps the store until it has gone out (even past the
        // pool's drop).
        if let Some(lease) = lease {
            drop(lease);
            if let Some((runtime, pool)) = self.settle_on_drop.take() {
                exit::settle_later(&runtime, pool);
            }
        }
    }
}
