//! The public face: `Pool`, its builder, and the calls the business code makes.

use std::fmt;
use std::sync::Arc;

use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::address::ProxyAddress;
use crate::clock::{Clock, SystemClock};
use crate::config::{PoolConfig, Strategy};
use crate::error::{AcquireError, BuildError, PoolError};
use crate::lease::Lease;
use crate::snapshot::Snapshot;
use crate::state::PoolState;
use crate::store::{MemoryStore, Store};
use crate::ticket::Ticket;

/// What a pool and its leases share.
pub(crate) struct Shared {
    pub(crate) store: Store,
    pub(crate) clock: Arc<dyn Clock>,
}

/// A pool of proxy addresses behind `acquire` and `release`. Cheap to clone; clones share
/// one pool.
///
/// ```
/// use proxypool::{Outcome, Pool, Ticket};
/// use std::time::Duration;
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let pool = Pool::builder()
///     .address("http://user:pass@10.0.0.1:8080")
///     .address("socks5://10.0.0.2:1080")
///     .seed(42)
///     .build()?;
/// let lease = pool.acquire(Ticket::new().key("account-7").site("shop.example")).await?;
/// println!("using {} ({:?})", lease.address(), lease.choice());
/// lease.release(Outcome::Success { latency: Duration::from_millis(180) }).await?;
/// // The same account keeps its address for the session.
/// let again = pool.acquire(Ticket::new().key("account-7")).await?;
/// assert_eq!(again.choice(), proxypool::Choice::Bound);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct Pool {
    shared: Arc<Shared>,
}

impl Pool {
    /// Starts describing a pool.
    pub fn builder() -> PoolBuilder {
        PoolBuilder::default()
    }

    /// A lease on an address for the ticket, or why there is none.
    pub async fn acquire(&self, ticket: Ticket) -> Result<Lease, AcquireError> {
        let now = self.shared.clock.now();
        let grant = self.shared.store.acquire(&ticket, now).await?;
        Ok(Lease::new(grant, Arc::clone(&self.shared)))
    }

    /// Ends a key's session before its TTL runs out (the account logged out, the caller gave
    /// up on it): the binding is dropped and the key's next acquire starts a new session.
    /// Whether the key had one.
    pub async fn end_session(&self, key: &str) -> bool {
        let now = self.shared.clock.now();
        self.shared.store.end_session(key, now).await
    }

    /// Adds an address at runtime, to the whole pool only.
    pub async fn add(&self, address: &str) -> Result<(), PoolError> {
        self.add_to(address, &[]).await
    }

    /// Adds an address at runtime, to the whole pool and the named sub-pools.
    pub async fn add_to(&self, address: &str, sub_pools: &[&str]) -> Result<(), PoolError> {
        let address = ProxyAddress::parse(address)?;
        let names: Vec<String> = sub_pools.iter().map(|s| (*s).to_owned()).collect();
        let now = self.shared.clock.now();
        self.shared.store.add(address, &names, now).await
    }

    /// Removes an address at runtime. Sessions bound to it are reported broken on their next
    /// acquire; its open leases are forgotten when they come back.
    pub async fn remove(&self, address: &str) -> Result<(), PoolError> {
        let address = ProxyAddress::parse(address)?;
        let now = self.shared.clock.now();
        self.shared.store.remove(&address, now).await
    }

    /// Feeds the result of an active probe of `address` (the hook for active probes, P12):
    /// a probing address needs `rise_successes` passes in a row to return, a failure sends
    /// it back to quarantine; a dead address comes back only this way. Ignored in other states.
    pub async fn report_probe(&self, address: &str, passed: bool) -> Result<(), PoolError> {
        let address = ProxyAddress::parse(address)?;
        let now = self.shared.clock.now();
        self.shared.store.report_probe(&address, passed, now).await
    }

    #[cfg(feature = "probe")]
    pub(crate) fn now(&self) -> crate::clock::Timestamp {
        self.shared.clock.now()
    }

    #[cfg(feature = "probe")]
    pub(crate) async fn probe_targets(
        &self,
        now: crate::clock::Timestamp,
    ) -> Vec<crate::store::ProbeTarget> {
        self.shared.store.probe_targets(now).await
    }

    /// `report_probe` for an address already parsed (the prober's path).
    #[cfg(feature = "probe")]
    pub(crate) async fn report_probe_of(
        &self,
        address: &ProxyAddress,
        passed: bool,
    ) -> Result<(), PoolError> {
        let now = self.shared.clock.now();
        self.shared.store.report_probe(address, passed, now).await
    }

    /// Waits until the store has every operation this process queued before the call: with
    /// Redis, the abandons of leases dropped unreleased, which travel with the next batch
    /// rather than on their own (an in-memory pool has them at once). A process about to leave
    /// without running its runtime further (`std::process::exit`, a forked worker's
    /// `os._exit`) calls this last; [`StoreUnavailable`](PoolError::StoreUnavailable) if Redis
    /// does not answer within `RedisOptions::timeout`, and then the lease TTL frees those
    /// slots.
    ///
    /// ```
    /// use proxypool::{Pool, Ticket};
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let pool = Pool::builder().address("http://10.0.0.1:3128").build()?;
    /// drop(pool.acquire(Ticket::new()).await?);
    /// pool.settle().await?;
    /// assert_eq!(pool.snapshot().await.addresses[0].totals.abandoned, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub async fn settle(&self) -> Result<(), PoolError> {
        self.shared.store.settle().await
    }

    /// The whole state as plain data.
    pub async fn snapshot(&self) -> Snapshot {
        let now = self.shared.clock.now();
        self.shared.store.snapshot(now).await
    }
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("store", &self.shared.store)
            .field("clock", &self.shared.clock)
            .finish()
    }
}

