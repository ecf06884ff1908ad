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
//!
//! Layout: `connection` (connecting, loading the library, one bounded FCALL), `encoding` (the
//! configuration, arguments and replies as they cross), `operations` (the pool's calls),
//! `batch` (group commit), `stale` (grants whose callers left, going back), `lost` (this
//! process's lease ids, and grants whose reply was lost found by them), `judging` (the
//! judge's facts and its decisions applied), `verdicts` (sites and our side judged), `latency`
//! (this process's latency figures), `prober` (the prober role), `view` (the snapshot reply
//! read) and `telemetry` (the pool's metrics).

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rand::rngs::StdRng;

mod batch;
mod connection;
mod encoding;
mod judging;
mod latency;
mod lost;
mod operations;
#[cfg(feature = "probe")]
mod prober;
mod stale;
mod telemetry;
mod verdicts;
mod view;

use batch::Queue;
use connection::Conn;
use encoding::AcquireReply;
use judging::Facts;
use latency::Latencies;
pub(crate) use view::SharedView;

use crate::address::ProxyAddress;
use crate::clock::Timestamp;
use crate::config::PoolConfig;

/// Where the shared state lives. Passed to [`PoolBuilder::redis`](crate::PoolBuilder::redis).
#[derive(Debug, Clone)]
pub struct RedisOptions {
    nodes: Vec<String>,
    cluster: bool,
    pool_name: String,
    timeout: Duration,
    batches_in_flight: NonZeroUsize,
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
            batches_in_flight: BATCHES_IN_FLIGHT,
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

