//! Prometheus metrics of one process, in a registry of its own (no globals).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::{Atomic, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Stripes of a [`Striped`] count: more than the worker threads of a 2- or 4-core machine.
const STRIPES: usize = 8;

/// One stripe, alone on its cache lines (128 bytes: the adjacent-line prefetch pairs them).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe(AtomicU64);

/// A count that each thread adds to in a stripe of its own and a scrape sums: the counters
/// every redirect bumps would otherwise move one cache line between the cores on each
/// request (wall time that instruction counts do not show).
#[derive(Debug, Default)]
pub(crate) struct Striped([Stripe; STRIPES]);

/// The stripe of the calling thread: threads take the next one as they first ask. The click
/// queue picks its lanes by it too.
pub(crate) fn stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static MINE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
    }
    MINE.with(|mine| *mine)
}

impl Atomic<u64> for Striped {
    fn inc(&self) -> u64 {
        self.inc_by(1)
    }

    /// Returns the stripe's previous value, not the total's (nothing here reads it).
    fn inc_by(&self, v: u64) -> u64 {
        self.0[stripe()].0.fetch_add(v, Ordering::Relaxed)
    }

    fn get(&self) -> u64 {
        self.0
            .iter()
            .map(|s| s.0.load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    }
}

/// A counter of the redirect path: striped (see [`Striped`]).
pub(crate) type HotCounter = Counter<u64, Striped>;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Replica {
    replica: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Layer {
    layer: &'static str,
}

/// Every metric the service exports. Hot-path counters are resolved once, up front, so that
/// counting a redirect is one atomic add, on a cache line of the counting thread's own.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    pub redirect_found: HotCounter,
    pub redirect_not_found: HotCounter,
    pub redirect_gone: HotCounter,
    pub redirect_error: HotCounter,
    pub redirect_seconds: Histogram,
    pub cache_hit: HotCounter,
    pub cache_negative_hit: HotCounter,
    pub cache_miss: HotCounter,
    pub store_link_reads: Counter,
    pub cache_renewals: Counter,
    pub l2_hit: HotCounter,
    pub cache_entries: Gauge,
    pub cache_bytes: Gauge,
    creates: Family<Outcome, Counter>,
    pub generated_code_skips: Counter,
    pub auto_disabled: Counter,
    pub threat_sweep_disabled: Counter,
    pub threat_sweep_seconds: Histogram,
    pub threat_sweeps_left: Counter,
    pub threat_feed_entries: Gauge,
    pub trusted_domains: Gauge,
    pub clicks_dropped: Counter,
    pub clicks_flushed: Counter,
    pub click_flushes: Counter,
    pub click_flush_failures: Counter,
    pub click_flush_seconds: Histogram,
    pub click_flush_events: Histogram,
    pub click_queue_depth: Gauge,
    pub click_batches_applied: Counter,
    pub click_batches_replayed: Counter,
    pub clicks_shipped: Counter,
    pub redis_up: Gauge,
    pub unannounced_changes: Gauge,
    pub store_timeouts: Counter,
    pub store_refused: Counter,
    pub store_breaker_opens: Counter,
    pub store_breaker_state: Gauge,
    pub stale_l1: Counter,
    pub stale_l2: Counter,
    replica_healthy: Family<Replica, Gauge>,
    replica_lag_ms: Family<Replica, Gauge>,
    pub replica_reads: Counter,
    pub primary_reads: Counter,
    pub store_up: Gauge,
    pub click_lag_seconds: Gauge,
    pub click_stream_lag_seconds: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut registry = Registry::with_prefix("shortener");
        let redirects = Family::<Outcome, HotCounter>::default();
        registry.register(
            "redirects",
            "Requests for short codes, by outcome",
            redirects.clone(),
        );
        let outcome = |o| redirects.get_or_create(&Outcome { outcome: o }).clone();
        let lookups = Family::<Outcome, HotCounter>::default();
        registry.register(
            "cache_lookups",
            "Cache lookups of the redirect path: L1 hit, negative_hit (known unknown), miss; l2_hit counts L1 misses answered by the shared Redis cache",
            lookups.clone(),
        );
        let lookup = |o| lookups.get_or_create(&Outcome { outcome: o }).clone();
        let stale = Family::<Layer, Counter>::default();
        registry.register(
            "stale_served",
            "Links served past their cache TTL because the store was unavailable, by the layer that still held them (l1, l2)",
            stale.clone(),
        );
        // Owned clones: a family's read guard must not outlive its statement.
        let layer = |l| stale.get_or_create(&Layer { layer: l }).clone();
        let creates = Family::<Outcome, Counter>::default();
        registry.register(
            "link_creates",
            "Link creation requests, by outcome",
            creates.clone(),
        );
        let metrics = Self {
            redirect_found: outcome("found"),
            redirect_not_found: outcome("not_found"),
            redirect_gone: outcome("gone"),
            redirect_error: outcome("error"),
            redirect_seconds: Histogram::new(exponential_buckets(0.000_005, 2.0, 18)),
            cache_hit: lookup("hit"),
            cache_negative_hit: lookup("negative_hit"),
            cache_miss: lookup("miss"),
            store_link_reads: Counter::default(),
            cache_renewals: Counter::default(),
            l2_hit: lookup("l2_hit"),
            cache_entries: Gauge::default(),
            cache_bytes: Gauge::default(),
            creates,
            generated_code_skips: Counter::default(),
            auto_disabled: Counter::default(),
            threat_sweep_disabled: Counter::default(),
            threat_sweep_seconds: Histogram::new(exponential_buckets(0.01, 2.0, 14)),
            threat_sweeps_left: Counter::default(),
            threat_feed_entries: Gauge::default(),
            trusted_domains: Gauge::default(),
            clicks_dropped: Counter::default(),
            clicks_flushed: Counter::default(),
            click_flushes: Counter::default(),
            click_flush_failures: Counter::default(),
            click_flush_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            click_flush_events: Histogram::new(exponential_buckets(1.0, 4.0, 10)),
            click_queue_depth: Gauge::default(),
            click_batches_applied: Counter::default(),
            click_batches_replayed: Counter::default(),
            clicks_shipped: Counter::default(),
            redis_up: Gauge::default(),
            unannounced_changes: Gauge::default(),
            store_timeouts: Counter::default(),
            store_refused: Counter::default(),
            store_breaker_opens: Counter::default(),
            store_breaker_state: Gauge::default(),
            stale_l1: layer("l1"),
            stale_l2: layer("l2"),
            replica_healthy: Family::default(),
            replica_lag_ms: Family::default(),
            replica_reads: Counter::default(),
            primary_reads: Counter::default(),
            store_up: Gauge::default(),
            click_lag_seconds: Gauge::default(),
            click_stream_lag_seconds: Gauge::default(),
            registry,
        };
        metrics.register_rest()
    }

