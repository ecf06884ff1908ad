//! Many tasks on a multi-threaded runtime hammer one pool with random outcomes and random
//! drops; afterwards (and while it runs) the invariants must hold exactly. Run against each
//! store by `stress.rs` and `stress_redis.rs` (`crate::STORE`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use proxypool::{ManualClock, Outcome, PoolConfig, Ticket};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::common;

const TASKS: u64 = 32;
const ROUNDS: usize = 400;
const CAP: u32 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stress_many_tasks_random_outcomes_and_drops() {
    let clock = ManualClock::new();
    let mut cfg = PoolConfig::default();
    cfg.max_leases_per_address = CAP;
    let pool = common::pool_with(20, &clock, cfg).await;
    let done = Arc::new(AtomicBool::new(false));

    let checker = {
        let (pool, done) = (pool.clone(), Arc::clone(&done));
        tokio::spawn(async move {
            let mut checks = 0;
            while !done.load(Ordering::Acquire) {
                let snap = pool.snapshot().await;
                let p = &snap.pool;
                assert!(p.quarantined <= p.quarantine_cap);
                assert!(p.offered >= 2);
                assert!(snap.addresses.iter().all(|a| a.active_leases <= CAP));
                let sum: u64 = snap
                    .addresses
                    .iter()
                    .map(|a| u64::from(a.active_leases))
                    .sum();
                assert_eq!(sum, p.active_leases);
                checks += 1;
                tokio::task::yield_now().await;
            }
            checks
        })
    };

    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (pool, clock) = (pool.clone(), clock.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(t);
            let mut held = Vec::new();
            for _ in 0..ROUNDS {
                let mut ticket = Ticket::new().site(format!("s{}", rng.random_range(0..3)));
                if rng.random_bool(0.3) {
                    ticket = ticket.key(format!("k{}", rng.random_range(0..50)));
                }
                if let Ok(lease) = pool.acquire(ticket).await {
                    held.push(lease);
                }
                if !held.is_empty() && (held.len() > 2 || rng.random_bool(0.5)) {
                    let lease = held.swap_remove(rng.random_range(0..held.len()));
                    let outcome = match rng.random_range(0..10) {
                        0 => Outcome::ConnectError,
                        1 => Outcome::Timeout,
                        2 => Outcome::Captcha,
                        3 => Outcome::RateLimited {
                            retry_after: Duration::from_secs(1),
                        },
                        _ => Outcome::Success {
                            latency: Duration::from_millis(rng.random_range(50..300)),
                        },
                    };
                    if rng.random_bool(0.1) {
                        drop(lease);
                    } else {
                        lease.release(outcome).await.unwrap();
                    }
                }
                if rng.random_bool(0.05) {
                    clock.advance(Duration::from_secs(1));
                }
                tokio::task::yield_now().await;
            }
            held.len()
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    done.store(true, Ordering::Release);
    assert!(checker.await.unwrap() > 0);

    // Every lease was released or dropped when its task ended: nothing is left out.
    let snap = pool.snapshot().await;
    assert_eq!(snap.pool.active_leases, 0);
    assert!(snap.addresses.iter().all(|a| a.active_leases == 0));
    let p = &snap.pool;
    // Every lease ended one way or another (a late release of an expired lease counts twice).
    assert!(p.acquired <= p.released + p.abandoned + p.expired);
    assert!(p.released > 0 && p.abandoned > 0);
    assert!(p.quarantined <= p.quarantine_cap);
}
