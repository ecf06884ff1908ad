//! Read replicas (`--database-replica`): redirect misses, link reads and analytics go to a
//! healthy replica, every write (and token lookups) to the primary.
//!
//! - *Regions*: the change sequence is read from the replica, where each note arrives with
//!   the change it describes, so a region's caches follow its own replica.
//! - *Read your writes*: a code this instance created or changed, or that another instance
//!   announced as changed, is read from the primary for as long as a replica may not have it
//!   yet (the lag bound plus two probes). Tokens are looked up on the primary, so that a
//!   revoke is seen within the API's token cache life whatever a replica's lag.
//! - *Health*: a monitor samples the primary's log position and each replica's replayed
//!   position every [`PROBE_EVERY`]; a replica's lag is how long ago the primary passed the
//!   position the replica has replayed (so an idle primary means no lag, unlike replay
//!   timestamps). A replica past `--replica-max-lag-ms`, or that fails or does not answer,
//!   is skipped until a probe finds it back. While the primary itself does not answer, lag
//!   cannot be measured and replicas that answer stay in use: they are all there is. A
//!   replica that does not answer at start does not stop the start: it is skipped (a warning,
//!   its health metric 0, `/readyz` names it) until the monitor reaches it.
//! - A replica read that fails moves on to the next replica, then to the primary; a read of a
//!   recently written code that the primary cannot answer takes a replica's link if it has it.

use super::Store;
use super::guarded::GuardedStore;
use super::postgres::{DatabaseUrl, OpenError, PgStore};
use crate::metrics::Metrics;
use async_trait::async_trait;
use futures_util::future::BoxFuture;
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
use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How often the monitor measures the replicas.
pub(crate) const PROBE_EVERY: Duration = Duration::from_millis(250);
/// Codes remembered as written here at most; past this, the oldest expired ones go first
/// and then the newest write wins over nothing (reads then may miss on a lagging replica).
const MAX_RECENT: usize = 100_000;

/// One replica, opened at start or, if it did not answer then, by the monitor later.
#[derive(Debug)]
struct Replica {
    name: String,
    url: DatabaseUrl,
    opened: OnceLock<Opened>,
    healthy: AtomicBool,
}

/// A bounded store for reads, a pool of its own for the monitor's probes.
#[derive(Debug)]
struct Opened {
    reads: GuardedStore,
    probe: PgStore,
}

/// How a replica's pools are opened (again).
#[derive(Debug)]
struct Opening {
    pool_size: usize,
    timeout: Duration,
    metrics: Arc<Metrics>,
}

impl Opening {
    /// Both pools, once the replica answers with this binary's schema.
    async fn open(&self, url: &DatabaseUrl) -> Result<Opened, OpenError> {
        let reads = PgStore::open_bounded(url, self.pool_size, Some(self.timeout)).await?;
        let probe = PgStore::open_bounded(url, 1, Some(self.timeout)).await?;
        Ok(Opened {
            reads: GuardedStore::replica(Arc::new(reads), self.timeout, self.metrics.clone()),
            probe,
        })
    }
}

/// The primary's log positions over the last few probes, oldest first.
#[derive(Debug, Default)]
struct Samples(VecDeque<(Instant, u64)>);

impl Samples {
    fn push(&mut self, at: Instant, position: u64, keep: Duration) {
        self.0.push_back((at, position));
        // Keep one sample older than `keep`, so that a lag of `keep` is still measurable.
        while self.0.len() > 2 && self.0[1].0 + keep < at {
            self.0.pop_front();
        }
    }

    /// How far behind a replica that replayed up to `replayed` is at `now`: since when the
    /// primary has been past that point (`None`: no recent sample of the primary).
    fn lag(&self, replayed: u64, now: Instant, fresh: Duration) -> Option<Duration> {
        let &(newest_at, _) = self.0.back()?;
        if newest_at + fresh < now {
            return None;
        }
        let ahead_since = self
            .0
            .iter()
            .find(|&&(_, position)| position > replayed)
            .map(|&(at, _)| at);
        Some(ahead_since.map_or(Duration::ZERO, |at| now.saturating_duration_since(at)))
    }
}

