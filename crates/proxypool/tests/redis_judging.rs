//! The Redis store's decisions are the Rust judge's, applied by `apply` only on the facts they
//! were taken on: a decision taken on an address's older version, or on quarantine-gate facts
//! that moved, is refused (the caller reads again and judges again), so two processes judging
//! the same address at once make one transition, not two.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use proxypool::{Clock, ManualClock, Outcome, Pool, PoolConfig, RedisOptions, Ticket};
use testkit::RedisServer;

fn start(name: &str) -> (RedisServer, ManualClock) {
    let dir = std::env::temp_dir().join(format!("proxypool-judging-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let redis = RedisServer::start(&dir).unwrap();
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(1_000));
    (redis, clock)
}

async fn process(redis: &RedisServer, name: &str, clock: &ManualClock) -> Pool {
    Pool::builder()
        .addresses((1..=6).map(|i| format!("http://10.0.0.{i}:3128")))
        .config(PoolConfig::default())
        .clock(clock.clone())
        .seed(1)
        .redis(RedisOptions::new(redis.url(), name))
        .connect()
        .await
        .unwrap()
}

/// `apply` by hand, with the common arguments a process passes (the configuration as the pool
/// recorded it).
fn apply(redis: &RedisServer, pool: &str, now: u64, args: &[&str]) -> Vec<String> {
    by_hand(redis, "_apply", pool, now, args)
}

/// The library's function named `…suffix` by hand, as `apply`.
fn by_hand(redis: &RedisServer, suffix: &str, pool: &str, now: u64, args: &[&str]) -> Vec<String> {
    let functions = redis.cli(&["FUNCTION", "LIST"]);
    let function = functions
        .iter()
        .find(|f| f.ends_with(suffix))
        .unwrap_or_else(|| panic!("{functions:?}"))
        .clone();
    let meta = format!("proxypool:{{{pool}}}:meta");
    let config = redis.cli(&["HGET", &meta, "config"]).remove(0);
    let now = now.to_string();
    let mut call = vec!["FCALL", &function, "1", &meta, &now, "0", "32", &config];
    call.extend_from_slice(args);
    redis.cli(&call)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_on_an_older_version_or_moved_gate_facts_is_refused() {
    let (redis, clock) = start("apply");
    let pool = process(&redis, "apply", &clock).await;
    let lease = pool.acquire(Ticket::new().key("acct")).await.unwrap();
    let url = lease.address().as_str().to_owned();
    lease
        .release(Outcome::Success {
            latency: Duration::from_millis(50),
        })
        .await
        .unwrap();
    let id = redis
        .cli(&["HGET", "proxypool:{apply}:byurl", &url])
        .remove(0);
    let a = format!("proxypool:{{apply}}:a:{id}");
    let version = redis.cli(&["HGET", &a, "ver"]).remove(0);
    let now = clock.now().as_millis();
    let state = || redis.cli(&["HGET", &a, "s"]).remove(0);

    // Another version: refused, nothing written.
    let stale = (version.parse::<u64>().unwrap() + 1).to_string();
    let reply = apply(
        &redis,
        "apply",
        now,
        &[&id, &stale, "", "degraded", "by hand", "", "su", "0"],
    );
    assert_eq!(reply, ["0"]);
    assert_eq!(state(), "healthy");
    assert!(redis.cli(&["HGET", &a, "su"]).iter().all(String::is_empty));
    // Gate facts that no longer hold: refused.
    let reply = apply(
        &redis,
        "apply",
        now,
        &[
            &id,
            &version,
            "1 6 0 6 6",
            "quarantined",
            "x",
            "",
            "lv",
            "1",
        ],
    );
    assert_eq!(reply, ["0"]);
    assert_eq!(state(), "healthy");
    // A field no decision writes: an error, and nothing written.
    let reply = apply(
        &redis,
        "apply",
        now,
        &[&id, &version, "", "degraded", "x", "", "s", "dead"],
    );
    assert!(
        reply.iter().any(|l| l.contains("not a decided field")),
        "{reply:?}"
    );
    assert_eq!(state(), "healthy");
    // On its version: applied, and the version moves (a second try on it is refused).
    let reply = apply(
        &redis,
        "apply",
        now,
        &[&id, &version, "", "degraded", "by hand", "", "su", "0"],
    );
    assert_eq!(reply, ["1"]);
    assert_eq!(state(), "degraded");
    assert_eq!(redis.cli(&["HGET", &a, "su"]), ["0"]);
    let reply = apply(
        &redis,
        "apply",
        now,
        &[&id, &version, "", "healthy", "again", ""],
    );
    assert_eq!(reply, ["0"]);
    let decisions = pool.snapshot().await.decisions;
    assert!(
        decisions
            .iter()
            .any(|d| d.to == "degraded" && d.reason == "by hand"),
        "{decisions:?}"
    );
}

/// Two processes, and concurrent releases within one, judge one address at once: releases
/// sharing a batch bring facts of the same version, so each of those with three failures in
/// the window decides a quarantine; whichever applies first wins, the others are refused and
/// judged again (nothing left to decide), so the address enters quarantine once.
/// A site's change is applied only on the state it was decided on (another process decided
/// first otherwise: its decision stands), and our side only while no site changed since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_change_on_a_moved_state_is_refused() {
    let (redis, clock) = start("site");
    let _pool = process(&redis, "site", &clock).await;
    let now = clock.now().as_millis();
    let meta = "proxypool:{site}:meta";
    let degraded = || redis.cli(&["HGET", meta, "d|shop"]);
    let site = |guard: &str, to: &str| {
        by_hand(
            &redis,
            "_site",
            "site",
            now,
            &["shop", guard, to, "by hand", "0"],
        )
    };
    // Decided on a degraded site that is ok: refused, nothing written.
    assert_eq!(site("5", "0")[0], "0");
    assert!(degraded().iter().all(String::is_empty));
    let reply = site("", "1");
    assert_eq!(reply[..2], ["1".to_owned(), now.to_string()]);
    assert_eq!(degraded(), [now.to_string()]);
    // A second process that judged the site ok meanwhile: refused, told the state now.
    assert_eq!(site("", "1")[..2], ["0".to_owned(), now.to_string()]);
    let version = reply[2].clone();
    let our_side = |sv: &str| by_hand(&redis, "_our_side", "site", now, &[sv, "1", "by hand"]);
    assert_eq!(our_side("0"), ["0"]);
    assert!(
        redis
            .cli(&["HGET", meta, "frozen"])
            .iter()
            .all(String::is_empty)
    );
    assert_eq!(our_side(&version), ["1"]);
    assert_eq!(redis.cli(&["HGET", meta, "frozen"]), ["1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_judgements_of_one_address_make_one_transition() {
    let (redis, clock) = start("race");
    let a = process(&redis, "race", &clock).await;
    let b = process(&redis, "race", &clock).await;
    let mut leases = Vec::new();
    for pool in [&a, &b, &a, &b, &a, &b, &a, &b] {
        leases.push(pool.acquire(Ticket::new().key("acct")).await.unwrap());
    }
    let address = leases[0].address().redacted().to_owned();
    assert!(leases.iter().all(|l| l.address().redacted() == address));
    let releases: Vec<_> = leases
        .into_iter()
        .map(|l| tokio::spawn(l.release(Outcome::ConnectError)))
        .collect();
    for r in releases {
        r.await.unwrap().unwrap();
    }
    let snapshot = a.snapshot().await;
    let entered: Vec<_> = snapshot
        .decisions
        .iter()
        .filter(|d| d.to == "quarantined")
        .collect();
    assert_eq!(entered.len(), 1, "{:?}", snapshot.decisions);
    assert_eq!(
        snapshot.address(&address).unwrap().state.as_str(),
        "quarantined"
    );
}
