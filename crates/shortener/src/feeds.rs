//! Threat feed files (`--threat-feed`, and `--blocklist` as one more feed) and the trusted
//! domains (`--trusted-domains`): loaded at start, re-read when one changes or on SIGHUP.
//! After every feed reload a background sweep disables the active links whose destination
//! now matches (actor `threat-feed`), in batches. Of the processes on one store, one sweeps
//! each set of feeds: the one that takes the store's lease on it.

use crate::api::App;
use crate::metrics::{Metrics, gauge};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use shortener_core::audit::Origin;
use shortener_core::link::LinkChange;
use shortener_core::long_url::Blocklist;
use shortener_core::store::{ChangeOutcome, StoreError};
use shortener_core::threat::{Feed, Feeds, ThreatMatcher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::Notify;

/// How often the files' modification times are checked.
const POLL: Duration = Duration::from_secs(2);
/// Links read per sweep batch.
const SWEEP_BATCH: usize = 500;
/// Disables in flight at once during a sweep (the embedded store commits them in groups).
const SWEEP_CONCURRENCY: usize = 32;
/// Pause between sweep batches, so that a sweep never crowds out redirects.
const BETWEEN_BATCHES: Duration = Duration::from_millis(5);
/// The store's lease of the sweep, and how long it holds when its holder dies mid-sweep.
const SWEEP_LEASE: &str = "threat-sweep";
const SWEEP_LEASE_SECONDS: i64 = 600;
/// After a sweep the store cut short (a busy pool, a restart), the wait before it runs again,
/// doubling up to the second figure while it keeps failing; a reload starts it sooner.
const SWEEP_RETRY_FIRST: Duration = Duration::from_secs(1);
const SWEEP_RETRY_MAX: Duration = Duration::from_secs(60);
/// The system actor of sweeps.
pub(crate) const ACTOR: &str = "threat-feed";
/// Skipped lines listed one by one in the log, per file.
const SKIPPED_LOGGED: usize = 20;

/// A feed file and the name its matches are reported under (the file name).
#[derive(Debug, Clone)]
pub(crate) struct FeedFile {
    pub(crate) path: PathBuf,
    pub(crate) name: String,
}

impl FeedFile {
    pub(crate) fn new(path: PathBuf) -> Self {
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        Self { path, name }
    }

    /// Reads and parses the file, with the SHA-256 of its text; garbage lines are logged with
    /// their numbers, never fatal.
    pub(crate) fn load(&self) -> std::io::Result<(Feed, [u8; 32])> {
        let text = std::fs::read_to_string(&self.path)?;
        let (feed, skipped) = Feed::parse(&self.name, &text);
        for s in skipped.iter().take(SKIPPED_LOGGED) {
            tracing::warn!(feed = %self.name, line = s.line, reason = s.reason, "skipped a feed line");
        }
        if skipped.len() > SKIPPED_LOGGED {
            tracing::warn!(feed = %self.name, more = skipped.len() - SKIPPED_LOGGED, "skipped more feed lines");
        }
        tracing::info!(feed = %self.name, entries = feed.len(), skipped = skipped.len(), "threat feed loaded");
        Ok((feed, Sha256::digest(text.as_bytes()).into()))
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// The feeds in force and what they were read from.
#[derive(Debug, Clone, Default)]
pub(crate) struct LoadedFeeds {
    pub(crate) feeds: Feeds,
    /// The SHA-256 of each file's text, in the order of `feeds`.
    digests: Vec<[u8; 32]>,
}

impl LoadedFeeds {
    /// Names the set of feeds: processes that read the same files agree on it, so the
    /// store's lease lets one of them sweep each set once.
    fn fingerprint(&self) -> String {
        let mut all = Sha256::new();
        for (feed, digest) in self.feeds.0.iter().zip(&self.digests) {
            all.update(feed.name().as_bytes());
            all.update([0]);
            all.update(digest);
        }
        STANDARD.encode(all.finalize())
    }
}

/// A value readers share and a reload swaps whole.
#[derive(Debug, Default)]
pub(crate) struct Swapped<T>(Arc<RwLock<Arc<T>>>);

impl<T> Clone for Swapped<T> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<T> Swapped<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(Arc::new(RwLock::new(Arc::new(value))))
    }

    pub(crate) fn get(&self) -> Arc<T> {
        match self.0.read() {
            Ok(v) => v.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn set(&self, value: T) {
        let mut guard = match self.0.write() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        *guard = Arc::new(value);
    }
}

/// Loads every file at start: an unreadable one stops the start.
pub(crate) fn load_all(files: &[FeedFile]) -> anyhow::Result<LoadedFeeds> {
    let mut loaded = LoadedFeeds::default();
    for f in files {
        let (feed, digest) = f
            .load()
            .map_err(|e| anyhow::anyhow!("cannot read threat feed {}: {e}", f.path.display()))?;
        loaded.feeds.0.push(feed);
        loaded.digests.push(digest);
    }
    Ok(loaded)
}

/// The trusted domains of `path`, one per line (subdomains included).
pub(crate) fn load_trusted(path: &Path) -> std::io::Result<Blocklist> {
    std::fs::read_to_string(path).map(|text| Blocklist::parse(&text))
}

/// What [`reload_forever`] keeps in step with its files.
#[derive(Debug)]
pub(crate) struct Watched {
    pub(crate) feed_files: Vec<FeedFile>,
    pub(crate) feeds: Swapped<LoadedFeeds>,
    pub(crate) trusted_file: Option<PathBuf>,
    pub(crate) trusted: Swapped<Blocklist>,
    pub(crate) metrics: Arc<Metrics>,
}

/// Keeps the feeds and the trusted domains in step with their files, and wakes `sweep` after
/// each feed reload, forever. A file that cannot be read keeps its previous contents.
pub(crate) async fn reload_forever(watched: Watched, sweep: Arc<Notify>) {
    let feeds_seen = || -> Vec<_> {
        watched
            .feed_files
            .iter()
            .map(|f| modified(&f.path))
            .collect()
    };
    let trusted_seen = || watched.trusted_file.as_deref().and_then(modified);
    let (mut last_feeds, mut last_trusted) = (feeds_seen(), trusted_seen());
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    let mut tick = tokio::time::interval(POLL);
    loop {
        let forced = tokio::select! {
            _ = tick.tick() => false,
            Some(()) = async { match hangup.as_mut() { Some(h) => h.recv().await, None => None } } => true,
        };
        let (now_feeds, now_trusted) = (feeds_seen(), trusted_seen());
        if let Some(path) = &watched.trusted_file
            && (forced || now_trusted != last_trusted)
        {
            match load_trusted(path) {
                Ok(list) => {
                    tracing::info!(domains = list.len(), "trusted domains loaded");
                    watched.metrics.trusted_domains.set(gauge(list.len()));
                    watched.trusted.set(list);
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot reload trusted domains; keeping the previous ones")
                }
            }
        }
        last_trusted = now_trusted;
        if watched.feed_files.is_empty() || (!forced && now_feeds == last_feeds) {
            continue;
        }
        last_feeds = now_feeds;
        let current = watched.feeds.get();
        let mut next = LoadedFeeds::default();
        for (i, file) in watched.feed_files.iter().enumerate() {
            // A million-line file takes a while to parse: off the runtime's workers.
            let reading = file.clone();
            let loaded = tokio::task::spawn_blocking(move || reading.load())
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e)));
            let (feed, digest) = match loaded {
                Ok(read) => read,
                Err(e) => {
                    tracing::warn!(path = %file.path.display(), error = %e, "cannot reload threat feed; keeping the previous one");
                    (
                        current.feeds.0.get(i).cloned().unwrap_or_default(),
                        current.digests.get(i).copied().unwrap_or_default(),
                    )
                }
            };
            next.feeds.0.push(feed);
            next.digests.push(digest);
        }
        watched.feeds.set(next);
        sweep.notify_one();
    }
}

