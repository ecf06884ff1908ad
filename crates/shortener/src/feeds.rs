//! Threat feed files (`--threat-feed`, and `--blocklist` as one more feed): loaded at start,
//! re-read when one changes or on SIGHUP; after every reload a background sweep disables
//! the active links whose destination now matches (actor `threat-feed`), in batches. In the
//! scale-out mode one instance sweeps: the one that takes a lock in Redis.

use crate::api::App;
use crate::metrics::Metrics;
use futures_util::StreamExt;
use shortener_core::audit::Origin;
use shortener_core::link::LinkChange;
use shortener_core::store::ChangeOutcome;
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
/// The Redis key of the sweep lock and how long it holds without being released.
const SWEEP_LOCK: &str = "shortener:threat-sweep";
const SWEEP_LOCK_MS: u64 = 600_000;
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

    /// Reads and parses the file; garbage lines are logged with their numbers, never fatal.
    pub(crate) fn load(&self) -> std::io::Result<Feed> {
        let text = std::fs::read_to_string(&self.path)?;
        let (feed, skipped) = Feed::parse(&self.name, &text);
        for s in skipped.iter().take(SKIPPED_LOGGED) {
            tracing::warn!(feed = %self.name, line = s.line, reason = s.reason, "skipped a feed line");
        }
        if skipped.len() > SKIPPED_LOGGED {
            tracing::warn!(feed = %self.name, more = skipped.len() - SKIPPED_LOGGED, "skipped more feed lines");
        }
        tracing::info!(feed = %self.name, entries = feed.len(), skipped = skipped.len(), "threat feed loaded");
        Ok(feed)
    }

    fn modified(&self) -> Option<SystemTime> {
        std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .ok()
    }
}

/// The feeds in force; swapped whole on a reload.
#[derive(Debug, Clone, Default)]
pub(crate) struct FeedCell(Arc<RwLock<Arc<Feeds>>>);

impl FeedCell {
    pub(crate) fn new(feeds: Feeds) -> Self {
        Self(Arc::new(RwLock::new(Arc::new(feeds))))
    }

    pub(crate) fn get(&self) -> Arc<Feeds> {
        match self.0.read() {
            Ok(f) => f.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn set(&self, feeds: Feeds) {
        let mut guard = match self.0.write() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        *guard = Arc::new(feeds);
    }
}

/// Loads every file at start: an unreadable one stops the start.
pub(crate) fn load_all(files: &[FeedFile]) -> anyhow::Result<Feeds> {
    files
        .iter()
        .map(|f| {
            f.load()
                .map_err(|e| anyhow::anyhow!("cannot read threat feed {}: {e}", f.path.display()))
        })
        .collect::<anyhow::Result<Vec<_>>>()
        .map(Feeds)
}

/// Keeps `cell` in step with the files and wakes `sweep` after each reload, forever.
pub(crate) async fn reload_forever(files: Vec<FeedFile>, cell: FeedCell, sweep: Arc<Notify>) {
    let mut last: Vec<Option<SystemTime>> = files.iter().map(FeedFile::modified).collect();
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    let mut tick = tokio::time::interval(POLL);
    loop {
        let forced = tokio::select! {
            _ = tick.tick() => false,
            Some(()) = async { match hangup.as_mut() { Some(h) => h.recv().await, None => None } } => true,
        };
        let now: Vec<Option<SystemTime>> = files.iter().map(FeedFile::modified).collect();
        if !forced && now == last {
            continue;
        }
        last = now;
        let current = cell.get();
        let mut feeds = Vec::with_capacity(files.len());
        for (i, file) in files.iter().enumerate() {
            // A million-line file takes a while to parse: off the runtime's workers.
            let reading = file.clone();
            let loaded = tokio::task::spawn_blocking(move || reading.load())
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e)));
            match loaded {
                Ok(feed) => feeds.push(feed),
                Err(e) => {
                    tracing::warn!(path = %file.path.display(), error = %e, "cannot reload threat feed; keeping the previous one");
                    feeds.push(current.0.get(i).cloned().unwrap_or_default());
                }
            }
        }
        cell.set(Feeds(feeds));
        sweep.notify_one();
    }
}

/// Sweeps at start and after every reload, forever.
pub(crate) async fn sweep_forever(app: Arc<App>, sweep: Arc<Notify>) {
    loop {
        let feeds = app.threats.get();
        app.metrics
            .threat_feed_entries
            .set(i64::try_from(feeds.len()).unwrap_or(i64::MAX));
        if !feeds.is_empty() {
            match sweep_once(&app).await {
                Ok(Some(disabled)) => tracing::info!(disabled, "threat sweep done"),
                Ok(None) => tracing::debug!("another instance sweeps"),
                Err(e) => {
                    tracing::warn!(error = %e, "threat sweep stopped; the next reload retries")
                }
            }
        }
        sweep.notified().await;
    }
}

/// One sweep over every active link; `None` when another instance holds the sweep.
async fn sweep_once(app: &App) -> Result<Option<u64>, shortener_core::store::StoreError> {
    let lock = match &app.scaleout {
        Some(scaleout) => {
            let owner = format!("{}-{}", crate::config::hostname(), std::process::id());
            let taken: Option<String> = scaleout
                .redis
                .query(
                    redis::cmd("SET")
                        .arg(SWEEP_LOCK)
                        .arg(&owner)
                        .arg("NX")
                        .arg("PX")
                        .arg(SWEEP_LOCK_MS),
                )
                .await
                .unwrap_or(None);
            if taken.is_none() {
                return Ok(None);
            }
            Some(scaleout.redis.clone())
        }
        None => None,
    };
    let started = Instant::now();
    let result = sweep_links(app, &app.metrics).await;
    app.metrics
        .threat_sweep_seconds
        .observe(started.elapsed().as_secs_f64());
    if let Some(redis) = lock {
        let _ = redis.query::<i64>(redis::cmd("DEL").arg(SWEEP_LOCK)).await;
    }
    result.map(Some)
}

async fn sweep_links(
    app: &App,
    metrics: &Metrics,
) -> Result<u64, shortener_core::store::StoreError> {
    let feeds = app.threats.get();
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
