//! The Redis store (P15, feature `redis`): one pool shared by many processes and machines.
//!
//! Every operation is one function of a Lua library (`redis/library.lua`) called with FCALL,
//! so each acquire and each release is one round trip and atomic against every other process.
//! The library is loaded at connect (FUNCTION LOAD) and again whenever a server answers that
//! it does not know it (a restart without persistence, a failover). Its name carries a hash of
//! its source, so processes running different versions never call each other's functions.
//! Deadlines of leases (P14), bindings (P2) and quarantines (P6) are one sorted set, swept by
//! the functions, since Redis 7.0 has no per-field TTL. All keys of a pool are
//! `proxypool:{NAME}:…`: the hash tag puts them in one Cluster slot.
//!
//! Time is the calling process's pool clock, passed in as milliseconds since the epoch: the
//! processes' clocks must agree to within a small fraction of the TTLs (NTP does). Acquires
//! and releases ask for the sweep at most every [`SWEEP_EVERY_MS`] per process (the sweep is a
//! fixed share of a call's cost); snapshots, probes and admin calls always sweep.
//!
//! Redis unreachable or too slow: acquire fails at once with
//! [`AcquireError::StoreUnavailable`](crate::AcquireError::StoreUnavailable) after at most the
//! configured timeout — there is no local fallback, because a local view would hand out leases
//! and bindings the other processes cannot see (breaking the caps and sticky sessions).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Value};
use std::future::Future;
use tokio::sync::oneshot;
use tokio::time::Instant;

mod batch;
mod encoding;
mod latency;

use batch::{Job, Queue};
use encoding::{Arg, pool_spec};
use latency::Latencies;

use super::{Grant, Release};
use crate::address::ProxyAddress;
use crate::clock::{Timestamp, millis};
use crate::config::{PoolConfig, Strategy};
use crate::decision::{Decision, Subject};
use crate::error::{AcquireError, BuildError, PoolError};
use crate::health::{HealthState, ramp};
use crate::lease::{Choice, LeaseId, Outcome};
use crate::snapshot::{
    AddressSnapshot, CellSnapshot, PoolSnapshot, SiteSnapshot, Snapshot, Totals,
};
use crate::state::LeaseRef;
use crate::strategy::consistent_hash::{fingerprint, key_hash, points};
use crate::ticket::Ticket;

/// Where the shared state lives. Passed to [`PoolBuilder::redis`](crate::PoolBuilder::redis).
#[derive(Debug, Clone)]
pub struct RedisOptions {
    nodes: Vec<String>,
    cluster: bool,
    pool_name: String,
    timeout: Duration,
}

impl RedisOptions {
    /// A standalone server (`redis://host:port/db`) holding the pool named `pool_name`; every
    /// process using the same name shares one pool.
    pub fn new(url: impl Into<String>, pool_name: impl Into<String>) -> Self {
        Self {
            nodes: vec![url.into()],
            cluster: false,
            pool_name: pool_name.into(),
            timeout: Duration::from_millis(500),
        }
    }

    /// A Redis Cluster, from some of its nodes.
    pub fn cluster(nodes: Vec<String>, pool_name: impl Into<String>) -> Self {
        Self {
            nodes,
            cluster: true,
            ..Self::new("", pool_name)
        }
    }

