//! The click pipeline: redirects push events into a bounded lock-free queue; one task empties
//! it every few milliseconds, folds the events into per (code, UTC day) counts and writes each
//! batch in one store transaction — or, in the scale-out mode, ships it onto the Redis click
//! stream for the aggregators (`scaleout::clickstream`).
//!
//! One write at a time is under way, in order, and the fold goes on meanwhile: a slow write
//! (300 ms on a loaded machine) must not leave the queue to fill, or redirects drop clicks.
//! While the target fails, folded clicks wait (merged back into what is pending, or one
//! frozen batch for the stream, so that a send whose answer was lost is retried as the very
//! same batch) until the backlog bound; then the queue stops being emptied: it fills, and
//! further clicks are dropped and counted, never blocking a redirect.

use crate::metrics::Metrics;
use crate::scaleout::clickstream::ClickShipper;
use crate::scaleout::redis::Unreachable;
use crate::visits::{Visit, VisitFold};
use crossbeam_queue::ArrayQueue;
use shortener_core::day::{ANALYTICS_DAYS, Day, UnixSeconds};
use shortener_core::people::People;
use shortener_core::store::{ClickBatch, ClickDelta, ClickSink, StoreError};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

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

/// What the fold may hold, folded and being written, counted in what costs memory: entries
/// (code, day) and people's clicks (a bot's click on a link already folded costs nothing), or
/// less: at most the queue's capacity, so that `--click-queue` bounds what a failing target
/// keeps. A write is forced at half of it: the other half folds while that one is written.
const MAX_BACKLOG: u64 = 100_000;
/// How often the aggregator empties the queue. Polling (rather than a wake-up per event)
/// keeps the redirect's cost at one lock-free push.
const DRAIN_EVERY: Duration = Duration::from_millis(10);

/// Creates the queue and spawns the aggregator. The aggregator writes what it folded every
/// `interval` (or once it holds half of [`MAX_BACKLOG`]) and finishes, after a final write of
/// everything queued, once `shutdown` changes.
pub(crate) fn start(
    store: Arc<dyn ClickSink>,
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
    let aggregator = Aggregator::new(store, shipper, visits, metrics, capacity);
    let handle = tokio::spawn(aggregator.run(queue, interval, shutdown));
    (recorder, handle)
}

/// What the fold holds for one (code, day). People's facts are boxed and made on a
/// person's first click: a bot's entry stays three words, and the map (which keeps its
/// capacity from one write to the next) a fifth of the size.
#[derive(Default)]
struct Pending {
    human: u64,
    bot: u64,
    people: Option<Box<People>>,
}

impl Pending {
    fn absorb(&mut self, other: Pending) {
        self.human += other.human;
        self.bot += other.bot;
        if let Some(theirs) = other.people {
            match &mut self.people {
                Some(mine) => mine.merge(&theirs),
                None => self.people = Some(theirs),
            }
        }
    }
}

/// Keyed by codes of existing links only, so a fast hasher (not SipHash) is safe here.
type Counts = HashMap<(Arc<str>, Day), Pending, quick_cache::DefaultHashBuilder>;

/// Clicks folded and not yet written.
#[derive(Default)]
struct Fold {
    counts: Counts,
    /// Clicks folded in.
    events: u64,
    /// People's clicks among them: each may grow its entry's people.
    visits: u64,
    /// When the oldest of them happened: the lag metric.
    oldest: Option<UnixSeconds>,
}

impl Fold {
    /// What it weighs against [`MAX_BACKLOG`].
    fn cost(&self) -> u64 {
        self.counts.len() as u64 + self.visits
    }

    /// Counts a click taken from the queue.
    fn taken(&mut self, at: UnixSeconds) {
        self.oldest = Some(self.oldest.map_or(at, |o| o.min(at)));
        self.events += 1;
    }

    /// Empties it, keeping the map's capacity.
    fn clear(&mut self) {
        self.counts.clear();
        self.events = 0;
        self.visits = 0;
        self.oldest = None;
    }

