//! The Redis store (P15) against real, throwaway redis-server instances: the same pool API,
//! shared by several pools ("processes") and by real OS processes.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use proxypool::{
    AcquireError, BuildError, Choice, Clock, HealthState, ManualClock, Outcome, Pool, PoolBuilder,
    PoolConfig, RedisOptions, Strategy, Ticket,
};
use rand::{Rng, SeedableRng};
use testkit::{Process, RedisServer};

const OK: Outcome = Outcome::Success {
    latency: Duration::from_millis(50),
};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("proxypool-redis-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn addresses(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("http://10.0.0.{i}:3128")).collect()
}

async fn shared_pool(
    redis: &RedisServer,
    name: &str,
    clock: &ManualClock,
    cfg: PoolConfig,
) -> Pool {
    Pool::builder()
        .addresses(addresses(6))
        .config(cfg)
        .clock(clock.clone())
        .seed(1)
        .redis(patient(RedisOptions::new(redis.url(), name)))
        .connect()
        .await
        .unwrap()
}

/// Far from the default timeout (500 ms), which a debug build on a machine busy with builds
/// missed now and then: these tests are about what the store does, not when it gives up (the
/// outage tests set their own).
fn patient(options: RedisOptions) -> RedisOptions {
    options.timeout(Duration::from_secs(10))
}

/// A throwaway server (its files under a directory named after `name`) and a clock at 1 000 s.
fn start(name: &str) -> (RedisServer, ManualClock) {
    let redis = RedisServer::start(&dir(name)).unwrap();
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(1_000));
    (redis, clock)
}

/// A throwaway server, a clock at 1 000 s and a pool named `name` on it (default config).
async fn lab(name: &str) -> (RedisServer, ManualClock, Pool) {
    let (redis, clock) = start(name);
    let pool = shared_pool(&redis, name, &clock, PoolConfig::default()).await;
    (redis, clock, pool)
}

