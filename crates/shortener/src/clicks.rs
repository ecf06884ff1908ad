//! The click pipeline: redirects push events into a bounded lock-free queue (a lane per
//! worker thread, `queue`); one task empties it every few milliseconds, folds the events into
//! per (code, UTC day) counts (`fold`) and writes each batch in one store transaction — or,
//! in the scale-out mode, ships it onto the Redis click stream for the aggregators
//! (`scaleout::clickstream`).
//!
//! One write at a time is under way, in order, and the fold goes on meanwhile: a slow write
//! (300 ms on a loaded machine) must not leave the queue to fill, or redirects drop clicks.
//! While the target fails, folded clicks wait (merged back into what is pending, or one
//! frozen batch for the stream, so that a send whose answer was lost is retried as the very
//! same batch) until the backlog bound; then the queue stops being emptied: it fills, and
//! further clicks are dropped and counted, never blocking a redirect.

mod fold;
mod queue;

use crate::metrics::Metrics;
use crate::scaleout::clickstream::ClickShipper;
use crate::scaleout::redis::Unreachable;
use crate::visits::{Visit, VisitFold};
use fold::{Counts, Fold, Frozen};
pub(crate) use queue::ClickQueue;
use queue::Taker;
use shortener_core::day::{ANALYTICS_DAYS, Day, UnixSeconds};
use shortener_core::store::{ClickBatch, ClickSink, StoreError};
use smol_str::SmolStr;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// One redirect, as the redirect handler saw it.
#[derive(Debug)]
pub(crate) struct ClickEvent {
    /// A copy (inline up to 23 bytes; a longer alias shares the cache entry's allocation):
    /// queuing a click allocates nothing, and the fold and the writes never touch the link
    /// cache's memory, which the workers read on every hit.
    pub code: SmolStr,
    pub at: UnixSeconds,
    pub bot: bool,
    /// A person's raw facts (none for bots): parsed in the fold, not here.
    pub visit: Option<Box<Visit>>,
}

/// The redirect side of the pipeline: never waits, never fails, never wakes anyone.
#[derive(Debug, Clone)]
pub(crate) struct ClickRecorder {
    queue: Arc<ClickQueue>,
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

/// Spawns the aggregator over `queue`. The aggregator writes what it folded every
/// `interval` (or once it holds half of [`MAX_BACKLOG`]) and finishes, after a final write of
/// everything queued, once `shutdown` changes.
pub(crate) fn start(
    store: Arc<dyn ClickSink>,
    shipper: Option<Arc<ClickShipper>>,
    visits: VisitFold,
    metrics: Arc<Metrics>,
    queue: ClickQueue,
    interval: Duration,
    shutdown: watch::Receiver<bool>,
) -> (ClickRecorder, tokio::task::JoinHandle<()>) {
    let capacity = queue.capacity();
    let queue = Arc::new(queue);
    let recorder = ClickRecorder {
        queue: queue.clone(),
        metrics: metrics.clone(),
    };
    let aggregator = Aggregator::new(store, shipper, visits, metrics, capacity);
    let handle = tokio::spawn(aggregator.run(queue, interval, shutdown));
    (recorder, handle)
}

/// Runs the fold's heavy work on the blocking pool: under a long-tailed load a drain folds
/// a thousand clicks (a few hundred µs), a write holds some 30 000 codes, and building its
/// deltas or emptying its map takes milliseconds, which on a runtime worker every connection
/// it serves would wait out.
async fn off_worker<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(work).await {
        Ok(done) => done,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Cancelled: only when the runtime shuts down, which drops this future too.
        Err(_) => std::future::pending().await,
    }
}

