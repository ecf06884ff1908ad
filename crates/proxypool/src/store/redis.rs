//! The Redis store (P15, feature `redis`): one pool shared by many processes and machines.
//!
//! Every operation is one Lua script run with EVALSHA (`redis::Script` reloads it on NOSCRIPT),
//! so each acquire and each release is one round trip and atomic against every other process.
//! The scripts live in `redis/*.lua`; `common.lua` (keys, TTL sweep, the health machine) is
//! prepended to each. Deadlines of leases (P14), bindings (P2) and quarantines (P6) are sorted
//! sets swept by every script, since Redis 7.0 has no per-field TTL. All keys of a pool are
//! `proxypool:{NAME}:…`: the hash tag puts them in one Cluster slot.
//!
//! Time is the calling process's pool clock, passed in as milliseconds since the epoch: the
//! processes' clocks must agree to within a small fraction of the TTLs (NTP does).
//!
//! Redis unreachable or too slow: acquire fails at once with
//! [`AcquireError::StoreUnavailable`](crate::AcquireError::StoreUnavailable) after at most the
//! configured timeout — there is no local fallback, because a local view would hand out leases
//! and bindings the other processes cannot see (breaking the caps and sticky sessions).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use redis::{Script, Value};

use super::{Grant, Release};
use crate::address::ProxyAddress;
use crate::clock::{Timestamp, millis};
use crate::config::PoolConfig;
use crate::decision::{Decision, Subject};
use crate::error::{AcquireError, PoolError};
use crate::health::HealthState;
use crate::lease::{Choice, LeaseId, Outcome};
use crate::snapshot::{AddressSnapshot, PoolSnapshot, Snapshot, Totals};
use crate::state::LeaseRef;
use crate::strategy::consistent_hash::fingerprint;
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

struct Scripts {
    acquire: Script,
    release: Script,
    abandon: Script,
    probe: Script,
    admin: Script,
    snapshot: Script,
}

const COMMON: &str = include_str!("redis/common.lua");

fn script(body: &str) -> Script {
    Script::new(&format!("{COMMON}\n{body}"))
}

/// The order of `KEYS` that `common.lua` unpacks.
const KEY_NAMES: [&str; 16] = [
    "meta", "url", "name", "byurl", "state", "since", "leases", "due", "bind", "keys", "win",
    "streak", "level", "cycles", "log", "pass",
];

/// Why Redis failed, as the typed errors carry it.
fn unavailable(e: &redis::RedisError) -> String {
    e.to_string()
}

pub(crate) struct RedisStore {
    conn: Conn,
    keys: Vec<String>,
    scripts: Scripts,
    cfg: PoolConfig,
    timeout: Duration,
    rng: Mutex<StdRng>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("keys", &self.keys.first())
            .finish_non_exhaustive()
    }
}

enum Arg<'a> {
    Int(u64),
    Str(&'a str),
    Float(f64),
}

impl RedisStore {
    /// Connects (lazily for a single server: the first call connects) and checks nothing else.
    pub(crate) async fn connect(
        options: &RedisOptions,
        cfg: PoolConfig,
        seed: Option<u64>,
    ) -> Result<Self, String> {
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
        Ok(Self {
            conn,
            keys: KEY_NAMES
                .iter()
                .map(|k| format!("proxypool:{{{tag}}}:{k}"))
                .collect(),
            scripts: Scripts {
                acquire: script(include_str!("redis/acquire.lua")),
                release: script(include_str!("redis/release.lua")),
                abandon: script(include_str!("redis/abandon.lua")),
                probe: script(include_str!("redis/probe.lua")),
                admin: script(include_str!("redis/admin.lua")),
                snapshot: script(include_str!("redis/snapshot.lua")),
            },
            cfg,
            timeout: options.timeout,
            rng: Mutex::new(rng),
        })
    }

