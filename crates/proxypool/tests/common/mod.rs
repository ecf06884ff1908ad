//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::time::Duration;

use proxypool::{ManualClock, Outcome, Pool, PoolConfig, Ticket};

pub fn addr(i: usize) -> String {
    format!("http://10.0.{}.{}:8080", i / 250, i % 250)
}

pub fn pool_with(n: usize, clock: &ManualClock, config: PoolConfig) -> Pool {
    Pool::builder()
        .addresses((0..n).map(addr))
        .config(config)
        .clock(clock.clone())
        .seed(7)
        .build()
        .unwrap()
}

pub fn pool(n: usize, clock: &ManualClock) -> Pool {
    pool_with(n, clock, PoolConfig::default())
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
