//! Helpers shared by the integration tests, and the store-generic harness: a test crate's
//! root names the store its pools live in (`STORE`), so one suite runs against both.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::cell::OnceCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proxypool::{ManualClock, Outcome, Pool, PoolBuilder, PoolConfig, RedisOptions, Ticket};
use testkit::RedisServer;

/// Where a test crate's pools keep their state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    Memory,
    /// One redis-server per test binary (started at the first pool), a pool name per pool.
    Redis,
}

thread_local! {
    /// The test's redis-server: each test runs on a thread of its own, so the server stops
    /// (its `Drop`) when the test ends.
    static SERVER: OnceCell<RedisServer> = const { OnceCell::new() };
}

/// Builds `builder` in the crate's store.
pub async fn build(builder: PoolBuilder) -> Pool {
    match crate::STORE {
        Store::Memory => builder.build().unwrap(),
        Store::Redis => {
            static POOLS: AtomicUsize = AtomicUsize::new(0);
            let url = SERVER.with(|s| {
                s.get_or_init(|| {
                    let dir = std::env::temp_dir()
                        .join(format!("proxypool-suite-{}", std::process::id()));
                    std::fs::create_dir_all(&dir).unwrap();
                    RedisServer::start(&dir).unwrap()
                })
                .url()
            });
            let name = format!("suite-{}", POOLS.fetch_add(1, Ordering::Relaxed));
            builder
                // The suite is about behaviour, not the timeout, on a machine shared by builds.
                .redis(RedisOptions::new(url, name).timeout(Duration::from_secs(10)))
                .connect()
                .await
                .unwrap()
        }
    }
}

/// A runtime on this thread, with the timers and I/O the Redis store's connection and
/// deadlines need (tests that run the pool on a runtime of their own).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

pub fn addr(i: usize) -> String {
    format!("http://10.0.{}.{}:8080", i / 250, i % 250)
}

pub async fn pool_with(n: usize, clock: &ManualClock, config: PoolConfig) -> Pool {
    let builder = Pool::builder()
        .addresses((0..n).map(addr))
        .config(config)
        .clock(clock.clone())
        .seed(7);
    build(builder).await
}

pub async fn pool(n: usize, clock: &ManualClock) -> Pool {
    pool_with(n, clock, PoolConfig::default()).await
}

pub fn ok() -> Outcome {
    Outcome::Success {
        latency: Duration::from_millis(100),
    }
}

/// `n` acquire/release rounds with `ticket`, the outcome decided per address; the clock moves
/// `step` after each. Returns the addresses served, in order.
pub async fn serve(
    pool: &Pool,
    clock: &ManualClock,
    ticket: &Ticket,
    n: usize,
    step: Duration,
    mut outcome: impl FnMut(&str) -> Outcome,
) -> Vec<String> {
    let mut served = Vec::with_capacity(n);
    for _ in 0..n {
        let lease = pool.acquire(ticket.clone()).await.unwrap();
        let a = lease.address().as_str().to_owned();
        lease.release(outcome(&a)).await.unwrap();
        served.push(a);
        clock.advance(step);
    }
    served
}

/// Drives releases on one address directly: acquire keyed to it is not possible, so loop
/// keyless until it comes up (bounded).
pub async fn hit(pool: &Pool, clock: &ManualClock, target: &str, outcome: Outcome, times: usize) {
    let mut done = 0;
    for _ in 0..100_000 {
        if done == times {
            return;
        }
        let lease = pool.acquire(Ticket::new()).await.unwrap();
        if lease.address().as_str() == target {
            lease.release(outcome).await.unwrap();
            done += 1;
        } else {
            lease.release(ok()).await.unwrap();
        }
        clock.advance(Duration::from_millis(10));
    }
    panic!("{target} was not picked {times} times");
}
