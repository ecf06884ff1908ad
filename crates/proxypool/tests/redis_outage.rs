//! A Redis server that stops answering (SIGSTOP) and thaws: it then runs the calls that queued
//! up meanwhile, acquires whose callers were told `StoreUnavailable` among them. Their grants
//! must go back at once, not hold the caps until the lease TTL, and until they are back no
//! caller is refused for want of what they hold — also when the reply of such a call is lost
//! (its connection gone before the server ran it).
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use proxypool::{AcquireError, ManualClock, Outcome, Pool, PoolConfig, RedisOptions, Ticket};
use testkit::{RedisServer, Relay};

/// Guard against a hang: far above the store's timeout, far below the lease TTL (which the
/// manual clock never reaches anyway).
const HANG: Duration = Duration::from_secs(30);

/// A pool of `addresses` on Redis at `url` (pool `name`), one lease per address, whose clock
/// stands still (no lease ever expires by its TTL), after one acquire and release (the
/// library loaded, the process's lease ids reserved).
async fn one_lease_each(addresses: &[&str], url: String, name: &str) -> Pool {
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(1_000));
    let mut cfg = PoolConfig::default();
    cfg.max_leases_per_address = 1;
    let pool = Pool::builder()
        .addresses(addresses.iter().copied())
        .config(cfg)
        .clock(clock)
        .redis(RedisOptions::new(url, name).timeout(Duration::from_millis(300)))
        .connect()
        .await
        .unwrap();
    let ok = Outcome::Success {
        latency: Duration::from_millis(50),
    };
    pool.acquire(Ticket::new())
        .await
        .unwrap()
        .release(ok)
        .await
        .unwrap();
    pool
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_abandoned_during_a_pause_leave_no_lease_after_the_thaw() {
    let dir = std::env::temp_dir().join(format!("proxypool-redis-thaw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let redis = RedisServer::start(&dir).unwrap();
    // Two addresses, one lease each: any lease left behind shows as a refused acquire.
    let pool = one_lease_each(
        &["http://10.0.0.1:3128", "http://10.0.0.2:3128"],
        redis.url(),
        "thaw",
    )
    .await;

    redis.pause().unwrap();
    let waiting: Vec<_> = (0..8)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { pool.acquire(Ticket::new()).await.map(drop) })
        })
        .collect();
    for acquire in waiting {
        let err = acquire.await.unwrap().unwrap_err();
        assert!(matches!(err, AcquireError::StoreUnavailable(_)), "{err:?}");
    }
    // Asked across the thaw: Redis runs them after the queued grants, before those are back.
    // Served, or told the store is recovering — never refused for want of an address, which
    // would be false (no caller holds those grants).
    let across: Vec<_> = (0..4)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { pool.acquire(Ticket::new()).await.map(drop) })
        })
        .collect();
    redis.resume().unwrap();
    for acquire in across {
        match acquire.await.unwrap() {
            Ok(()) | Err(AcquireError::StoreUnavailable(_)) => {}
            Err(e) => panic!("across the thaw: {e:?}"),
        }
    }

    // The thawed server grants what the queued calls asked for; those grants come back.
    let deadline = Instant::now() + HANG;
    loop {
        let snap = pool.snapshot().await;
        if snap.pool.active_leases == 0 && snap.pool.abandoned > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "leases left behind: {:?}",
            snap.pool
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Both caps are free again.
    let first = pool.acquire(Ticket::new()).await.unwrap();
    let second = pool.acquire(Ticket::new()).await.unwrap();
    assert_ne!(first.address(), second.address());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_whose_reply_was_lost_comes_back_once_redis_answers_again() {
    let dir = std::env::temp_dir().join(format!("proxypool-redis-lost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let redis = RedisServer::start(&dir).unwrap();
    // The pool talks to Redis through a relay, so that its connection can go while Redis
    // keeps what was sent on it.
    let target = format!("127.0.0.1:{}", redis.port()).parse().unwrap();
    let mut relay = Relay::start(target).await.unwrap();
    // One address with one lease: a grant left behind refuses every acquire.
    let url = format!("redis://{}", relay.addr);
    let pool = one_lease_each(&["http://10.0.0.1:3128"], url, "lost").await;
    let leases = || {
        redis
            .cli(&["ZRANGE", "proxypool:{lost}:due", "0", "-1"])
            .into_iter()
            .filter(|m| m.starts_with('l'))
            .count()
    };
    assert_eq!(leases(), 0);

    // The acquire reaches a frozen Redis and times out; then its connection goes (the relay
    // closes both ends) with the call unread in Redis' socket, and Redis thaws: it runs the
    // call, grants the lease and cannot answer.
    redis.pause().unwrap();
    let err = pool.acquire(Ticket::new()).await.unwrap_err();
    assert!(matches!(err, AcquireError::StoreUnavailable(_)), "{err:?}");
    relay.cut().await;
    redis.resume().unwrap();
    let deadline = Instant::now() + HANG;
    while leases() == 0 {
        assert!(Instant::now() < deadline, "the call never ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A grant nobody holds. Redis is back within reach: the address can be leased again
    // (meanwhile a refusal may say the store is recovering), long before any TTL.
    relay.restore().await.unwrap();
    let lease = loop {
        match pool.acquire(Ticket::new()).await {
            Ok(lease) => break lease,
            Err(AcquireError::StoreUnavailable(_)) => {}
            Err(e) => panic!("refused while the lost grant is held: {e:?}"),
        }
        assert!(
            Instant::now() < deadline,
            "the lost grant was never given back"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(lease.address().as_str(), "http://10.0.0.1:3128");
    assert!(pool.snapshot().await.pool.abandoned >= 1);
}
