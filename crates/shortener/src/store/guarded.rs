//! The store as the request path sees it: every call bounded by `--store-timeout-ms` (the wait
//! for a pooled connection included) and passed through a circuit breaker, so that a store
//! that is down, or accepts and never answers, costs a request at most the timeout — and
//! nothing at all while the breaker is open.
//!
//! A timed-out or refused call is [`StoreError::Unavailable`] (503, and stale serving in the
//! cache). A write that timed out may still commit on the server: the caller answered 503
//! without knowing (README, "Availability").
//!
//! Click batches are background work with retries of their own: they pass through unbounded.

use crate::breaker::{Breaker, Change, Refused};
use crate::metrics::Metrics;
use async_trait::async_trait;
use shortener_core::day::{Day, UnixSeconds};
use shortener_core::link::Link;
use shortener_core::store::{
    ClickBatch, ClickDelta, ClickSink, DailyCount, InsertOutcome, LinkStore, StoreError,
    TokenRecord,
};
use shortener_core::token::{Principal, TokenHash};
use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Store;

/// Failures in a row (errors meaning unavailable, or timeouts) that open the breaker.
const BREAKER_THRESHOLD: u32 = 3;
/// How long the store is left alone once the breaker opened, before one probe.
const BREAKER_OPEN: Duration = Duration::from_secs(1);

/// Default of `--store-timeout-ms`.
pub(crate) const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_millis(250);

#[derive(Debug, thiserror::Error)]
#[error("no answer from the store within {0:?}")]
struct TimedOut(Duration);

/// A store behind a deadline and a breaker.
#[derive(Debug)]
pub(crate) struct GuardedStore {
    inner: Arc<dyn Store>,
    timeout: Duration,
    breaker: Breaker,
    metrics: Arc<Metrics>,
    /// Only the primary's breaker is the `store_breaker_state` gauge.
    primary: bool,
}

impl GuardedStore {
    /// The primary store.
    pub(crate) fn new(inner: Arc<dyn Store>, timeout: Duration, metrics: Arc<Metrics>) -> Self {
        Self {
            inner,
            timeout,
            breaker: Breaker::new(BREAKER_THRESHOLD, BREAKER_OPEN),
            metrics,
            primary: true,
        }
    }

    /// A read replica: its own breaker, counted with the primary's but not its gauge.
    pub(crate) fn replica(inner: Arc<dyn Store>, timeout: Duration, metrics: Arc<Metrics>) -> Self {
        Self {
            primary: false,
            ..Self::new(inner, timeout, metrics)
        }
    }

    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let pass = self.breaker.admit(Instant::now()).map_err(|e: Refused| {
            self.metrics.store_refused.inc();
            StoreError::Unavailable(Box::new(e))
        })?;
        let outcome = match tokio::time::timeout(self.timeout, call).await {
            Ok(outcome) => outcome,
            Err(_) => {
                self.metrics.store_timeouts.inc();
                Err(StoreError::Unavailable(Box::new(TimedOut(self.timeout))))
            }
        };
        let healthy = !matches!(outcome, Err(StoreError::Unavailable(_)));
        match self.breaker.record(pass, healthy, Instant::now()) {
            Change::Opened => {
                self.metrics.store_breaker_opens.inc();
                tracing::warn!("store circuit breaker open: the store fails or does not answer");
            }
            Change::Closed => tracing::info!("store circuit breaker closed: the store answers"),
            Change::None => {}
        }
        if self.primary {
            self.metrics
                .store_breaker_state
                .set(self.breaker.phase().gauge());
        }
        outcome
    }
}

#[async_trait]
impl LinkStore for GuardedStore {
    async fn lease_ids(&self, count: u64) -> Result<Range<u64>, StoreError> {
        self.bounded(self.inner.lease_ids(count)).await
    }

    async fn code_key(&self, candidate: [u8; 16]) -> Result<[u8; 16], StoreError> {
        self.bounded(self.inner.code_key(candidate)).await
    }

    async fn insert_link(&self, link: &Link) -> Result<InsertOutcome, StoreError> {
        self.bounded(self.inner.insert_link(link)).await
    }

    async fn get_link(&self, code: &str) -> Result<Option<Link>, StoreError> {
        self.bounded(self.inner.get_link(code)).await
    }

    async fn disable_link(&self, code: &str, at: UnixSeconds) -> Result<bool, StoreError> {
        self.bounded(self.inner.disable_link(code, at)).await
    }

    async fn daily_clicks(&self, code: &str, since: Day) -> Result<Vec<DailyCount>, StoreError> {
        self.bounded(self.inner.daily_clicks(code, since)).await
    }

    async fn insert_token(&self, token: &TokenRecord) -> Result<(), StoreError> {
        self.bounded(self.inner.insert_token(token)).await
    }

    async fn find_token(&self, hash: &TokenHash) -> Result<Option<Principal>, StoreError> {
        self.bounded(self.inner.find_token(hash)).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.bounded(self.inner.ping()).await
    }
}

#[async_trait]
impl ClickSink for GuardedStore {
    async fn apply_clicks(&self, deltas: &[ClickDelta]) -> Result<(), StoreError> {
        self.inner.apply_clicks(deltas).await
    }

    async fn apply_click_batches(&self, batches: &[ClickBatch]) -> Result<usize, StoreError> {
        self.inner.apply_click_batches(batches).await
    }

    async fn prune_clicks_before(&self, day: Day) -> Result<u64, StoreError> {
        self.inner.prune_clicks_before(day).await
    }
}
