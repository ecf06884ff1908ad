//! The click pipeline: redirects drop events into a bounded queue; one task folds them into
//! per (code, UTC day) counts and writes each batch in one store transaction.

use crate::metrics::Metrics;
use crate::store::Store;
use shortener_core::day::{ANALYTICS_DAYS, Day, UnixSeconds};
use shortener_core::store::ClickDelta;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// One redirect, as the redirect handler saw it.
#[derive(Debug)]
pub(crate) struct ClickEvent {
    /// Shared with the cache entry: queuing a click allocates nothing.
    pub code: Arc<str>,
    pub at: UnixSeconds,
    pub bot: bool,
}

/// The redirect side of the pipeline: never waits, never fails.
#[derive(Debug, Clone)]
pub(crate) struct ClickRecorder {
    tx: mpsc::Sender<ClickEvent>,
    metrics: Arc<Metrics>,
}

impl ClickRecorder {
    /// Queues the event, or drops and counts it when the queue is full.
    pub(crate) fn record(&self, event: ClickEvent) {
        if self.tx.try_send(event).is_err() {
            self.metrics.clicks_dropped.inc();
        }
    }

    /// Events waiting in the queue.
    pub(crate) fn depth(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }
}

/// Events folded per batch before a write is forced, whatever the timer says.
const MAX_PENDING_EVENTS: u64 = 50_000;

/// Creates the queue and spawns the aggregator. The aggregator flushes every `interval`
/// and finishes (after a final flush of everything queued) once `shutdown` turns true.
pub(crate) fn start(
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    capacity: usize,
    interval: Duration,
    shutdown: watch::Receiver<bool>,
) -> (ClickRecorder, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(capacity);
    let recorder = ClickRecorder {
        tx,
        metrics: metrics.clone(),
    };
    let aggregator = Aggregator {
        store,
        metrics,
        pending: HashMap::new(),
        pending_events: 0,
        pruned_through: None,
    };
    let handle = tokio::spawn(aggregator.run(rx, interval, shutdown));
    (recorder, handle)
}

struct Aggregator {
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    /// (code, day) → (human, bot) clicks not yet written.
    pending: HashMap<(Arc<str>, Day), (u64, u64)>,
    pending_events: u64,
    pruned_through: Option<Day>,
}

impl Aggregator {
    async fn run(
        mut self,
        mut rx: mpsc::Receiver<ClickEvent>,
        interval: Duration,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                event = rx.recv() => match event {
                    Some(event) => {
                        self.fold(event);
                        if self.pending_events >= MAX_PENDING_EVENTS {
                            self.flush().await;
                        }
                    }
                    None => break,
                },
                _ = tick.tick() => {
                    self.flush().await;
                    self.prune().await;
                }
                // Any change (or the sender going away) means stop.
                _ = shutdown.changed() => break,
            }
        }
        // Shutting down: refuse new events, take every queued one, write them all.
        rx.close();
        while let Some(event) = rx.recv().await {
            self.fold(event);
        }
        for attempt in 1..=5u32 {
            self.flush().await;
            if self.pending.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
        }
        tracing::error!(
            events = self.pending_events,
            "could not write the last clicks before exit; they are lost"
        );
    }

    fn fold(&mut self, event: ClickEvent) {
        let entry = self
            .pending
            .entry((event.code, Day::from_unix(event.at)))
            .or_default();
        if event.bot {
            entry.1 += 1;
        } else {
            entry.0 += 1;
        }
        self.pending_events += 1;
    }

    async fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let deltas: Vec<ClickDelta> = self
            .pending
            .iter()
            .map(|((code, day), &(human, bot))| ClickDelta {
                code: code.to_string(),
                day: *day,
                human,
                bot,
            })
            .collect();
        let started = std::time::Instant::now();
        match self.store.apply_clicks(&deltas).await {
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