/// The store as `serve` sees it with replicas: the primary for writes, replicas for reads.
#[derive(Debug)]
pub(crate) struct Replicated {
    primary: Arc<dyn Store>,
    /// A pool of one on the primary for the monitor's log positions.
    primary_probe: PgStore,
    replicas: Vec<Replica>,
    opening: Opening,
    max_lag: Duration,
    samples: Mutex<Samples>,
    /// Codes written by this instance, until when they are read from the primary.
    recent: Mutex<HashMap<String, Instant>>,
    next: AtomicUsize,
    metrics: Arc<Metrics>,
}

type Read<'a, T> = BoxFuture<'a, Result<T, StoreError>>;

impl Replicated {
    /// Opens every replica behind `primary` and measures them once. A replica must carry this
    /// binary's schema, like the primary; one that does not answer is skipped until it does.
    pub(crate) async fn open(
        primary: Arc<dyn Store>,
        primary_url: &DatabaseUrl,
        replica_urls: &[DatabaseUrl],
        pool_size: usize,
        timeout: Duration,
        max_lag: Duration,
        metrics: Arc<Metrics>,
    ) -> Result<Self, OpenError> {
        let primary_probe = PgStore::open_bounded(primary_url, 1, Some(timeout)).await?;
        let opening = Opening {
            pool_size,
            timeout,
            metrics: metrics.clone(),
        };
        let mut replicas = Vec::with_capacity(replica_urls.len());
        for url in replica_urls {
            let replica = Replica {
                name: url.to_string(),
                url: url.clone(),
                opened: OnceLock::new(),
                // Until the first probe says otherwise.
                healthy: AtomicBool::new(true),
            };
            match opening.open(url).await {
                Ok(opened) => {
                    let _ = replica.opened.set(opened);
                }
                Err(e @ OpenError::Unreachable { .. }) => {
                    tracing::warn!(replica = %replica.name, error = %e, "read replica does not answer; skipped until it does");
                    replica.healthy.store(false, Ordering::Relaxed);
                    metrics.set_replica(&replica.name, false, None);
                }
                Err(e) => return Err(e),
            }
            replicas.push(replica);
        }
        let replicated = Self {
            primary,
            primary_probe,
            replicas,
            opening,
            max_lag,
            samples: Mutex::default(),
            recent: Mutex::default(),
            next: AtomicUsize::new(0),
            metrics,
        };
        replicated.probe().await;
        Ok(replicated)
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.recent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Remembers that `code` just changed (written here, or announced by another instance):
    /// it is read from the primary until every replica in use must have the change.
    pub(crate) fn changed(&self, code: &str) {
        let now = Instant::now();
        let until = now + self.max_lag + 2 * PROBE_EVERY;
        let mut recent = self.recent();
        if recent.len() >= MAX_RECENT {
            recent.retain(|_, until| *until > now);
        }
        if recent.len() < MAX_RECENT || recent.contains_key(code) {
            recent.insert(code.to_owned(), until);
        }
    }

    fn written_recently(&self, code: &str) -> bool {
        let mut recent = self.recent();
        match recent.get(code) {
            Some(until) if *until > Instant::now() => true,
            Some(_) => {
                recent.remove(code);
                false
            }
            None => false,
        }
    }

    /// `read` on the healthy replicas in turn (from a rotating start), then on the primary;
    /// `use_answer` says whether a replica's answer stands (else the primary is asked).
    async fn read<'c, T>(
        &'c self,
        read: impl Fn(&'c dyn Store) -> Read<'c, T>,
        use_answer: impl Fn(&T) -> bool,
    ) -> Result<T, StoreError> {
        self.read_tagged(read, use_answer)
            .await
            .map(|(answer, _)| answer)
    }

    /// `read` on the primary while `written_here` (what it reads may be newer there than on a
    /// replica: read your writes), else as [`Self::read`]. With the primary away, a replica's
    /// answer stands in if `stands_in` accepts it; otherwise the primary's error stands.
    async fn read_own_writes<'c, T>(
        &'c self,
        written_here: bool,
        read: impl Fn(&'c dyn Store) -> Read<'c, T>,
        stands_in: impl Fn(&T) -> bool,
    ) -> Result<T, StoreError> {
        if !written_here {
            return self.read(read, |_| true).await;
        }
        self.metrics.primary_reads.inc();
        match read(&*self.primary).await {
            Err(e @ StoreError::Unavailable(_)) => match self.read(read, &stands_in).await {
                Ok(answer) if stands_in(&answer) => Ok(answer),
                _ => Err(e),
            },
            answer => answer,
        }
    }

    /// [`Self::read`], saying whether a replica answered (`false`: the primary).
    async fn read_tagged<'c, T>(
        &'c self,
        read: impl Fn(&'c dyn Store) -> Read<'c, T>,
        use_answer: impl Fn(&T) -> bool,
    ) -> Result<(T, bool), StoreError> {
        if let Some(answer) = self.replica_read(&read, use_answer).await? {
            return Ok((answer, true));
        }
        self.metrics.primary_reads.inc();
        read(&*self.primary).await.map(|answer| (answer, false))
    }

    /// `read` on the healthy replicas in turn (from a rotating start); `None` when none
    /// answered or `use_answer` refused an answer.
    async fn replica_read<'c, T>(
        &'c self,
        read: &impl Fn(&'c dyn Store) -> Read<'c, T>,
        use_answer: impl Fn(&T) -> bool,
    ) -> Result<Option<T>, StoreError> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let count = self.replicas.len();
        for i in 0..count {
            let replica = &self.replicas[(start + i) % count];
            let Some(opened) = replica.opened.get() else {
                continue;
            };
            if !replica.healthy.load(Ordering::Relaxed) {
                continue;
            }
            match read(&opened.reads).await {
                Ok(answer) if use_answer(&answer) => {
                    self.metrics.replica_reads.inc();
                    return Ok(Some(answer));
                }
                Ok(_) => break,
                Err(StoreError::Unavailable(e)) => {
                    tracing::debug!(replica = %replica.name, error = %e, "replica read failed; trying the next");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// Measures every replica once.
    pub(crate) async fn probe(&self) {
        let timeout = PROBE_EVERY * 2;
        let primary = tokio::time::timeout(timeout, self.primary_probe.wal_position()).await;
        // Taken out for the probes (the monitor is their only user): no lock across awaits.
        let samples = {
            let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
            if let Ok(Ok(position)) = primary {
                samples.push(Instant::now(), position, self.max_lag + timeout);
            }
            std::mem::take(&mut *samples)
        };
        for replica in &self.replicas {
            let Some(opened) = self.opened(replica, timeout).await else {
                continue;
            };
            let replayed = tokio::time::timeout(timeout, opened.probe.wal_position()).await;
            let (healthy, lag) = match replayed {
                Ok(Ok(replayed)) => {
                    match samples.lag(replayed, Instant::now(), timeout + PROBE_EVERY) {
                        Some(lag) => (lag <= self.max_lag, Some(lag)),
                        None => (true, None),
                    }
                }
                _ => (false, None),
            };
            let was = replica.healthy.swap(healthy, Ordering::Relaxed);
            if was != healthy {
                tracing::warn!(replica = %replica.name, healthy, ?lag, "replica health changed");
            }
            let lag_ms = lag.map(|l| u64::try_from(l.as_millis()).unwrap_or(u64::MAX));
            self.metrics.set_replica(&replica.name, healthy, lag_ms);
        }
        *self.samples.lock().unwrap_or_else(|p| p.into_inner()) = samples;
    }

    /// The replica's pools, opening them first if the replica did not answer before.
    async fn opened<'r>(&self, replica: &'r Replica, timeout: Duration) -> Option<&'r Opened> {
        if let Some(opened) = replica.opened.get() {
            return Some(opened);
        }
        match tokio::time::timeout(timeout, self.opening.open(&replica.url)).await {
            Ok(Ok(opened)) => {
                tracing::info!(replica = %replica.name, "read replica answers now");
                // The monitor is the only opener: the cell is still empty.
                Some(replica.opened.get_or_init(|| opened))
            }
            Ok(Err(e)) => {
                tracing::debug!(replica = %replica.name, error = %e, "read replica still not open");
                None
            }
            Err(_) => None,
        }
    }

    /// Each replica's name and whether reads go to it now (for `/readyz`).
    pub(crate) fn health(&self) -> Vec<(&str, bool)> {
        self.replicas
            .iter()
            .map(|r| {
                let in_use = r.opened.get().is_some() && r.healthy.load(Ordering::Relaxed);
                (r.name.as_str(), in_use)
            })
            .collect()
    }

    /// Probes forever.
    pub(crate) async fn monitor_forever(self: Arc<Self>) {
        let mut tick = tokio::time::interval(PROBE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.probe().await;
        }
    }
}

#[async_trait]
impl LinkStore for Replicated {
    async fn lease_ids(&self, count: u64) -> Result<Range<u64>, StoreError> {
        self.primary.lease_ids(count).await
    }

    async fn secret(&self, name: &'static str, candidate: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        self.primary.secret(name, candidate).await
    }

    async fn spend_once(
        &self,
        token: &str,
        until: UnixSeconds,
        now: UnixSeconds,
    ) -> Result<bool, StoreError> {
        self.primary.spend_once(token, until, now).await
    }

    async fn take_lease(
        &self,
        name: &str,
        holder: &str,
        work: &str,
        until: UnixSeconds,
        now: UnixSeconds,
    ) -> Result<bool, StoreError> {
        self.primary
            .take_lease(name, holder, work, until, now)
            .await
    }

    async fn end_lease(
        &self,
        name: &str,
        holder: &str,
        done: Option<&str>,
    ) -> Result<(), StoreError> {
        self.primary.end_lease(name, holder, done).await
    }

    async fn insert_link(&self, link: &Link, origin: &Origin) -> Result<InsertOutcome, StoreError> {
        // Before the write: a read between its commit and its answer must find it too. A
        // timed-out insert may have committed, so it is remembered whatever the outcome.
        self.changed(&link.code);
        self.primary.insert_link(link, origin).await
    }

    async fn import_links(&self, batch: Arc<ImportBatch>) -> Result<ImportOutcome, StoreError> {
        self.primary.import_links(batch).await
    }

    async fn after_import(&self) -> Result<Option<&'static str>, StoreError> {
        self.primary.after_import().await
    }

    async fn meta(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.primary.meta(key).await
    }

    // With the primary away, a replica that already has the link beats a 503; one that does
    // not may only be behind, so its "unknown" is not an answer.
    async fn get_link(&self, code: &str) -> Result<Option<Link>, StoreError> {
        let written = self.written_recently(code);
        self.read_own_writes(written, |store| store.get_link(code), Option::is_some)
            .await
    }

    async fn redirect_target(&self, code: &str) -> Result<Option<RedirectTarget>, StoreError> {
        let written = self.written_recently(code);
        self.read_own_writes(
            written,
            |store| store.redirect_target(code),
            Option::is_some,
        )
        .await
    }

    /// All on the primary while any of `codes` may be newer there; with the primary away, a
    /// replica's answer that has every one of those (its other answers may be older: the
    /// change poll compares versions, the cache's renewals go by generations).
    async fn redirect_targets(
        &self,
        codes: &[String],
    ) -> Result<Vec<Option<RedirectTarget>>, StoreError> {
        let written: Vec<bool> = codes
            .iter()
            .map(|code| self.written_recently(code))
            .collect();
        let has_written = |targets: &Vec<Option<RedirectTarget>>| {
            targets
                .iter()
                .zip(&written)
                .all(|(target, written)| target.is_some() || !written)
        };
        self.read_own_writes(
            written.contains(&true),
            |store| store.redirect_targets(codes),
            has_written,
        )
        .await
    }

    async fn change_link(
        &self,
        code: &str,
        change: &LinkChange,
        origin: &Origin,
        now: UnixSeconds,
    ) -> Result<ChangeOutcome, StoreError> {
        self.changed(code);
        self.primary.change_link(code, change, origin, now).await
    }

    /// The region's replica: its notes arrive with the data they describe.
    async fn last_change(&self) -> Result<u64, StoreError> {
        self.read(|store| store.last_change(), |_| true).await
    }

    async fn changes_after(&self, seq: u64, limit: usize) -> Result<Vec<ChangeNote>, StoreError> {
        let (notes, from_replica) = self
            .read_tagged(|store| store.changes_after(seq, limit), |_| true)
            .await?;
        if !from_replica {
            // Notes from the primary may be ahead of every replica: read those codes there.
            for note in &notes {
                self.changed(&note.code);
            }
        }
        Ok(notes)
    }

    async fn number_pending_changes(&self) -> Result<u64, StoreError> {
        self.primary.number_pending_changes().await
    }

    async fn prune_changes_before(&self, at: UnixSeconds, batch: usize) -> Result<u64, StoreError> {
        self.primary.prune_changes_before(at, batch).await
    }

    async fn live_destinations_after(
        &self,
        after: &str,
        limit: usize,
    ) -> Result<Vec<(String, String)>, StoreError> {
        self.read(
            |store| store.live_destinations_after(after, limit),
            |_| true,
        )
        .await
    }

    /// The primary, as every moderation read: what an admin just did shows at once.
    async fn audit(&self, query: &AuditQuery) -> Result<Vec<AuditRow>, StoreError> {
        self.primary.audit(query).await
    }

    // The primary: a link just created or edited shows in its owner's list at once.
    async fn list_links(&self, query: &LinkQuery) -> Result<PageOfLinks, StoreError> {
        self.primary.list_links(query).await
    }

    async fn prune_audit_before(&self, at: UnixSeconds, batch: usize) -> Result<u64, StoreError> {
        self.primary.prune_audit_before(at, batch).await
    }

    async fn daily_clicks(&self, code: &str, since: Day) -> Result<Vec<DailyCount>, StoreError> {
        self.read(|store| store.daily_clicks(code, since), |_| true)
            .await
    }

    async fn insert_report(
        &self,
        report: &NewReport,
        origin: &Origin,
        auto: Option<AutoDisable>,
    ) -> Result<ReportOutcome, StoreError> {
        // It may disable the link.
        self.changed(&report.code);
        self.primary.insert_report(report, origin, auto).await
    }

    async fn reports(&self, query: &ReportQuery) -> Result<Vec<Report>, StoreError> {
        self.primary.reports(query).await
    }

    async fn resolve_report(
        &self,
        id: i64,
        resolution: &Resolution,
    ) -> Result<ResolveOutcome, StoreError> {
        self.primary.resolve_report(id, resolution).await
    }

    async fn insert_token(&self, token: &TokenRecord, origin: &Origin) -> Result<(), StoreError> {
        self.primary.insert_token(token, origin).await
    }

    async fn touch_token(&self, hash: &TokenHash, at: UnixSeconds) -> Result<(), StoreError> {
        self.primary.touch_token(hash, at).await
    }

    async fn list_tokens(&self) -> Result<Vec<TokenInfo>, StoreError> {
        self.primary.list_tokens().await
    }

    async fn revoke_token(
        &self,
        id: TokenId,
        origin: &Origin,
        at: UnixSeconds,
    ) -> Result<Option<TokenInfo>, StoreError> {
        self.primary.revoke_token(id, origin, at).await
    }

    /// On the primary, so that a revoke counts whatever a replica's lag (callers cache the
    /// answer briefly, so this is rare). A replica answers only while the primary does not; a
    /// revoke made just before such an outage may then be missed until the replica has it.
    async fn find_token(&self, hash: &TokenHash) -> Result<Option<FoundToken>, StoreError> {
        self.metrics.primary_reads.inc();
        match self.primary.find_token(hash).await {
            Err(StoreError::Unavailable(e)) => self
                .replica_read(&|store| store.find_token(hash), |_| true)
                .await?
                .ok_or(StoreError::Unavailable(e)),
            answer => answer,
        }
    }

    /// The primary: readiness reports whether writes work.
    async fn ping(&self) -> Result<(), StoreError> {
        self.primary.ping().await
    }
}

#[async_trait]
impl ClickSink for Replicated {
    async fn apply_clicks(&self, deltas: Vec<ClickDelta>) -> Result<(), StoreError> {
        self.primary.apply_clicks(deltas).await
    }