/// Sweeps at start and after every reload, forever; a sweep the store cut short runs again.
pub(crate) async fn sweep_forever(app: Arc<App>, sweep: Arc<Notify>) {
    // Unique among the processes on the store: the lease's holder.
    let holder = format!(
        "{}-{}-{:08x}",
        crate::config::hostname(),
        std::process::id(),
        rand::random::<u32>()
    );
    let mut retry = SWEEP_RETRY_FIRST;
    loop {
        let loaded = app.threats.get();
        app.metrics
            .threat_feed_entries
            .set(gauge(loaded.feeds.len()));
        if !loaded.feeds.is_empty() {
            match sweep_once(&app, &loaded, &holder).await {
                Ok(Some(disabled)) => tracing::info!(disabled, "threat sweep done"),
                Ok(None) => {
                    app.metrics.threat_sweeps_left.inc();
                    tracing::debug!("another process sweeps, or swept, these feeds");
                }
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?retry, "threat sweep stopped; it runs again");
                    // Its lease was given back unfinished: whichever process comes first sweeps.
                    tokio::select! {
                        () = sweep.notified() => {}
                        () = tokio::time::sleep(retry) => {}
                    }
                    retry = (retry * 2).min(SWEEP_RETRY_MAX);
                    continue;
                }
            }
        }
        retry = SWEEP_RETRY_FIRST;
        sweep.notified().await;
    }
}