    /// The longest a call may wait on Redis (connecting or answering) before it fails with a
    /// typed error (default 500 ms).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

const LIBRARY: &str = include_str!("redis/library.lua");

/// How often (pool clock) one process asks an acquire or release to sweep due deadlines:
/// leases, bindings and quarantine waits end at most this late.
pub(crate) const SWEEP_EVERY_MS: u64 = 100;

/// How long the prober role stays with a process that stopped asking for targets: longer than
/// a round (probes time out after 10 s, then each is reported).
#[cfg(feature = "probe")]
const PROBER_HOLD: Duration = Duration::from_secs(60);

/// How the library's refusals of a configuration begin (see `config` in library.lua).
const CONFIG_REFUSED: &str = "proxypool config:";

/// The site column of tickets without one, as snapshots name it.
const NO_SITE: &str = "-";

/// Ring points and fingerprints are 64-bit; Redis scores are doubles, exact to 53 bits.
const TO_52_BITS: u32 = 12;

/// The library's functions, by their full names.
struct Functions {
    ops: String,
    probe: String,
    add: String,
    remove: String,
    end_session: String,
    snapshot: String,
    config: String,
    #[cfg(feature = "probe")]
    targets: String,
}

/// Why Redis failed, as the typed errors carry it.
fn unavailable(e: &redis::RedisError) -> String {
    e.to_string()
}

pub(crate) struct RedisStore {
    conn: Conn,
    /// `proxypool:{NAME}:meta`, the one key every call passes.
    meta: String,
    /// `proxypool:{NAME}:url`, read when an address id is not in `addresses` yet.
    url_key: String,
    library: String,
    functions: Functions,
    cfg: PoolConfig,
    /// The configuration as the library reads it (`encoding::config`).
    health: String,
    timeout: Duration,
    rng: Mutex<StdRng>,
    /// Pool-clock ms of this process's last sweep; `u64::MAX` for "sweep on the next call".
    last_sweep: AtomicU64,
    /// Address id → address, with a generation bumped whenever Redis lost the pool (ids then
    /// name other addresses); within an epoch ids are never reused and an id's URL never
    /// changes.
    addresses: RwLock<(u64, HashMap<u32, ProxyAddress>)>,
    sites: Mutex<Sites>,
    latencies: Mutex<Latencies>,
    /// The pool's epoch as last seen (set by the first add of a pool): when it changes, Redis
    /// lost the pool and ids name other addresses.
    epoch: Mutex<Epoch>,
    /// A re-add after a loss is running.
    rebuilding: std::sync::atomic::AtomicBool,
    /// What this process added (start list, API), with the sub-pools: added again when the
    /// pool was lost.
    added: Mutex<HashMap<String, (ProxyAddress, Vec<String>)>>,
    /// How the library names the whole pool with its keyless strategy (see `acquire` in
    /// library.lua), and each declared sub-pool.
    whole: Arc<str>,
    sub_pools: HashMap<String, Arc<str>>,
    /// This process's claim to the prober role.
    #[cfg(feature = "probe")]
    prober_token: String,
    /// The number of the newest decision this process passed to `tracing` (prober only).
    #[cfg(feature = "probe")]
    logged: AtomicU64,
    /// Acquires and releases, sent together in batches (`ops_batch`).
    ops: Queue<Op, Result<Answer, String>>,
}

/// One operation in a batch.
enum Op {
    Acquire(AcquireRequest),
    Release(ReleaseRequest),
}

/// Its answer.
enum Answer {
    Acquired(AcquireReply),
    Released,
}

/// One acquire in a batch.
struct AcquireRequest {
    now: Timestamp,
    /// The pool: the keyless strategy's letter, then the sub-pool's name.
    pool: Arc<str>,
    /// Empty for keyless work.
    key: String,
    /// The key's point on the ring.
    point: u64,
    /// `-` for tickets without a site.
    site: Arc<str>,
}

/// One release (or abandon) in a batch.
struct ReleaseRequest {
    now: Timestamp,
    lease: u64,
    id: u32,
    /// The outcome class the library judges: 's', 'f', 'b' (a block by a named site), 'c',
    /// 'r', or 'a' for an abandon.
    class: &'static str,
    jitter: f64,
    /// `-` for tickets without a site.
    site: Arc<str>,
    /// For a rate limit: until when (ms) the address cools for the site.
    cool_until: u64,
    /// For a success: this process's judgement of the address's latency when it changed
    /// (see `Latencies`).
    latency: Option<i64>,
}

/// What a process knows of the pool's epoch (see `add` in library.lua).
#[derive(Debug)]
enum Epoch {
    Unknown,
    Seen(String),
    /// Seen, then gone: the pool is being added again.
    Lost,
}

/// Site names of this process's tickets by small ids, so a lease carries its site as the
/// memory store's do (`Grant::site`); 0 is "no site".
#[derive(Default)]
struct Sites {
    ids: HashMap<Arc<str>, u32>,
    names: Vec<Arc<str>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("meta", &self.meta)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects, loads the function library and starts the batch workers on the current
    /// tokio runtime (they stop when the store is dropped).
    pub(crate) async fn connect(
        options: &RedisOptions,
        cfg: PoolConfig,
        sub_pools: &[(String, Strategy)],
        seed: Option<u64>,
    ) -> Result<Arc<Self>, String> {
        let t = Some(options.timeout);
        let conn = if options.cluster {
            let client = redis::cluster::ClusterClient::builder(options.nodes.clone())
                .connection_timeout(options.timeout)
                .response_timeout(options.timeout)
                .retries(1)
                .build()
                .map_err(|e| unavailable(&e))?;
            let conn = tokio::time::timeout(options.timeout, client.get_async_connection())
                .await
                .map_err(|_| format!("no answer within {:?}", options.timeout))?
                .map_err(|e| unavailable(&e))?;
            Conn::Cluster(conn)
        } else {
            let url = options.nodes.first().map_or("", String::as_str);
            let client = redis::Client::open(url).map_err(|e| unavailable(&e))?;
            let config = redis::aio::ConnectionManagerConfig::new()
                .set_connection_timeout(t)
                .set_response_timeout(t)
                .set_number_of_retries(1);
            Conn::Single(
                ConnectionManager::new_lazy_with_config(client, config)
                    .map_err(|e| unavailable(&e))?,
            )
        };
        let tag = &options.pool_name;
        let rng = match seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_os_rng(),
        };
        let name = format!("proxypool_{:012x}", fingerprint(LIBRARY) >> 16);
        let f = |op: &str| format!("{name}_{op}");
        let health = encoding::config(&cfg);
        let whole = pool_spec(cfg.strategy, "");
        let store = Arc::new_cyclic(|me: &Weak<Self>| Self {
            conn,
            meta: format!("proxypool:{{{tag}}}:meta"),
            url_key: format!("proxypool:{{{tag}}}:url"),
            library: LIBRARY.replace("__LIB__", &name),
            functions: Functions {
                ops: f("ops"),
                probe: f("probe"),
                add: f("add"),
                remove: f("remove"),
                end_session: f("end_session"),
                snapshot: f("snapshot"),
                config: f("config"),
                #[cfg(feature = "probe")]
                targets: f("targets"),
            },
            health,
            cfg,
            timeout: options.timeout,
            rng: Mutex::new(rng),
            last_sweep: AtomicU64::new(u64::MAX),
            addresses: RwLock::new((0, HashMap::new())),
            sites: Mutex::new(Sites::default()),
            latencies: Mutex::new(Latencies::default()),
            epoch: Mutex::new(Epoch::Unknown),
            rebuilding: std::sync::atomic::AtomicBool::new(false),
            added: Mutex::new(HashMap::new()),
            whole,
            sub_pools: sub_pools
                .iter()
                .map(|(name, strategy)| (name.clone(), pool_spec(*strategy, name)))
                .collect(),
            #[cfg(feature = "probe")]
            prober_token: format!("{:016x}", rand::random::<u64>()),
            #[cfg(feature = "probe")]
            logged: AtomicU64::new(0),
            ops: batch::spawn(me.clone(), Self::ops_batch),
        });
        store
            .by(store.deadline(), store.load())
            .await
            .map_err(|e| {
                if e.to_string().contains("unknown command") {
                    format!("the Redis store needs Redis 7.0 or later (FUNCTION LOAD): {e}")
                } else {
                    unavailable(&e)
                }
            })?;
        Ok(store)
    }