/// What the next send to the click stream carries.
enum ToShip {
    /// A batch whose send failed: resent as is.
    Unsent(Frozen),
    /// Clicks folded since: frozen into a batch (on the blocking pool) when the send starts.
    Fresh(Fold),
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
        /// The map it was built from, emptied for reuse.
        emptied: Option<Counts>,
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
        queue: Arc<ClickQueue>,
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
            if !queue.is_empty() {
                // The aggregator moves to the blocking pool and back whole.
                let queue = queue.clone();
                self = off_worker(move || {
                    self.drain(&queue);
                    self
                })
                .await;
            }
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
    fn drain(&mut self, queue: &ClickQueue) {
        let mut queue = queue.taker();
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
            next = self.fold(event, &mut queue);
        }
        // Taken, so folded even past the bound (it takes nothing more from the queue then).
        while let Some(event) = next {
            next = self.fold(event, &mut queue);
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
    /// hot link or a crawler's retries, costs a comparison of two inline codes per click, not
    /// a map entry. Returns the event it took that was not one of them.
    fn fold(&mut self, event: ClickEvent, queue: &mut Taker<'_>) -> Option<ClickEvent> {
        let day = Day::from_unix(event.at);
        self.pending.taken(event.at);
        let (mut human, mut bot) = (u64::from(!event.bot), u64::from(event.bot));
        let mut next = None;
        // The run adds to the backlog's events, not to its cost: checked once.
        if event.visit.is_none() && self.backlog() < self.max_backlog {
            while let Some(follower) = queue.pop() {
                if follower.visit.is_some()
                    || follower.code != event.code
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
    fn fold_all(&mut self, queue: &ClickQueue) {
        let mut queue = queue.taker();
        let mut next = queue.pop();
        while let Some(event) = next {
            next = self.fold(event, &mut queue).or_else(|| queue.pop());
        }
    }

    /// Takes what is pending for a write, leaving the spare map (emptied, capacity kept) to
    /// fold into meanwhile.
    fn take_pending(&mut self) -> Fold {
        std::mem::replace(
            &mut self.pending,
            Fold {
                counts: std::mem::take(&mut self.spare),
                ..Fold::default()
            },
        )
    }

    /// Starts the next write, if there is something to write and none is under way: the
    /// frozen batch first, then what is pending (its map swapped out for the write).
    fn start_write(&mut self) {
        if self.writing.is_some() {
            return;
        }
        let started = std::time::Instant::now();
        if let Some(shipper) = self.shipper.clone() {
            let (next, first) = match self.unsent.take() {
                Some(frozen) => (ToShip::Unsent(frozen), false),
                None if self.pending.counts.is_empty() => return,
                None => (ToShip::Fresh(self.take_pending()), true),
            };
            let (cost, oldest) = match &next {
                ToShip::Unsent(frozen) => (frozen.cost, frozen.oldest),
                ToShip::Fresh(fold) => (fold.cost(), fold.oldest),
            };
            self.writing = Some(Writing {
                cost,
                oldest,
                done: Box::pin(async move {
                    let (frozen, emptied) = match next {
                        ToShip::Unsent(frozen) => (frozen, None),
                        ToShip::Fresh(fold) => {
                            let batches = shipper.clone();
                            let (frozen, map) =
                                off_worker(move || Frozen::of(fold, &batches)).await;
                            (frozen, Some(map))
                        }
                    };
                    let result = shipper.ship(&frozen.batch).await;
                    Done::Shipped {
                        frozen,
                        emptied,
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
        let fold = self.take_pending();
        let store = self.store.clone();
        self.writing = Some(Writing {
            cost: fold.cost(),
            oldest: fold.oldest,
            done: Box::pin(async move {
                let (mut fold, deltas) = off_worker(move || {
                    let mut fold = fold;
                    let deltas = fold.deltas();
                    (fold, deltas)
                })
                .await;
                let result = store.apply_clicks(deltas).await;
                if result.is_ok() {
                    // Its events are still counted: the metrics want them.
                    fold = off_worker(move || {
                        fold.counts.clear();
                        fold
                    })
                    .await;
                }
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
                emptied,
                first,
                started,
                result,
            } => {
                if let Some(map) = emptied {
                    self.spare = map;
                }
                self.shipped(frozen, first, started, result)
            }
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
mod tests;