    /// Adds the clicks of a write that failed; returns its map, emptied (capacity kept).
    fn absorb(&mut self, mut failed: Fold) -> Counts {
        for (key, pending) in failed.counts.drain() {
            self.counts.entry(key).or_default().absorb(pending);
        }
        self.events += failed.events;
        self.visits += failed.visits;
        self.oldest = match (self.oldest, failed.oldest) {
            (Some(mine), Some(theirs)) => Some(mine.min(theirs)),
            (mine, theirs) => mine.or(theirs),
        };
        failed.counts
    }

    /// The deltas to write; people are trimmed to their stored size here, in the fold too.
    fn deltas(&mut self) -> Vec<ClickDelta> {
        self.counts
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
}

/// A batch for the click stream, frozen when first sent: a failed send is retried as is.
struct Frozen {
    batch: ClickBatch,
    events: u64,
    cost: u64,
    oldest: Option<UnixSeconds>,
}

/// The one write under way.
struct Writing {
    cost: u64,
    oldest: Option<UnixSeconds>,
    done: Pin<Box<dyn Future<Output = Done> + Send>>,
}

/// How a write went, with what it carried (so that a failure can keep it).
enum Done {
    /// Clicks written to the store.
    Written {
        fold: Fold,
        started: std::time::Instant,
        result: Result<(), StoreError>,
    },
    /// A batch shipped to the click stream; `first`: not a retry.
    Shipped {
        frozen: Frozen,
        first: bool,
        started: std::time::Instant,
        result: Result<(), Unreachable>,
    },
    Pruned {
        today: Day,
        result: Result<u64, StoreError>,
    },
}

struct Aggregator {
    store: Arc<dyn ClickSink>,
    /// Set in the scale-out mode: batches go to the click stream, not to the store.
    shipper: Option<Arc<ClickShipper>>,
    metrics: Arc<Metrics>,
    visits: VisitFold,
    pending: Fold,
    /// The map of the last write that succeeded, emptied: the next write's fold reuses it.
    spare: Counts,
    /// A shipped batch whose send failed: resent as is before anything else.
    unsent: Option<Frozen>,
    writing: Option<Writing>,
    max_backlog: u64,
    /// A write starts once the fold costs this much (unless the last one failed: then the
    /// retry waits for the interval).
    write_at: u64,
    failing: bool,
    /// When the last write of clicks ended, well or not.
    last_write: Instant,
    pruned_through: Option<Day>,
}

impl Aggregator {
    fn new(
        store: Arc<dyn ClickSink>,
        shipper: Option<Arc<ClickShipper>>,
        visits: VisitFold,
        metrics: Arc<Metrics>,
        capacity: usize,
    ) -> Self {
        let max_backlog = MAX_BACKLOG.min(capacity as u64).max(1);
        Aggregator {
            store,
            shipper,
            metrics,
            visits,
            pending: Fold::default(),
            spare: Counts::default(),
            unsent: None,
            writing: None,
            max_backlog,
            write_at: (max_backlog / 2).max(1),
            failing: false,
            last_write: Instant::now(),
            pruned_through: None,
        }
    }

    async fn run(
        mut self,
        queue: Arc<ArrayQueue<ClickEvent>>,
        interval: Duration,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut drain = tokio::time::interval(DRAIN_EVERY);
        drain.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_prune = Instant::now();
        loop {
            tokio::select! {
                done = self.written() => {
                    self.finish(done);
                }
                _ = drain.tick() => {}
                // Any change (or the sender going away) means stop.
                _ = shutdown.changed() => break,
            }
            // Before the drain, which may start a write: under a steady load the writes
            // follow one another, and the prune takes its turn when one ends.
            if self.writing.is_none() && last_prune.elapsed() >= interval {
                last_prune = Instant::now();
                self.start_prune();
            }
            self.drain(&queue);
            if self.writing.is_none() && self.last_write.elapsed() >= interval {
                self.start_write();
            }
            self.metrics.click_lag_seconds.set(self.lag());
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
            events = self.pending.events + self.unsent.as_ref().map_or(0, |u| u.events),
            "could not write the last clicks before exit; they are lost"
        );
    }

    /// The write under way, once it ends; never, if none is.
    async fn written(&mut self) -> Done {
        match &mut self.writing {
            Some(writing) => writing.done.as_mut().await,
            None => std::future::pending().await,
        }
    }

