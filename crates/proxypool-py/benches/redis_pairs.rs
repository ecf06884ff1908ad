//! The Rust side of the Python bench (`benches/bench.py`): acquire + release pairs per second
//! through Redis from 50 tokio tasks, keyless, on a pool the Python side built (same server,
//! same pool name), for the given seconds. Prints the rate and the number of pairs.
//! Run by bench.py: `cargo bench -p proxypool-py --bench redis_pairs -- URL POOL SECONDS`.
#![allow(clippy::unwrap_used, reason = "a bench: a panic is its failure report")]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use proxypool::{Outcome, Pool, PoolConfig, RedisOptions, Ticket};

const TASKS: usize = 50;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let [url, name, seconds] = &args[..] else {
        panic!("usage: redis_pairs URL POOL SECONDS");
    };
    let run = Duration::from_secs_f64(seconds.parse().unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut config = PoolConfig::default();
    config.max_leases_per_address = 1_000;
    let pool = rt
        .block_on(
            Pool::builder()
                .config(config)
                .redis(RedisOptions::new(url, name).timeout(Duration::from_secs(5)))
                .connect(),
        )
        .unwrap();
    let (rate, pairs) = rt.block_on(pairs_per_second(pool, run));
    println!("{rate:.0} {pairs}");
}

/// Pairs per second, and how many were made.
async fn pairs_per_second(pool: Pool, run: Duration) -> (f64, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..TASKS as u64 {
        let (pool, stop, done) = (pool.clone(), Arc::clone(&stop), Arc::clone(&done));
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let lease = pool.acquire(Ticket::new()).await.unwrap();
                // Latencies that vary, as bench.py's do (the same formula).
                let latency = Duration::from_millis(30 + (t * 31 + i * 17) % 100);
                lease.release(Outcome::Success { latency }).await.unwrap();
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(run).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let pairs = done.load(Ordering::Relaxed);
    (pairs as f64 / started.elapsed().as_secs_f64(), pairs)
}
