//! A Redis server that stops answering (SIGSTOP) and thaws: it then runs the calls that queued
//! up meanwhile, acquires whose callers were told `StoreUnavailable` among them. Their grants
//! must go back at once, not hold the caps until the lease TTL, and until they are back no
//! caller is refused for want of what they hold.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use proxypool::{AcquireError, ManualClock, Outcome, Pool, PoolConfig, RedisOptions, Ticket};
use testkit::RedisServer;

/// Guard against a hang: far above the store's timeout, far below the lease TTL (which the
/// manual clock never reaches anyway).
const HANG: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_abandoned_during_a_pause_leave_no_lease_after_the_thaw() {
    let dir = std::env::temp_dir().join(format!("proxypool-redis-thaw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let redis = RedisServer::start(&dir).unwrap();
    // Two addresses, one lease each: any lease left behind shows as a refused acquire. The
    // clock stands still, so no lease ever expires by its TTL.
    let clock = ManualClock::new();
    clock.advance(Duration::from_secs(1_000));
    let mut cfg = PoolConfig::default();
    cfg.max_leases_per_address = 1;
    let pool = Pool::builder()
        .addresses(["http://10.0.0.1:3128", "http://10.0.0.2:3128"])
        .config(cfg)
        .clock(clock)
        .redis(RedisOptions::new(redis.url(), "thaw").timeout(Duration::from_millis(300)))
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
