//! Acquire + release pairs through the Redis store, a fixed number of each kind, for
//! `scripts/callgrind-redis` to record (with `MONITOR`) and replay under callgrind: the redis
//! bench's pool, tasks, tickets and latencies (`benches/redis_support`), 1 000 unmeasured pairs
//! of each kind, then PAIRS keyless and PAIRS keyed ones. Before each measured kind and after
//! the last it sends `ECHO MARK-<kind>` on a connection of its own: where the replay zeroes
//! and dumps the counters.
//!
//! `target/release/examples/redis_pairs redis://127.0.0.1:PORT PAIRS`
#![allow(clippy::unwrap_used, missing_docs)]

#[path = "../benches/redis_support/mod.rs"]
mod redis_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use proxypool::{Outcome, Pool};
use redis_support::{TASKS, latency, ticket};

const WARM_UP: u64 = 1_000;

/// `total` pairs of one kind, shared by the tasks.
async fn pairs(pool: &Pool, keyed: bool, total: u64) {
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (pool, next) = (pool.clone(), Arc::clone(&next));
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while next.fetch_add(1, Ordering::Relaxed) < total {
                i += 1;
                let lease = pool.acquire(ticket(keyed, t, i)).await.unwrap();
                let latency = latency(t, i);
                lease.release(Outcome::Success { latency }).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let url = args.next().expect("usage: redis_pairs REDIS_URL PAIRS");
    let count: u64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(6_000);
    let mut marks = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut mark = |what: &str| {
        redis::cmd("ECHO")
            .arg(format!("MARK-{what}"))
            .exec(&mut marks)
            .unwrap();
    };
    let rt = redis_support::runtime();
    let pool = rt.block_on(redis_support::pool(url));
    rt.block_on(pairs(&pool, false, WARM_UP));
    rt.block_on(pairs(&pool, true, WARM_UP));
    mark("keyless");
    rt.block_on(pairs(&pool, false, count));
    mark("keyed");
    rt.block_on(pairs(&pool, true, count));
    mark("end");
}