    /// Folded, being written, or waiting to be resent: what counts against the bound.
    fn backlog(&self) -> u64 {
        self.pending.cost()
            + self.writing.as_ref().map_or(0, |w| w.cost)
            + self.unsent.as_ref().map_or(0, |u| u.cost)
    }

    fn is_done(&self) -> bool {
        self.pending.counts.is_empty() && self.unsent.is_none() && self.writing.is_none()
    }

    /// Seconds since the oldest click not yet written happened.
    fn lag(&self) -> i64 {
        [
            self.pending.oldest,
            self.writing.as_ref().and_then(|w| w.oldest),
            self.unsent.as_ref().and_then(|u| u.oldest),
        ]
        .into_iter()
        .flatten()
        .min()
        .map_or(0, |at| (crate::now() - at).max(0))
    }

    /// Folds what the queue holds, up to the bound, starting a write whenever one is due.
    fn drain(&mut self, queue: &ArrayQueue<ClickEvent>) {
        // An event taken from the queue that did not belong to the run before it.
        let mut next = None;
        loop {
            if self.writing.is_none() && !self.failing && self.pending.cost() >= self.write_at {
                self.start_write();
            }
            // Still full means the target is failing: the rest waits in the queue (and past
            // its capacity, is dropped and counted).
            if self.backlog() >= self.max_backlog {
                break;
            }
            let Some(event) = next.take().or_else(|| queue.pop()) else {
                break;
            };
            next = self.fold(event, queue);
        }
        // Taken, so folded even past the bound (it takes nothing more from the queue then).
        while let Some(event) = next {
            next = self.fold(event, queue);
        }
    }

