//! Active probes (P12): a prober that schedules checks of the pool's addresses by their state
//! and feeds the results to [`Pool::report_probe`](crate::Pool::report_probe).
//!
//! This module (feature `probe`, on by default) is the only part of the crate that touches the
//! network; the engine still knows nothing of sockets or HTTP and sees a probe as a pass or a
//! fail. Schedules:
//! - idle healthy (or degraded) addresses every 30–60 s, at a random point of that range so
//!   probes never fire in sync; busy ones are not probed (their traffic speaks for them) and
//!   their timer restarts;
//! - quarantined addresses are left alone until their wait ends; the engine then moves them to
//!   probing, and they are probed every `probing_every` until the rise threshold (5 passes in a
//!   row) sends them to the half-open ramp, or a failure back to quarantine;
//! - dead addresses hourly (± 10 %);
//! - at most `concurrency` probes at once.
//!
//! If every probe of a round fails (at least two addresses, one of them in service), the
//! common factor is our side (P9): the round is reported as such and no result is fed to the
//! pool, so a network outage cannot quarantine the pool.

mod check;

pub use check::{Check, CheckError, CheckFuture, HttpGet, Majority, TcpConnect};

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::address::ProxyAddress;
use crate::clock::{Timestamp, millis};
use crate::error::PoolError;
use crate::health::HealthState;
use crate::pool::Pool;

/// How often each state is probed and how many probes may run at once.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ProbeSchedule {
    /// Idle healthy or degraded addresses: a random interval in this range.
    pub healthy_every: (Duration, Duration),
    /// Probing (half-open) addresses.
    pub probing_every: Duration,
    /// Dead addresses (± 10 %).
    pub dead_every: Duration,
    /// Probes in flight at once.
    pub concurrency: usize,
}

impl Default for ProbeSchedule {
    fn default() -> Self {
        Self {
            healthy_every: (Duration::from_secs(30), Duration::from_secs(60)),
            probing_every: Duration::from_secs(10),
            dead_every: Duration::from_secs(3600),
            concurrency: 16,
        }
    }
}

/// What one round found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Round {
    /// Each probed address (redacted) and whether it passed.
    pub probed: Vec<(String, bool)>,
    /// Every probe failed: blamed on our side, nothing was reported to the pool.
    pub our_side: bool,
}

/// Why a round could not finish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProbeError {
    /// The pool refused a report.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// A probe task panicked.
    #[error("probe task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

#[derive(Debug, Clone, Copy)]
struct Due {
    state: HealthState,
    at: Timestamp,
}

/// Probes the addresses of one pool on its clock. Drive it with [`Prober::round`] (tests, own
/// loops) or [`Prober::run`].
#[derive(Debug)]
pub struct Prober {
    pool: Pool,
    check: Arc<dyn Check>,
    schedule: ProbeSchedule,
    limit: Arc<Semaphore>,
    rng: Mutex<StdRng>,
    due: Mutex<HashMap<ProxyAddress, Due>>,
    metrics: ProbeMetrics,
}

/// `proxypool_probes_total{result="pass"|"fail"}` and
/// `proxypool_probe_rounds_failed_everywhere_total` (rounds blamed on our side): registered
/// with the prober, so that they are exported before the first probe.
#[derive(Debug)]
struct ProbeMetrics {
    passed: metrics::Counter,
    failed: metrics::Counter,
    failed_everywhere: metrics::Counter,
}

impl ProbeMetrics {
    fn new() -> Self {
        Self {
            passed: metrics::counter!("proxypool_probes_total", "result" => "pass"),
            failed: metrics::counter!("proxypool_probes_total", "result" => "fail"),
            failed_everywhere: metrics::counter!("proxypool_probe_rounds_failed_everywhere_total"),
        }
    }
}

impl Prober {
    /// A prober of `pool` running `check` (use [`Majority`] for several control endpoints).
    pub fn new(pool: Pool, check: Arc<dyn Check>, schedule: ProbeSchedule) -> Self {
        let permits = schedule.concurrency.max(1);
        Self {
            pool,
            check,
            schedule,
            limit: Arc::new(Semaphore::new(permits)),
            rng: Mutex::new(StdRng::from_os_rng()),
            due: Mutex::new(HashMap::new()),
            metrics: ProbeMetrics::new(),
        }
    }

