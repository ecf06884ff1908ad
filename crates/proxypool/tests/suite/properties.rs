//! Property tests: random sequences of operations on a pool driven by a manual clock, with the
//! invariants checked after every step. Run against each store by `properties.rs` and
//! `properties_redis.rs` (`crate::STORE`, `crate::CASES`).

use std::collections::HashMap;
use std::time::Duration;

use crate::common;
use common::addr;
use proptest::prelude::*;
use proxypool::{AcquireError, Choice, Lease, ManualClock, Outcome, Pool, PoolConfig, Ticket};

#[derive(Debug, Clone)]
enum Op {
    Acquire { key: Option<u8>, site: u8 },
    Release { index: usize, outcome: u8 },
    Drop { index: usize },
    Advance { secs: u16 },
    Remove { address: u8 },
    Add { address: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (prop::option::of(0u8..12), 0u8..3).prop_map(|(key, site)| Op::Acquire { key, site }),
        6 => (any::<usize>(), 0u8..12).prop_map(|(index, outcome)| Op::Release { index, outcome }),
        1 => any::<usize>().prop_map(|index| Op::Drop { index }),
        2 => (0u16..400).prop_map(|secs| Op::Advance { secs }),
        1 => (0u8..10).prop_map(|address| Op::Remove { address }),
        1 => (0u8..10).prop_map(|address| Op::Add { address }),
    ]
}

fn outcome(n: u8) -> Outcome {
    match n {
        0..=4 => Outcome::Success {
            latency: Duration::from_millis(50 + u64::from(n) * 40),
        },
        5 | 6 => Outcome::ConnectError,
        7 => Outcome::Timeout,
        8 => Outcome::Blocked,
        9 | 10 => Outcome::Captcha,
        _ => Outcome::RateLimited {
            retry_after: Duration::from_secs(20),
        },
    }
}

struct Held {
    lease: Lease,
    deadline_ms: u64,
}

struct Model {
    clock: ManualClock,
    pool: Pool,
    held: Vec<Held>,
    present: Vec<bool>,
    /// key → (address, ms of last use)
    bound: HashMap<u8, (String, u64)>,
}

const TTL_MS: u64 = 15 * 60 * 1000;
const LEASE_MS: u64 = 5 * 60 * 1000;

impl Model {
    fn now(&self) -> u64 {
        use proxypool::Clock;
        self.clock.now().as_millis()
    }

    async fn apply(&mut self, op: Op) {
        match op {
            Op::Acquire { key, site } => {
                let mut t = Ticket::new().site(format!("site{site}.example"));
                if let Some(k) = key {
                    t = t.key(format!("key{k}"));
                }
                let now = self.now();
                let live = key
                    .and_then(|k| self.bound.get(&k))
                    .filter(|(_, used)| now < used + TTL_MS)
                    .cloned();
                match self.pool.acquire(t).await {
                    Ok(lease) => {
                        if let Some(k) = key {
                            let a = lease.address().as_str().to_owned();
                            if let Some((was, _)) = &live {
                                // P2: a live binding never moves.
                                assert_eq!((&a, lease.choice()), (was, Choice::Bound));
                            } else {
                                assert_eq!(lease.choice(), Choice::Hashed);
                            }
                            self.bound.insert(k, (a, now));
                        }
                        self.held.push(Held {
                            lease,
                            deadline_ms: now + LEASE_MS,
                        });
                    }
                    Err(AcquireError::SessionBroken { address, .. }) => {
                        let k = key.unwrap();
                        assert_eq!(live.unwrap().0, address.as_str());
                        self.bound.remove(&k);
                    }
                    Err(
                        AcquireError::BoundAddressBusy { .. }
                        | AcquireError::BoundAddressCooling { .. },
                    ) => {
                        assert!(live.is_some());
                    }
                    Err(AcquireError::NoAddressAvailable) => {}
                    Err(e) => panic!("{e}"),
                }
            }
            Op::Release { index, outcome: o } => {
                if !self.held.is_empty() {
                    let h = self.held.swap_remove(index % self.held.len());
                    h.lease.release(outcome(o)).await.unwrap();
                }
            }
            Op::Drop { index } => {
                if !self.held.is_empty() {
                    drop(self.held.swap_remove(index % self.held.len()));
                }
            }
            Op::Advance { secs } => self.clock.advance(Duration::from_secs(u64::from(secs))),
            Op::Remove { address } => {
                let i = usize::from(address);
                let r = self.pool.remove(&addr(i)).await;
                assert_eq!(r.is_ok(), self.present[i]);
                self.present[i] = false;
            }
            Op::Add { address } => {
                let i = usize::from(address);
                let r = self.pool.add(&addr(i)).await;
                assert_eq!(r.is_ok(), !self.present[i]);
                self.present[i] = true;
            }
        }
    }

    async fn check(&self) {
        let snap = self.pool.snapshot().await;
        let now = self.now();
        let p = &snap.pool;
        // Leases: exactly the ones we hold and that have not expired (P14).
        let out = self.held.iter().filter(|h| h.deadline_ms > now).count() as u64;
        assert_eq!(p.active_leases, out);
        let per_address: u64 = snap
            .addresses
            .iter()
            .map(|a| u64::from(a.active_leases))
            .sum();
        assert!(per_address <= out);
        let on_present = self
            .held
            .iter()
            .filter(|h| h.deadline_ms > now && snap.address(h.lease.address().redacted()).is_some())
            .count() as u64;
        assert!(per_address <= on_present);
        // P7 and P8.
        assert!(p.quarantined <= p.quarantine_cap, "{p:?}");
        assert!(p.offered >= p.addresses.min(2), "{p:?}");
        assert_eq!(
            snap.addresses.len(),
            self.present.iter().filter(|x| **x).count()
        );
    }
}

fn run(ops: Vec<Op>) {
    let rt = common::runtime();
    rt.block_on(async {
        let clock = ManualClock::new();
        let mut cfg = PoolConfig::default();
        cfg.max_leases_per_address = 3;
        let pool = common::pool_with(8, &clock, cfg).await;
        let mut present = vec![false; 10];
        present[..8].iter_mut().for_each(|p| *p = true);
        let mut m = Model {
            clock,
            pool,
            held: Vec::new(),
            present,
            bound: HashMap::new(),
        };
        for op in ops {
            m.apply(op).await;
            m.check().await;
        }
        // Everything back: no lease counted anywhere.
        let held = std::mem::take(&mut m.held);
        for (i, h) in held.into_iter().enumerate() {
            if i % 2 == 0 {
                h.lease.release(outcome(0)).await.unwrap()
            } else {
                drop(h)
            }
        }
        let snap = m.pool.snapshot().await;
        assert_eq!(snap.pool.active_leases, 0);
        assert!(snap.addresses.iter().all(|a| a.active_leases == 0));
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: crate::CASES, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_under_any_sequence(ops in prop::collection::vec(op(), 1..300)) {
        run(ops);
    }
}