/// Describes a pool: addresses, sub-pools, configuration, clock and random seed.
#[derive(Debug, Default)]
pub struct PoolBuilder {
    config: PoolConfig,
    addresses: Vec<(String, Vec<String>)>,
    sub_pools: Vec<(String, Strategy)>,
    clock: Option<Arc<dyn Clock>>,
    seed: Option<u64>,
    #[cfg(feature = "redis")]
    redis: Option<crate::store::redis::RedisOptions>,
}

impl PoolBuilder {
    /// An address of the whole pool.
    pub fn address(self, address: impl Into<String>) -> Self {
        self.address_in(address, &[])
    }

    /// An address of the whole pool and of the named sub-pools.
    pub fn address_in(mut self, address: impl Into<String>, sub_pools: &[&str]) -> Self {
        let names = sub_pools.iter().map(|s| (*s).to_owned()).collect();
        self.addresses.push((address.into(), names));
        self
    }

    /// Several addresses of the whole pool.
    pub fn addresses<S: Into<String>>(mut self, addresses: impl IntoIterator<Item = S>) -> Self {
        self.addresses
            .extend(addresses.into_iter().map(|a| (a.into(), Vec::new())));
        self
    }

    /// Declares a sub-pool (per site or task type) with its keyless strategy. Names are
    /// non-empty, unique and without spaces.
    pub fn sub_pool(mut self, name: impl Into<String>, strategy: Strategy) -> Self {
        self.sub_pools.push((name.into(), strategy));
        self
    }

    /// Replaces the whole configuration.
    pub fn config(mut self, config: PoolConfig) -> Self {
        self.config = config;
        self
    }

    /// The keyless strategy of the whole pool.
    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.config.strategy = strategy;
        self
    }

    /// The clock (default: the wall clock).
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Seeds the random choices (jitter, power of two choices) for reproducible runs
    /// (default: from the operating system).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Keeps the pool's state in Redis, shared by every process that uses the same server
    /// and pool name (P15). Build it with [`PoolBuilder::connect`]; every process of a pool
    /// must declare the same sub-pools and strategies, and run the same configuration (a
    /// process configured otherwise is refused with [`BuildError::StoreMismatch`]). Each
    /// process judges latency from the successes it releases: see the crate's ARCHITECTURE
    /// notes.
    #[cfg(feature = "redis")]
    pub fn redis(mut self, options: crate::store::redis::RedisOptions) -> Self {
        self.redis = Some(options);
        self
    }

    /// Builds the pool on the store the configuration names: in memory (same as
    /// [`PoolBuilder::build`]) or in Redis, where the start addresses are added unless another
    /// process added them already. Needs a tokio runtime for Redis. Fails with
    /// [`BuildError::StoreMismatch`] when the pool's configuration (recorded by its first
    /// process) differs from this one's, naming the field.
    pub async fn connect(self) -> Result<Pool, BuildError> {
        #[cfg(feature = "redis")]
        if let Some(options) = &self.redis {
            self.config.validate()?;
            check_sub_pools(&self.sub_pools)?;
            let mut start = Vec::with_capacity(self.addresses.len());
            for (address, pools) in &self.addresses {
                start.push((
                    ProxyAddress::parse(address).map_err(PoolError::from)?,
                    pools,
                ));
            }
            let clock = self.clock.unwrap_or_else(|| Arc::new(SystemClock));
            let store = crate::store::redis::RedisStore::connect(
                options,
                self.config,
                &self.sub_pools,
                self.seed,
            )
            .await
            .map_err(|e| BuildError::Pool(PoolError::StoreUnavailable(e)))?;
            store.check_config(clock.now()).await?;
            for (address, pools) in start {
                store.add_idempotent(&address, pools, clock.now()).await?;
            }
            return Ok(Pool {
                shared: Arc::new(Shared {
                    store: Store::Redis(store),
                    clock,
                }),
            });
        }
        self.build()
    }

    /// Checks everything and builds the pool (in memory).
    pub fn build(self) -> Result<Pool, BuildError> {
        self.config.validate()?;
        check_sub_pools(&self.sub_pools)?;
        let rng = match self.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        let clock = self.clock.unwrap_or_else(|| Arc::new(SystemClock));
        let mut batch = Vec::with_capacity(self.addresses.len());
        for (address, pools) in self.addresses {
            batch.push((
                ProxyAddress::parse(&address).map_err(PoolError::from)?,
                pools,
            ));
        }
        let mut state = PoolState::new(self.config, &self.sub_pools, rng);
        state.add(batch, clock.now())?;
        Ok(Pool {
            shared: Arc::new(Shared {
                store: Store::Memory(MemoryStore::new(state)),
                clock,
            }),
        })
    }
}

/// Sub-pool names are non-empty, unique and without whitespace or control characters (the
/// Redis store keeps an address's sub-pools as one space-separated field).
fn check_sub_pools(sub_pools: &[(String, Strategy)]) -> Result<(), BuildError> {
    let mut names = std::collections::HashSet::new();
    for (name, _) in sub_pools {
        if name.is_empty()
            || name.chars().any(|c| c.is_whitespace() || c.is_control())
            || !names.insert(name.as_str())
        {
            return Err(BuildError::InvalidConfig(format!(
                "sub-pool names must be non-empty, unique and without spaces: {name:?}"
            )));
        }
    }
    Ok(())
}