    /// The options a URL names, as `proxypool serve --redis` and the bindings take them:
    /// `redis://HOST:PORT[/DB]` (or `rediss://`) for one server, `redis+cluster://HOST:PORT,…`
    /// for a Cluster (some of its nodes). The pool name becomes the hash tag of the pool's keys
    /// (`proxypool:{NAME}:…`), so it is non-empty, without braces or white space.
    ///
    /// ```
    /// use proxypool::RedisOptions;
    /// assert!(RedisOptions::from_url("redis+cluster://127.0.0.1:7001,127.0.0.1:7002", "scraper").is_ok());
    /// assert!(RedisOptions::from_url("redis://127.0.0.1:6379/0", "scraper").is_ok());
    /// assert!(RedisOptions::from_url("http://127.0.0.1:6379", "scraper").is_err());
    /// assert!(RedisOptions::from_url("redis://127.0.0.1:6379", "a{b}").is_err());
    /// ```
    pub fn from_url(url: &str, pool_name: &str) -> Result<Self, crate::BuildError> {
        use crate::BuildError::InvalidConfig;
        if pool_name.is_empty()
            || pool_name.contains(['{', '}'])
            || pool_name.chars().any(char::is_whitespace)
        {
            return Err(InvalidConfig(format!(
                "pool name {pool_name:?}: non-empty, without braces or white space"
            )));
        }
        let bad = || {
            InvalidConfig(format!(
                "redis URL {url:?}: expected redis://HOST:PORT[/DB], rediss://… or \
                 redis+cluster://HOST:PORT,HOST:PORT,…"
            ))
        };
        if let Some(nodes) = url.strip_prefix("redis+cluster://") {
            let nodes = nodes
                .split(',')
                .map(|node| {
                    let node = node.trim();
                    node.rsplit_once(':')
                        .filter(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
                        .map(|_| format!("redis://{node}"))
                        .ok_or_else(bad)
                })
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(Self::cluster(nodes, pool_name));
        }
        let parsed = url::Url::parse(url).map_err(|_| bad())?;
        if !matches!(parsed.scheme(), "redis" | "rediss") || parsed.host_str().is_none() {
            return Err(bad());
        }
        Ok(Self::new(url, pool_name))
    }

    /// The longest a call may wait on Redis (connecting or answering) before it fails with a
    /// typed error (default 500 ms).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How many batched calls (each carrying the process's concurrent acquires and releases)
    /// one process keeps out at once (default 2). More keep the server busy while answers
    /// travel back, fewer make larger batches. Callers that hand their operations over from
    /// another thread in bursts, as the bindings' event loops do, gain from 4.
    ///
    /// ```
    /// use std::num::NonZeroUsize;
    /// use proxypool::RedisOptions;
    /// let four = NonZeroUsize::new(4).unwrap();
    /// let _options = RedisOptions::new("redis://127.0.0.1:6379", "scraper").batches_in_flight(four);
    /// ```
    pub fn batches_in_flight(mut self, batches: NonZeroUsize) -> Self {
        self.batches_in_flight = batches;
        self
    }
}

/// Batched calls one process keeps out at once by default: with `batch.rs`'s gather yields the
/// Rust caller keeps the server 95 % busy at 2 on the 50-task benchmark; 8 made its batches
/// smaller for no more work done.
const BATCHES_IN_FLIGHT: NonZeroUsize = NonZeroUsize::MIN.saturating_add(1);

/// How often (pool clock) one process asks an acquire or release to sweep due deadlines:
/// leases, bindings and quarantine waits end at most this late.
pub(crate) const SWEEP_EVERY_MS: u64 = 100;

/// How long the prober role stays with a process that stopped asking for targets: longer than
/// a round (probes time out after 10 s, then each is reported).
#[cfg(feature = "probe")]
const PROBER_HOLD: Duration = Duration::from_secs(60);

/// How the library's refusals of a configuration begin (see `config` in library.lua).
const CONFIG_REFUSED: &str = "proxypool config:";

/// How the library's refusal to run without the pool's tables begins (Redis lost them: see
/// `health` in library.lua); the configuration check puts them back.
const TABLES_MISSING: &str = "proxypool tables missing";

/// The site column of tickets without one, as snapshots name it.
const NO_SITE: &str = "-";

/// Ring points and fingerprints are 64-bit; Redis scores are doubles, exact to 53 bits.
const TO_52_BITS: u32 = 12;

/// The library's functions, by their full names.
struct Functions {
    ops: String,
    reserve: String,
    reclaim: String,
    probe: String,
    facts: String,
    apply: String,
    pair: String,
    site: String,
    our_side: String,
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
    /// The weight arithmetic's tables as the library looks them up (`encoding::tables`).
    tables: String,
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
    telemetry: telemetry::Telemetry,
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
    /// Grants for callers that left, being given back.
    stale: Arc<stale::Stale>,
    /// The lease ids this process reserved and has not used yet.
    lease_ids: Mutex<lost::LeaseIds>,
}

/// One operation in a batch.
enum Op {
    Acquire(AcquireRequest),
    Release(ReleaseRequest),
    /// Answered once every operation this process queued before it has run: a snapshot
    /// sees the process's own releases and abandons.
    Settle,
}

/// Its answer.
enum Answer {
    Acquired(AcquireReply),
    /// With the address's facts when the outcome is news for the judge.
    Released(Option<Box<Facts>>),
    Settled,
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
    /// Least connections' seed, from the pool's generator as in memory (0 for other acquires).
    seed: u32,
}

/// One release (or abandon) in a batch.
struct ReleaseRequest {
    now: Timestamp,
    lease: u64,
    id: u32,
    /// The outcome class the library judges: 's', 'f', 'b' (a block by a named site), 'c',
    /// 'r', or 'a' for an abandon.
    class: &'static str,
    /// `-` for tickets without a site.
    site: Arc<str>,
    /// For a rate limit: until when (ms) the address cools for the site.
    cool_until: u64,
    /// For a success: this process's judgement of the address's latency level when it
    /// changed (see `Latencies`).
    level: Option<i64>,
    /// For a success: its latency (ms, at most 65 535) and whether it may have grown the tail.
    success: Option<(u16, bool)>,
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
