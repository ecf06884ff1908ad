//! What the shortener's `/metrics` says while the cases run: of its click pipeline, clicks
//! dropped because the queue was full (issue 18: none while the store is only slow), the
//! writes, and the lag gauge, sampled; of its link cache, how full it is and how often a
//! request waited on the store.

use anyhow::{Context, bail};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the lag gauge is read during a case.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// The click and store-read counters at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Counters {
    dropped: f64,
    written: f64,
    writes: f64,
    write_seconds: f64,
    lag_seconds: f64,
    /// Misses that read the store: a request waited on it.
    store_reads: f64,
    /// Unknown codes read again in the background instead.
    renewals: f64,
}

impl Counters {
    /// Reads them from the server at `base` (`http://host:port`).
    pub(crate) fn read(base: &str) -> anyhow::Result<Counters> {
        let text = get_metrics(base)?;
        let value = |name: &str| metric(&text, name);
        Ok(Counters {
            dropped: value("shortener_click_events_dropped_total"),
            // Written to the store, or (scale-out) shipped to the stream.
            written: value("shortener_click_events_flushed_total")
                + value("shortener_click_events_shipped_total"),
            writes: value("shortener_click_flush_seconds_count"),
            write_seconds: value("shortener_click_flush_seconds_sum"),
            lag_seconds: value("shortener_click_lag_seconds"),
            store_reads: value("shortener_store_link_reads_total"),
            renewals: value("shortener_cache_renewals_total"),
        })
    }

    /// One line: what happened between `self` (earlier) and `later`.
    pub(crate) fn since(&self, later: &Counters, lag_max: f64) -> String {
        let writes = later.writes - self.writes;
        format!(
            "clicks dropped {:.0}, written {:.0} in {writes:.0} writes (mean {:.0} ms), lag gauge up to {lag_max:.0} s; store reads on requests {:.0}, in the background {:.0}",
            later.dropped - self.dropped,
            later.written - self.written,
            (later.write_seconds - self.write_seconds) / writes.max(1.0) * 1e3,
            later.store_reads - self.store_reads,
            later.renewals - self.renewals,
        )
    }
}

/// The link cache's fill: what explains most of the RSS once its room is full.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CacheFill {
    entries: f64,
    weight_bytes: f64,
}

impl CacheFill {
    /// Reads it from the server at `base` (`http://host:port`).
    pub(crate) fn read(base: &str) -> anyhow::Result<CacheFill> {
        let text = get_metrics(base)?;
        Ok(CacheFill {
            entries: metric(&text, "shortener_cache_entries"),
            weight_bytes: metric(&text, "shortener_cache_weight_bytes"),
        })
    }
}

impl std::fmt::Display for CacheFill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "link cache {:.0} entries, {:.1} MiB by its estimate",
            self.entries,
            self.weight_bytes / (1024.0 * 1024.0)
        )
    }
}

/// The value of an unlabelled metric in `/metrics`' text, 0 when absent.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// `GET /metrics`, blocking: it is read between wrk runs and from the sampling thread, outside
/// the bench's runtime.
fn get_metrics(base: &str) -> anyhow::Result<String> {
    let response = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?
        .get(format!("{base}/metrics"))
        .send()
        .with_context(|| format!("GET {base}/metrics"))?;
    if !response.status().is_success() {
        bail!("/metrics answered {}", response.status());
    }
    Ok(response.text()?)
}

/// Samples the lag gauge until stopped; gives the highest value read.
pub(crate) struct LagWatch {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<f64>,
}

impl LagWatch {
    pub(crate) fn start(base: &str) -> LagWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let (base, stopped) = (base.to_owned(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut highest: f64 = 0.0;
            while !stopped.load(Ordering::Relaxed) {
                // A failed read (the server busy past the timeout) is a sample missed, not an error.
                if let Ok(clicks) = Counters::read(&base) {
                    highest = highest.max(clicks.lag_seconds);
                }
                std::thread::sleep(SAMPLE_EVERY);
            }
            highest
        });
        LagWatch { stop, thread }
    }

    pub(crate) fn finish(self) -> f64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or(f64::NAN)
    }
}
