//! The click pipeline: redirects push events into a bounded lock-free queue; one task empties
//! it every few milliseconds, folds the events into per (code, UTC day) counts and writes each
//! batch in one store transaction — or, in the scale-out mode, ships it onto the Redis click
//! stream for the aggregators (`scaleout::clickstream`).
//!
//! While the target fails, folded clicks wait (one frozen batch, so that a send whose answer
//! was lost is retried as the very same batch) and then the queue stops being emptied: it
//! fills, and further clicks are dropped and counted, never blocking a redirect.

use crate::metrics::Metrics;
use crate::scaleout::clickstream::ClickShipper;
use crate::store::Store;
use crate::visits::{Visit, VisitFold};
use crossbeam_queue::ArrayQueue;
use shortener_core::day::{ANALYTICS_DAYS, Day, UnixSeconds};
use shortener_core::people::People;
use shortener_core::store::{ClickBatch, ClickDelta};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// One redirect, as the redirect handler saw it.
#[derive(Debug)]
pub(crate) struct ClickEvent {
    /// Shared with the cache entry: queuing a click allocates nothing.
    pub code: Arc<str>,
    pub at: UnixSeconds,
    pub bot: bool,
    /// A person's raw facts (none for bots): parsed in the fold, not here.
    pub visit: Option<Box<Visit>>,
}

/// The redirect side of the pipeline: never waits, never fails, never wakes anyone.
#[derive(Debug, Clone)]
pub(crate) struct ClickRecorder {
    queue: Arc<ArrayQueue<ClickEvent>>,
    metrics: Arc<Metrics>,
}

impl ClickRecorder {
    /// Queues the event, or drops and counts it when the queue is full.
    pub(crate) fn record(&self, event: ClickEvent) {
        if self.queue.push(event).is_err() {
            self.metrics.clicks_dropped.inc();
        }
    }

    /// Events waiting in the queue.
    pub(crate) fn depth(&self) -> usize {
        self.queue.len()
    }
}

/// Events folded per batch before a write is forced, whatever the timer says (or fewer: at
/// most the queue's capacity, so that `--click-queue` bounds what a failing target keeps).
const MAX_PENDING_EVENTS: u64 = 50_000;
/// How often the aggregator empties the queue. Polling (rather than a wake-up per event)
/// keeps the redirect's cost at one lock-free push.
const DRAIN_EVERY: Duration = Duration::from_millis(10);

/// Creates the queue and spawns the aggregator. The aggregator writes what it folded every
/// `interval` (or every [`MAX_PENDING_EVENTS`]) and finishes, after a final write of
/// everything queued, once `shutdown` changes.
pub(crate) fn start(
    store: Arc<dyn Store>,
    shipper: Option<Arc<ClickShipper>>,
    visits: VisitFold,
    metrics: Arc<Metrics>,
    capacity: usize,
    interval: Duration,
    shutdown: watch::Receiver<bool>,
) -> (ClickRecorder, tokio::task::JoinHandle<()>) {
    let queue = Arc::new(ArrayQueue::new(capacity));
    let recorder = ClickRecorder {
        queue: queue.clone(),
        metrics: metrics.clone(),
    };
    let aggregator = Aggregator {
        store,
        shipper,
        metrics,
        visits,
        pending: HashMap::default(),
        pending_events: 0,
        oldest: None,
        unsent: None,
        max_backlog: MAX_PENDING_EVENTS.min(capacity as u64).max(1),
        pruned_through: None,
    };
    let handle = tokio::spawn(aggregator.run(queue, interval, shutdown));
    (recorder, handle)
}

/// What the fold holds for one (code, day). People's facts are boxed and made on a
/// person's first click: a bot's entry stays three words, and the map (which keeps its
/// capacity from one flush to the next) a fifth of the size.
#[derive(Default)]
struct Pending {
    human: u64,
    bot: u64,
    people: Option<Box<People>>,
}