    /// At exit with the stream unreachable: the store takes the batches directly, under the
    /// ids they were (maybe) shipped with, so that one that did reach the stream still
    /// counts once.
    async fn write_stranded_batches(&mut self) -> bool {
        let Some(shipper) = self.shipper.clone() else {
            return false;
        };
        let mut batches: Vec<ClickBatch> =
            self.unsent.take().map(|u| u.batch).into_iter().collect();
        if !self.pending.counts.is_empty() {
            batches.push(shipper.batch(self.pending.deltas()));
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

    /// Folds `event` and the clicks right behind it in the queue on the same link and UTC
    /// day without a visit (while the backlog has room): a link clicked over and over, the
    /// hot link or a crawler's retries, costs a pointer comparison per click, not a map entry.
    /// Returns the event it took that was not one of them.
    fn fold(&mut self, event: ClickEvent, queue: &ArrayQueue<ClickEvent>) -> Option<ClickEvent> {
        let day = Day::from_unix(event.at);
        self.pending.taken(event.at);
        let (mut human, mut bot) = (u64::from(!event.bot), u64::from(event.bot));
        let mut next = None;
        // The run adds to the backlog's events, not to its cost: checked once.
        if event.visit.is_none() && self.backlog() < self.max_backlog {
            while let Some(follower) = queue.pop() {
                // The cache hands out one `Arc` per link: the same pointer is the same code.
                if follower.visit.is_some()
                    || !Arc::ptr_eq(&follower.code, &event.code)
                    || Day::from_unix(follower.at) != day
                {
                    next = Some(follower);
                    break;
                }
                self.pending.taken(follower.at);
                human += u64::from(!follower.bot);
                bot += u64::from(follower.bot);
            }
        }
        let entry = self.pending.counts.entry((event.code, day)).or_default();
        entry.human += human;
        entry.bot += bot;
        if let Some(visit) = &event.visit {
            self.pending.visits += 1;
            self.visits
                .count(entry.people.get_or_insert_with(Box::default), visit);
        }
        next
    }

    /// Folds every event in the queue, however many.
    fn fold_all(&mut self, queue: &ArrayQueue<ClickEvent>) {
        let mut next = queue.pop();
        while let Some(event) = next {
            next = self.fold(event, queue).or_else(|| queue.pop());
        }
    }

    /// Starts the next write, if there is something to write and none is under way: the
    /// frozen batch first, then what is pending (its map swapped out for the write).
    fn start_write(&mut self) {
        if self.writing.is_some() {
            return;
        }
        let started = std::time::Instant::now();
        if let Some(shipper) = self.shipper.clone() {
            let (frozen, first) = match self.unsent.take() {
                Some(frozen) => (frozen, false),
                None if self.pending.counts.is_empty() => return,
                None => {
                    let frozen = Frozen {
                        batch: shipper.batch(self.pending.deltas()),
                        events: self.pending.events,
                        cost: self.pending.cost(),
                        oldest: self.pending.oldest,
                    };
                    self.pending.clear();
                    (frozen, true)
                }
            };
            self.writing = Some(Writing {
                cost: frozen.cost,
                oldest: frozen.oldest,
                done: Box::pin(async move {
                    let result = shipper.ship(&frozen.batch).await;
                    Done::Shipped {
                        frozen,
                        first,
                        started,
                        result,
                    }
                }),
            });
            return;
        }
        if self.pending.counts.is_empty() {
            return;
        }
        let deltas = self.pending.deltas();
        let fold = std::mem::replace(
            &mut self.pending,
            Fold {
                counts: std::mem::take(&mut self.spare),
                ..Fold::default()
            },
        );
        let store = self.store.clone();
        self.writing = Some(Writing {
            cost: fold.cost(),
            oldest: fold.oldest,
            done: Box::pin(async move {
                let result = store.apply_clicks(deltas).await;
                Done::Written {
                    fold,
                    started,
                    result,
                }
            }),
        });
    }

    /// Once per UTC day, forgets daily counts older than the analytics window (plus a day):
    /// a write of its own, in turn with the clicks'.
    fn start_prune(&mut self) {
        let today = Day::from_unix(crate::now());
        if self.writing.is_some() || self.pruned_through == Some(today) {
            return;
        }
        let store = self.store.clone();
        self.writing = Some(Writing {
            cost: 0,
            oldest: None,
            done: Box::pin(async move {
                let result = store.prune_clicks_before(today.minus(ANALYTICS_DAYS)).await;
                Done::Pruned { today, result }
            }),
        });
    }

    /// Takes the outcome of the write that ended; returns whether it failed.
    fn finish(&mut self, done: Done) -> bool {
        self.writing = None;
        let failed = match done {
            Done::Written {
                fold,
                started,
                result,
            } => self.stored(fold, started, result),
            Done::Shipped {
                frozen,
                first,
                started,
                result,
            } => self.shipped(frozen, first, started, result),
            Done::Pruned { today, result } => {
                match result {
                    Ok(rows) => {
                        self.pruned_through = Some(today);
                        if rows > 0 {
                            tracing::info!(
                                rows,
                                "pruned daily click counts past the analytics window"
                            );
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "pruning old daily click counts failed"),
                }
                return false;
            }
        };
        self.last_write = Instant::now();
        self.failing = failed;
        failed
    }

    fn stored(
        &mut self,
        mut fold: Fold,
        started: std::time::Instant,
        result: Result<(), StoreError>,
    ) -> bool {
        if let Err(e) = result {
            // Kept pending: the retry writes it with whatever arrived since.
            self.metrics.click_flush_failures.inc();
            tracing::warn!(error = %e, events = fold.events, "click flush failed; will retry");
            self.spare = self.pending.absorb(fold);
            return true;
        }
        self.flushed(fold.events, started);
        self.metrics.clicks_flushed.inc_by(fold.events);
        fold.clear();
        self.spare = fold.counts;
        false
    }

    fn shipped(
        &mut self,
        frozen: Frozen,
        first: bool,
        started: std::time::Instant,
        result: Result<(), Unreachable>,
    ) -> bool {
        if let Err(e) = result {
            self.metrics.click_flush_failures.inc();
            tracing::warn!(error = %e, events = frozen.events, "cannot ship clicks to the stream; will retry");
            self.unsent = Some(frozen);
            return true;
        }
        if first {
            self.flushed(frozen.events, started);
        }
        self.metrics.clicks_shipped.inc_by(frozen.events);
        false
    }

    /// The metrics of a batch written or shipped on its first try.
    fn flushed(&self, events: u64, started: std::time::Instant) {
        self.metrics.click_flushes.inc();
        self.metrics.click_flush_events.observe(events as f64);
        self.metrics
            .click_flush_seconds
            .observe(started.elapsed().as_secs_f64());
    }

    /// Waits for the write under way, then writes everything left, one write after another,
    /// until nothing is left or one fails (at exit, and in tests).
    async fn flush(&mut self) {
        loop {
            self.start_write();
            let Some(writing) = &mut self.writing else {
                return;
            };
            let done = writing.done.as_mut().await;
            if self.finish(done) {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use tokio::sync::Semaphore;

    fn aggregator(store: Arc<dyn ClickSink>) -> Aggregator {
        let metrics = Arc::new(Metrics::new());
        Aggregator::new(store, None, VisitFold::new([7; 16], None), metrics, 65_536)
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
            let pending = &fold.pending.counts[&(Arc::from(code), Day::from_unix(at))];
            (pending.human, pending.bot, pending.people.is_some())
        };
        assert_eq!(counts("hotlink", day), (2, 5, true));
        assert_eq!(counts("another", day), (1, 0, false));
        assert_eq!(counts("hotlink", day + 86_400), (0, 1, false));
        assert_eq!(fold.pending.counts.len(), 3);
        assert_eq!(fold.pending.events, 9);
        assert_eq!(
            fold.pending.cost(),
            3 + 1,
            "three entries and one person's click"
        );
        assert_eq!(fold.pending.oldest, Some(day));
        assert!(queue.is_empty());
    }

    #[tokio::test]
    async fn the_lag_counts_from_the_oldest_click_not_yet_written() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(crate::store::sqlite::SqliteStore::open(dir.path()).unwrap());
        let mut fold = aggregator(store);
        let code: Arc<str> = Arc::from("someone");
        let queue = ArrayQueue::new(16);
        let at = crate::now() - 100;
        queue.push(click(&code, at, true, false)).unwrap();
        fold.fold_all(&queue);
        assert!(fold.lag() >= 100);
        fold.flush().await;
        assert!(fold.is_done());
        assert_eq!(fold.lag(), 0);
        // A busy process folds again right after a write: its lag is that of the new clicks.
        queue.push(click(&code, at + 7, true, false)).unwrap();
        fold.fold_all(&queue);
        assert_eq!(fold.pending.oldest, Some(at + 7));
        // And while they are being written, from them still.
        fold.start_write();
        assert!(fold.pending.oldest.is_none());
        assert_eq!(fold.writing.as_ref().map(|w| w.oldest), Some(Some(at + 7)));
        assert!(fold.lag() >= 93);
    }

    #[test]
    fn the_bound_counts_entries_and_people_not_a_runs_clicks() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(crate::store::sqlite::SqliteStore::open(dir.path()).unwrap());
        let mut fold = aggregator(store);
        fold.max_backlog = 3;
        fold.write_at = u64::MAX;
        let codes: Vec<Arc<str>> = ["hotlink", "another", "third", "fourth", "fifth"]
            .into_iter()
            .map(Arc::from)
            .collect();
        let queue = ArrayQueue::new(16);
        for i in [0, 0, 0, 0, 0, 1, 2, 3, 4, 4] {
            queue
                .push(click(&codes[i], 1_700_000_000, true, false))
                .unwrap();
        }
        fold.drain(&queue);
        // The run of five costs one entry; the third entry fills the bound, and the event
        // taken after it (to end its run) is folded too.
        assert_eq!(fold.pending.counts.len(), 4);
        assert_eq!(fold.pending.events, 8);
        let hot = (codes[0].clone(), Day::from_unix(1_700_000_000));
        assert_eq!(fold.pending.counts[&hot].bot, 5);
        assert_eq!(queue.len(), 2);
    }

    /// A click sink that counts in memory; its writes wait at a gate the test opens, and
    /// the ones `fails` names are refused.
    struct Sink {
        /// Each write takes a permit and gives it back: one permit opens the gate for good.
        gate: Semaphore,
        fails: fn(usize) -> bool,
        started: AtomicUsize,
        inside: AtomicUsize,
        most_inside: AtomicUsize,
        /// Each successful write: (code, human, bot) per delta, in code order.
        writes: Mutex<Vec<Vec<(String, u64, u64)>>>,
    }

    impl Sink {
        fn new(open: bool, fails: fn(usize) -> bool) -> Arc<Sink> {
            Arc::new(Sink {
                gate: Semaphore::new(usize::from(open)),
                fails,
                started: AtomicUsize::new(0),
                inside: AtomicUsize::new(0),
                most_inside: AtomicUsize::new(0),
                writes: Mutex::new(Vec::new()),
            })
        }

        fn writes(&self) -> Vec<Vec<(String, u64, u64)>> {
            self.writes.lock().unwrap().clone()
        }

        fn clicks(&self) -> u64 {
            self.writes().iter().flatten().map(|(_, h, b)| h + b).sum()
        }
    }

    #[async_trait::async_trait]
    impl ClickSink for Sink {
        async fn apply_clicks(&self, deltas: Vec<ClickDelta>) -> Result<(), StoreError> {
            let n = self.started.fetch_add(1, Ordering::SeqCst);
            let inside = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_inside.fetch_max(inside, Ordering::SeqCst);
            let pass = self.gate.acquire().await;
            let result = if pass.is_err() || (self.fails)(n) {
                Err(StoreError::Unavailable("refused by the test".into()))
            } else {
                let mut write: Vec<_> = deltas
                    .into_iter()
                    .map(|d| (d.code, d.human, d.bot))
                    .collect();
                write.sort();
                self.writes.lock().unwrap().push(write);
                Ok(())
            };
            self.inside.fetch_sub(1, Ordering::SeqCst);
            result
        }

        async fn apply_click_batches(&self, _: &[ClickBatch]) -> Result<usize, StoreError> {
            Err(StoreError::Backend("no stream in these tests".into()))
        }

        async fn prune_clicks_before(&self, _: Day) -> Result<u64, StoreError> {
            Ok(0)
        }
    }

    struct Running {
        recorder: ClickRecorder,
        metrics: Arc<Metrics>,
        stop: watch::Sender<bool>,
        handle: tokio::task::JoinHandle<()>,
    }

    fn run(sink: &Arc<Sink>, capacity: usize, interval: Duration) -> Running {
        let metrics = Arc::new(Metrics::new());
        let (stop, stopped) = watch::channel(false);
        let (recorder, handle) = start(
            sink.clone(),
            None,
            VisitFold::new([7; 16], None),
            metrics.clone(),
            capacity,
            interval,
            stopped,
        );
        Running {
            recorder,
            metrics,
            stop,
            handle,
        }
    }

    impl Running {
        /// Records a click on each of the codes a, b, c and d (the size of a write with the
        /// bound of 8): returns them and the clicks' time.
        fn one_click_on_each_of_four(&self, bot: bool) -> ([Arc<str>; 4], UnixSeconds) {
            let four = <[Arc<str>; 4]>::try_from(codes(&["a", "b", "c", "d"])).unwrap();
            let at = crate::now();
            for code in &four {
                self.recorder.record(click(code, at, bot, false));
            }
            (four, at)
        }

        async fn stop(self) -> Arc<Metrics> {
            self.stop.send(true).unwrap();
            self.handle.await.unwrap();
            self.metrics
        }
    }

    /// Lets the aggregator run (it drains on its own timer) until `cond` holds; the limit
    /// only keeps a broken build from hanging.
    async fn until(what: &str, cond: impl Fn() -> bool) {
        let waited = tokio::time::timeout(Duration::from_secs(30), async {
            while !cond() {
                tokio::task::yield_now().await;
            }
        });
        assert!(waited.await.is_ok(), "never came: {what}");
    }

    fn codes(names: &[&str]) -> Vec<Arc<str>> {
        names.iter().map(|&name| Arc::from(name)).collect()
    }

    /// Issue 18: a write that takes its time no longer leaves the queue to fill.
    #[tokio::test]
    async fn a_write_under_way_does_not_stop_the_fold() {
        let sink = Sink::new(false, |_| false);
        // Bound 8, a write at 4; no write on the timer.
        let running = run(&sink, 8, Duration::from_secs(3600));
        let ([a, b, ..], at) = running.one_click_on_each_of_four(true);
        until("the first write to start", || {
            sink.started.load(Ordering::SeqCst) == 1
        })
        .await;
        // Ten queues' worth of clicks while that write waits at the gate.
        for _ in 0..10 {
            for code in [&a, &a, &a, &a, &b, &b, &b, &b] {
                running.recorder.record(click(code, at, true, false));
            }
            until("the queue to be drained", || running.recorder.depth() == 0).await;
        }
        assert_eq!(running.metrics.clicks_dropped.get(), 0);
        assert_eq!(
            sink.started.load(Ordering::SeqCst),
            1,
            "one write at a time"
        );
        assert!(sink.writes().is_empty());
        sink.gate.add_permits(1);
        until("the first write to end", || sink.writes().len() == 1).await;
        let metrics = running.stop().await;
        let one = |code: &str, n| (code.to_owned(), 0, n);
        assert_eq!(
            sink.writes(),
            [
                vec![one("a", 1), one("b", 1), one("c", 1), one("d", 1)],
                vec![one("a", 40), one("b", 40)],
            ],
            "written in order, each click once"
        );
        assert_eq!(metrics.clicks_flushed.get(), 84);
        assert_eq!(metrics.clicks_dropped.get(), 0);
        assert_eq!(sink.most_inside.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_failed_write_is_merged_back_and_written_once() {
        let sink = Sink::new(true, |n| n == 0);
        let running = run(&sink, 8, Duration::from_secs(3600));
        let ([a, ..], at) = running.one_click_on_each_of_four(false);
        until("the write to fail", || {
            running.metrics.click_flush_failures.get() == 1
        })
        .await;
        for _ in 0..3 {
            running.recorder.record(click(&a, at, true, false));
        }
        until("the queue to be drained", || running.recorder.depth() == 0).await;
        // The failed write's clicks are pending again (cost 4, the size of a write), but
        // the retry waits for the timer: a failing target is not hammered.
        assert_eq!(sink.started.load(Ordering::SeqCst), 1);
        let metrics = running.stop().await;
        assert_eq!(
            sink.writes(),
            [vec![
                ("a".to_owned(), 1, 3),
                ("b".to_owned(), 1, 0),
                ("c".to_owned(), 1, 0),
                ("d".to_owned(), 1, 0),
            ]]
        );
        assert_eq!(metrics.clicks_flushed.get(), 7);
        assert_eq!(metrics.click_flush_failures.get(), 1);
    }

    /// Producers on threads of their own, a sink refusing every third write (the first too), writes on a
    /// short timer: whatever interleaving happens, every click is written once or counted
    /// as dropped, and no two writes overlap.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_click_is_written_once_or_counted_dropped() {
        let sink = Sink::new(true, |n| n % 3 == 0);
        let running = run(&sink, 256, Duration::from_millis(5));
        let codes = codes(&["a", "b", "c", "d", "e", "f", "g", "h"]);
        let sent = Arc::new(AtomicU64::new(0));
        let producers: Vec<_> = (0..4u64)
            .map(|p| {
                let (recorder, codes, sent) =
                    (running.recorder.clone(), codes.clone(), sent.clone());
                tokio::task::spawn_blocking(move || {
                    let at = crate::now();
                    for i in 0..40_000u64 {
                        // Runs of one code, spread codes, people now and then.
                        let code = &codes[((i / 16 + p * i) % 8) as usize];
                        recorder.record(click(code, at, i % 3 == 0, i % 1000 == 0));
                        sent.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for producer in producers {
            producer.await.unwrap();
        }
        let metrics = running.stop().await;
        let dropped = metrics.clicks_dropped.get();
        assert_eq!(sink.clicks() + dropped, sent.load(Ordering::Relaxed));
        assert_eq!(metrics.clicks_flushed.get(), sink.clicks());
        assert_eq!(sink.most_inside.load(Ordering::SeqCst), 1);
        assert!(metrics.click_flush_failures.get() > 0);
    }
}
