//! Telling every instance that a link changed: the writer updates the L2 entry and publishes
//! `CODE:VERSION` on a pub/sub channel; every instance (the writer included) drops its L1
//! entry when the message arrives, unless it already holds that version or a later one.
//!
//! An announcement that cannot reach Redis is kept and retried until it does, so that a
//! Redis outage during a write cannot leave a stale L2 entry behind once Redis is back. A
//! subscriber that lost its connection may have missed messages: after every (re)subscribe
//! it drops its whole L1. L1 TTLs stay the last safety net.

use super::l2::{Entry, L2};
use super::redis::{Redis, Unreachable};
use futures_util::StreamExt;
use shortener_core::day::UnixSeconds;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const CHANNEL: &str = "shortener:invalidate";
/// Announcements kept for retry at most; past this, L1 TTLs are the safety net.
const MAX_PENDING: usize = 100_000;
const RETRY_EVERY: Duration = Duration::from_millis(500);
const RESUBSCRIBE_AFTER: Duration = Duration::from_millis(500);
/// How often the subscriber checks that its connection still answers.
const HEARTBEAT: Duration = Duration::from_secs(2);

/// The writer side and the subscriber of invalidations.
#[derive(Debug)]
pub(crate) struct Invalidations {
    redis: Arc<Redis>,
    l2: Arc<L2>,
    pending: std::sync::Mutex<HashMap<String, Entry>>,
    subscribed: AtomicBool,
}

impl Invalidations {
    pub(crate) fn new(redis: Arc<Redis>, l2: Arc<L2>) -> Self {
        Self {
            redis,
            l2,
            pending: std::sync::Mutex::default(),
            subscribed: AtomicBool::new(false),
        }
    }

    /// Whether this instance currently hears other instances' writes.
    pub(crate) fn is_subscribed(&self) -> bool {
        self.subscribed.load(Ordering::Relaxed)
    }

    async fn try_announce(
        &self,
        code: &str,
        entry: &Entry,
        now: UnixSeconds,
    ) -> Result<(), Unreachable> {
        if let Err(e) = self.l2.fill(code, entry, now).await {
            // A refused script (out of memory under `noeviction`, say) must not silence the
            // broadcast: drop the entry instead, which Redis still allows.
            tracing::warn!(code, error = %e, "cannot fill L2 with a change; dropping the entry");
            self.l2.forget(code).await?;
        }
        self.redis
            .query::<i64>(
                redis::cmd("PUBLISH")
                    .arg(CHANNEL)
                    .arg(format!("{code}:{}", entry.version())),
            )
            .await
            .map(drop)
    }

    /// Called after a write to `code` committed; `entry` is the link's new state.
    pub(crate) async fn announce(&self, code: &str, entry: Entry, now: UnixSeconds) {
        if let Err(e) = self.try_announce(code, &entry, now).await {
            tracing::warn!(code, error = %e, "cannot announce a link change yet; will retry");
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(waiting) = pending.get_mut(code) {
                if waiting.version() <= entry.version() {
                    *waiting = entry;
                }
            } else if pending.len() < MAX_PENDING {
                pending.insert(code.to_owned(), entry);
            } else {
                tracing::error!(
                    code,
                    "too many unannounced link changes; this one reaches other instances only when their L1 and the L2 entry expire"
                );
            }
        }
    }

    /// Announcements waiting for Redis.
    pub(crate) fn pending(&self) -> usize {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Tries every waiting announcement once; returns how many are still waiting.
    pub(crate) async fn retry_pending(&self) -> usize {
        let batch: Vec<(String, Entry)> = {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            pending.drain().collect()
        };
        let mut failed = Vec::new();
        let now = crate::now();
        for (code, entry) in batch {
            // After one failure Redis is down: keep the rest for the next round.
            if failed.is_empty() && self.try_announce(&code, &entry, now).await.is_ok() {
                continue;
            }
            failed.push((code, entry));
        }
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        for (code, entry) in failed {
            // A later version of the same code, queued meanwhile, wins.
            let waiting = pending.entry(code).or_insert_with(|| entry.clone());
            if waiting.version() < entry.version() {
                *waiting = entry;
            }
        }
        pending.len()
    }

    /// Retries failed announcements until they go through. Runs forever.
    pub(crate) async fn retry_forever(self: Arc<Self>) {
        let mut tick = tokio::time::interval(RETRY_EVERY);
        loop {
            tick.tick().await;
            self.retry_pending().await;
        }
    }

    /// Listens for changes and calls `drop_one` for each code and version, `drop_all` after every
    /// (re)subscribe. Runs forever, reconnecting (to the next node of a Cluster) as needed;
    /// a connection that stops answering pings counts as lost.
    pub(crate) async fn listen_forever(
        self: Arc<Self>,
        drop_one: impl Fn(&str, u64),
        drop_all: impl Fn(),
    ) {
        for attempt in 0.. {
            match self.subscribe(attempt).await {
                Ok((mut sink, mut messages)) => {
                    self.subscribed.store(true, Ordering::Relaxed);
                    drop_all();
                    tracing::info!("listening for link changes of other instances");
                    let mut heartbeat = tokio::time::interval(HEARTBEAT);
                    heartbeat.tick().await;
                    loop {
                        tokio::select! {
                            message = messages.next() => match message {
                                Some(message) => match message.get_payload::<String>() {
                                    Ok(payload) => {
                                        let (code, version) = parse_message(&payload);
                                        drop_one(code, version);
                                    }
                                    Err(e) => tracing::warn!(error = %e, "unreadable invalidation"),
                                },
                                None => break,
                            },
                            _ = heartbeat.tick() => {
                                let pong = tokio::time::timeout(HEARTBEAT, sink.ping::<redis::Value>()).await;
                                if !matches!(pong, Ok(Ok(_))) {
                                    break;
                                }
                            }
                        }
                    }
                    self.subscribed.store(false, Ordering::Relaxed);
                    tracing::warn!("lost the invalidation channel; resubscribing");
                }
                Err(e) => {
                    tracing::debug!(error = %e, "cannot subscribe to invalidations");
                }
            }
            tokio::time::sleep(RESUBSCRIBE_AFTER).await;
        }
    }

    async fn subscribe(
        &self,
        attempt: usize,
    ) -> Result<(redis::aio::PubSubSink, redis::aio::PubSubStream), redis::RedisError> {
        let mut pubsub = self.redis.pubsub(attempt).await?;
        pubsub.subscribe(CHANNEL).await?;
        Ok(pubsub.split())
    }
}

/// `CODE:VERSION`; a bare code (an older instance's message) is version 0, dropped always.
fn parse_message(payload: &str) -> (&str, u64) {
    match payload.rsplit_once(':') {
        Some((code, version)) => match version.parse() {
            Ok(version) => (code, version),
            Err(_) => (payload, 0),
        },
        None => (payload, 0),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn messages_carry_the_version() {
        assert_eq!(super::parse_message("abc1234:7"), ("abc1234", 7));
        assert_eq!(super::parse_message("abc1234"), ("abc1234", 0));
    }
}
