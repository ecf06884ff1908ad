//! A steady redirect load in the background, counting what failed, for outage tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::task::JoinSet;

/// Pause of each load task between its requests: a few hundred requests per second in all.
const PACE: Duration = Duration::from_millis(10);

/// Redirects answered, by outcome.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    /// 301/302.
    pub redirected: u64,
    /// Anything else (5xx, 404, connection errors).
    pub failed: u64,
}

/// Tasks requesting `urls` round-robin until [`Load::stop`].
pub struct Load {
    stop: Arc<AtomicBool>,
    redirected: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    tasks: JoinSet<()>,
}

impl Load {
    pub fn start(client: reqwest::Client, urls: Vec<String>, tasks: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let redirected = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let urls = Arc::new(urls);
        let mut set = JoinSet::new();
        for t in 0..tasks {
            let (stop, ok, bad, urls, c) = (
                stop.clone(),
                redirected.clone(),
                failed.clone(),
                urls.clone(),
                client.clone(),
            );
            set.spawn(async move {
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    let url = &urls[i % urls.len()];
                    i += 1;
                    match c.get(url).send().await {
                        Ok(r) if r.status().is_redirection() => {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        outcome => {
                            // Named in the test's output, to tell what failed.
                            let what = match outcome {
                                Ok(r) => {
                                    format!("{} {}", r.status(), r.text().await.unwrap_or_default())
                                }
                                Err(e) => e.to_string(),
                            };
                            eprintln!("load: {url} failed: {what}");
                            bad.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    tokio::time::sleep(PACE).await;
                }
            });
        }
        Self {
            stop,
            redirected,
            failed,
            tasks: set,
        }
    }

    /// The tally so far.
    pub fn tally(&self) -> Tally {
        Tally {
            redirected: self.redirected.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
        }
    }

    pub async fn stop(mut self) -> Tally {
        self.stop.store(true, Ordering::Relaxed);
        while self.tasks.join_next().await.is_some() {}
        self.tally()
    }
}

/// What happened between two tallies.
pub fn since(before: Tally, after: Tally) -> Tally {
    Tally {
        redirected: after.redirected - before.redirected,
        failed: after.failed - before.failed,
    }
}