    /// Runs `script` with the pool's keys, `now` and `args`: one EVALSHA (plus one SCRIPT LOAD
    /// the first time a server sees it), bounded by the timeout.
    async fn run(
        &self,
        script: &Script,
        now: Timestamp,
        args: &[Arg<'_>],
    ) -> Result<Value, redis::RedisError> {
        let mut inv = script.prepare_invoke();
        for k in &self.keys {
            inv.key(k);
        }
        inv.arg(now.as_millis());
        for a in args {
            match a {
                Arg::Int(n) => inv.arg(*n),
                Arg::Str(s) => inv.arg(*s),
                Arg::Float(x) => inv.arg(*x),
            };
        }
        let call = async {
            match self.conn.clone() {
                Conn::Single(mut c) => inv.invoke_async(&mut c).await,
                Conn::Cluster(mut c) => inv.invoke_async(&mut c).await,
            }
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| {
                redis::RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer within {:?}", self.timeout),
                ))
            })?
    }

    /// The health arguments at `ARGV[5..=14]` (see `common.lua`).
    fn health_args(&self) -> Vec<Arg<'static>> {
        let (h, b) = (&self.cfg.health, &self.cfg.backoff);
        let jitter = {
            let mut rng = self.rng.lock().unwrap_or_else(PoisonError::into_inner);
            1.0 + rng.random_range(-b.jitter..=b.jitter)
        };
        vec![
            Arg::Int(h.recent as u64),
            Arg::Int(h.recent_failures as u64),
            Arg::Float(self.cfg.quarantine_cap),
            Arg::Int(u64::from(self.cfg.min_in_service)),
            Arg::Int(millis(b.base)),
            Arg::Int(millis(b.cap)),
            Arg::Float(jitter),
            Arg::Int(u64::from(h.dead_after_cycles)),
            Arg::Int(u64::from(h.rise_successes)),
            Arg::Int(millis(h.min_dwell)),
        ]
    }

    pub(crate) async fn acquire(
        &self,
        ticket: &Ticket,
        now: Timestamp,
    ) -> Result<Grant, AcquireError> {
        if let Some(sp) = &ticket.sub_pool {
            // This store keeps the whole pool only.
            return Err(AcquireError::UnknownSubPool(sp.to_string()));
        }
        let key = ticket.key.as_deref().unwrap_or("");
        let args = [
            Arg::Int(millis(self.cfg.lease_ttl)),
            Arg::Int(millis(self.cfg.sticky_ttl)),
            Arg::Int(u64::from(self.cfg.max_leases_per_address)),
            Arg::Str(key),
        ];
        let reply = self
            .run(&self.scripts.acquire, now, &args)
            .await
            .map_err(|e| AcquireError::StoreUnavailable(unavailable(&e)))?;
        parse_grant(reply, key)
    }

    pub(crate) async fn release(&self, release: Release, now: Timestamp) -> Result<(), PoolError> {
        let class = match release.outcome {
            Outcome::Success { .. } => "s",
            Outcome::ConnectError | Outcome::Timeout | Outcome::Blocked => "f",
            Outcome::Captcha => "c",
            Outcome::RateLimited { .. } => "r",
        };
        let (lid, slot) = (release.lease.id.0.to_string(), release.slot.to_string());
        let mut args = vec![Arg::Str(&lid), Arg::Str(&slot), Arg::Str(class)];
        args.extend(self.health_args());
        self.run(&self.scripts.release, now, &args)
            .await
            .map(drop)
            .map_err(|e| PoolError::StoreUnavailable(unavailable(&e)))
    }

    /// From `Drop`: spawned on the current runtime if there is one; otherwise (or if Redis
    /// fails) the lease TTL frees the slot.
    pub(crate) fn abandon(self: &std::sync::Arc<Self>, lease: LeaseRef, slot: u32, now: Timestamp) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let me = std::sync::Arc::clone(self);
        rt.spawn(async move {
            let (lid, slot) = (lease.id.0.to_string(), slot.to_string());
            if let Err(e) = me
                .run(&me.scripts.abandon, now, &[Arg::Str(&lid), Arg::Str(&slot)])
                .await
            {
                tracing::warn!(target: "proxypool::redis", error = %e, "abandon lost; the lease TTL frees it");
            }
        });
    }

    async fn admin(&self, op: &str, arg: &str, name: &str, now: Timestamp) -> Result<bool, String> {
        let reply = self
            .run(
                &self.scripts.admin,
                now,
                &[Arg::Str(op), Arg::Str(arg), Arg::Str(name)],
            )
            .await
            .map_err(|e| unavailable(&e))?;
        Ok(matches!(reply, Value::Int(1)))
    }

    pub(crate) async fn end_session(&self, key: &str, now: Timestamp) -> bool {
        match self.admin("end_session", key, "", now).await {
            Ok(ended) => ended,
            Err(e) => {
                tracing::warn!(target: "proxypool::redis", error = %e, "end_session failed");
                false
            }
        }
    }

    /// Adds `address` unless it is there: every process may add the same start list.
    pub(crate) async fn add_idempotent(
        &self,
        address: &ProxyAddress,
        now: Timestamp,
    ) -> Result<bool, PoolError> {
        self.admin("add", address.as_str(), address.redacted(), now)
            .await
            .map_err(PoolError::StoreUnavailable)
    }

    pub(crate) async fn add(&self, address: ProxyAddress, now: Timestamp) -> Result<(), PoolError> {
        if self.add_idempotent(&address, now).await? {
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
        let removed = self
            .admin("remove", address.as_str(), "", now)
            .await
            .map_err(PoolError::StoreUnavailable)?;
        if removed {
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
        let mut args = vec![
            Arg::Str(address.as_str()),
            Arg::Str(if passed { "1" } else { "0" }),
            Arg::Str(""),
        ];
        args.extend(self.health_args());
        let reply = self
            .run(&self.scripts.probe, now, &args)
            .await
            .map_err(|e| PoolError::StoreUnavailable(unavailable(&e)))?;
        if matches!(reply, Value::Int(1)) {
            Ok(())
        } else {
            Err(PoolError::UnknownAddress(address.clone()))
        }
    }

    /// The raw shared state, one round trip.
    pub(crate) async fn read(&self, now: Timestamp) -> Result<SharedView, String> {
        let reply = self
            .run(&self.scripts.snapshot, now, &[])
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

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

fn parse_grant(reply: Value, key: &str) -> Result<Grant, AcquireError> {
    let malformed = || AcquireError::StoreUnavailable("malformed acquire reply".into());
    let Value::Array(items) = reply else {
        return Err(malformed());
    };
    match items.as_slice() {
        [Value::Int(lid), Value::Int(slot), url, choice] => {
            let address = text(url)
                .and_then(|u| ProxyAddress::parse(&u).ok())
                .ok_or_else(malformed)?;
            let choice = match text(choice).as_deref() {
                Some("bound") => Choice::Bound,
                Some("hashed") => Choice::Hashed,
                Some("weighted") => Choice::Weighted,
                _ => return Err(malformed()),
            };
            Ok(Grant {
                lease: LeaseRef::shared(LeaseId(u64::try_from(*lid).map_err(|_| malformed())?)),
                slot: u32::try_from(*slot).map_err(|_| malformed())?,
                site: 0,
                address,
                choice,
            })
        }
        [_, kind, url] => {
            let address = || {
                text(url)
                    .and_then(|u| ProxyAddress::parse(&u).ok())
                    .ok_or_else(malformed)
            };
            match text(kind).as_deref() {
                Some("broken") => Err(AcquireError::SessionBroken {
                    key: key.to_owned(),
                    address: address()?,
                }),
                Some("busy") => Err(AcquireError::BoundAddressBusy {
                    key: key.to_owned(),
                    address: address()?,
                }),
                _ => Err(AcquireError::NoAddressAvailable),
            }
        }
        _ => Err(malformed()),
    }
}

/// The shared state as the snapshot script returns it.
pub(crate) struct SharedView {
    pub(crate) snapshot: Snapshot,
    /// Full URLs (with credentials) in the order of `snapshot.addresses`, for the prober.
    #[cfg(feature = "probe")]
    pub(crate) urls: Vec<ProxyAddress>,
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
            #[cfg(feature = "probe")]
            urls: Vec::new(),
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
            leases,
            keys,
            since,
            qexp,
            level,
            cycles,
            meta,
            bindings,
            log,
        ] = parts.as_slice()
        else {
            return None;
        };
        let (url, name, leases, keys, since) =
            (map(url), map(name), map(leases), map(keys), map(since));
        let (qexp, level, cycles, meta) = (map(qexp), map(level), map(cycles), map(meta));
        let n = |m: &HashMap<String, String>, k: &str| {
            m.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        };
        let mut view = Self::empty(now);
        let mut by_state = [0usize; 5];
        let mut rows = Vec::new();
        for (id, s) in map(state) {
            let Some(st) = state_of(&s) else { continue };
            let Some(full) = url.get(&id).and_then(|u| ProxyAddress::parse(u).ok()) else {
                continue;
            };
            let redacted = name
                .get(&id)
                .cloned()
                .unwrap_or_else(|| full.redacted().to_owned());
            by_state[st as usize] += 1;
            let row = AddressSnapshot {
                address: redacted,
                fingerprint: format!("{:016x}", fingerprint(full.as_str())),
                sub_pools: Vec::new(),
                state: st,
                state_since_ms: n(&since, &id),
                reason: String::new(),
                weight: 0.0,
                ramp_share: None,
                active_leases: u32::try_from(n(&leases, &id)).unwrap_or(u32::MAX),
                bound_keys: n(&keys, &id),
                window_samples: 0,
                success_rate: None,
                captcha_rate: None,
                latency_p50_ms: None,
                latency_p95_ms: None,
                quarantined_until_ms: qexp
                    .get(&id)
                    .and_then(|v| v.parse::<f64>().ok())
                    .map(|v| v as u64),
                quarantine_entries: 0,
                backoff_level: u32::try_from(n(&level, &id)).unwrap_or(u32::MAX),
                failed_cycles: u32::try_from(n(&cycles, &id)).unwrap_or(u32::MAX),
                totals: Totals::default(),
            };
            rows.push((row, full));
        }
        rows.sort_by(|a, b| a.0.address.cmp(&b.0.address));
        #[cfg(feature = "probe")]
        {
            view.urls = rows.iter().map(|(_, full)| full.clone()).collect();
        }
        view.snapshot.addresses = rows.into_iter().map(|(row, _)| row).collect();
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
        p.acquired = n(&meta, "seq");
        p.released = n(&meta, "released");
        p.abandoned = n(&meta, "abandoned");
        p.expired = n(&meta, "expired");
        p.unavailable = n(&meta, "none");
        p.sessions_broken = n(&meta, "broken");
        if let Value::Array(entries) = log {
            // Newest first in Redis; oldest first in a snapshot.
            for e in entries.iter().rev().filter_map(text) {
                let mut f = e.splitn(5, '\t');
                let (Some(at), Some(address), Some(from), Some(to), Some(reason)) =
                    (f.next(), f.next(), f.next(), f.next(), f.next())
                else {
                    continue;
                };
                view.snapshot.decisions.push(Decision {
                    at_ms: at.parse().unwrap_or(0),
                    subject: Subject::Address {
                        address: address.to_owned(),
                    },
                    from: from.to_owned(),
                    to: to.to_owned(),
                    reason: reason.to_owned(),
                });
            }
        }
        Some(view)
    }
}