struct Aggregator {
    store: Arc<dyn Store>,
    /// Set in the scale-out mode: batches go to the click stream, not to the store.
    shipper: Option<Arc<ClickShipper>>,
    metrics: Arc<Metrics>,
    visits: VisitFold,
    /// Clicks per (code, day) not yet written.
    /// Keyed by codes of existing links only, so a fast hasher (not SipHash) is safe here.
    pending: HashMap<(Arc<str>, Day), Pending, quick_cache::DefaultHashBuilder>,
    pending_events: u64,
    /// When the oldest click not yet written (or shipped) happened: the lag metric.
    oldest: Option<UnixSeconds>,
    /// A shipped batch whose send failed, and its events: resent as is.
    unsent: Option<(ClickBatch, u64)>,
    max_backlog: u64,
    pruned_through: Option<Day>,
}

impl Aggregator {
    async fn run(
        mut self,
        queue: Arc<ArrayQueue<ClickEvent>>,
        interval: Duration,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut drain = tokio::time::interval(DRAIN_EVERY);
        drain.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_write = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = drain.tick() => {}
                // Any change (or the sender going away) means stop.
                _ = shutdown.changed() => break,
            }
            // An event taken from the queue that did not belong to the run before it.
            let mut next = None;
            while self.backlog() < self.max_backlog {
                let Some(event) = next.take().or_else(|| queue.pop()) else {
                    break;
                };
                next = self.fold(event, &queue);
                if self.backlog() >= self.max_backlog {
                    // Still full after this means the target is failing: the rest waits in
                    // the queue (and past its capacity, is dropped and counted).
                    self.flush().await;
                    last_write = tokio::time::Instant::now();
                }
            }
            // Taken, so folded even past the bound (it takes nothing more from the queue then).
            while let Some(event) = next {
                next = self.fold(event, &queue);
            }
            if last_write.elapsed() >= interval {
                self.flush().await;
                self.prune().await;
                last_write = tokio::time::Instant::now();
            }
            let lag = self.oldest.map_or(0, |at| (crate::now() - at).max(0));
            self.metrics.click_lag_seconds.set(lag);
        }
        // The server has stopped and finished its requests: take every queued event.
        self.fold_all(&queue);
        for attempt in 1..=5u32 {
            self.flush().await;
            if self.is_done() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
        }
        if self.shipper.is_some() && self.write_stranded_batches().await {
            return;
        }
        tracing::error!(
            events = self.backlog(),
            "could not write the last clicks before exit; they are lost"
        );
    }

    /// Events folded but not yet written or shipped.
    fn backlog(&self) -> u64 {
        self.pending_events + self.unsent.as_ref().map_or(0, |u| u.1)
    }

    fn is_done(&self) -> bool {
        self.pending.is_empty() && self.unsent.is_none()
    }

    /// At exit with the stream unreachable: the store takes the batches directly, under the
    /// ids they were (maybe) shipped with, so that one that did reach the stream still
    /// counts once.
    async fn write_stranded_batches(&mut self) -> bool {
        let Some(shipper) = self.shipper.clone() else {
            return false;
        };
        let mut batches: Vec<ClickBatch> = self.unsent.take().map(|u| u.0).into_iter().collect();
        if !self.pending.is_empty() {
            batches.push(shipper.batch(self.deltas()));
        }
        match self.store.apply_click_batches(&batches).await {
            Ok(_) => {
                tracing::info!(
                    batches = batches.len(),
                    "click stream unreachable at exit; wrote the last clicks to the store directly"
                );
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot write the last clicks to the store either");
                false
            }
        }
    }

    fn deltas(&mut self) -> Vec<ClickDelta> {
        self.pending
            .iter_mut()
            .map(|((code, day), pending)| ClickDelta {
                code: code.to_string(),
                day: *day,
                human: pending.human,
                bot: pending.bot,
                people: pending.people.as_deref_mut().map(|people| {
                    people.trim();
                    Box::new(people.clone())
                }),
            })
            .collect()
    }

    /// Ships the frozen batch, then what is pending.
    async fn ship(&mut self, shipper: &ClickShipper) {
        if let Some((batch, events)) = &self.unsent {
            if let Err(e) = shipper.ship(batch).await {
                self.metrics.click_flush_failures.inc();
                tracing::warn!(error = %e, "cannot ship clicks to the stream; will retry");
                return;
            }
            self.metrics.clicks_shipped.inc_by(*events);
            self.unsent = None;
        }
        if self.pending.is_empty() {
            return;
        }
        let batch = shipper.batch(self.deltas());
        let events = std::mem::take(&mut self.pending_events);
        self.pending.clear();
        let started = std::time::Instant::now();
        match shipper.ship(&batch).await {
            Ok(()) => {
                self.metrics.click_flushes.inc();
                self.metrics.clicks_shipped.inc_by(events);
                self.metrics.click_flush_events.observe(events as f64);
                self.metrics
                    .click_flush_seconds
                    .observe(started.elapsed().as_secs_f64());
            }
            Err(e) => {
                self.metrics.click_flush_failures.inc();
                tracing::warn!(error = %e, events, "cannot ship clicks to the stream; will retry");
                self.unsent = Some((batch, events));
            }
        }
    }

    /// Folds `event` and the clicks right behind it in the queue on the same link and UTC
    /// day without a visit (while the backlog has room): a link clicked over and over, the
    /// hot link or a crawler's retries, costs a pointer comparison per click, not a map entry.
    /// Returns the event it took that was not one of them.
    fn fold(&mut self, event: ClickEvent, queue: &ArrayQueue<ClickEvent>) -> Option<ClickEvent> {
        let day = Day::from_unix(event.at);
        self.taken(event.at);
        let (mut human, mut bot) = (u64::from(!event.bot), u64::from(event.bot));
        let mut next = None;
        if event.visit.is_none() {
            while self.backlog() < self.max_backlog {
                let Some(follower) = queue.pop() else { break };
                // The cache hands out one `Arc` per link: the same pointer is the same code.
                if follower.visit.is_some()
                    || !Arc::ptr_eq(&follower.code, &event.code)
                    || Day::from_unix(follower.at) != day
                {
                    next = Some(follower);
                    break;
                }
                self.taken(follower.at);
                human += u64::from(!follower.bot);
                bot += u64::from(follower.bot);
            }
        }
        let entry = self.pending.entry((event.code, day)).or_default();
        entry.human += human;
        entry.bot += bot;
        if let Some(visit) = &event.visit {
            self.visits
                .count(entry.people.get_or_insert_with(Box::default), visit);
        }
        next
    }

    /// Counts a click taken from the queue into the backlog and the lag.
    fn taken(&mut self, at: UnixSeconds) {
        self.oldest = Some(self.oldest.map_or(at, |o| o.min(at)));
        self.pending_events += 1;
    }

    /// Folds every event in the queue, however many.
    fn fold_all(&mut self, queue: &ArrayQueue<ClickEvent>) {
        let mut next = queue.pop();
        while let Some(event) = next {
            next = self.fold(event, queue).or_else(|| queue.pop());
        }
    }

    /// Writes (or ships) what is pending; once nothing is left, the lag starts again from the
    /// next click taken. Under a steady load the backlog bound forces every write and the
    /// fold is never found empty between rounds, so the lag is reset here, not when idle:
    /// before, it grew with the uptime of a busy process (30 s after 30 s of load).
    async fn flush(&mut self) {
        self.write().await;
        if self.is_done() {
            self.oldest = None;
        }
    }

    async fn write(&mut self) {
        if let Some(shipper) = self.shipper.clone() {
            return self.ship(&shipper).await;
        }
        if self.pending.is_empty() {
            return;
        }
        let deltas = self.deltas();
        let started = std::time::Instant::now();
        match self.store.apply_clicks(deltas).await {
            Ok(()) => {
                self.metrics.click_flushes.inc();
                self.metrics.clicks_flushed.inc_by(self.pending_events);
                self.metrics
                    .click_flush_events
                    .observe(self.pending_events as f64);
                self.metrics
                    .click_flush_seconds
                    .observe(started.elapsed().as_secs_f64());
                self.pending.clear();
                self.pending_events = 0;
            }
            Err(e) => {
                // Kept pending: the next tick retries with whatever arrived since.
                self.metrics.click_flush_failures.inc();
                tracing::warn!(error = %e, events = self.pending_events, "click flush failed; will retry");
            }
        }
    }

    /// Once per UTC day, forgets daily counts older than the analytics window (plus a day).
    async fn prune(&mut self) {
        let today = Day::from_unix(crate::now());
        if self.pruned_through == Some(today) {
            return;
        }
        match self
            .store
            .prune_clicks_before(today.minus(ANALYTICS_DAYS))
            .await
        {
            Ok(rows) => {
                self.pruned_through = Some(today);
                if rows > 0 {
                    tracing::info!(rows, "pruned daily click counts past the analytics window");
                }
            }
            Err(e) => tracing::warn!(error = %e, "pruning old daily click counts failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aggregator(store: Arc<dyn Store>) -> Aggregator {
        Aggregator {
            store,
            shipper: None,
            metrics: Arc::new(Metrics::new()),
            visits: VisitFold::new([7; 16], None),
            pending: HashMap::default(),
            pending_events: 0,
            oldest: None,
            unsent: None,
            max_backlog: MAX_PENDING_EVENTS,
            pruned_through: None,
        }
    }

    fn click(code: &Arc<str>, at: UnixSeconds, bot: bool, person: bool) -> ClickEvent {
        ClickEvent {
            code: code.clone(),
            at,
            bot,
            visit: person.then(|| Visit::new([192, 0, 2, 1].into(), "Firefox", None)),
        }
    }

    #[test]
    fn runs_of_one_code_count_as_many_clicks_as_were_queued() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(crate::store::sqlite::SqliteStore::open(dir.path()).unwrap());
        let mut fold = aggregator(store);
        let day = 1_700_000_000;
        let hot: Arc<str> = Arc::from("hotlink");
        // The same code from another allocation: counted under the same key all the same.
        let hot_again: Arc<str> = Arc::from("hotlink");
        let other: Arc<str> = Arc::from("another");
        let queue = ArrayQueue::new(16);
        for event in [
            click(&hot, day, true, false),
            click(&hot, day + 1, true, false),
            click(&hot, day + 2, false, true),
            click(&hot, day + 3, true, false),
            click(&hot_again, day + 4, true, false),
            click(&other, day + 5, false, false),
            click(&hot, day + 6, false, false),
            click(&hot, day + 7, true, false),
            // The next UTC day: a key of its own.
            click(&hot, day + 86_400, true, false),
        ] {
            queue.push(event).unwrap();
        }
        fold.fold_all(&queue);
        let counts = |code: &str, at: UnixSeconds| {
            let pending = &fold.pending[&(Arc::from(code), Day::from_unix(at))];
            (pending.human, pending.bot, pending.people.is_some())
        };
        assert_eq!(counts("hotlink", day), (2, 5, true));
        assert_eq!(counts("another", day), (1, 0, false));
        assert_eq!(counts("hotlink", day + 86_400), (0, 1, false));
        assert_eq!(fold.pending.len(), 3);
        assert_eq!(fold.pending_events, 9);
        assert_eq!(fold.oldest, Some(day));
        assert!(queue.is_empty());
    }

    #[tokio::test]
    async fn the_lag_counts_from_the_oldest_click_not_yet_written() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(crate::store::sqlite::SqliteStore::open(dir.path()).unwrap());
        let mut fold = aggregator(store);
        let code: Arc<str> = Arc::from("someone");
        let queue = ArrayQueue::new(16);
        let at = 1_700_000_000;
        queue.push(click(&code, at, true, false)).unwrap();
        fold.fold_all(&queue);
        assert_eq!(fold.oldest, Some(at));
        fold.flush().await;
        assert!(fold.is_done());
        assert_eq!(fold.oldest, None);
        // A busy process folds again right after a write: its lag is that of the new clicks.
        queue.push(click(&code, at + 7, true, false)).unwrap();
        fold.fold_all(&queue);
        assert_eq!(fold.oldest, Some(at + 7));
    }

    #[test]
    fn a_run_stops_at_the_backlog_bound() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(crate::store::sqlite::SqliteStore::open(dir.path()).unwrap());
        let mut fold = aggregator(store);
        fold.max_backlog = 3;
        let hot: Arc<str> = Arc::from("hotlink");
        let other: Arc<str> = Arc::from("another");
        let queue = ArrayQueue::new(16);
        for code in [&hot, &hot, &hot, &hot, &hot, &other] {
            queue.push(click(code, 1_700_000_000, true, false)).unwrap();
        }
        let first = queue.pop().unwrap();
        assert!(fold.fold(first, &queue).is_none());
        assert_eq!(fold.pending_events, 3);
        assert_eq!(fold.pending[&(hot, Day::from_unix(1_700_000_000))].bot, 3);
        assert_eq!(queue.len(), 3);
    }
}
