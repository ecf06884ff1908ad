//! Acquire + release pairs, keyless and keyed, at 1 000 and 10 000 addresses with 100 000 keys;
//! plus the quality of the consistent hash (printed before the timings): the fraction of keys
//! that move when 1 of N addresses is removed, and the max ÷ mean of bound keys.
//!
//! Run: `cargo bench -p proxypool --bench pool`
#![allow(clippy::unwrap_used, missing_docs)]

use std::collections::HashMap;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use proxypool::{ManualClock, Outcome, Pool, Strategy, Ticket};

const KEYS: usize = 100_000;

const OK: Outcome = Outcome::Success {
    latency: Duration::from_millis(120),
};

fn url(i: usize) -> String {
    format!(
        "http://10.{}.{}.{}:3128",
        i / 65536,
        (i / 256) % 256,
        i % 256
    )
}

fn pool(n: usize, strategy: Strategy) -> Pool {
    Pool::builder()
        .addresses((0..n).map(url))
        .strategy(strategy)
        .clock(ManualClock::new())
        .seed(1)
        .build()
        .unwrap()
}

/// The in-memory store never waits: one poll with a no-op waker runs a call to completion,
/// so the timings are the pool's and not an executor's.
fn ready<F: Future>(f: F) -> F::Output {
    match pin!(f)
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the in-memory store never waits"),
    }
}

fn pair(pool: &Pool, ticket: Ticket) {
    ready(async {
        let lease = pool.acquire(ticket).await.unwrap();
        lease.release(OK).await.unwrap();
    });
}

#[divan::bench(args = [1_000, 10_000], sample_count = 100, sample_size = 1000)]
fn keyless_weighted(b: divan::Bencher, n: usize) {
    let pool = pool(n, Strategy::Weighted);
    b.bench_local(|| pair(&pool, Ticket::new()));
}

#[divan::bench(args = [1_000, 10_000], sample_count = 100, sample_size = 1000)]
fn keyless_round_robin(b: divan::Bencher, n: usize) {
    let pool = pool(n, Strategy::RoundRobin);
    b.bench_local(|| pair(&pool, Ticket::new()));
}

#[divan::bench(args = [1_000, 10_000], sample_count = 100, sample_size = 1000)]
fn keyless_least_connections(b: divan::Bencher, n: usize) {
    let pool = pool(n, Strategy::LeastConnections);
    b.bench_local(|| pair(&pool, Ticket::new()));
}

#[divan::bench(args = [1_000, 10_000], sample_count = 100, sample_size = 1000)]
fn keyed_100k_keys(b: divan::Bencher, n: usize) {
    let pool = pool(n, Strategy::Weighted);
    let tickets: Vec<Ticket> = (0..KEYS)
        .map(|k| Ticket::new().key(format!("account-{k}")))
        .collect();
    // Bind every key first: the timed pairs are session renewals, the common case.
    for t in &tickets {
        pair(&pool, t.clone());
    }
    let mut i = 0;
    b.bench_local(|| {
        i = (i + 1) % KEYS;
        pair(&pool, tickets[i].clone());
    });
}

/// Binds `keys` keys on a pool of `n` addresses, optionally without address `skip`.
fn placements(n: usize, skip: Option<usize>) -> (HashMap<usize, String>, Pool) {
    let pool = Pool::builder()
        .addresses((0..n).filter(|i| Some(*i) != skip).map(url))
        .clock(ManualClock::new())
        .seed(1)
        .build()
        .unwrap();
    let mut placed = HashMap::new();
    for k in 0..KEYS {
        ready(async {
            let lease = pool
                .acquire(Ticket::new().key(format!("account-{k}")))
                .await
                .unwrap();
            placed.insert(k, lease.address().as_str().to_owned());
            lease.release(OK).await.unwrap();
        });
    }
    (placed, pool)
}

fn hash_quality() {
    for n in [1_000, 10_000] {
        let (before, pool) = placements(n, None);
        let (after, _) = placements(n, Some(n / 2));
        let moved = before.iter().filter(|(k, a)| after[*k] != **a).count();
        let snap = ready(pool.snapshot());
        let max = snap
            .addresses
            .iter()
            .map(|a| a.bound_keys)
            .max()
            .unwrap_or(0);
        let mean = KEYS as f64 / n as f64;
        println!(
            "hash n={n}: removing 1 of {n} placed {:.4} of {KEYS} keys differently (1/N = {:.4}); \
             bound keys max/mean = {:.2} (bound ⌈1.25 × mean⌉ = {})",
            moved as f64 / KEYS as f64,
            1.0 / n as f64,
            max as f64 / mean,
            (1.25 * mean).ceil()
        );
    }
}

fn main() {
    hash_quality();
    divan::main();
}
