//! The store as the request path sees it: every call bounded by `--store-timeout-ms` (the wait
//! for a pooled connection included) and passed through a circuit breaker, so that a store
//! that is down, or accepts and never answers, costs a request at most the timeout — and
//! nothing at all while the breaker is open.
//!
//! A timed-out or refused call is [`StoreError::Unavailable`] (503, and stale serving in the
//! cache). A write that timed out may still commit on the server: the caller answered 503
//! without knowing (README, "Availability").
//!
//! Click batches, pruning and feed sweeps are background work with retries of their own: they
//! pass through unbounded.

use crate::breaker::{Breaker, Change, Refused};
use crate::metrics::Metrics;
use async_trait::async_trait;
use shortener_core::audit::{AuditQuery, AuditRow, Origin};
use shortener_core::day::{Day, UnixSeconds};
use shortener_core::link::{Link, LinkChange, RedirectTarget};
use shortener_core::listing::{LinkQuery, PageOfLinks};
use shortener_core::report::{
    AutoDisable, NewReport, Report, ReportOutcome, ReportQuery, Resolution, ResolveOutcome,
};
use shortener_core::store::{
    ChangeNote, ChangeOutcome, ClickBatch, ClickDelta, ClickSink, DailyCount, FoundToken,
    ImportBatch, ImportOutcome, InsertOutcome, LinkStore, StoreError, TokenInfo, TokenRecord,
};
use shortener_core::token::{TokenHash, TokenId};
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

    async fn secret(&self, name: &'static str, candidate: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        self.bounded(self.inner.secret(name, candidate)).await
    }

    async fn spend_once(
        &self,
        token: &str,
        until: UnixSeconds,
        now: UnixSeconds,
    ) -> Result<bool, StoreError> {
        self.bounded(self.inner.spend_once(token, until, now)).await
    }

    async fn take_lease(
        &self,
        name: &str,
        holder: &str,
        work: &str,
        until: UnixSeconds,
        now: UnixSeconds,
    ) -> Result<bool, StoreError> {
        // Background work, off every request's path.
        self.inner.take_lease(name, holder, work, until, now).await
    }

    async fn end_lease(
        &self,
        name: &str,
        holder: &str,
        done: Option<&str>,
    ) -> Result<(), StoreError> {
        self.inner.end_lease(name, holder, done).await
    }

    async fn insert_link(&self, link: &Link, origin: &Origin) -> Result<InsertOutcome, StoreError> {
        self.bounded(self.inner.insert_link(link, origin)).await
    }

    async fn import_links(&self, batch: Arc<ImportBatch>) -> Result<ImportOutcome, StoreError> {
        // Never on a request's path: a batch takes as long as it takes.
        self.inner.import_links(batch).await
    }

    async fn after_import(&self) -> Result<Option<&'static str>, StoreError> {
        // Never on a request's path either.
        self.inner.after_import().await
    }

    async fn meta(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.bounded(self.inner.meta(key)).await
    }

    async fn get_link(&self, code: &str) -> Result<Option<Link>, StoreError> {
        self.bounded(self.inner.get_link(code)).await
    }

    async fn redirect_target(&self, code: &str) -> Result<Option<RedirectTarget>, StoreError> {
        self.bounded(self.inner.redirect_target(code)).await
    }

    async fn redirect_targets(
        &self,
        codes: &[String],
    ) -> Result<Vec<Option<RedirectTarget>>, StoreError> {
        self.bounded(self.inner.redirect_targets(codes)).await
    }

    async fn list_links(&self, query: &LinkQuery) -> Result<PageOfLinks, StoreError> {
        self.bounded(self.inner.list_links(query)).await
    }

    async fn change_link(
        &self,
        code: &str,
        change: &LinkChange,
        origin: &Origin,
        now: UnixSeconds,
    ) -> Result<ChangeOutcome, StoreError> {
        self.bounded(self.inner.change_link(code, change, origin, now))
            .await
    }

    async fn last_change(&self) -> Result<u64, StoreError> {
        self.bounded(self.inner.last_change()).await
    }

    async fn changes_after(&self, seq: u64, limit: usize) -> Result<Vec<ChangeNote>, StoreError> {
        self.bounded(self.inner.changes_after(seq, limit)).await
    }

    // Background work, with retries of its own: unbounded here.
    async fn number_pending_changes(&self) -> Result<u64, StoreError> {
        self.inner.number_pending_changes().await
    }

    async fn prune_changes_before(&self, at: UnixSeconds, batch: usize) -> Result<u64, StoreError> {
        self.inner.prune_changes_before(at, batch).await
    }

    async fn live_destinations_after(
        &self,
        after: &str,
        limit: usize,
    ) -> Result<Vec<(String, String)>, StoreError> {
        self.inner.live_destinations_after(after, limit).await
    }

    async fn audit(&self, query: &AuditQuery) -> Result<Vec<AuditRow>, StoreError> {
        self.bounded(self.inner.audit(query)).await
    }

    async fn prune_audit_before(&self, at: UnixSeconds, batch: usize) -> Result<u64, StoreError> {
        self.inner.prune_audit_before(at, batch).await
    }

    async fn daily_clicks(&self, code: &str, since: Day) -> Result<Vec<DailyCount>, StoreError> {
        self.bounded(self.inner.daily_clicks(code, since)).await
    }

    async fn insert_report(
        &self,
        report: &NewReport,
        origin: &Origin,
        auto: Option<AutoDisable>,
    ) -> Result<ReportOutcome, StoreError> {
        self.bounded(self.inner.insert_report(report, origin, auto))
            .await
    }

    async fn reports(&self, query: &ReportQuery) -> Result<Vec<Report>, StoreError> {
        self.bounded(self.inner.reports(query)).await
    }

    async fn resolve_report(
        &self,
        id: i64,
        resolution: &Resolution,
    ) -> Result<ResolveOutcome, StoreError> {
        self.bounded(self.inner.resolve_report(id, resolution))
            .await
    }

    async fn insert_token(&self, token: &TokenRecord, origin: &Origin) -> Result<(), StoreError> {
        self.bounded(self.inner.insert_token(token, origin)).await
    }

    async fn find_token(&self, hash: &TokenHash) -> Result<Option<FoundToken>, StoreError> {
        self.bounded(self.inner.find_token(hash)).await
    }

    async fn touch_token(&self, hash: &TokenHash, at: UnixSeconds) -> Result<(), StoreError> {
        self.bounded(self.inner.touch_token(hash, at)).await
    }

    async fn list_tokens(&self) -> Result<Vec<TokenInfo>, StoreError> {
        self.bounded(self.inner.list_tokens()).await
    }

    async fn revoke_token(
        &self,
        id: TokenId,
        origin: &Origin,
        at: UnixSeconds,
    ) -> Result<Option<TokenInfo>, StoreError> {
        self.bounded(self.inner.revoke_token(id, origin, at)).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.bounded(self.inner.ping()).await
    }
}

#[async_trait]
impl ClickSink for GuardedStore {
    async fn apply_clicks(&self, deltas: Vec<ClickDelta>) -> Result<(), StoreError> {
        self.inner.apply_clicks(deltas).await
    }

    async fn apply_click_batches(&self, batches: &[ClickBatch]) -> Result<usize, StoreError> {
        self.inner.apply_click_batches(batches).await
    }

    async fn prune_clicks_before(&self, day: Day) -> Result<u64, StoreError> {
        self.inner.prune_clicks_before(day).await
    }
}
