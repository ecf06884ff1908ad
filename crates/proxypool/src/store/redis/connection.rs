//! The connection (a connection manager, or a Cluster connection), loading the function
//! library, one bounded FCALL, the configuration check, and what follows when Redis lost the
//! pool (its epoch changed).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};

use rand::SeedableRng;
use rand::rngs::StdRng;
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Value};
use std::future::Future;
use tokio::time::Instant;

use super::encoding::{Arg, pool_spec};
use super::latency::Latencies;
use super::telemetry::Telemetry;

use super::{
    CONFIG_REFUSED, Epoch, Functions, Op, RedisOptions, RedisStore, SWEEP_EVERY_MS, Sites,
    TABLES_MISSING, batch, encoding, unavailable,
};
use crate::address::ProxyAddress;
use crate::clock::Timestamp;
use crate::config::{PoolConfig, Strategy};
use crate::error::{BuildError, PoolError};
use crate::strategy::consistent_hash::fingerprint;

#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

pub(super) const LIBRARY: &str = include_str!("library.lua");

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
        // Every call is bounded by `options.timeout` (`by`); the connection waits longer, for
        // as long as a lease lives: a reply that comes late (a paused server runs what queued
        // up when it thaws) still names the grants whose callers gave up (see `ops_batch`).
        let late = options.timeout.max(cfg.lease_ttl);
        let conn = if options.cluster {
            let client = redis::cluster::ClusterClient::builder(options.nodes.clone())
                .connection_timeout(options.timeout)
                .response_timeout(late)
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
                .set_response_timeout(Some(late))
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
        let tables = encoding::tables(&cfg);
        let whole = pool_spec(cfg.strategy, "");
        let store = Arc::new_cyclic(|me: &Weak<Self>| Self {
            conn,
            meta: format!("proxypool:{{{tag}}}:meta"),
            url_key: format!("proxypool:{{{tag}}}:url"),
            library: LIBRARY.replace("__LIB__", &name),
            functions: Functions {
                ops: f("ops"),
                reserve: f("reserve"),
                reclaim: f("reclaim"),
                probe: f("probe"),
                facts: f("facts"),
                apply: f("apply"),
                pair: f("pair"),
                site: f("site"),
                our_side: f("our_side"),
                add: f("add"),
                remove: f("remove"),
                end_session: f("end_session"),
                snapshot: f("snapshot"),
                config: f("config"),
                #[cfg(feature = "probe")]
                targets: f("targets"),
            },
            health,
            tables,
            cfg,
            timeout: options.timeout,
            rng: Mutex::new(rng),
            last_sweep: AtomicU64::new(u64::MAX),
            addresses: RwLock::new((0, HashMap::new())),
            sites: Mutex::new(Sites::default()),
            latencies: Mutex::new(Latencies::default()),
            telemetry: Telemetry::new(),
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
            ops: batch::spawn(
                me.clone(),
                options.batches_in_flight,
                |op| matches!(op, Op::Settle),
                Self::ops_batch,
            ),
            stale: Arc::default(),
            lease_ids: Mutex::default(),
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

    /// Has the library check this process's configuration and tables: their encodings
    /// (version, names, types) and values against those the pool's first process recorded
    /// (which the pool keeps for the library to load).
    pub(crate) async fn check_config(&self, now: Timestamp) -> Result<(), BuildError> {
        match self
            .by(self.deadline(), self.send(&self.config_call(now)))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => match e.to_string().split_once(CONFIG_REFUSED) {
                Some((_, why)) => Err(BuildError::StoreMismatch(encoding::refusal(why))),
                None => Err(BuildError::Pool(PoolError::StoreUnavailable(unavailable(
                    &e,
                )))),
            },
        }
    }

    fn config_call(&self, now: Timestamp) -> Cmd {
        self.fcall(
            &self.functions.config,
            now,
            false,
            &[Arg::Str(&self.tables)],
        )
    }

    /// One command, bounded by the timeout.
    pub(super) async fn query(&self, cmd: &Cmd) -> Result<Value, redis::RedisError> {
        match self.conn.clone() {
            Conn::Single(mut c) => cmd.query_async(&mut c).await,
            Conn::Cluster(mut c) => cmd.query_async(&mut c).await,
        }
    }

    /// `work` (any number of commands), done by `deadline` or failed as timed out.
    pub(super) async fn by<T>(
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

    pub(super) fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    /// Loads the library (on every primary of a Cluster); replacing it with itself is harmless.
    pub(super) async fn load(&self) -> Result<(), redis::RedisError> {
        let mut cmd = redis::cmd("FUNCTION");
        cmd.arg("LOAD").arg("REPLACE").arg(&self.library);
        self.query(&cmd).await.map(drop)
    }

    /// Whether an acquire or release should sweep: at most every [`SWEEP_EVERY_MS`] per
    /// process (one caller wins the race), and whenever the pool clock went back further.
    pub(super) fn claim_sweep(&self, now: Timestamp) -> bool {
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
    pub(super) fn note_more(&self, more: bool) {
        if more {
            self.last_sweep.store(u64::MAX, Ordering::Relaxed);
        }
    }

    /// Calls `function` with the pool's key, the common arguments and `args`: one FCALL (plus
    /// one FUNCTION LOAD when the server has lost the library), bounded by the timeout.
    pub(super) async fn call(
        &self,
        function: &str,
        now: Timestamp,
        sweep: bool,
        args: &[Arg<'_>],
    ) -> Result<Value, redis::RedisError> {
        let cmd = self.fcall(function, now, sweep, args);
        self.by(self.deadline(), self.send(&cmd)).await
    }

    /// The FCALL of `function` with the pool's key, the common arguments and `args`.
    pub(super) fn fcall(
        &self,
        function: &str,
        now: Timestamp,
        sweep: bool,
        args: &[Arg<'_>],
    ) -> Cmd {
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
        cmd
    }

    /// Sends an FCALL, first loading the library when the server has lost it (a restart,
    /// `FUNCTION FLUSH`) and putting the pool's tables back when it has lost those
    /// (`FLUSHALL` too), each at most once; unbounded but by the connection's response
    /// timeout.
    pub(super) async fn send(&self, cmd: &Cmd) -> Result<Value, redis::RedisError> {
        let (mut loaded, mut checked) = (false, false);
        loop {
            match self.query(cmd).await {
                Err(e) if !loaded && e.to_string().contains("Function not found") => {
                    loaded = true;
                    self.load().await?;
                }
                Err(e) if !checked && e.to_string().contains(TABLES_MISSING) => {
                    checked = true;
                    // The check reads no time.
                    self.query(&self.config_call(Timestamp::default())).await?;
                }
                reply => return reply,
            }
        }
    }

    /// The epoch an acquire batch saw. Redis lost the pool (a restart without persistence)
    /// when a known epoch turns into none, or into another (a process rebuilt it first):
    /// cached ids are forgotten and what this process added is added again — retried while
    /// the pool stays without an epoch. (A failover to a stale replica keeps the epoch and is
    /// not detected.)
    pub(super) fn note_epoch(self: &Arc<Self>, epoch: String, now: Timestamp) {
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
        self.telemetry.forget();
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
}
