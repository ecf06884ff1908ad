//! The domain blocklist file: loaded at start, re-read when it changes or on SIGHUP.

use shortener_core::long_url::{Blocklist, UrlPolicy};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

/// How often the file's modification time is checked.
const POLL: Duration = Duration::from_secs(2);

/// The URL policy in force; swapped whole when the blocklist changes.
#[derive(Debug, Clone)]
pub(crate) struct PolicyCell(Arc<RwLock<Arc<UrlPolicy>>>);

impl PolicyCell {
    pub(crate) fn new(policy: UrlPolicy) -> Self {
        Self(Arc::new(RwLock::new(Arc::new(policy))))
    }

    /// The current policy.
    pub(crate) fn get(&self) -> Arc<UrlPolicy> {
        match self.0.read() {
            Ok(p) => p.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn set_blocklist(&self, blocklist: Blocklist) {
        let mut guard = match self.0.write() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        let mut policy = (**guard).clone();
        policy.blocklist = blocklist;
        *guard = Arc::new(policy);
    }
}

/// Reads and parses a blocklist file.
pub(crate) fn load(path: &Path) -> std::io::Result<Blocklist> {
    std::fs::read_to_string(path).map(|text| Blocklist::parse(&text))
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Keeps `cell`'s blocklist in step with the file until the process ends.
pub(crate) fn spawn_reloader(path: PathBuf, cell: PolicyCell) {
    tokio::spawn(async move {
        let mut last = modified(&path);
        let mut hangup =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        let mut tick = tokio::time::interval(POLL);
        loop {
            let forced = tokio::select! {
                _ = tick.tick() => false,
                Some(()) = async { match hangup.as_mut() { Some(h) => h.recv().await, None => None } } => true,
            };
            let now = modified(&path);
            if !forced && now == last {
                continue;
            }
            last = now;
            match load(&path) {
                Ok(list) => {
                    tracing::info!(path = %path.display(), domains = list.len(), "blocklist reloaded");
                    cell.set_blocklist(list);
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot reload blocklist; keeping the previous one")
                }
            }
        }
    });
}