    async fn apply_click_batches(&self, batches: &[ClickBatch]) -> Result<usize, StoreError> {
        self.primary.apply_click_batches(batches).await
    }

    async fn prune_clicks_before(&self, day: Day) -> Result<u64, StoreError> {
        self.primary.prune_clicks_before(day).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls `query` on `client` until it finds a row, for at most 60 s.
    async fn until_row(client: &tokio_postgres::Client, query: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while client.query_opt(query, &[]).await.unwrap().is_none() {
            assert!(Instant::now() < deadline, "no row for {query}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Read your writes in a batch (the change poll's `redirect_targets`): with the replica's
    /// replay paused, a batch holding a code this instance just wrote is read on the primary,
    /// while a batch of codes written elsewhere is still read on the replica. (No monitor runs:
    /// the replica stays in use however far behind it falls.)
    #[tokio::test(flavor = "multi_thread")]
    async fn a_batch_with_a_code_written_here_is_read_on_the_primary() {
        let dir = tempfile::tempdir().unwrap();
        let mut server = testkit::Postgres::primary(&dir.path().join("primary")).unwrap();
        server.create_database("shortener").unwrap();
        let url: DatabaseUrl = server.url("shortener").parse().unwrap();
        PgStore::migrate(&url).await.unwrap();
        let standby = server.standby(&dir.path().join("standby")).unwrap();
        let (replica, connection) =
            tokio_postgres::connect(&standby.url("shortener"), tokio_postgres::NoTls)
                .await
                .unwrap();
        tokio::spawn(connection);
        let metrics = Arc::new(Metrics::new());
        let primary: Arc<dyn Store> = Arc::new(PgStore::open(&url, 2).await.unwrap());
        let store = Replicated::open(
            primary.clone(),
            &url,
            &[standby.url("shortener").parse().unwrap()],
            2,
            Duration::from_secs(5),
            Duration::from_secs(1),
            metrics.clone(),
        )
        .await
        .unwrap();
        let origin = Origin::system("test");
        let now = crate::now();
        let link = |code| Link::new(code, "https://example.com/", now, now + 86_400);
        // Written by another process (straight on the primary), then replayed.
        primary
            .insert_link(&link("elsewh1"), &origin)
            .await
            .unwrap();
        until_row(&replica, "SELECT 1 FROM links WHERE code = 'elsewh1'").await;
        replica
            .batch_execute("SELECT pg_wal_replay_pause()")
            .await
            .unwrap();
        store.insert_link(&link("writtn1"), &origin).await.unwrap();
        let on_replica = replica
            .query_opt("SELECT 1 FROM links WHERE code = 'writtn1'", &[])
            .await
            .unwrap();
        assert!(on_replica.is_none(), "the replica is behind");

        let replica_reads = metrics.replica_reads.get();
        let elsewhere = store
            .redirect_targets(&["elsewh1".to_owned()])
            .await
            .unwrap();
        assert!(elsewhere[0].is_some());
        assert!(
            metrics.replica_reads.get() > replica_reads,
            "read on the replica"
        );

        let primary_reads = metrics.primary_reads.get();
        let both = store
            .redirect_targets(&["elsewh1".to_owned(), "writtn1".to_owned()])
            .await
            .unwrap();
        assert!(both.iter().all(Option::is_some), "{both:?}");
        assert!(
            metrics.primary_reads.get() > primary_reads,
            "read on the primary"
        );

        // The primary away: the replica's "unknown" for the code written here is no answer (a
        // renewal would cache it), its answers for the others are.
        server.stop().unwrap();
        let codes = ["elsewh1".to_owned(), "writtn1".to_owned()];
        assert!(matches!(
            store.redirect_targets(&codes).await,
            Err(StoreError::Unavailable(_))
        ));
        let elsewhere = store.redirect_targets(&codes[..1]).await.unwrap();
        assert!(elsewhere[0].is_some());
    }

    const KEEP: Duration = Duration::from_secs(5);
    const FRESH: Duration = Duration::from_millis(750);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn an_idle_primary_means_no_lag_however_long_ago_it_wrote() {
        let t0 = Instant::now();
        let mut s = Samples::default();
        for i in 0..100 {
            s.push(t0 + ms(250 * i), 1000, KEEP);
        }
        let now = t0 + ms(250 * 99);
        assert_eq!(s.lag(1000, now, FRESH), Some(Duration::ZERO));
    }

    #[test]
    fn lag_is_the_time_since_the_primary_passed_the_replayed_position() {
        let t0 = Instant::now();
        let mut s = Samples::default();
        for i in 0..40u64 {
            s.push(t0 + ms(250 * i), 1000 + 10 * i, KEEP);
        }
        let now = t0 + ms(250 * 39);
        // Replayed up to the 30th sample's position: behind since the 31st.
        assert_eq!(s.lag(1000 + 10 * 30, now, FRESH), Some(ms(250 * 8)));
        // Caught up, or ahead of the last sample.
        assert_eq!(s.lag(1000 + 10 * 39, now, FRESH), Some(Duration::ZERO));
        assert_eq!(s.lag(5000, now, FRESH), Some(Duration::ZERO));
        // Behind every kept sample: at least as old as the oldest, past the bound.
        let lag = s.lag(0, now, FRESH).unwrap();
        assert!(lag > KEEP, "{lag:?}");
    }

    #[test]
    fn without_a_recent_primary_sample_lag_is_unknown() {
        let t0 = Instant::now();
        let mut s = Samples::default();
        assert_eq!(s.lag(0, t0, FRESH), None);
        s.push(t0, 10, KEEP);
        assert_eq!(s.lag(0, t0 + ms(2000), FRESH), None);
    }
}