    fn register_rest(mut self) -> Self {
        let r = &mut self.registry;
        r.register(
            "redirect_duration_seconds",
            format!(
                "Time to answer GET/HEAD /{{code}}, from handler entry to response (one redirect in {} of each worker thread, an even sample)",
                crate::api::redirect::TIMED_ONE_IN
            ),
            self.redirect_seconds.clone(),
        );
        r.register(
            "auto_disabled_links",
            "Links disabled by this process because of reports from distinct addresses",
            self.auto_disabled.clone(),
        );
        r.register(
            "threat_sweep_disabled",
            "Links disabled by threat feed sweeps of this process",
            self.threat_sweep_disabled.clone(),
        );
        r.register(
            "threat_sweep_duration_seconds",
            "Duration of threat feed sweeps over every active link",
            self.threat_sweep_seconds.clone(),
        );
        r.register(
            "threat_sweeps_left",
            "Feed reloads whose sweep this process left to another on the store (it held the sweep, or swept those feeds)",
            self.threat_sweeps_left.clone(),
        );
        r.register(
            "threat_feed_entries",
            "Entries (domains and URLs) of the threat feeds loaded",
            self.threat_feed_entries.clone(),
        );
        r.register(
            "trusted_domains",
            "Domains of --trusted-domains loaded (their links are never disabled by reports)",
            self.trusted_domains.clone(),
        );
        r.register(
            "store_link_reads",
            "Links read from the store by the redirect path (concurrent misses of one code share one)",
            self.store_link_reads.clone(),
        );
        r.register(
            "cache_renewals",
            "Unknown codes read again off the redirect path before their cache entry expired",
            self.cache_renewals.clone(),
        );
        r.register(
            "cache_entries",
            "Entries in the L1 link cache, negative ones included",
            self.cache_entries.clone(),
        );
        r.register(
            "cache_weight_bytes",
            "Estimated memory held by the L1 link cache",
            self.cache_bytes.clone(),
        );
        r.register(
            "click_batches_applied",
            "Click batches from the Redis stream applied to the store (scale-out mode)",
            self.click_batches_applied.clone(),
        );
        r.register(
            "click_batches_replayed",
            "Click batches delivered again and ignored because already applied (scale-out mode)",
            self.click_batches_replayed.clone(),
        );
        r.register(
            "click_events_shipped",
            "Click events shipped to the Redis stream (scale-out mode)",
            self.clicks_shipped.clone(),
        );
        r.register(
            "redis_up",
            "1 while Redis answers, 0 while this instance runs on its local fallbacks (scale-out mode)",
            self.redis_up.clone(),
        );
        r.register(
            "unannounced_link_changes",
            "Link changes not yet announced to other instances because Redis did not answer (retried)",
            self.unannounced_changes.clone(),
        );
        r.register(
            "store_timeouts",
            "Store calls of the request path that got no answer within --store-timeout-ms",
            self.store_timeouts.clone(),
        );
        r.register(
            "store_breaker_refusals",
            "Store calls refused at once because the store's circuit breaker was open",
            self.store_refused.clone(),
        );
        r.register(
            "store_breaker_opens",
            "Times the store's circuit breaker opened after repeated failures or timeouts",
            self.store_breaker_opens.clone(),
        );
        r.register(
            "store_breaker_state",
            "The store's circuit breaker: 0 closed, 1 open, 2 half-open (one probe out)",
            self.store_breaker_state.clone(),
        );
        r.register(
            "replica_healthy",
            "1 while a read replica answers and is within --replica-max-lag-ms, 0 while it is skipped",
            self.replica_healthy.clone(),
        );
        r.register(
            "replica_lag_milliseconds",
            "How far a read replica's replay is behind the primary's log, as last measured",
            self.replica_lag_ms.clone(),
        );
        r.register(
            "replica_reads",
            "Reads (links, analytics, tokens) answered by a read replica",
            self.replica_reads.clone(),
        );
        r.register(
            "primary_reads",
            "Reads sent to the primary although replicas are configured: codes this instance just wrote, replica misses of tokens, no healthy replica",
            self.primary_reads.clone(),
        );
        r.register(
            "generated_code_skips",
            "Generated codes skipped because a custom alias already held them",
            self.generated_code_skips.clone(),
        );
        r.register(
            "click_events_dropped",
            "Click events dropped because the click queue was full",
            self.clicks_dropped.clone(),
        );
        r.register(
            "click_events_flushed",
            "Click events written to the store",
            self.clicks_flushed.clone(),
        );
        r.register(
            "click_flushes",
            "Batches of clicks written to the store",
            self.click_flushes.clone(),
        );
        r.register(
            "click_flush_failures",
            "Batches of clicks the store refused (retried later)",
            self.click_flush_failures.clone(),
        );
        r.register(
            "click_flush_seconds",
            "Time to write one batch of clicks",
            self.click_flush_seconds.clone(),
        );
        r.register(
            "click_flush_events",
            "Click events per batch written to the store",
            self.click_flush_events.clone(),
        );
        r.register(
            "click_queue_depth",
            "Click events waiting in the queue",
            self.click_queue_depth.clone(),
        );
        r.register(
            "store_up",
            "1 while the link store answers a ping (checked at each scrape), 0 while it does not",
            self.store_up.clone(),
        );
        r.register(
            "click_lag_seconds",
            "Age of the oldest click this process took that is not yet in the store (or, scale-out, the stream); 0 when none",
            self.click_lag_seconds.clone(),
        );
        r.register(
            "click_stream_lag_seconds",
            "Age of the oldest click batch the aggregator read from the stream in its last round; 0 when the stream was empty (scale-out mode)",
            self.click_stream_lag_seconds.clone(),
        );
        self
    }