/// One keyless acquire, released with a success.
async fn one_pair(pool: &Pool) {
    pool.acquire(Ticket::new())
        .await
        .unwrap()
        .release(OK)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pools_on_one_redis_share_leases_bindings_and_health() {
    let (redis, clock) = start("share");
    let mut cfg = PoolConfig::default();
    cfg.max_leases_per_address = 1;
    let a = shared_pool(&redis, "share", &clock, cfg.clone()).await;
    let b = shared_pool(&redis, "share", &clock, cfg.clone()).await;

    // Caps are global: six addresses, one lease each, whichever pool asks.
    let mut held = Vec::new();
    for i in 0..6 {
        let pool = if i % 2 == 0 { &a } else { &b };
        held.push(pool.acquire(Ticket::new()).await.unwrap());
    }
    assert_eq!(
        b.acquire(Ticket::new()).await.unwrap_err(),
        AcquireError::NoAddressAvailable
    );
    let snap = a.snapshot().await;
    assert_eq!(snap.pool.active_leases, 6);
    for lease in held {
        lease.release(OK).await.unwrap();
    }

    // A key bound through one pool is served by the same address through the other.
    let first = a.acquire(Ticket::new().key("acct-1")).await.unwrap();
    assert_eq!(first.choice(), Choice::Hashed);
    let bound = first.address().clone();
    first.release(OK).await.unwrap();
    let again = b.acquire(Ticket::new().key("acct-1")).await.unwrap();
    assert_eq!(again.choice(), Choice::Bound);
    assert_eq!(again.address(), &bound);
    again.release(OK).await.unwrap();

    // Three failures quarantine it, seen by both; its session breaks (never moves silently).
    for _ in 0..3 {
        let lease = b.acquire(Ticket::new().key("acct-1")).await.unwrap();
        lease.release(Outcome::ConnectError).await.unwrap();
    }
    let redacted = bound.redacted().to_owned();
    let row = a.snapshot().await.address(&redacted).unwrap().clone();
    assert_eq!(row.state, HealthState::Quarantined);
    let until = row.quarantined_until_ms.unwrap();
    assert!(matches!(
        a.acquire(Ticket::new().key("acct-1")).await,
        Err(AcquireError::SessionBroken { .. })
    ));

    // The wait ends → probing; five passing probes after the dwell → healthy again.
    clock.set(proxypool::Timestamp::from_millis(until));
    assert_eq!(
        b.snapshot().await.address(&redacted).unwrap().state,
        HealthState::Probing
    );
    for _ in 0..5 {
        clock.advance(Duration::from_secs(10));
        a.report_probe(bound.as_str(), true).await.unwrap();
    }
    let snap = b.snapshot().await;
    assert_eq!(snap.address(&redacted).unwrap().state, HealthState::Healthy);
    let steps: Vec<_> = snap
        .decisions
        .iter()
        .filter(|d| matches!(&d.subject, proxypool::Subject::Address { address } if *address == redacted))
        .map(|d| format!("{}->{}", d.from, d.to))
        .collect();
    assert_eq!(
        steps,
        [
            "absent->healthy",
            "healthy->quarantined",
            "quarantined->probing",
            "probing->healthy"
        ]
    );

    // A worker that dies holding a lease: the lease TTL gives the slot back.
    let lost = a.acquire(Ticket::new()).await.unwrap();
    std::mem::forget(lost);
    assert_eq!(b.snapshot().await.pool.active_leases, 1);
    clock.advance(cfg.lease_ttl + Duration::from_secs(1));
    let snap = b.snapshot().await;
    assert_eq!(snap.pool.active_leases, 0);
    assert_eq!(snap.pool.expired, 1);

    // A restarted worker (a new pool on the same name) loses nothing.
    drop(a);
    let c = shared_pool(&redis, "share", &clock, cfg).await;
    assert_eq!(c.snapshot().await.addresses, b.snapshot().await.addresses);
    let lease = c.acquire(Ticket::new().key("acct-1")).await.unwrap();
    assert_eq!(
        lease.choice(),
        Choice::Hashed,
        "the broken session was dropped"
    );
    lease.release(OK).await.unwrap();

    // Every key of the pool shares the hash tag (one Cluster slot).
    let keys = redis.cli(&["KEYS", "*"]);
    assert!(!keys.is_empty());
    assert!(
        keys.iter().all(|k| k.starts_with("proxypool:{share}:")),
        "{keys:?}"
    );
}

#[tokio::test]
async fn unreachable_redis_fails_fast_with_a_typed_error() {
    let mut redis = RedisServer::start(&dir("down")).unwrap();
    let pool = Pool::builder()
        .addresses(addresses(3))
        .redis(RedisOptions::new(redis.url(), "down").timeout(Duration::from_millis(300)))
        .connect()
        .await
        .unwrap();
    one_pair(&pool).await;
    redis.stop();
    for _ in 0..3 {
        let started = Instant::now();
        let err = pool.acquire(Ticket::new()).await.unwrap_err();
        assert!(matches!(err, AcquireError::StoreUnavailable(_)), "{err:?}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }
}

/// The addresses the multi-process test's workers find bad.
const BAD: [&str; 4] = [
    "http://10.0.0.1:3128",
    "http://10.0.0.2:3128",
    "http://10.0.0.3:3128",
    "http://10.0.0.4:3128",
];

/// Run by the multi-process test in child processes of this same test binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_process() {
    let Ok(url) = std::env::var("PROXYPOOL_WORKER_REDIS") else {
        return; // Not a child: nothing to do.
    };
    let out = std::env::var("PROXYPOOL_WORKER_OUT").unwrap();
    let mut cfg = PoolConfig::default();
    cfg.max_leases_per_address = 3;
    // Half the pool failing is what a bad site looks like (P9); here it is the addresses.
    cfg.judgement.site_min_addresses = 9;
    let pool = Pool::builder()
        .addresses(addresses(8))
        .config(cfg)
        .redis(RedisOptions::new(url, "multi").timeout(Duration::from_secs(5)))
        .connect()
        .await
        .unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let pool = pool.clone();
        tasks.spawn(async move {
            let mut log = Vec::new();
            for _ in 0..150 {
                let (keyed, key, roll, hold) = {
                    let mut rng = rand::rng();
                    let key = format!("k{}", rng.random_range(0..40));
                    (
                        rng.random_bool(0.5),
                        key,
                        rng.random::<f64>(),
                        rng.random_range(0..3),
                    )
                };
                let ticket = if keyed {
                    Ticket::new().key(key.as_str())
                } else {
                    Ticket::new()
                };
                match pool.acquire(ticket).await {
                    Ok(lease) => {
                        if keyed {
                            log.push(format!(
                                "g {key} {} {} {:?}",
                                lease.id(),
                                lease.address(),
                                lease.choice()
                            ));
                        } else {
                            log.push("a".to_owned());
                        }
                        tokio::time::sleep(Duration::from_millis(hold)).await;
                        // Half the pool is bad (70 % failures), more than the quarantine cap
                        // allows out; the rest fails now and then (3 %).
                        let bad = BAD.contains(&lease.address().as_str());
                        let fail = roll < if bad { 0.7 } else { 0.03 };
                        let outcome = if fail { Outcome::ConnectError } else { OK };
                        lease.release(outcome).await.unwrap();
                    }
                    Err(AcquireError::SessionBroken { .. }) => log.push(format!("b {key}")),
                    Err(
                        AcquireError::NoAddressAvailable | AcquireError::BoundAddressBusy { .. },
                    ) => {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            log
        });
    }
    let mut lines = Vec::new();
    while let Some(log) = tasks.join_next().await {
        lines.extend(log.unwrap());
    }
    std::fs::write(out, lines.join("\n")).unwrap();
    // On a line of its own: libtest has printed "test worker_process ... " before it.
    println!("\nworker done");
}

#[test]
fn four_processes_share_one_pool_exactly() {
    let d = dir("multi");
    let redis = RedisServer::start(&d).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut workers: Vec<Process> = (0..4)
        .map(|i| {
            let mut cmd = Command::new(&exe);
            cmd.args([
                "--exact",
                "worker_process",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("PROXYPOOL_WORKER_REDIS", redis.url())
            .env("PROXYPOOL_WORKER_OUT", d.join(format!("worker-{i}.log")));
            Process::spawn(&format!("worker-{i}"), cmd).unwrap()
        })
        .collect();
    for w in &mut workers {
        w.wait_for_line("worker done", Duration::from_secs(300))
            .unwrap();
    }
    let mut grants = 0u64;
    // key → [(lease id, address, choice)], from every process.
    let mut by_key: HashMap<String, Vec<(u64, String, String)>> = HashMap::new();
    let mut broken: HashMap<String, usize> = HashMap::new();
    for i in 0..4 {
        let text = std::fs::read_to_string(d.join(format!("worker-{i}.log"))).unwrap();
        for line in text.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            match f.as_slice() {
                ["a"] => grants += 1,
                ["g", key, id, address, choice] => {
                    grants += 1;
                    by_key.entry((*key).to_owned()).or_default().push((
                        id.parse().unwrap(),
                        (*address).to_owned(),
                        (*choice).to_owned(),
                    ));
                }
                ["b", key] => *broken.entry((*key).to_owned()).or_default() += 1,
                _ => panic!("bad line {line:?}"),
            }
        }
    }
    // Lease counts exact: every grant was released, none is left open.
    let meta: Vec<String> = redis.cli(&["HGETALL", "proxypool:{multi}:meta"]);
    let meta: HashMap<&str, u64> = meta
        .chunks(2)
        .map(|p| (p[0].as_str(), p[1].parse().unwrap_or(0)))
        .collect();
    // Ids processes reserved count as they are granted (see `reserve` in library.lua).
    let count = |field| meta.get(field).copied().unwrap_or(0);
    assert_eq!(
        count("seq") + count("granted") - count("seq0") - count("reserved"),
        grants,
        "{meta:?}"
    );
    assert_eq!(meta.get("expired"), None, "{meta:?}");
    assert_eq!(meta.get("abandoned"), None, "{meta:?}");
    let ids = redis.cli(&["HKEYS", "proxypool:{multi}:state"]);
    assert_eq!(ids.len(), 8, "{ids:?}");
    for id in ids {
        let open = redis.cli(&["HGET", &format!("proxypool:{{multi}}:a:{id}"), "n"]);
        assert_eq!(open, ["0"], "address {id}");
    }
    let due = redis.cli(&["ZRANGE", "proxypool:{multi}:due", "0", "-1"]);
    assert!(
        due.iter().all(|m| !m.starts_with('l')),
        "open leases: {due:?}"
    );
    // Caps held globally: no grant ever took an address past 3 leases (the script counts any
    // such grant in `over_cap`), and the cap was reached (acquires found addresses busy).
    assert_eq!(meta.get("over_cap"), None, "{meta:?}");
    assert!(meta.get("busy").copied().unwrap_or(0) > 0, "{meta:?}");
    // The quarantine cap held: at most ⌈30 % × 8⌉ = 3 quarantined or probing at any time.
    let q_peak: u64 = meta.get("q_peak").copied().unwrap_or(0);
    assert!(q_peak <= 3, "{meta:?}");
    assert!(
        meta.get("q_entries").copied().unwrap_or(0) >= 1,
        "no quarantine happened: {meta:?}"
    );
    // A key bound once is served by one address in every process: a `Bound` grant has an
    // address a `Hashed` grant of the key bound it to, and new bindings follow only broken
    // sessions. (Lease ids are each process's own, from blocks it reserves: they order one
    // process's grants, not the four's.)
    for (key, gs) in by_key {
        let hashed_to: std::collections::HashSet<&str> = gs
            .iter()
            .filter(|g| g.2 == "Hashed")
            .map(|g| g.1.as_str())
            .collect();
        for g in gs.iter().filter(|g| g.2 == "Bound") {
            assert!(hashed_to.contains(g.1.as_str()), "key {key} moved: {gs:?}");
        }
        let hashed = gs.iter().filter(|g| g.2 == "Hashed").count();
        assert!(
            hashed <= 1 + broken.get(&key).copied().unwrap_or(0),
            "key {key}: {gs:?}"
        );
    }
    eprintln!("multi-process: {grants} grants, {meta:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_on_redis_cluster() {
    let cluster = testkit::RedisCluster::start(&dir("cluster")).unwrap();
    // `redis+cluster://a,b,c` → the nodes as plain URLs.
    let nodes: Vec<String> = cluster
        .url()
        .trim_start_matches("redis+cluster://")
        .split(',')
        .map(|n| format!("redis://{n}"))
        .collect();
    let connect = || {
        Pool::builder()
            .addresses(addresses(4))
            .sub_pool("rr", Strategy::RoundRobin)
            .address_in("http://10.0.0.5:3128", &["rr"])
            .address_in("http://10.0.0.6:3128", &["rr"])
            .redis(
                RedisOptions::cluster(nodes.clone(), "clustered").timeout(Duration::from_secs(2)),
            )
            .connect()
    };
    let (a, b) = (connect().await.unwrap(), connect().await.unwrap());
    let first = a.acquire(Ticket::new().key("acct")).await.unwrap();
    let address = first.address().clone();
    first.release(OK).await.unwrap();
    let again = b.acquire(Ticket::new().key("acct")).await.unwrap();
    assert_eq!((again.choice(), again.address()), (Choice::Bound, &address));
    again.release(OK).await.unwrap();
    // A sub-pool's keys share the pool's slot too.
    let mut turns = Vec::new();
    for pool in [&a, &b, &a, &b] {
        let lease = pool.acquire(Ticket::new().sub_pool("rr")).await.unwrap();
        turns.push(lease.address().redacted().to_owned());
        lease.release(OK).await.unwrap();
    }
    assert_eq!(turns[0], turns[2], "{turns:?}");
    assert_ne!(turns[0], turns[1], "{turns:?}");
    let snap = b.snapshot().await;
    assert_eq!(snap.pool.addresses, 6);
    assert_eq!(snap.pool.acquired, 6);
    assert_eq!(snap.pool.active_leases, 0);
}

/// Fails every probe of one address.
#[derive(Debug)]
struct FailOne(String);

impl proxypool::probe::Check for FailOne {
    fn check<'a>(
        &'a self,
        proxy: &'a proxypool::ProxyAddress,
    ) -> proxypool::probe::CheckFuture<'a> {
        let pass = proxy.as_str() != self.0;
        Box::pin(async move {
            if pass {
                Ok(())
            } else {
                Err(proxypool::probe::CheckError::Timeout(Duration::ZERO))
            }
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prober_drives_a_shared_pool() {
    use proxypool::probe::{ProbeSchedule, Prober};
    let (redis, clock, pool) = lab("prober").await;
    let bad = addresses(6)[2].clone();
    let check = std::sync::Arc::new(FailOne(bad.clone()));
    let prober = Prober::new(pool.clone(), check.clone(), ProbeSchedule::default()).seed(5);
    prober.round().await.unwrap();
    for _ in 0..3 {
        clock.advance(Duration::from_secs(61));
        let round = prober.round().await.unwrap();
        assert_eq!(round.probed.len(), 6, "{round:?}");
        assert!(round.probed.contains(&(bad.clone(), false)));
    }
    let snap = pool.snapshot().await;
    assert_eq!(snap.address(&bad).unwrap().state, HealthState::Quarantined);
    assert_eq!(snap.pool.quarantined, 1);

    // A second process's prober on the same pool: one of them probes, not both.
    let other = shared_pool(&redis, "prober", &clock, PoolConfig::default()).await;
    let second = Prober::new(other, check, ProbeSchedule::default()).seed(6);
    for _ in 0..2 {
        // Two rounds: a new prober schedules its first probes, then would send them.
        clock.advance(Duration::from_secs(61));
        let round = second.round().await.unwrap();
        assert!(round.probed.is_empty(), "both probers probed: {round:?}");
    }
    assert!(!prober.round().await.unwrap().probed.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_lease_is_abandoned_in_redis() {
    let redis = RedisServer::start(&dir("drop")).unwrap();
    let clock = ManualClock::new();
    let pool = shared_pool(&redis, "drop", &clock, PoolConfig::default()).await;
    drop(pool.acquire(Ticket::new()).await.unwrap());
    // The abandon runs on a spawned task: wait for it (bounded).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let snap = pool.snapshot().await;
        if snap.pool.abandoned == 1 {
            assert_eq!(snap.pool.active_leases, 0);
            break;
        }
        assert!(Instant::now() < deadline, "{:?}", snap.pool);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A Redis of its own and the pools of two processes on it (a pool clock standing still).
async fn two_processes(name: &str) -> (RedisServer, Pool, Pool) {
    let redis = RedisServer::start(&dir(name)).unwrap();
    let clock = ManualClock::new();
    let pool = shared_pool(&redis, name, &clock, PoolConfig::default()).await;
    let other = shared_pool(&redis, name, &clock, PoolConfig::default()).await;
    (redis, pool, other)
}

/// `abandon` returns once Redis has it: another process sees the slot free at once, whatever
/// this process's queue still holds (its snapshot would settle only its own queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_awaited_abandon_is_in_redis_when_it_returns() {
    let (_redis, pool, other) = two_processes("abandon").await;
    for _ in 0..20 {
        pool.acquire(Ticket::new())
            .await
            .unwrap()
            .abandon()
            .await
            .unwrap();
        assert_eq!(other.snapshot().await.pool.active_leases, 0);
    }
    assert_eq!(other.snapshot().await.pool.abandoned, 20);
}

/// Dropped leases' abandons travel with the next batch; `settle` returns once Redis has all of
/// them: another process then sees every slot free (its snapshot settles only its own queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settle_returns_once_redis_has_every_dropped_lease() {
    let (_redis, pool, other) = two_processes("settle").await;
    for round in 1..=10 {
        let leases =
            futures_util::future::join_all((0..5).map(|_| pool.acquire(Ticket::new()))).await;
        drop(leases);
        pool.settle().await.unwrap();
        let seen = other.snapshot().await.pool;
        assert_eq!((seen.active_leases, seen.abandoned), (0, 5 * round));
    }
}

/// A pool dropped before its leases: their abandons still reach Redis (the store is kept until
/// they have), so another process sees the slots free well before the lease TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_dropped_after_their_pool_still_free_their_slots() {
    let (_redis, pool, other) = two_processes("orphans").await;
    let leases = futures_util::future::join_all((0..5).map(|_| pool.acquire(Ticket::new()))).await;
    drop(pool);
    drop(leases);
    // The pool clock stands still: only the abandons can free the slots.
    let freed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let seen = other.snapshot().await.pool;
            if (seen.active_leases, seen.abandoned) == (0, 5) {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(freed.is_ok(), "{:?}", other.snapshot().await.pool);
}

/// A named site's blocks reach both the address's window and the pair's (P9, as in memory):
/// an address doing well elsewhere is avoided on that site only — keyless work there passes
/// it over until the pair's evidence ages out, its bound session keeps it — and forgiven then;
/// blocks everywhere are the address's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sites_blocks_avoid_the_pair_and_reach_the_address() {
    let (_redis, clock, pool) = lab("sites").await;
    let at = |site: &str| Ticket::new().key("acct").site(site);
    let address = through_at(&pool, "acct", Some("news.example"), &[OK; 10]).await;
    for _ in 0..3 {
        let lease = pool.acquire(at("shop.example")).await.unwrap();
        assert_eq!(lease.choice(), Choice::Bound);
        lease.release(Outcome::Blocked).await.unwrap();
    }
    // Three of the pair's last five: avoided there until they age out (ten minutes).
    let snap = pool.snapshot().await;
    let row = snap.address(&address).unwrap();
    assert_eq!(row.state, HealthState::Healthy, "{}", row.reason);
    // The blocks are in the address's window; they are left out of its judgement only.
    assert_eq!(
        (row.window_samples, row.success_rate),
        (13, Some(10.0 / 13.0))
    );
    let shop = proxypool::Subject::Cell {
        address: address.clone(),
        site: "shop.example".into(),
    };
    let avoided = snap
        .decisions
        .iter()
        .find(|d| d.subject == shop && d.to == "avoided")
        .unwrap();
    assert!(
        avoided.reason.ends_with("on this site"),
        "{}",
        avoided.reason
    );
    let cell = |snap: &proxypool::Snapshot| {
        snap.matrix
            .iter()
            .find(|c| c.address == address && c.site == "shop.example")
            .map(|c| (c.avoided, c.window_samples, c.totals.failures))
    };
    assert_eq!(cell(&snap), Some((true, 3, 3)));
    // Keyless work there passes it over; elsewhere it is served, and its session keeps it (P2).
    let keyless = |site: &'static str| {
        let pool = pool.clone();
        async move {
            let mut served = Vec::new();
            for _ in 0..20 {
                let lease = pool.acquire(Ticket::new().site(site)).await.unwrap();
                served.push(lease.address().redacted().to_owned());
                lease.release(OK).await.unwrap();
            }
            served
        }
    };
    assert!(!keyless("shop.example").await.contains(&address));
    assert!(keyless("news.example").await.contains(&address));
    let lease = pool.acquire(at("shop.example")).await.unwrap();
    assert_eq!(lease.choice(), Choice::Bound);
    drop(lease);
    // After the wait the pair is forgiven: keyless work there finds the address again.
    clock.advance(Duration::from_secs(600));
    let snap = pool.snapshot().await;
    assert_eq!(cell(&snap), Some((false, 0, 3)));
    assert!(keyless("shop.example").await.contains(&address));
    let forgiven = snap.decisions.iter().rfind(|d| d.subject == shop).unwrap();
    assert_eq!(
        (forgiven.to.as_str(), forgiven.reason.as_str()),
        ("ok", "its outcomes there aged out")
    );
    // Blocks on every site: the address's own problem.
    through_at(&pool, "acct", Some("news.example"), &[Outcome::Blocked; 3]).await;
    let row = pool.snapshot().await.address(&address).cloned().unwrap();
    assert_eq!(row.state, HealthState::Quarantined, "{}", row.reason);
    assert_eq!(row.totals.failures, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_batches_keep_a_probing_address_at_its_small_share() {
    let (redis, clock) = start("share-weights");
    let pool = Pool::builder()
        .addresses(addresses(3))
        .clock(clock.clone())
        .redis(patient(RedisOptions::new(redis.url(), "weights")))
        .connect()
        .await
        .unwrap();
    let first = pool.acquire(Ticket::new().key("x")).await.unwrap();
    let probing = first.address().redacted().to_owned();
    first.release(Outcome::ConnectError).await.unwrap();
    for _ in 0..2 {
        let lease = pool.acquire(Ticket::new().key("x")).await.unwrap();
        lease.release(Outcome::ConnectError).await.unwrap();
    }
    let until = pool
        .snapshot()
        .await
        .address(&probing)
        .unwrap()
        .quarantined_until_ms;
    clock.set(proxypool::Timestamp::from_millis(until.unwrap()));
    assert_eq!(
        pool.snapshot().await.address(&probing).unwrap().state,
        HealthState::Probing
    );
    // 64 tasks at once: acquires travel in shared batches.
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let pool = pool.clone();
        tasks.spawn(async move {
            let mut picks = Vec::new();
            for _ in 0..20 {
                let lease = pool.acquire(Ticket::new()).await.unwrap();
                picks.push(lease.address().redacted().to_owned());
                lease.release(OK).await.unwrap();
            }
            picks
        });
    }
    let (mut total, mut on_probing) = (0, 0);
    while let Some(picks) = tasks.join_next().await {
        for p in picks.unwrap() {
            total += 1;
            on_probing += usize::from(p == probing);
        }
    }
    // Weights 1, 1 and 0.1: about 5 %; a batch giving every candidate one pick would be 33 %.
    let share = on_probing as f64 / total as f64;
    assert!(share > 0.0 && share < 0.12, "probing share {share:.3}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_cools_the_address_for_that_site_only() {
    let (redis, clock, pool) = lab("cooling").await;
    let shop = || Ticket::new().key("acct").site("shop.example");
    let lease = pool.acquire(shop()).await.unwrap();
    let cooled = lease.address().clone();
    let retry_after = Duration::from_secs(30);
    lease
        .release(Outcome::RateLimited { retry_after })
        .await
        .unwrap();

    // The session is kept but told to wait; other sites still get the address.
    match pool.acquire(shop()).await {
        Err(AcquireError::BoundAddressCooling {
            address, retry_in, ..
        }) => assert_eq!((address, retry_in), (cooled.clone(), retry_after)),
        other => panic!("{other:?}"),
    }
    let elsewhere = pool
        .acquire(Ticket::new().key("acct").site("news.example"))
        .await
        .unwrap();
    assert_eq!(elsewhere.address(), &cooled);
    elsewhere.release(OK).await.unwrap();
    // Keyless work and new sessions for the site go elsewhere.
    for i in 0..12 {
        let lease = pool
            .acquire(Ticket::new().site("shop.example"))
            .await
            .unwrap();
        assert_ne!(lease.address(), &cooled);
        lease.release(OK).await.unwrap();
        let lease = pool
            .acquire(Ticket::new().key(format!("k{i}")).site("shop.example"))
            .await
            .unwrap();
        assert_ne!(lease.address(), &cooled);
        lease.release(OK).await.unwrap();
    }
    let snap = pool.snapshot().await;
    let cell = snap
        .matrix
        .iter()
        .find(|c| c.address == cooled.redacted() && c.site == "shop.example")
        .unwrap();
    assert_eq!(cell.cooling_until_ms, Some(1_000_000 + 30_000));
    assert_eq!(
        snap.address(cooled.redacted()).unwrap().state,
        HealthState::Healthy
    );

    // Once the wait is over the session goes on where it was; a few seconds later (other
    // processes' clocks may lag) the cooling's fields go.
    clock.advance(retry_after);
    let lease = pool.acquire(shop()).await.unwrap();
    assert_eq!((lease.choice(), lease.address()), (Choice::Bound, &cooled));
    clock.advance(Duration::from_secs(5));
    pool.acquire(Ticket::new().site("shop.example"))
        .await
        .unwrap()
        .release(OK)
        .await
        .unwrap();
    let left: Vec<String> = redis
        .cli(&["KEYS", "proxypool:{cooling}:*"])
        .into_iter()
        .filter(|k| k.contains(":a:") || k.contains("cooled"))
        .flat_map(|k| redis.cli(&["HKEYS", &k]))
        .filter(|f| f.starts_with("cool|"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let sets = redis.cli(&["KEYS", "proxypool:{cooling}:cooled:*"]);
    assert!(sets.iter().all(|k| k.is_empty()), "{sets:?}");

    // A site asking for forever gets the longest quarantine wait, and breaks nothing.
    lease
        .release(Outcome::RateLimited {
            retry_after: Duration::MAX,
        })
        .await
        .unwrap();
    match pool.acquire(shop()).await {
        Err(AcquireError::BoundAddressCooling { retry_in, .. }) => {
            assert_eq!(retry_in, PoolConfig::default().backoff.cap);
        }
        other => panic!("{other:?}"),
    }
    one_pair(&pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_redis_lost_is_rebuilt_and_old_ids_name_nothing() {
    let (redis, _clock, pool) = lab("lost").await;
    let held = pool.acquire(Ticket::new()).await.unwrap();
    one_pair(&pool).await;
    // Redis loses everything, as after a restart without persistence: keys and functions.
    redis.cli(&["FLUSHALL"]);
    redis.cli(&["FUNCTION", "FLUSH"]);
    // The first acquire finds an empty pool of a new epoch; this process adds its addresses
    // again, after which acquires work on the new ids.
    let deadline = Instant::now() + Duration::from_secs(10);
    let lease = loop {
        match pool.acquire(Ticket::new()).await {
            Ok(lease) => break lease,
            Err(AcquireError::NoAddressAvailable) => {
                assert!(Instant::now() < deadline, "the pool was never rebuilt");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert!(addresses(6).contains(&lease.address().to_string()));
    // The configuration check put the weight tables back (the library needs them).
    let tables = redis
        .cli(&["HGET", "proxypool:{lost}:meta", "tables"])
        .join(" ");
    assert!(tables.starts_with("tables=1 "), "{tables}");
    // The lease from before the loss ends without touching whichever address has its id now.
    held.release(Outcome::ConnectError).await.unwrap();
    held_is_harmless(&pool).await;
    lease.release(OK).await.unwrap();
}

async fn held_is_harmless(pool: &Pool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let snap = pool.snapshot().await;
        if snap.pool.addresses == 6 {
            assert_eq!(snap.pool.active_leases, 1, "{:?}", snap.pool);
            assert!(
                snap.addresses
                    .iter()
                    .all(|a| a.state == HealthState::Healthy && a.totals.failures == 0),
                "{:?}",
                snap.addresses
            );
            return;
        }
        assert!(Instant::now() < deadline, "{:?}", snap.pool);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What the judgement of an address shows in a snapshot.
#[derive(Debug, PartialEq)]
struct Judged {
    state: HealthState,
    backoff_level: u32,
    failed_cycles: u32,
    quarantine_entries: u32,
    ramp_share: Option<f64>,
    quarantined_for_ms: Option<u64>,
    steps: Vec<String>,
}

async fn judged(pool: &Pool, clock: &ManualClock, address: &str) -> Judged {
    let snap = pool.snapshot().await;
    let row = snap.address(address).unwrap();
    Judged {
        state: row.state,
        backoff_level: row.backoff_level,
        failed_cycles: row.failed_cycles,
        quarantine_entries: row.quarantine_entries,
        ramp_share: row.ramp_share,
        quarantined_for_ms: row
            .quarantined_until_ms
            .map(|u| u - clock.now().as_millis()),
        steps: snap
            .decisions
            .iter()
            .filter(|d| matches!(&d.subject, proxypool::Subject::Address { address: a } if a == address))
            .map(|d| format!("{}->{}", d.from, d.to))
            .collect(),
    }
}

/// The newest decision's reason for `address`.
async fn reason(pool: &Pool, address: &str) -> String {
    let snap = pool.snapshot().await;
    let d = snap.decisions.iter().rfind(
        |d| matches!(&d.subject, proxypool::Subject::Address { address: a } if a == address),
    );
    d.unwrap().reason.clone()
}

/// `outcomes` on the address `key` is bound to; that address.
async fn through(pool: &Pool, key: &str, outcomes: &[Outcome]) -> String {
    through_at(pool, key, None, outcomes).await
}

/// `outcomes` on the address `key` is bound to, for tickets of `site`; that address.
async fn through_at(pool: &Pool, key: &str, site: Option<&str>, outcomes: &[Outcome]) -> String {
    let mut address = String::new();
    for o in outcomes {
        let ticket = match site {
            Some(site) => Ticket::new().key(key).site(site),
            None => Ticket::new().key(key),
        };
        let lease = pool.acquire(ticket).await.unwrap();
        address = lease.address().redacted().to_owned();
        lease.release(*o).await.unwrap();
    }
    address
}

/// One script of outcomes, probes and clock steps through the memory store and the Redis
/// store side by side: after every step both judge each address alike — suspect and confirm
/// (P4), the success-rate and captcha-rate signals, the ramp back and a failure during it
/// (P10), failed cycles (P11) and the backoff reset after a stable stretch (P6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_store_judges_like_the_memory_store() {
    const F: Outcome = Outcome::ConnectError;
    const C: Outcome = Outcome::Captcha;
    let (redis, clock, memory, redis_pool) = side_by_side_lab("parity").await;
    let pools = [&memory, &redis_pool];
    let both = |what: &'static str, address: String| {
        let (memory, redis_pool, clock) = (memory.clone(), redis_pool.clone(), clock.clone());
        async move {
            let a = judged(&memory, &clock, &address).await;
            let b = judged(&redis_pool, &clock, &address).await;
            assert_eq!(a, b, "{what}: memory (left) and Redis (right) differ");
            a
        }
    };

    // Slow start: a new address ramps too.
    assert_eq!(
        both("new", "http://10.0.0.1:3128".into()).await.ramp_share,
        Some(0.10)
    );
    clock.advance(Duration::from_secs(61));

    // A long good record, then 3 failures in 5: suspect (degraded); as many more confirm it.
    let mut x = String::new();
    for pool in pools {
        x = through(pool, "acct-x", &[OK; 20]).await;
        through(pool, "acct-x", &[F, F, F]).await;
    }
    let j = both("suspect", x.clone()).await;
    assert_eq!(j.state, HealthState::Degraded);
    for pool in pools {
        assert!(reason(pool, &x).await.contains("suspect"));
        assert_eq!(through(pool, "acct-x", &[F, F, F]).await, x);
    }
    let j = both("confirmed", x.clone()).await;
    assert_eq!(j.state, HealthState::Quarantined);
    assert_eq!((j.backoff_level, j.quarantine_entries), (1, 1));
    assert_eq!(j.quarantined_for_ms, Some(60_000));
    for pool in pools {
        assert!(
            reason(pool, &x)
                .await
                .contains("confirmed by 3 more failures")
        );
    }

    // Half-open, five passing probes after the dwell: back on the ramp at 10 %.
    clock.advance(Duration::from_secs(60));
    assert_eq!(
        both("wait over", x.clone()).await.state,
        HealthState::Probing
    );
    for _ in 0..5 {
        clock.advance(Duration::from_secs(10));
        for pool in pools {
            pool.report_probe(&x, true).await.unwrap();
        }
    }
    let j = both("risen", x.clone()).await;
    assert_eq!((j.state, j.ramp_share), (HealthState::Healthy, Some(0.10)));
    clock.advance(Duration::from_secs(20));
    assert_eq!(both("ramp step", x.clone()).await.ramp_share, Some(0.25));

    // One failure during the ramp back: quarantined again at once, a failed cycle, a longer wait.
    for pool in pools {
        assert_eq!(through(pool, "acct-x", &[F]).await, x);
        assert!(reason(pool, &x).await.contains("failure during the ramp"));
    }
    let j = both("failed during the ramp", x.clone()).await;
    assert_eq!(j.state, HealthState::Quarantined);
    assert_eq!((j.failed_cycles, j.backoff_level), (1, 2));
    assert_eq!(j.quarantined_for_ms, Some(120_000));

    // Back again; a completed ramp ends the failed cycle count.
    clock.advance(Duration::from_secs(120));
    for _ in 0..5 {
        clock.advance(Duration::from_secs(10));
        for pool in pools {
            pool.report_probe(&x, true).await.unwrap();
        }
    }
    clock.advance(Duration::from_secs(61));
    let j = both("ramp over", x.clone()).await;
    assert_eq!((j.ramp_share, j.failed_cycles), (None, 0));

    // Ten stable minutes reset the backoff: the next fall waits the base again.
    clock.advance(Duration::from_secs(600));
    for pool in pools {
        assert_eq!(through(pool, "acct-x", &[F, F, F]).await, x);
    }
    let j = both("reset", x.clone()).await;
    assert_eq!((j.state, j.backoff_level), (HealthState::Quarantined, 1));
    assert_eq!(j.quarantined_for_ms, Some(60_000));

    // The success rate over the window, with no 3 failures in any 5.
    let pattern = [OK, F, OK, OK, F, OK, OK, F, OK, OK, F];
    let mut y = String::new();
    for pool in pools {
        y = through(pool, "acct-y", &pattern).await;
        assert!(
            reason(pool, &y)
                .await
                .starts_with("success rate 64% over 11 outcomes")
        );
    }
    assert_ne!(x, y);
    assert_eq!(
        both("low success", y.clone()).await.state,
        HealthState::Quarantined
    );

    // Captchas (without a site) past their own threshold, in a fresh pair of pools: here bad
    // outcomes on three addresses would have the memory store judge the site instead (P9),
    // which the Redis store does not do.
    let (memory, redis_pool) = side_by_side(&redis, &clock, "parity-captchas").await;

    // A failure, then a window gone stale: the successes after it count, the failure not —
    // 3 failures in 5 against that record only make the address suspect.
    let mut w = String::new();
    for pool in [&memory, &redis_pool] {
        w = through(pool, "acct-w", &[F]).await;
    }
    clock.advance(Duration::from_secs(11 * 60));
    for pool in [&memory, &redis_pool] {
        through(pool, "acct-w", &[OK; 30]).await;
        through(pool, "acct-w", &[F, OK, F, F]).await;
        assert!(reason(pool, &w).await.contains("suspect"));
    }
    let a = judged(&memory, &clock, &w).await;
    assert_eq!(a, judged(&redis_pool, &clock, &w).await);
    assert_eq!(a.state, HealthState::Degraded);

    let mut z = String::new();
    for pool in [&memory, &redis_pool] {
        z = through(pool, "acct-z", &[OK, OK, C, OK, OK, C, OK, OK, OK, C]).await;
        let why = reason(pool, &z).await;
        assert!(
            why.starts_with("captcha rate 30% over 10 outcomes"),
            "{why}"
        );
    }
    let a = judged(&memory, &clock, &z).await;
    assert_eq!(a, judged(&redis_pool, &clock, &z).await);
    assert_eq!(a.state, HealthState::Quarantined);
}

/// A throwaway server, a clock at 1 000 s, and a memory pool and a Redis pool named `name`
/// side by side.
async fn side_by_side_lab(name: &str) -> (RedisServer, ManualClock, Pool, Pool) {
    let (redis, clock) = start(&format!("parity-{name}"));
    let (memory, shared) = side_by_side(&redis, &clock, name).await;
    (redis, clock, memory, shared)
}

/// A memory pool and a Redis pool named `name` with one configuration (no backoff jitter).
async fn side_by_side(redis: &RedisServer, clock: &ManualClock, name: &str) -> (Pool, Pool) {
    let mut cfg = PoolConfig::default();
    cfg.backoff.jitter = 0.0;
    let builder = || {
        Pool::builder()
            .addresses(addresses(10))
            .config(cfg.clone())
            .clock(clock.clone())
            .seed(1)
    };
    both(redis, name, builder).await
}

/// Whether `site` is judged degraded, whether quarantining is frozen, and the state of every
/// address.
async fn site_view(pool: &Pool, site: &str) -> (bool, bool, Vec<(String, HealthState)>) {
    let snap = pool.snapshot().await;
    let degraded = snap.sites.iter().any(|s| s.site == site && s.degraded);
    let mut states: Vec<_> = snap
        .addresses
        .iter()
        .map(|a| (a.address.clone(), a.state))
        .collect();
    states.sort_by(|a, b| a.0.cmp(&b.0));
    (degraded, snap.pool.frozen, states)
}

/// P9 side by side: one bad address at a good site is quarantined; failures at one site from
/// every address make the site degraded (judged from the outcome that convicts it, and
/// excused from then on) rather than the addresses; every site with traffic degraded freezes
/// quarantining; successes bring a site back after the dwell. Both stores agree after every
/// outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sites_are_judged_like_in_the_memory_store() {
    const F: Outcome = Outcome::ConnectError;
    let (_redis, clock, memory, redis_pool) = side_by_side_lab("sites").await;
    let pools = [&memory, &redis_pool];
    // Keys bound to ten different addresses (the same in both: one ring).
    let (mut keys, mut seen) = (Vec::new(), Vec::new());
    for k in 0.. {
        let key = format!("k{k}");
        let address = through(&memory, &key, &[OK]).await;
        assert_eq!(through(&redis_pool, &key, &[OK]).await, address);
        if !seen.contains(&address) {
            seen.push(address);
            keys.push(key);
        }
        if keys.len() == 10 {
            break;
        }
    }
    let step = |key: String, site: &'static str, outcome: Outcome| {
        let (memory, redis_pool) = (memory.clone(), redis_pool.clone());
        async move {
            let a = through_at(&memory, &key, Some(site), &[outcome]).await;
            let b = through_at(&redis_pool, &key, Some(site), &[outcome]).await;
            assert_eq!(a, b, "{key} is bound alike");
            let (m, r) = (
                site_view(&memory, site).await,
                site_view(&redis_pool, site).await,
            );
            assert_eq!(
                m, r,
                "{key} at {site}: memory (left) and Redis (right) differ"
            );
            m
        }
    };

    // One bad address at a good site: the address falls, the site stays ok.
    let bad = seen[0].clone();
    for _ in 0..3 {
        step(keys[0].clone(), "shop", F).await;
        for key in &keys[1..] {
            step(key.clone(), "shop", OK).await;
        }
    }
    let (degraded, frozen, states) = site_view(&redis_pool, "shop").await;
    assert!(!degraded && !frozen);
    let quarantined: Vec<_> = states
        .iter()
        .filter(|(_, s)| *s == HealthState::Quarantined)
        .map(|(a, _)| a.clone())
        .collect();
    assert_eq!(quarantined, std::slice::from_ref(&bad));

    // Every address failing at one site: the site is judged, not the addresses.
    clock.advance(Duration::from_secs(11 * 60));
    let mut convicted = None;
    for round in 0..3 {
        for (i, key) in keys[1..].iter().enumerate() {
            let (degraded, frozen, _) = step(key.clone(), "down", F).await;
            assert!(!frozen);
            if degraded && convicted.is_none() {
                convicted = Some(round * 9 + i + 1);
            }
        }
    }
    assert_eq!(convicted, Some(10), "degraded at the 10th outcome");
    let (_, _, states) = site_view(&redis_pool, "down").await;
    assert_eq!(
        states
            .iter()
            .filter(|(_, s)| *s == HealthState::Healthy)
            .count(),
        9,
        "{states:?}"
    );

    // A second site going the same way: every site with traffic is degraded, our side.
    for _ in 0..2 {
        for key in &keys[1..] {
            step(key.clone(), "also-down", F).await;
        }
    }
    for pool in pools {
        let (degraded, frozen, _) = site_view(pool, "also-down").await;
        assert!(degraded && frozen);
        let snap = pool.snapshot().await;
        let pool_steps: Vec<_> = snap
            .decisions
            .iter()
            .filter(|d| d.subject == proxypool::Subject::Pool)
            .map(|d| format!("{}->{}", d.from, d.to))
            .collect();
        assert_eq!(pool_steps, ["quarantining->frozen"]);
    }

    // Successes at the first site after the dwell: it recovers, and the freeze ends.
    clock.advance(Duration::from_secs(31));
    let mut recovered = None;
    for round in 0..10 {
        for (i, key) in keys[1..].iter().enumerate() {
            let (degraded, frozen, _) = step(key.clone(), "down", OK).await;
            if !degraded && recovered.is_none() {
                recovered = Some(round * 9 + i + 1);
                assert!(!frozen);
            }
        }
    }
    assert!(recovered.is_some());
    for pool in pools {
        let snap = pool.snapshot().await;
        let site_steps: Vec<_> = snap
            .decisions
            .iter()
            .filter(|d| matches!(&d.subject, proxypool::Subject::Site { site } if site == "down"))
            .map(|d| format!("{}->{}", d.from, d.to))
            .collect();
        assert_eq!(site_steps, ["ok->degraded", "degraded->ok"]);
    }

    // Failures at a site long ago are forgotten: a failure now does not convict it with them.
    for key in &keys[1..] {
        step(key.clone(), "stale", F).await;
    }
    clock.advance(Duration::from_secs(11 * 60));
    step(keys[1].clone(), "stale", OK).await;
    let (degraded, _, _) = step(keys[2].clone(), "stale", F).await;
    assert!(!degraded);
}

/// A pool laid out by another version of the library is refused with a clear error, before
/// anything is written: processes of one pool must run one version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_another_layout_is_refused() {
    let (redis, _clock, pool) = lab("layout").await;
    one_pair(&pool).await;
    redis.cli(&["HSET", "proxypool:{layout}:meta", "layout", "1"]);
    let seq = redis.cli(&["HGET", "proxypool:{layout}:meta", "seq"]);
    match pool.acquire(Ticket::new()).await {
        Err(AcquireError::StoreUnavailable(e)) => {
            assert!(e.contains("another version of proxypool"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(redis.cli(&["HGET", "proxypool:{layout}:meta", "seq"]), seq);
}

/// Every process of a pool judges by one configuration: a process configured otherwise is
/// refused at connect, naming the field; the library reads only its own encoding version,
/// with every field named and typed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_configured_otherwise_or_encoded_otherwise_is_refused() {
    let (redis, clock, _pool) = lab("config").await;
    let mut cfg = PoolConfig::default();
    cfg.health.min_success_rate = 0.5;
    let refused = Pool::builder()
        .config(cfg)
        .clock(clock.clone())
        .redis(RedisOptions::new(redis.url(), "config"))
        .connect()
        .await
        .unwrap_err();
    match &refused {
        BuildError::StoreMismatch(why) => {
            assert!(
                why.contains("health.min_success_rate = 0.7 and this process with 0.5"),
                "{why}"
            );
        }
        other => panic!("{other:?}"),
    }
    // The same configuration under another name is another pool.
    shared_pool(&redis, "config-2", &clock, PoolConfig::default()).await;

    let library = redis
        .cli(&["FUNCTION", "LIST"])
        .into_iter()
        .find(|l| l.starts_with("proxypool_"))
        .unwrap();
    let check = format!("{library}_config");
    let fcall_with = |config: &str, tables: &str| {
        redis
            .cli(&[
                "FCALL",
                &check,
                "1",
                "proxypool:{config}:meta",
                "0",
                "0",
                "1",
                config,
                tables,
            ])
            .join(" ")
    };
    let field = |name| {
        redis
            .cli(&["HGET", "proxypool:{config}:meta", name])
            .join(" ")
    };
    let (recorded, tables) = (field("config"), field("tables"));
    assert_eq!(fcall_with(&recorded, &tables), "1");
    // The configuration, then the weight tables: of another version, shape, type or values,
    // refused.
    let config = |c: String, why| (c, tables.clone(), why);
    let table = |t: String, why| (recorded.clone(), t, why);
    for (c, t, why) in [
        config(
            recorded.replacen("config=1", "config=2", 1),
            "encoding config=2",
        ),
        config(
            recorded.replacen(" recent=i5", "", 1),
            "missing field recent",
        ),
        config(
            recorded.replacen("recent=i5", "recent=f5", 1),
            "unknown field or type recent=f5",
        ),
        config(
            recorded.replacen("recent=i5", "recent=i2.5", 1),
            "recent = 2.5 is not a whole number",
        ),
        config(
            format!("{recorded} extra=i1"),
            "unknown field or type extra=i1",
        ),
        table(
            tables.replacen("tables=1", "tables=2", 1),
            "encoding tables=2",
        ),
        table(
            tables.replacen(" ramp=w20000,", " ramp=w", 1),
            "tables of another configuration",
        ),
        table(
            tables.replacen("healthy=w9051,", "healthy=w9050,", 1),
            "other weight tables",
        ),
        table(
            tables.replacen("rates=g-1,1;", "rates=gx;", 1),
            "rates holds x",
        ),
    ] {
        let answer = fcall_with(&c, &t);
        assert!(answer.contains(why), "{c} {t}: {answer}");
    }
}

/// A memory pool and a Redis pool named `name` with sub-pools: `shop` (weighted) holds
/// addresses 1–2, `rr` (round-robin) and `lc` (least connections) hold 3–5; 6 is in the
/// whole pool only (no backoff jitter).
async fn with_sub_pools(redis: &RedisServer, clock: &ManualClock, name: &str) -> (Pool, Pool) {
    let mut cfg = PoolConfig::default();
    cfg.backoff.jitter = 0.0;
    let builder = || {
        let mut b = Pool::builder()
            .config(cfg.clone())
            .clock(clock.clone())
            .seed(1)
            .sub_pool("shop", Strategy::Weighted)
            .sub_pool("rr", Strategy::RoundRobin)
            .sub_pool("lc", Strategy::LeastConnections);
        for (i, a) in addresses(6).into_iter().enumerate() {
            b = match i {
                0 | 1 => b.address_in(a, &["shop"]),
                2..=4 => b.address_in(a, &["rr", "lc"]),
                _ => b.address_in(a, &[]),
            };
        }
        b
    };
    both(redis, name, builder).await
}

/// Sub-pools and keyless strategies, side by side: each sub-pool serves its members only,
/// with its own strategy (round-robin in turn, least connections balancing held leases, with
/// the same draws from the same seed in both stores); a new session is placed on the
/// sub-pool's ring exactly as in memory, and keeps its address whichever pool a later ticket
/// names; the minimum in service holds per sub-pool (P8), also after a removal; runtime
/// additions join the named sub-pools; unknown names are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sub_pools_and_strategies_work_like_in_the_memory_store() {
    const F: Outcome = Outcome::ConnectError;
    let (redis, clock) = start("sub-pools");
    let (memory, shared) = with_sub_pools(&redis, &clock, "sub-pools").await;
    let pools = [&memory, &shared];
    let a = |i: usize| format!("http://10.0.0.{i}:3128");
    clock.advance(Duration::from_secs(61));

    // Least connections' picks per pool: both draw from their seeded generator, alike.
    let mut least = Vec::new();
    for pool in pools {
        // Each sub-pool's members only.
        for _ in 0..20 {
            let lease = pool.acquire(Ticket::new().sub_pool("shop")).await.unwrap();
            let got = lease.address().redacted().to_owned();
            assert!(got == a(1) || got == a(2), "{got}");
            assert_eq!(lease.choice(), Choice::Weighted);
            lease.release(OK).await.unwrap();
        }
        // Round-robin: each member once in every three picks.
        let mut picks = Vec::new();
        for _ in 0..9 {
            let lease = pool.acquire(Ticket::new().sub_pool("rr")).await.unwrap();
            assert_eq!(lease.choice(), Choice::RoundRobin);
            picks.push(lease.address().redacted().to_owned());
            lease.release(OK).await.unwrap();
        }
        for turn in picks.chunks(3) {
            let mut turn = turn.to_vec();
            turn.sort();
            assert_eq!(turn, [a(3), a(4), a(5)], "{picks:?}");
        }
        // Least connections: held leases spread evenly.
        let mut held = Vec::new();
        for _ in 0..12 {
            let lease = pool.acquire(Ticket::new().sub_pool("lc")).await.unwrap();
            assert_eq!(lease.choice(), Choice::LeastConnections);
            held.push(lease);
        }
        let mut per: HashMap<String, usize> = HashMap::new();
        for lease in &held {
            *per.entry(lease.address().redacted().to_owned())
                .or_default() += 1;
        }
        eprintln!("PER {per:?}");
        assert_eq!(per.len(), 3, "{per:?}");
        assert!(per.values().all(|n| (2..=6).contains(n)), "{per:?}");
        least.push(
            held.iter()
                .map(|l| l.address().redacted().to_owned())
                .collect::<Vec<_>>(),
        );
        for lease in held {
            lease.release(OK).await.unwrap();
        }
        assert!(matches!(
            pool.acquire(Ticket::new().sub_pool("nope")).await,
            Err(AcquireError::UnknownSubPool(_))
        ));
        assert!(
            pool.add_to("http://10.0.0.99:3128", &["nope"])
                .await
                .is_err()
        );
    }
    assert_eq!(least[0], least[1], "memory (left) and Redis (right) differ");

    // New sessions land on the same address of the sub-pool's ring in both stores; a bound
    // key keeps its address through the whole pool's tickets too.
    for k in 0..24 {
        let key = format!("acct-{k}");
        let mut got = Vec::new();
        for pool in pools {
            let lease = pool
                .acquire(Ticket::new().key(key.as_str()).sub_pool("rr"))
                .await
                .unwrap();
            got.push(lease.address().redacted().to_owned());
            lease.release(OK).await.unwrap();
            let again = pool.acquire(Ticket::new().key(key.as_str())).await.unwrap();
            assert_eq!(again.address().redacted(), got[got.len() - 1]);
            again.release(OK).await.unwrap();
        }
        assert_eq!(got[0], got[1], "{key}");
        assert!([a(3), a(4), a(5)].contains(&got[0]), "{key}: {got:?}");
    }
    for pool in pools {
        assert_eq!(pool.snapshot().await.pool.bindings, 24);
    }

    // P8 per sub-pool: `shop` has two members, so a failing one is kept in service (degraded:
    // suspect, then confirmed, yet not quarantined).
    let fail = |key: &'static str, n: usize| async move {
        for pool in pools {
            for _ in 0..n {
                let ticket = Ticket::new().key(key).sub_pool("shop");
                pool.acquire(ticket)
                    .await
                    .unwrap()
                    .release(F)
                    .await
                    .unwrap();
            }
        }
    };
    fail("shopper", 6).await;
    let shopper = pool_binding(&memory, "shopper").await;
    assert_eq!(shopper, pool_binding(&shared, "shopper").await);
    let j = alike(&memory, &shared, &clock, &shopper).await;
    assert_eq!(j.state, HealthState::Degraded);
    for pool in pools {
        let snap = pool.snapshot().await;
        assert_eq!(snap.address(&a(1)).unwrap().sub_pools, ["shop"]);
        assert_eq!(snap.address(&a(6)).unwrap().sub_pools, Vec::<String>::new());
    }

    // A runtime addition joins `shop`, which can now spare the failing one.
    for pool in pools {
        pool.add_to(&a(7), &["shop"]).await.unwrap();
    }
    for pool in pools {
        let snap = pool.snapshot().await;
        assert_eq!(snap.address(&a(7)).unwrap().sub_pools, ["shop"]);
    }
    fail("shopper", 1).await;
    let j = alike(&memory, &shared, &clock, &shopper).await;
    assert_eq!(j.state, HealthState::Quarantined);

    // Removing another member leaves `shop` short: the quarantined one comes back early.
    let other = if shopper == a(1) { a(2) } else { a(1) };
    for pool in pools {
        pool.remove(&other).await.unwrap();
        let why = reason(pool, &shopper).await;
        assert!(
            why.contains("brought back early to keep 2 in service"),
            "{why}"
        );
    }
    let j = alike(&memory, &shared, &clock, &shopper).await;
    assert_eq!(j.state, HealthState::Probing);
    for pool in pools {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..30 {
            let lease = pool.acquire(Ticket::new().sub_pool("shop")).await.unwrap();
            seen.insert(lease.address().redacted().to_owned());
            lease.release(OK).await.unwrap();
        }
        assert!(seen.contains(&a(7)) && !seen.contains(&other), "{seen:?}");
    }
}

/// A memory pool and a Redis pool named `name` from one builder.
async fn both(redis: &RedisServer, name: &str, builder: impl Fn() -> PoolBuilder) -> (Pool, Pool) {
    let shared = builder()
        .redis(patient(RedisOptions::new(redis.url(), name)))
        .connect()
        .await
        .unwrap();
    (builder().build().unwrap(), shared)
}

/// `n` keyless pairs released with `outcome`.
async fn keyless(pool: &Pool, n: usize, outcome: Outcome) {
    for _ in 0..n {
        let lease = pool.acquire(Ticket::new()).await.unwrap();
        lease.release(outcome).await.unwrap();
    }
}

/// How both stores judge `address`, which must be alike.
async fn alike(memory: &Pool, shared: &Pool, clock: &ManualClock, address: &str) -> Judged {
    let j = judged(memory, clock, address).await;
    assert_eq!(
        j,
        judged(shared, clock, address).await,
        "memory (left) and Redis (right) differ"
    );
    j
}

/// The address `key` is bound to, as a whole-pool ticket finds it.
async fn pool_binding(pool: &Pool, key: &str) -> String {
    let lease = pool.acquire(Ticket::new().key(key)).await.unwrap();
    let address = lease.address().redacted().to_owned();
    lease.release(OK).await.unwrap();
    address
}

/// Two pools ("processes") × 32 tasks hammer one shared pool through its sub-pools (each
/// address in one or two of them, a lease cap of 2) with keyless and keyed tickets and some
/// failures: no address ever holds more than 2 leases, whichever sub-pool and process took
/// them; every lease comes back; and afterwards every offered address is in each of its
/// pools' selection set exactly once, and nothing else is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sub_pools_hold_the_caps_under_concurrency() {
    let (redis, clock) = start("sub-pool-race");
    let mut cfg = PoolConfig::default();
    cfg.max_leases_per_address = 2;
    let connect = || {
        let mut b = Pool::builder()
            .config(cfg.clone())
            .clock(clock.clone())
            .sub_pool("a", Strategy::Weighted)
            .sub_pool("b", Strategy::LeastConnections)
            .sub_pool("c", Strategy::RoundRobin);
        for (i, address) in addresses(9).into_iter().enumerate() {
            b = b.address_in(address, [&["a"][..], &["b", "c"], &["a", "c"]][i % 3]);
        }
        b.redis(patient(RedisOptions::new(redis.url(), "race")))
            .connect()
    };
    let pools = [connect().await.unwrap(), connect().await.unwrap()];
    let held: std::sync::Arc<std::sync::Mutex<HashMap<String, u32>>> = Default::default();
    let mut tasks = Vec::new();
    for t in 0..64u64 {
        let (pool, held) = (pools[(t % 2) as usize].clone(), held.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(t);
            for _ in 0..150 {
                let mut ticket = Ticket::new();
                if let Some(sp) = [None, Some("a"), Some("b"), Some("c")][rng.random_range(0..4)] {
                    ticket = ticket.sub_pool(sp);
                }
                if rng.random_bool(0.3) {
                    ticket = ticket.key(format!("k{}", rng.random_range(0..40)));
                }
                let Ok(lease) = pool.acquire(ticket).await else {
                    tokio::task::yield_now().await;
                    continue;
                };
                let address = lease.address().redacted().to_owned();
                let now = {
                    let mut held = held.lock().unwrap();
                    let n = held.entry(address.clone()).or_default();
                    *n += 1;
                    *n
                };
                assert!(now <= 2, "{address} holds {now} leases");
                tokio::task::yield_now().await;
                *held.lock().unwrap().get_mut(&address).unwrap() -= 1;
                let outcome = if rng.random_bool(0.05) {
                    Outcome::ConnectError
                } else {
                    OK
                };
                lease.release(outcome).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let snap = pools[0].snapshot().await;
    assert_eq!(snap.pool.active_leases, 0, "{:?}", snap.pool);
    assert!(snap.pool.acquired > 1_000, "{:?}", snap.pool);

    // Selection sets: each offered address once in the whole pool's and its sub-pools'.
    let urls: HashMap<String, String> = redis
        .cli(&["HGETALL", "proxypool:{race}:url"])
        .chunks(2)
        .map(|p| (p[0].clone(), p[1].clone()))
        .collect();
    for (set, name) in [
        ("proxypool:{race}:pass", None),
        ("proxypool:{race}:sp:a:pass", Some("a")),
        ("proxypool:{race}:sp:b:pass", Some("b")),
        ("proxypool:{race}:sp:c:pass", Some("c")),
    ] {
        let mut members: Vec<String> = redis
            .cli(&["ZRANGE", set, "0", "-1"])
            .iter()
            // Every `pass` ends with a member that keeps it a skiplist (see library.lua).
            .filter(|m| !m.is_empty() && !m.starts_with("end of pass"))
            // A member is 'RANK:step', RANK the id scrambled (`smooth_weighted::tie`): the
            // inverse multiplication gives the id back.
            .map(|m| {
                let rank = u32::from_str_radix(m.split(':').next().unwrap(), 16).unwrap();
                urls[&rank.wrapping_mul(0x0E8B_2F51).to_string()].clone()
            })
            .collect();
        members.sort();
        let mut expected: Vec<String> = snap
            .addresses
            .iter()
            .filter(|a| a.state.is_offered())
            .filter(|a| name.is_none_or(|n| a.sub_pools.iter().any(|s| s == n)))
            .map(|a| a.address.clone())
            .collect();
        expected.sort();
        assert_eq!(members, expected, "{set}");
    }
}

/// Latency side by side (P1, P4): a jump in one address's latency degrades it in both
/// stores, and it comes back once its latency is back to its norm; an address steadily much
/// slower than the pool keeps its state but loses weight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_weighs_and_a_jump_degrades_like_in_memory() {
    let at = |ms: u64| Outcome::Success {
        latency: Duration::from_millis(ms),
    };
    let (redis, clock, memory, shared) = side_by_side_lab("latency").await;
    let pools = [&memory, &shared];
    clock.advance(Duration::from_secs(61));
    let state = |pool: &Pool, address: String| {
        let pool = pool.clone();
        async move { pool.snapshot().await.address(&address).unwrap().state }
    };
    let mut x = String::new();
    for pool in pools {
        keyless(pool, 100, at(50)).await;
        x = through(pool, "acct-x", &[at(50); 30]).await;
        through(pool, "acct-x", &[at(400); 5]).await;
    }
    for pool in pools {
        assert_eq!(state(pool, x.clone()).await, HealthState::Degraded);
        let why = reason(pool, &x).await;
        assert!(why.contains("latency"), "{why}");
    }
    for pool in pools {
        through(pool, "acct-x", &[at(50); 60]).await;
    }
    clock.advance(Duration::from_secs(31));
    for pool in pools {
        through(pool, "acct-x", &[at(50)]).await;
        assert_eq!(state(pool, x.clone()).await, HealthState::Healthy);
        assert_eq!(reason(pool, &x).await, "signals cleared");
    }

    // Steadily ten times slower than the rest from its first outcome (fresh pools): no jump,
    // but a small weight.
    let (memory, shared) = side_by_side(&redis, &clock, "latency-steady").await;
    clock.advance(Duration::from_secs(61));
    for pool in [&memory, &shared] {
        let y = through(pool, "acct-y", &[at(500); 40]).await;
        keyless(pool, 100, at(50)).await;
        let snap = pool.snapshot().await;
        let row = snap.address(&y).unwrap();
        assert_eq!(
            row.state,
            HealthState::Healthy,
            "{y}: {}",
            reason(pool, &y).await
        );
        assert!(row.weight < 0.5, "{y}: {}", row.weight);
        let fast = snap.addresses.iter().find(|a| a.address != y).unwrap();
        assert!(fast.weight > 0.7, "{fast:?}");
        // Selection follows: about its weight's share of keyless work.
        let mut picked = 0;
        for _ in 0..200 {
            let lease = pool.acquire(Ticket::new()).await.unwrap();
            picked += usize::from(lease.address().redacted() == y);
            lease.release(at(50)).await.unwrap();
        }
        assert!(picked < 10, "{y} picked {picked} times of 200");
    }
}

/// A rate limit released in the same call as acquires for that site holds for them: the call
/// is made by hand (the store's own batching decides what shares a call), with the function
/// name and common arguments the store used, as the server's slow log shows them (and the
/// configuration the pool recorded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_holds_for_acquires_in_its_own_call() {
    let (redis, clock, pool) = lab("cool-call").await;
    redis.cli(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
    let lease = pool.acquire(Ticket::new().site("shop")).await.unwrap();
    let log = redis.cli(&["SLOWLOG", "GET", "10"]);
    let at = (0..log.len() - 1)
        .find(|&i| log[i] == "FCALL" && log[i + 1].ends_with("_ops"))
        .unwrap_or_else(|| panic!("{log:?}"));
    let (function, meta) = (&log[at + 1], &log[at + 3]);
    // The slow log cuts long arguments: the configuration as the pool recorded it.
    let health = &redis.cli(&["HGET", meta, "config"])[0];
    let url = lease.address().as_str().to_owned();
    let id = redis.cli(&["HGET", "proxypool:{cool-call}:byurl", &url])[0].clone();
    let now = clock.now().as_millis();
    let (lid, until, later) = (
        lease.id().get().to_string(),
        (now + 30_000).to_string(),
        (now + 300_000).to_string(),
    );
    let now = now.to_string();
    let member = format!("l{lid}:{id}");
    let mut call = vec![
        "FCALL", function, "1", meta, &now, "0", "32", health, &later, &later, "1.25", "1", "0", "",
    ];
    call.extend([member.as_str(), &id, "r", "shop", &until, ""]);
    for _ in 0..12 {
        call.extend(["", "0", "shop", "w", "0"]);
    }
    let reply = redis.cli(&call);
    let granted: Vec<&String> = reply.chunks(3).take(12).map(|r| &r[1]).collect();
    assert_eq!(granted.len(), 12, "{reply:?}");
    assert!(
        !granted.contains(&&id),
        "the cooled address {id} was granted: {reply:?}"
    );
}

/// The success rate's share of an address's weight lasts as long as its window: a window
/// forgotten after the maximum age takes its penalty with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forgotten_window_takes_its_weight_penalty_with_it() {
    const F: Outcome = Outcome::ConnectError;
    let (_redis, clock, pool) = lab("penalty").await;
    clock.advance(Duration::from_secs(61));
    let weight = |address: String| {
        let pool = pool.clone();
        async move { pool.snapshot().await.address(&address).unwrap().weight }
    };
    let mut x = String::new();
    for _ in 0..6 {
        x = through(&pool, "acct", &[OK, OK, OK, OK, F]).await;
    }
    // 24 of 30 (smoothed: 26 of 32): half an octave down.
    assert!((weight(x.clone()).await - 0.5f64.sqrt()).abs() < 1e-9);
    clock.advance(Duration::from_secs(11 * 60));
    through(&pool, "acct", &[OK; 3]).await;
    assert_eq!(weight(x.clone()).await, 1.0);
}