    /// Has the library check this process's configuration: its encoding (version, names,
    /// types) and its values against those the pool's first process recorded.
    pub(crate) async fn check_config(&self, now: Timestamp) -> Result<(), BuildError> {
        match self.call(&self.functions.config, now, false, &[]).await {
            Ok(_) => Ok(()),
            Err(e) if e.to_string().contains(CONFIG_REFUSED) => {
                Err(BuildError::StoreMismatch(e.to_string()))
            }
            Err(e) => Err(BuildError::Pool(PoolError::StoreUnavailable(unavailable(
                &e,
            )))),
        }
    }

    /// One command, bounded by the timeout.
    async fn query(&self, cmd: &Cmd) -> Result<Value, redis::RedisError> {
        match self.conn.clone() {
            Conn::Single(mut c) => cmd.query_async(&mut c).await,
            Conn::Cluster(mut c) => cmd.query_async(&mut c).await,
        }
    }

    /// `work` (any number of commands), done by `deadline` or failed as timed out.
    async fn by<T>(
        &self,
        deadline: Instant,
        work: impl Future<Output = Result<T, redis::RedisError>>,
    ) -> Result<T, redis::RedisError> {
        tokio::time::timeout_at(deadline, work).await.map_err(|_| {
            redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {:?}", self.timeout),
            ))
        })?
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    /// Loads the library (on every primary of a Cluster); replacing it with itself is harmless.
    async fn load(&self) -> Result<(), redis::RedisError> {
        let mut cmd = redis::cmd("FUNCTION");
        cmd.arg("LOAD").arg("REPLACE").arg(&self.library);
        self.query(&cmd).await.map(drop)
    }

    /// Whether an acquire or release should sweep: at most every [`SWEEP_EVERY_MS`] per
    /// process (one caller wins the race), and whenever the pool clock went back further.
    fn claim_sweep(&self, now: Timestamp) -> bool {
        let now = now.as_millis();
        let last = self.last_sweep.load(Ordering::Relaxed);
        // A batch stamped a little before the last claim is not a clock that went back.
        (now.saturating_add(SWEEP_EVERY_MS) < last || now >= last.saturating_add(SWEEP_EVERY_MS))
            && self
                .last_sweep
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// The last sweep stopped at its limit: the next call sweeps again.
    fn note_more(&self, more: bool) {
        if more {
            self.last_sweep.store(u64::MAX, Ordering::Relaxed);
        }
    }

    /// Calls `function` with the pool's key, the common arguments and `args`: one FCALL (plus
    /// one FUNCTION LOAD when the server has lost the library), bounded by the timeout.
    async fn call(
        &self,
        function: &str,
        now: Timestamp,
        sweep: bool,
        args: &[Arg<'_>],
    ) -> Result<Value, redis::RedisError> {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(function)
            .arg(1)
            .arg(&self.meta)
            .arg(now.as_millis())
            .arg(if sweep { "1" } else { "0" })
            .arg(self.cfg.max_leases_per_address)
            .arg(&self.health);
        for a in args {
            a.push(&mut cmd);
        }
        self.by(self.deadline(), async {
            match self.query(&cmd).await {
                Err(e) if e.to_string().contains("Function not found") => {
                    self.load().await?;
                    self.query(&cmd).await
                }
                reply => reply,
            }
        })
        .await
    }

    /// The epoch an acquire batch saw. Redis lost the pool (a restart without persistence)
    /// when a known epoch turns into none, or into another (a process rebuilt it first):
    /// cached ids are forgotten and what this process added is added again — retried while
    /// the pool stays without an epoch. (A failover to a stale replica keeps the epoch and is
    /// not detected.)
    fn note_epoch(self: &Arc<Self>, epoch: String, now: Timestamp) {
        let mut state = self.epoch.lock().unwrap_or_else(PoisonError::into_inner);
        let rebuild = match &*state {
            Epoch::Seen(e) if *e == epoch => false,
            Epoch::Seen(_) if epoch.is_empty() => {
                *state = Epoch::Lost;
                true
            }
            Epoch::Seen(_) => {
                *state = Epoch::Seen(epoch);
                true
            }
            // Nothing added yet: an empty pool is no loss.
            Epoch::Unknown if epoch.is_empty() => false,
            Epoch::Lost if epoch.is_empty() => true,
            Epoch::Unknown | Epoch::Lost => {
                *state = Epoch::Seen(epoch);
                false
            }
        };
        drop(state);
        if !rebuild || self.rebuilding.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::warn!(target: "proxypool::redis", "the pool's epoch changed: Redis lost it; adding this process's addresses again");
        {
            let mut cache = self
                .addresses
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            cache.0 += 1;
            cache.1.clear();
        }
        // The same ids will name other addresses: their latency figures go too.
        *self
            .latencies
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Latencies::default();
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let added: Vec<(ProxyAddress, Vec<String>)> = me
                .added
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .values()
                .cloned()
                .collect();
            for (address, sub_pools) in added {
                if let Err(e) = me.add_idempotent(&address, &sub_pools, now).await {
                    tracing::warn!(target: "proxypool::redis", error = %e, "re-adding an address failed");
                }
            }
            me.rebuilding.store(false, Ordering::Release);
        });
    }

    fn site_id(&self, site: &Arc<str>) -> u32 {
        let mut sites = self.sites.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(&id) = sites.ids.get(site) {
            return id;
        }
        sites.names.push(Arc::clone(site));
        let id = u32::try_from(sites.names.len()).unwrap_or(u32::MAX);
        sites.ids.insert(Arc::clone(site), id);
        id
    }

    fn site_name(&self, id: u32) -> Arc<str> {
        let sites = self.sites.lock().unwrap_or_else(PoisonError::into_inner);
        id.checked_sub(1)
            .and_then(|i| sites.names.get(i as usize))
            .cloned()
            .unwrap_or_else(|| Arc::from(NO_SITE))
    }

    fn jitter(&self) -> f64 {
        let j = self.cfg.backoff.jitter;
        let mut rng = self.rng.lock().unwrap_or_else(PoisonError::into_inner);
        1.0 + rng.random_range(-j..=j)
    }

    /// The address with this id: from memory, or read once from Redis by `deadline`.
    async fn address(&self, id: u32, deadline: Instant) -> Result<ProxyAddress, String> {
        let (known, generation) = {
            let cache = self
                .addresses
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            (cache.1.get(&id).cloned(), cache.0)
        };
        if let Some(a) = known {
            return Ok(a);
        }
        let mut cmd = redis::cmd("HGET");
        cmd.arg(&self.url_key).arg(id);
        let reply = self
            .by(deadline, self.query(&cmd))
            .await
            .map_err(|e| unavailable(&e))?;
        let address = text(&reply)
            .and_then(|u| ProxyAddress::parse(&u).ok())
            .ok_or_else(|| format!("no address with id {id} in Redis"))?;
        let mut cache = self
            .addresses
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        // Not if the cache was cleared meanwhile: the answer may predate a loss of the pool.
        if cache.0 == generation {
            cache.1.insert(id, address.clone());
        }
        Ok(address)
    }

    /// Sends `request` with the next batch of its queue and waits for its answer, at most the
    /// timeout.
    async fn batched<R, O>(
        &self,
        queue: &Queue<R, Result<O, String>>,
        request: R,
        deadline: Instant,
    ) -> Result<O, String> {
        let (reply, answer) = oneshot::channel();
        queue
            .send(Job { request, reply })
            .map_err(|_| "the store's batch worker has stopped (its runtime is gone)".to_owned())?;
        match tokio::time::timeout_at(deadline, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err("the store's batch worker has stopped (its runtime is gone)".into()),
            Err(_) => Err(format!("no answer within {:?}", self.timeout)),
        }
    }

    pub(crate) async fn acquire(
        &self,
        ticket: &Ticket,
        now: Timestamp,
    ) -> Result<Grant, AcquireError> {
        let pool = match &ticket.sub_pool {
            None => Arc::clone(&self.whole),
            Some(name) => self
                .sub_pools
                .get(&**name)
                .cloned()
                .ok_or_else(|| AcquireError::UnknownSubPool(name.to_string()))?,
        };
        let key = ticket.key.as_deref().unwrap_or("");
        let request = AcquireRequest {
            now,
            pool,
            key: key.to_owned(),
            point: if key.is_empty() {
                0
            } else {
                key_hash(key) >> TO_52_BITS
            },
            site: ticket.site.clone().unwrap_or_else(|| Arc::from(NO_SITE)),
        };
        // One deadline for the whole acquire: the batch and, the first time an id is seen,
        // reading its address.
        let deadline = self.deadline();
        let reply = match self
            .batched(&self.ops, Op::Acquire(request), deadline)
            .await
            .map_err(AcquireError::StoreUnavailable)?
        {
            Answer::Acquired(reply) => reply,
            Answer::Released => {
                return Err(AcquireError::StoreUnavailable("malformed ops reply".into()));
            }
        };
        let address = |id| async move {
            self.address(id, deadline)
                .await
                .map_err(AcquireError::StoreUnavailable)
        };
        let choice = match (reply.refusal, reply.choice) {
            (None, Some(choice)) => choice,
            (Some("broken"), _) => {
                return Err(AcquireError::SessionBroken {
                    key: key.to_owned(),
                    address: address(reply.id).await?,
                });
            }
            (Some("cooling"), _) => {
                return Err(AcquireError::BoundAddressCooling {
                    key: key.to_owned(),
                    address: address(reply.id).await?,
                    // The library puts the cooling's end where a grant's lease id goes.
                    retry_in: Timestamp::from_millis(reply.lease).since(now),
                });
            }
            (Some("busy"), _) => {
                return Err(AcquireError::BoundAddressBusy {
                    key: key.to_owned(),
                    address: address(reply.id).await?,
                });
            }
            _ => return Err(AcquireError::NoAddressAvailable),
        };
        let lease = LeaseRef::shared(LeaseId(reply.lease));
        match address(reply.id).await {
            Ok(address) => Ok(Grant {
                lease,
                slot: reply.id,
                site: ticket.site.as_ref().map_or(0, |s| self.site_id(s)),
                address,
                choice,
            }),
            Err(e) => {
                // Granted but unusable: give the slot back now rather than after the TTL.
                self.abandon(lease, reply.id, now);
                Err(e)
            }
        }
    }

    pub(crate) async fn release(&self, release: Release, now: Timestamp) -> Result<(), PoolError> {
        let site = self.site_name(release.site);
        let class = match release.outcome {
            Outcome::Success { .. } => "s",
            // A block is the site's judgement of the address, not the address's health.
            Outcome::Blocked if release.site != 0 => "b",
            Outcome::ConnectError | Outcome::Timeout | Outcome::Blocked => "f",
            Outcome::Captcha => "c",
            Outcome::RateLimited { .. } => "r",
        };
        let cool_until = match release.outcome {
            // A site's Retry-After is not trusted beyond the longest quarantine wait.
            Outcome::RateLimited { retry_after } => now
                .as_millis()
                .saturating_add(millis(retry_after.min(self.cfg.backoff.cap))),
            _ => 0,
        };
        let latency = match release.outcome {
            Outcome::Success { latency } => self
                .latencies
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .note(
                    release.slot,
                    latency.as_secs_f64() * 1000.0,
                    &self.cfg.health,
                    now,
                ),
            _ => None,
        };
        let request = ReleaseRequest {
            now,
            lease: release.lease.id.0,
            id: release.slot,
            class,
            jitter: self.jitter(),
            site,
            cool_until,
            latency,
        };
        self.batched(&self.ops, Op::Release(request), self.deadline())
            .await
            .map(drop)
            .map_err(PoolError::StoreUnavailable)
    }

    /// From `Drop`: queued with the releases, unanswered. Should it be lost (no runtime, Redis
    /// down), the lease TTL frees the slot.
    pub(crate) fn abandon(&self, lease: LeaseRef, slot: u32, now: Timestamp) {
        let (reply, _) = oneshot::channel();
        let request = ReleaseRequest {
            now,
            lease: lease.id.0,
            id: slot,
            class: "a",
            jitter: 1.0,
            site: Arc::from(NO_SITE),
            cool_until: 0,
            latency: None,
        };
        let _ = self.ops.send(Job {
            request: Op::Release(request),
            reply,
        });
    }

    /// One FCALL for a batch of releases and acquires (releases first: they may free what
    /// the acquires need), at the latest `now` among them.
    async fn ops_batch(self: Arc<Self>, jobs: Vec<Job<Op, Result<Answer, String>>>) {
        let mut releases = Vec::new();
        let mut acquires = Vec::new();
        for job in jobs {
            match job.request {
                Op::Release(r) => releases.push((r, job.reply)),
                // Callers that gave up (timed out, cancelled) must not take leases. (A release
                // goes out whatever: an abandon has no caller.)
                Op::Acquire(_) if job.reply.is_closed() => {}
                Op::Acquire(r) => acquires.push((r, job.reply)),
            }
        }
        let Some(now) = releases
            .iter()
            .map(|(r, _)| r.now)
            .chain(acquires.iter().map(|(r, _)| r.now))
            .max()
        else {
            return;
        };
        let mut args = Vec::with_capacity(4 + releases.len() * 7 + acquires.len() * 4);
        args.extend([
            Arg::Int(now.as_millis().saturating_add(millis(self.cfg.lease_ttl))),
            Arg::Int(now.as_millis().saturating_add(millis(self.cfg.sticky_ttl))),
            Arg::Float(self.cfg.load_factor),
            Arg::Int(releases.len() as u64),
        ]);
        for (r, _) in &releases {
            args.extend([
                Arg::Int(r.lease),
                Arg::Int(u64::from(r.id)),
                Arg::Str(r.class),
                Arg::Float(r.jitter),
                Arg::Str(&r.site),
                Arg::Int(r.cool_until),
                match r.latency {
                    Some(hint) => Arg::Signed(hint),
                    None => Arg::Str(""),
                },
            ]);
        }
        for (r, _) in &acquires {
            args.extend([
                Arg::Str(&r.key),
                Arg::Int(r.point),
                Arg::Str(&r.site),
                Arg::Str(&r.pool),
            ]);
        }
        let reply = self
            .call(&self.functions.ops, now, self.claim_sweep(now), &args)
            .await
            .map_err(|e| unavailable(&e))
            .and_then(|v| {
                parse_acquires(v, acquires.len()).ok_or_else(|| "malformed ops reply".into())
            });
        match reply {
            Ok((replies, more, epoch)) => {
                self.note_more(more);
                self.note_epoch(epoch, now);
                for (_, reply) in releases {
                    let _ = reply.send(Ok(Answer::Released));
                }
                for ((_, reply), r) in acquires.into_iter().zip(replies) {
                    // A caller that left meanwhile: its grant goes straight back.
                    if let Err(Ok(Answer::Acquired(r))) = reply.send(Ok(Answer::Acquired(r)))
                        && r.choice.is_some()
                    {
                        self.abandon(LeaseRef::shared(LeaseId(r.lease)), r.id, now);
                    }
                }
            }
            Err(e) => {
                if releases.iter().any(|(r, _)| r.class == "a") {
                    tracing::warn!(target: "proxypool::redis", error = %e, "abandon lost; the lease TTL frees it");
                }
                for (_, reply) in releases {
                    let _ = reply.send(Err(e.clone()));
                }
                for (_, reply) in acquires {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }

    pub(crate) async fn end_session(&self, key: &str, now: Timestamp) -> bool {
        match self
            .call(&self.functions.end_session, now, true, &[Arg::Str(key)])
            .await
        {
            Ok(reply) => matches!(reply, Value::Int(1)),
            Err(e) => {
                tracing::warn!(target: "proxypool::redis", error = %e, "end_session failed");
                false
            }
        }
    }

    /// Adds `address` to the whole pool and `sub_pools` unless it is there: every process
    /// may add the same start list.
    pub(crate) async fn add_idempotent(
        &self,
        address: &ProxyAddress,
        sub_pools: &[String],
        now: Timestamp,
    ) -> Result<bool, PoolError> {
        let mut names: Vec<&str> = Vec::with_capacity(sub_pools.len());
        for name in sub_pools {
            if !self.sub_pools.contains_key(name) {
                return Err(PoolError::UnknownSubPool(name.clone()));
            }
            if !names.contains(&name.as_str()) {
                names.push(name);
            }
        }
        let names = names.join(" ");
        let url = address.as_str();
        let token = format!("{:016x}", rand::random::<u64>());
        let mut args = vec![
            Arg::Str(url),
            Arg::Str(address.redacted()),
            Arg::Int(fingerprint(url) >> TO_52_BITS),
            Arg::Str(&token),
            Arg::Str(&names),
        ];
        args.extend(points(url, self.cfg.ring_vnodes).map(|p| Arg::Int(p >> TO_52_BITS)));
        let reply = self
            .call(&self.functions.add, now, true, &args)
            .await
            .map_err(|e| PoolError::StoreUnavailable(unavailable(&e)))?;
        self.added
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(url.to_owned(), (address.clone(), sub_pools.to_vec()));
        Ok(matches!(reply, Value::Int(1)))
    }

    pub(crate) async fn add(
        &self,
        address: ProxyAddress,
        sub_pools: &[String],
        now: Timestamp,
    ) -> Result<(), PoolError> {
        if self.add_idempotent(&address, sub_pools, now).await? {
            Ok(())
        } else {
            Err(PoolError::Duplicate(address))
        }
    }

    pub(crate) async fn remove(
        &self,
        address: &ProxyAddress,
        now: Timestamp,
    ) -> Result<(), PoolError> {
        let reply = self
            .call(
                &self.functions.remove,
                now,
                true,
                &[Arg::Str(address.as_str())],
            )
            .await
            .map_err(|e| PoolError::StoreUnavailable(unavailable(&e)))?;
        self.added
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(address.as_str());
        if matches!(reply, Value::Int(1)) {
            Ok(())
        } else {
            Err(PoolError::UnknownAddress(address.clone()))
        }
    }

    pub(crate) async fn report_probe(
        &self,
        address: &ProxyAddress,
        passed: bool,
        now: Timestamp,
    ) -> Result<(), PoolError> {
        let args = [
            Arg::Str(address.as_str()),
            Arg::Str(if passed { "1" } else { "0" }),
            Arg::Float(self.jitter()),
        ];
        let reply = self
            .call(&self.functions.probe, now, true, &args)
            .await
            .map_err(|e| PoolError::StoreUnavailable(unavailable(&e)))?;
        if matches!(reply, Value::Int(1)) {
            Ok(())
        } else {
            Err(PoolError::UnknownAddress(address.clone()))
        }
    }

    /// The addresses the prober considers, one round trip — none unless this process's prober
    /// holds the pool's prober role (taken when free, kept by asking within [`PROBER_HOLD`]):
    /// several processes with probers do not multiply the probes. The holder also passes the
    /// pool's new decisions to `tracing`, as the memory store does as it makes them: once per
    /// pool, not once per process.
    #[cfg(feature = "probe")]
    pub(crate) async fn probe_targets(
        &self,
        now: Timestamp,
    ) -> Result<Vec<super::ProbeTarget>, String> {
        let logged = self.logged.load(Ordering::Relaxed);
        let args = [
            Arg::Str(&self.prober_token),
            Arg::Int(millis(PROBER_HOLD)),
            Arg::Int(logged),
        ];
        let reply = self
            .call(&self.functions.targets, now, true, &args)
            .await
            .map_err(|e| unavailable(&e))?;
        let Value::Array(parts) = reply else {
            return Err("malformed targets reply".into());
        };
        let [Value::Array(items), decided, Value::Array(new)] = parts.as_slice() else {
            return Err("malformed targets reply".into());
        };
        // Oldest first; a count below ours means Redis lost the pool: start again from there.
        let mut entries: Vec<(u64, Decision)> =
            new.iter().filter_map(|e| log_entry(&text(e)?)).collect();
        entries.sort_by_key(|(n, _)| *n);
        for (_, d) in entries.iter().filter(|(n, _)| *n > logged) {
            crate::decision::trace(d);
        }
        if let Value::Int(decided) = decided {
            self.logged
                .store(u64::try_from(*decided).unwrap_or(0), Ordering::Relaxed);
        }
        Ok(items
            .chunks(3)
            .filter_map(|t| {
                let [state, url, open] = t else { return None };
                Some(super::ProbeTarget {
                    state: state_of(&text(state)?)?,
                    address: ProxyAddress::parse(&text(url)?).ok()?,
                    active_leases: text(open)?.parse().ok()?,
                })
            })
            .collect())
    }

    /// The raw shared state, one round trip.
    pub(crate) async fn read(&self, now: Timestamp) -> Result<SharedView, String> {
        let reply = self
            .call(&self.functions.snapshot, now, true, &[])
            .await
            .map_err(|e| unavailable(&e))?;
        SharedView::parse(reply, now, &self.cfg).ok_or_else(|| "malformed snapshot reply".into())
    }

    pub(crate) async fn snapshot(&self, now: Timestamp) -> Snapshot {
        match self.read(now).await {
            Ok(view) => view.snapshot,
            Err(e) => {
                // The snapshot API has no error: an empty one, and the reason in the log.
                tracing::warn!(target: "proxypool::redis", error = %e, "snapshot failed");
                SharedView::empty(now).snapshot
            }
        }
    }
}

/// One entry of the library's decision log: its number and the decision.
fn log_entry(e: &str) -> Option<(u64, Decision)> {
    let mut f = e.splitn(6, '\t');
    let (Some(n), Some(at), Some(subject), Some(from), Some(to), Some(reason)) =
        (f.next(), f.next(), f.next(), f.next(), f.next(), f.next())
    else {
        return None;
    };
    // Addresses are URLs; the library names sites and the pool with an '@'.
    let subject = match subject.strip_prefix("@site ") {
        Some(site) => Subject::Site {
            site: site.to_owned(),
        },
        None if subject == "@pool" => Subject::Pool,
        None => Subject::Address {
            address: subject.to_owned(),
        },
    };
    let decision = Decision {
        at_ms: at.parse().ok()?,
        subject,
        from: from.to_owned(),
        to: to.to_owned(),
        reason: reason.to_owned(),
    };
    Some((n.parse().ok()?, decision))
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

/// One acquire's answer in a batch reply.
struct AcquireReply {
    lease: u64,
    id: u32,
    choice: Option<Choice>,
    refusal: Option<&'static str>,
}

/// The `ops` function's reply: three elements per acquire (lease id, address id, tag), then
/// `more` and the epoch.
fn parse_acquires(reply: Value, n: usize) -> Option<(Vec<AcquireReply>, bool, String)> {
    let Value::Array(items) = reply else {
        return None;
    };
    let (epoch, rest) = items.split_last()?;
    let epoch = text(epoch)?;
    let (Value::Int(more), rest) = rest.split_last()? else {
        return None;
    };
    if rest.len() != 3 * n {
        return None;
    }
    let mut out = Vec::with_capacity(n);
    for r in rest.chunks(3) {
        // The address id comes as text (the library does not turn it into a number).
        let [Value::Int(lease), id, tag] = r else {
            return None;
        };
        let id: u32 = text(id)?.parse().ok()?;
        let (choice, refusal) = match text(tag).as_deref() {
            Some("bound") => (Some(Choice::Bound), None),
            Some("hashed") => (Some(Choice::Hashed), None),
            Some("weighted") => (Some(Choice::Weighted), None),
            Some("round_robin") => (Some(Choice::RoundRobin), None),
            Some("least") => (Some(Choice::LeastConnections), None),
            Some("broken") => (None, Some("broken")),
            Some("busy") => (None, Some("busy")),
            Some("cooling") => (None, Some("cooling")),
            Some("none") => (None, Some("none")),
            _ => return None,
        };
        out.push(AcquireReply {
            lease: u64::try_from(*lease).ok()?,
            id,
            choice,
            refusal,
        });
    }
    Some((out, *more == 1, epoch))
}

/// The shared state as the snapshot function returns it.
pub(crate) struct SharedView {
    pub(crate) snapshot: Snapshot,
}

fn map(v: &Value) -> HashMap<String, String> {
    let mut out = HashMap::new();
    if let Value::Array(items) = v {
        for pair in items.chunks(2) {
            if let [k, v] = pair
                && let (Some(k), Some(v)) = (text(k), text(v))
            {
                out.insert(k, v);
            }
        }
    }
    out
}

/// Lifetime outcome counts of one address × site pair (the library's `c:ID` hash).
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    s: u64,
    f: u64,
    b: u64,
    c: u64,
    r: u64,
}

impl Counts {
    fn add(&mut self, o: Self) {
        self.s += o.s;
        self.f += o.f;
        self.b += o.b;
        self.c += o.c;
        self.r += o.r;
    }

    /// Outcomes that speak of the address (rate limits do not).
    fn judged(&self) -> u64 {
        self.s + self.f + self.b + self.c
    }

    fn rate(&self, n: u64) -> Option<f64> {
        let all = self.judged();
        (all > 0).then(|| n as f64 / all as f64)
    }

    fn totals(&self) -> Totals {
        Totals {
            leases: self.judged() + self.r,
            successes: self.s,
            failures: self.f + self.b,
            captchas: self.c,
            rate_limited: self.r,
            abandoned: 0,
            expired: 0,
        }
    }
}

/// `site|class → n` fields → counts per site.
fn counts_by_site(v: &Value) -> BTreeMap<String, Counts> {
    let mut out: BTreeMap<String, Counts> = BTreeMap::new();
    for (field, n) in map(v) {
        let (Some((site, class)), Ok(n)) = (field.rsplit_once('|'), n.parse::<u64>()) else {
            continue;
        };
        let c = out.entry(site.to_owned()).or_default();
        match class {
            "s" => c.s += n,
            "f" => c.f += n,
            "b" => c.b += n,
            "c" => c.c += n,
            "r" => c.r += n,
            _ => {}
        }
    }
    out
}

fn state_of(s: &str) -> Option<HealthState> {
    HealthState::ALL.into_iter().find(|h| h.as_str() == s)
}

impl SharedView {
    fn empty(now: Timestamp) -> Self {
        Self {
            snapshot: Snapshot {
                at_ms: now.as_millis(),
                addresses: Vec::new(),
                matrix: Vec::new(),
                sites: Vec::new(),
                pool: PoolSnapshot {
                    addresses: 0,
                    by_state: Vec::new(),
                    offered: 0,
                    quarantined: 0,
                    quarantine_cap: 0,
                    quarantine_entries: 0,
                    frozen: false,
                    active_leases: 0,
                    bindings: 0,
                    acquired: 0,
                    released: 0,
                    abandoned: 0,
                    expired: 0,
                    unavailable: 0,
                    sessions_broken: 0,
                },
                decisions: Vec::new(),
            },
        }
    }

    fn parse(reply: Value, now: Timestamp, cfg: &PoolConfig) -> Option<Self> {
        let Value::Array(parts) = reply else {
            return None;
        };
        let [
            state,
            url,
            name,
            rows_in,
            cells_in,
            qexp,
            meta,
            bindings,
            log,
        ] = parts.as_slice()
        else {
            return None;
        };
        let Value::Array(cells_in) = cells_in else {
            return None;
        };
        let (url, name, qexp, meta) = (map(url), map(name), map(qexp), map(meta));
        let n = |m: &HashMap<String, String>, k: &str| {
            m.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        };
        let Value::Array(rows_in) = rows_in else {
            return None;
        };
        let Value::Array(state) = state else {
            return None;
        };
        let mut view = Self::empty(now);
        let mut by_state = [0usize; 5];
        let mut rows = Vec::new();
        // `rows_in` holds each address's hash in the order of the state index's pairs.
        let mut matrix = Vec::new();
        let mut sites: BTreeMap<String, (Counts, usize, usize)> = BTreeMap::new();
        for ((pair, a), cells) in state.chunks(2).zip(rows_in).zip(cells_in) {
            let (Some(id), Some(st)) = (text(&pair[0]), pair.get(1).and_then(text)) else {
                continue;
            };
            let Some(st) = state_of(&st) else { continue };
            let Some(full) = url.get(&id).and_then(|u| ProxyAddress::parse(u).ok()) else {
                continue;
            };
            let a = map(a);
            let redacted = name
                .get(&id)
                .cloned()
                .unwrap_or_else(|| full.redacted().to_owned());
            by_state[st as usize] += 1;
            let ramp_share = a
                .get("rs")
                .and_then(|v| v.parse::<u64>().ok())
                .and_then(|started| {
                    let (h, started) = (&cfg.health, Timestamp::from_millis(started));
                    ramp::share(&h.ramp_steps, h.ramp_duration, started, now)
                });
            let mut all = Counts::default();
            for (site, c) in counts_by_site(cells) {
                all.add(c);
                let cooling_until_ms = a
                    .get(&format!("cool|{site}"))
                    .and_then(|v| v.parse::<u64>().ok())
                    .filter(|&until| until > now.as_millis());
                let seen = sites.entry(site.clone()).or_default();
                seen.0.add(c);
                seen.1 += 1;
                seen.2 += usize::from(c.f + c.b + c.c > 0);
                matrix.push(CellSnapshot {
                    address: redacted.clone(),
                    site,
                    window_samples: c.judged() as usize,
                    success_rate: c.rate(c.s),
                    captcha_rate: c.rate(c.c),
                    avoided: false,
                    cooling_until_ms,
                    totals: c.totals(),
                });
            }
            let row = AddressSnapshot {
                address: redacted,
                fingerprint: format!("{:016x}", fingerprint(full.as_str())),
                sub_pools: a
                    .get("sp")
                    .map(|sp| sp.split_whitespace().map(str::to_owned).collect())
                    .unwrap_or_default(),
                state: st,
                state_since_ms: n(&a, "t"),
                reason: String::new(),
                // The library's keyless step is the inverse of this weight: state × ramp share
                // × quality (its level in half octaves), within the memory store's bounds.
                weight: (match st {
                    HealthState::Healthy => 1.0,
                    HealthState::Degraded => cfg.health.degraded_weight,
                    HealthState::Probing => cfg.health.probing_weight,
                    HealthState::Quarantined | HealthState::Dead => 0.0,
                } * ramp_share.unwrap_or(1.0)
                    * a.get("ql")
                        .and_then(|l| l.parse::<i32>().ok())
                        .map_or(1.0, |l| 2f64.powf(f64::from(l) / 2.0)))
                .clamp(if st.is_offered() { 0.01 } else { 0.0 }, 100.0),
                ramp_share,
                active_leases: u32::try_from(n(&a, "n")).unwrap_or(u32::MAX),
                bound_keys: n(&a, "k"),
                window_samples: all.judged() as usize,
                success_rate: all.rate(all.s),
                captcha_rate: all.rate(all.c),
                latency_p50_ms: None,
                latency_p95_ms: None,
                quarantined_until_ms: qexp
                    .get(&id)
                    .and_then(|v| v.parse::<f64>().ok())
                    .map(|v| v as u64),
                quarantine_entries: u32::try_from(n(&a, "qe")).unwrap_or(u32::MAX),
                backoff_level: u32::try_from(n(&a, "lv")).unwrap_or(u32::MAX),
                failed_cycles: u32::try_from(n(&a, "cy")).unwrap_or(u32::MAX),
                totals: all.totals(),
            };
            rows.push(row);
        }
        rows.sort_by(|a, b| a.address.cmp(&b.address));
        view.snapshot.addresses = rows;
        matrix.sort_by(|a, b| (&a.address, &a.site).cmp(&(&b.address, &b.site)));
        view.snapshot.matrix = matrix;
        view.snapshot.sites = sites
            .into_iter()
            .map(|(site, (c, addresses, bad))| SiteSnapshot {
                degraded: meta.contains_key(&format!("d|{site}")),
                site,
                window_samples: c.judged() as usize,
                failure_rate: c.rate(c.f + c.b),
                captcha_rate: c.rate(c.c),
                spread: (addresses > 0).then(|| bad as f64 / addresses as f64),
            })
            .collect();
        let total = view.snapshot.addresses.len();
        let quarantined =
            by_state[HealthState::Quarantined as usize] + by_state[HealthState::Probing as usize];
        let p = &mut view.snapshot.pool;
        p.addresses = total;
        p.by_state = HealthState::ALL
            .into_iter()
            .map(|s| (s, by_state[s as usize]))
            .collect();
        p.offered = HealthState::ALL
            .into_iter()
            .filter(|s| s.is_offered())
            .map(|s| by_state[s as usize])
            .sum();
        p.quarantined = quarantined;
        p.quarantine_cap = ((cfg.quarantine_cap * total as f64).ceil() as usize).max(1);
        p.quarantine_entries = n(&meta, "q_entries");
        p.active_leases = view
            .snapshot
            .addresses
            .iter()
            .map(|a| u64::from(a.active_leases))
            .sum();
        p.bindings = match bindings {
            Value::Int(b) => usize::try_from(*b).unwrap_or(0),
            _ => 0,
        };
        // Lease ids of an epoch start at a random `seq0`.
        p.acquired = n(&meta, "seq").saturating_sub(n(&meta, "seq0"));
        p.abandoned = n(&meta, "abandoned");
        p.expired = n(&meta, "expired");
        // Every lease is released, expired, abandoned or still open.
        p.released = p
            .acquired
            .saturating_sub(p.active_leases + p.abandoned + p.expired);
        p.unavailable = n(&meta, "none");
        p.sessions_broken = n(&meta, "broken");
        p.frozen = meta.get("frozen").is_some_and(|f| f == "1");
        if let Value::Array(entries) = log {
            // Newest first in Redis; oldest first in a snapshot.
            view.snapshot.decisions = entries
                .iter()
                .rev()
                .filter_map(|e| Some(log_entry(&text(e)?)?.1))
                .collect();
        }
        // An address's reason is that of its latest transition still in the log.
        let mut latest: HashMap<&str, &str> = HashMap::new();
        for d in &view.snapshot.decisions {
            if let Subject::Address { address } = &d.subject {
                latest.insert(address, &d.reason);
            }
        }
        let reasons: Vec<Option<String>> = view
            .snapshot
            .addresses
            .iter()
            .map(|r| latest.get(r.address.as_str()).map(|s| (*s).to_owned()))
            .collect();
        for (row, reason) in view.snapshot.addresses.iter_mut().zip(reasons) {
            row.reason = reason.unwrap_or_default();
        }
        Some(view)
    }
}