/// One sweep over every active link; `None` when another process holds the sweep's lease
/// or finished a sweep of these very feeds.
async fn sweep_once(
    app: &App,
    loaded: &LoadedFeeds,
    holder: &str,
) -> Result<Option<u64>, StoreError> {
    let work = loaded.fingerprint();
    let now = crate::now();
    let until = now + SWEEP_LEASE_SECONDS;
    if !app
        .store
        .take_lease(SWEEP_LEASE, holder, &work, until, now)
        .await?
    {
        return Ok(None);
    }
    let started = Instant::now();
    let result = sweep_links(app, &loaded.feeds).await;
    app.metrics
        .threat_sweep_seconds
        .observe(started.elapsed().as_secs_f64());
    let done = result.is_ok().then_some(work.as_str());
    if let Err(e) = app.store.end_lease(SWEEP_LEASE, holder, done).await {
        tracing::warn!(error = %e, "cannot end the sweep's lease; it runs out by itself");
    }
    result.map(Some)
}

async fn sweep_links(app: &App, feeds: &Feeds) -> Result<u64, StoreError> {
    let metrics = &app.metrics;
    let origin = Origin::system(ACTOR);
    let mut after = String::new();
    let mut disabled = 0;
    loop {
        let batch = app
            .store
            .live_destinations_after(&after, SWEEP_BATCH)
            .await?;
        let matches: Vec<(String, String)> = batch
            .iter()
            .filter_map(|(code, long_url)| {
                let url = url::Url::parse(long_url).ok()?;
                let feed = feeds.find(&url)?;
                Some((code.clone(), feed.to_owned()))
            })
            .collect();
        let outcomes: Vec<_> = futures_util::stream::iter(matches)
            .map(|(code, feed)| {
                let origin = &origin;
                async move {
                    let change = LinkChange::Disable {
                        reason: format!("destination on threat feed {feed}"),
                    };
                    app.store
                        .change_link(&code, &change, origin, crate::now())
                        .await
                }
            })
            .buffer_unordered(SWEEP_CONCURRENCY)
            .collect()
            .await;
        for outcome in outcomes {
            if let ChangeOutcome::Changed { after, .. } = outcome? {
                app.cache.written(&after).await;
                metrics.threat_sweep_disabled.inc();
                disabled += 1;
            }
        }
        match batch.last() {
            Some((code, _)) if batch.len() == SWEEP_BATCH => after.clone_from(code),
            _ => return Ok(disabled),
        }
        tokio::time::sleep(BETWEEN_BATCHES).await;
    }
}

/// The feed files a configuration names: `--blocklist` is one more feed.
pub(crate) fn files(blocklist: Option<&Path>, feeds: &[PathBuf]) -> Vec<FeedFile> {
    blocklist
        .into_iter()
        .chain(feeds.iter().map(PathBuf::as_path))
        .map(|p| FeedFile::new(p.to_owned()))
        .collect()
}