    /// Sets what the replica monitor last measured of one replica.
    pub(crate) fn set_replica(&self, replica: &str, healthy: bool, lag_ms: Option<u64>) {
        let label = Replica {
            replica: replica.to_owned(),
        };
        self.replica_healthy
            .get_or_create(&label)
            .set(i64::from(healthy));
        if let Some(lag) = lag_ms {
            self.replica_lag_ms
                .get_or_create(&label)
                .set(i64::try_from(lag).unwrap_or(i64::MAX));
        }
    }

    /// Counts one link creation request by its outcome (`created`, `invalid`, `conflict`, …).
    pub(crate) fn count_create(&self, outcome: &'static str) {
        self.creates.get_or_create(&Outcome { outcome }).inc();
    }

    /// The Prometheus text exposition of every metric.
    pub(crate) fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
        out
    }
}

/// A count as a gauge's value (saturating: a count past `i64::MAX` is not one a gauge shows).
pub(crate) fn gauge(count: impl TryInto<i64>) -> i64 {
    count.try_into().unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_striped_counter_sums_every_thread_s_counts() {
        let counter = std::sync::Arc::new(HotCounter::default());
        let threads: Vec<_> = (0..2 * STRIPES)
            .map(|_| {
                let counter = counter.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        counter.inc();
                    }
                    counter.inc_by(5);
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(counter.get(), 2 * STRIPES as u64 * 1005);
        let metrics = Metrics::new();
        metrics.redirect_found.inc_by(3);
        assert!(
            metrics
                .render()
                .contains(r#"shortener_redirects_total{outcome="found"} 3"#)
        );
    }
}
