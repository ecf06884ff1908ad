//! What `benches/redis.rs` and `examples/redis_pairs.rs` share: the pool, and each task's
//! tickets and latencies, so that the replayed pairs are the bench's.

use std::time::Duration;

use proxypool::{Pool, PoolConfig, RedisOptions, Ticket};

/// Tasks making pairs at once.
pub(crate) const TASKS: u64 = 50;

/// The runtime the pairs run on: two workers, as a small service would have.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The pool (`bench`) on the Redis server at `url`: 50 addresses, a cap no pair reaches.
pub(crate) async fn pool(url: String) -> Pool {
    let mut cfg = PoolConfig::default();
    cfg.max_leases_per_address = 1_000;
    Pool::builder()
        .addresses((1..=50).map(|i| format!("http://10.0.1.{i}:3128")))
        .config(cfg)
        .redis(RedisOptions::new(url, "bench").timeout(Duration::from_secs(5)))
        .connect()
        .await
        .unwrap()
}

/// Task `t`'s `i`th ticket: keyed ones over 2 000 keys.
pub(crate) fn ticket(keyed: bool, t: u64, i: u64) -> Ticket {
    if keyed {
        Ticket::new().key(format!("k{}", (t * 7919 + i) % 2_000))
    } else {
        Ticket::new()
    }
}

/// Task `t`'s `i`th success latency: latencies that vary, as real ones do (each success moves
/// the address's running figures; steady ones would leave nothing to write).
pub(crate) fn latency(t: u64, i: u64) -> Duration {
    Duration::from_millis(30 + (t * 31 + i * 17) % 100)
}