    /// Seeds the random offsets, for reproducible schedules.
    pub fn seed(self, seed: u64) -> Self {
        Self {
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            ..self
        }
    }

    /// Probes every address due now, waits for the probes and reports them.
    pub async fn round(&self) -> Result<Round, ProbeError> {
        let now = self.pool.now();
        let targets = self.pool.probe_targets(now).await;
        let mut picked = Vec::new();
        {
            let mut due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
            due.retain(|a, _| targets.iter().any(|t| &t.address == a));
            for t in &targets {
                let fresh = due.get(&t.address).is_none_or(|d| d.state != t.state);
                if fresh {
                    let at = self.first_due(t.state, now);
                    due.insert(t.address.clone(), Due { state: t.state, at });
                }
                let Some(d) = due.get_mut(&t.address) else {
                    continue;
                };
                let in_service = matches!(t.state, HealthState::Healthy | HealthState::Degraded);
                if in_service && t.active_leases > 0 {
                    // Busy: its traffic speaks for it; probe it once it has been idle a while.
                    d.at = now.after(self.next_interval(t.state));
                } else if t.state != HealthState::Quarantined && d.at <= now {
                    picked.push((t.address.clone(), in_service));
                    d.at = now.after(self.next_interval(t.state));
                }
            }
        }
        let mut tasks = JoinSet::new();
        for (address, in_service) in picked {
            let (check, limit) = (Arc::clone(&self.check), Arc::clone(&self.limit));
            tasks.spawn(async move {
                // The semaphore is never closed, so acquiring only waits.
                let _permit = limit.acquire_owned().await.ok();
                let result = check.check(&address).await;
                (address, in_service, result)
            });
        }
        let mut results = Vec::new();
        while let Some(r) = tasks.join_next().await {
            results.push(r?);
        }
        let our_side = results.len() >= 2
            && results.iter().all(|(_, _, r)| r.is_err())
            && results.iter().any(|(_, in_service, _)| *in_service);
        if our_side {
            self.metrics.failed_everywhere.increment(1);
            tracing::warn!(
                target: "proxypool::decision",
                probed = results.len(),
                "pool: every probe of the round failed; blaming our side, nothing reported"
            );
        }
        let mut round = Round {
            probed: Vec::with_capacity(results.len()),
            our_side,
        };
        for (address, _, result) in results {
            let counter = if result.is_ok() {
                &self.metrics.passed
            } else {
                &self.metrics.failed
            };
            counter.increment(1);
            if let Err(e) = &result {
                tracing::debug!(target: "proxypool::probe", address = %address, error = %e, "probe failed");
            }
            if !our_side {
                self.pool.report_probe_of(&address, result.is_ok()).await?;
            }
            round
                .probed
                .push((address.redacted().to_owned(), result.is_ok()));
        }
        Ok(round)
    }

    /// Runs a round every `tick` forever (spawn it). A round that fails is logged and the next
    /// one goes on.
    pub async fn run(self, tick: Duration) {
        loop {
            if let Err(e) = self.round().await {
                tracing::warn!(target: "proxypool::probe", error = %e, "probe round failed");
            }
            tokio::time::sleep(tick).await;
        }
    }

    /// When an address newly seen in `state` is first probed.
    fn first_due(&self, state: HealthState, now: Timestamp) -> Timestamp {
        match state {
            // Half-open: at once, the rise threshold needs its passes.
            HealthState::Probing => now,
            _ => now.after(self.next_interval(state)),
        }
    }

    fn next_interval(&self, state: HealthState) -> Duration {
        let s = &self.schedule;
        let mut rng = self.rng.lock().unwrap_or_else(PoisonError::into_inner);
        let (lo, hi) = match state {
            HealthState::Probing => return s.probing_every,
            HealthState::Dead => {
                let tenth = millis(s.dead_every) / 10;
                let base = millis(s.dead_every);
                (base - tenth, base + tenth)
            }
            _ => (millis(s.healthy_every.0), millis(s.healthy_every.1)),
        };
        Duration::from_millis(if hi > lo {
            rng.random_range(lo..=hi)
        } else {
            lo
        })
    }
}
