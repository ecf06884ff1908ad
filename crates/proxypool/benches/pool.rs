//! Acquire + release pairs, keyless and keyed, at 1 000 and 10 000 addresses with 100 000 keys;
//! plus the quality of the consistent hash (printed before the timings): the fraction of
//! unbound keys whose placement moves when 1 of N addresses is removed from a loaded pool,
//! that no bound key moves, and the max ÷ mean of bound keys.
//!
//! Run: `cargo bench -p proxypool --bench pool`
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use proxypool::{ManualClock, Pool, Strategy, Ticket};
use support::{OK, pair, pool, ready, url};

const KEYS: usize = 100_000;

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

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|k| format!("{prefix}-{k}")).collect()
}

/// Binds every key (a live session each); returns where each landed.
fn bind(pool: &Pool, keys: &[String]) -> Vec<String> {
    keys.iter()
        .map(|k| {
            ready(async {
                let lease = pool.acquire(Ticket::new().key(k.as_str())).await.unwrap();
                let a = lease.address().as_str().to_owned();
                lease.release(OK).await.unwrap();
                a
            })
        })
        .collect()
}

/// Where each unbound key would be placed now, without leaving a trace: acquire, drop the
/// lease, end the session.
fn placements(pool: &Pool, keys: &[String]) -> Vec<String> {
    keys.iter()
        .map(|k| {
            ready(async {
                let lease = pool.acquire(Ticket::new().key(k.as_str())).await.unwrap();
                let a = lease.address().as_str().to_owned();
                drop(lease);
                assert!(pool.end_session(k).await);
                a
            })
        })
        .collect()
}

fn differ(a: &[String], b: &[String]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x != y).count()
}

/// The consistent hash with bounded loads, on a loaded pool: 100 000 live sessions, then
/// 100 000 other (unbound) keys placed before and after each of 10 removals of one address.
fn hash_quality() {
    const REMOVALS: usize = 10;
    for n in [1_000, 10_000] {
        let pool = pool(n, Strategy::Weighted);
        let residents = keys("account", KEYS);
        let homes = bind(&pool, &residents);
        let snap = ready(pool.snapshot());
        let max = snap
            .addresses
            .iter()
            .map(|a| a.bound_keys)
            .max()
            .unwrap_or(0);
        let mean = KEYS as f64 / n as f64;
        let probes = keys("visitor", KEYS);
        let mut before = placements(&pool, &probes);
        let (mut moved, mut on_victims, mut share) = (0, 0, 0.0);
        let victims: Vec<String> = (0..REMOVALS).map(|i| url(i * n / REMOVALS + 7)).collect();
        for (i, victim) in victims.iter().enumerate() {
            ready(pool.remove(victim)).unwrap();
            let after = placements(&pool, &probes);
            moved += differ(&before, &after);
            on_victims += before.iter().filter(|a| *a == victim).count();
            // What 1/N is for this removal: one of the addresses left before it.
            share += 1.0 / (n - i) as f64;
            before = after;
        }
        // Every live session stays where it was, except those on the removed addresses.
        let bound_moved = residents
            .iter()
            .zip(&homes)
            .filter(|(k, home)| {
                !victims.contains(home)
                    && ready(async {
                        let lease = pool.acquire(Ticket::new().key(k.as_str())).await.unwrap();
                        lease.address().as_str() != home.as_str()
                    })
            })
            .count();
        // For contrast, not a move: two pools built from scratch, with and without one
        // address, binding the same keys in the same order. Bounded loads make each placement
        // depend on the ones before it, so such rebuilds differ by cascades.
        let with = bind(&pool_without(n, None), &residents);
        let without = bind(&pool_without(n, Some(n / 2)), &residents);
        println!(
            "hash n={n}: removing 1 of N ({REMOVALS} times) moved {:.2} × 1/N of {KEYS} unbound \
             keys ({moved} moves, {on_victims} of them were on the removed address), \
             {bound_moved} of {KEYS} bound keys; bound keys max/mean = {:.2} (max {max}, \
             ⌈1.25 × mean⌉ = {}); rebuilt from scratch instead: {:.2} × 1/N differ",
            moved as f64 / (KEYS as f64 * share),
            max as f64 / mean,
            (1.25 * mean).ceil(),
            differ(&with, &without) as f64 * n as f64 / KEYS as f64,
        );
    }
}

fn pool_without(n: usize, skip: Option<usize>) -> Pool {
    Pool::builder()
        .addresses((0..n).filter(|i| Some(*i) != skip).map(url))
        .clock(ManualClock::new())
        .seed(1)
        .build()
        .unwrap()
}

fn main() {
    hash_quality();
    divan::main();
}
