//! Clicks across instances: each instance ships its folded clicks as batches onto one Redis
//! stream; aggregators (a consumer group: inside each instance, or `shortener aggregate`)
//! apply them to the store.
//!
//! Exactly once, end to end: a batch carries an id chosen by its shipper, and the store
//! records applied ids in the same transaction as the counts ([`ClickSink::apply_click_batches`]).
//! So a send retried after a lost answer, an entry redelivered after an aggregator died
//! between its commit and its `XACK`, or one claimed by another aggregator (`XAUTOCLAIM`)
//! all count once. Acknowledged entries are deleted, so the stream holds only what is in
//! flight.
//!
//! [`ClickSink::apply_click_batches`]: shortener_core::store::ClickSink::apply_click_batches

use super::redis::{Redis, Unreachable};
use crate::metrics::Metrics;
use crate::store::Store;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use redis::streams::{StreamAutoClaimReply, StreamId, StreamReadReply};
use shortener_core::day::Day;
use shortener_core::people::People;
use shortener_core::store::{ClickBatch, ClickDelta};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::watch;

const STREAM: &str = "shortener:clicks";
const GROUP: &str = "aggregators";
/// Entries read per round.
const READ_COUNT: usize = 500;
/// Blocking read; below the client's response timeout.
const BLOCK_MS: u64 = 100;
/// An entry delivered this long ago and still not acknowledged belongs to a dead (or very
/// slow) aggregator and is taken over. Taking over a live one's entry is harmless: the
/// batch id makes the second apply a no-op.
pub(crate) const CLAIM_IDLE: Duration = Duration::from_secs(10);
const CLAIM_EVERY: Duration = Duration::from_secs(2);
const RETRY_AFTER: Duration = Duration::from_millis(200);
/// How long a stopping aggregator keeps applying what is left.
const DRAIN_AT_EXIT: Duration = Duration::from_secs(5);

/// The shipping side: one per instance.
#[derive(Debug)]
pub(crate) struct ClickShipper {
    redis: Arc<Redis>,
    instance: String,
    sequence: AtomicU64,
}

impl ClickShipper {
    pub(crate) fn new(redis: Arc<Redis>) -> Self {
        Self {
            redis,
            instance: format!("{:032x}", rand::random::<u128>()),
            sequence: AtomicU64::new(0),
        }
    }

    /// Names a new batch; ids never repeat across processes.
    pub(crate) fn batch(&self, deltas: Vec<ClickDelta>) -> ClickBatch {
        let n = self.sequence.fetch_add(1, Ordering::Relaxed);
        ClickBatch {
            id: format!("{}-{n}", self.instance),
            deltas,
        }
    }

    /// Appends the batch to the stream.
    pub(crate) async fn ship(&self, batch: &ClickBatch) -> Result<(), Unreachable> {
        self.redis
            .query::<String>(
                redis::cmd("XADD")
                    .arg(STREAM)
                    .arg("*")
                    .arg("id")
                    .arg(&batch.id)
                    .arg("d")
                    .arg(encode(&batch.deltas))
                    .arg("p")
                    .arg(encode_people(&batch.deltas)),
            )
            .await
            .map(drop)
    }
}

/// `code day human bot` per line; codes never contain spaces or newlines.
fn encode(deltas: &[ClickDelta]) -> String {
    let mut out = String::with_capacity(deltas.len() * 24);
    for d in deltas {
        use std::fmt::Write;
        let _ = writeln!(out, "{} {} {} {}", d.code, d.day.number(), d.human, d.bot);
    }
    out
}

/// The people of the deltas that have any, as JSON `[[index, sketch (base64), tops], …]`
/// (tops: [`People::tops_to_text`]); a field of its own so that `d` stays line-based.
fn encode_people(deltas: &[ClickDelta]) -> String {
    let entries: Vec<serde_json::Value> = deltas
        .iter()
        .enumerate()
        .filter_map(|(i, d)| d.people().map(|people| (i, people)))
        .map(|(i, people)| {
            serde_json::json!([
                i,
                BASE64.encode(people.visitors.to_bytes()),
                people.tops_to_text()
            ])
        })
        .collect();
    serde_json::Value::Array(entries).to_string()
}

/// Puts [`encode_people`]'s people back on their deltas.
fn decode_people(text: &str, deltas: &mut [ClickDelta]) -> Option<()> {
    let entries: Vec<(usize, String, String)> = serde_json::from_str(text).ok()?;
    for (i, sketch, tops) in entries {
        let bytes = BASE64.decode(sketch).ok()?;
        deltas.get_mut(i)?.people = Some(Box::new(People::from_parts(&bytes, &tops).ok()?));
    }
    Some(())
}

fn decode(text: &str) -> Option<Vec<ClickDelta>> {
    text.lines()
        .map(|line| {
            let mut parts = line.split(' ');
            let delta = ClickDelta {
                code: parts.next()?.into(),
                day: Day::from_number(parts.next()?.parse().ok()?),
                human: parts.next()?.parse().ok()?,
                bot: parts.next()?.parse().ok()?,
                people: None,
            };
            parts.next().is_none().then_some(delta)
        })
        .collect()
}

fn to_batch(entry: &StreamId) -> Option<ClickBatch> {
    let id: String = entry.get("id")?;
    let mut deltas = decode(&entry.get::<String>("d")?)?;
    // Entries shipped before people were counted have no `p`.
    if let Some(people) = entry.get::<String>("p") {
        decode_people(&people, &mut deltas)?;
    }
    Some(ClickBatch { id, deltas })
}

/// Runs one aggregator until `shutdown` changes: reads batches, applies them, acknowledges.
/// `redis` should be a connection of its own: the blocking read holds it for up to
/// [`BLOCK_MS`], and a shared multiplexed connection would make every other command wait.
pub(crate) async fn aggregate(
    redis: Arc<Redis>,
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    consumer: String,
    claim_idle: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut aggregator = Aggregator {
        redis,
        store,
        metrics,
        consumer,
        claim_idle,
        group_ready: false,
        own_backlog: true,
        last_claim: tokio::time::Instant::now(),
    };
    tracing::info!(consumer = %aggregator.consumer, "click aggregator running");
    loop {
        if *shutdown.borrow() {
            aggregator.drain().await;
            break;
        }
        if let Err(e) = aggregator.round().await {
            tracing::warn!(error = %e, "click aggregation round failed; retrying");
            aggregator.group_ready = false;
            aggregator.own_backlog = true;
            // Empty reads already wait in Redis (BLOCK); only failures are spaced out here.
            tokio::select! {
                _ = tokio::time::sleep(RETRY_AFTER) => {}
                _ = shutdown.changed() => {}
            }
        }
    }
    tracing::info!("click aggregator stopped");
}

#[derive(Debug, thiserror::Error)]
enum RoundError {
    #[error(transparent)]
    Redis(#[from] Unreachable),
    #[error(transparent)]
    Store(#[from] shortener_core::store::StoreError),
}

struct Aggregator {
    redis: Arc<Redis>,
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    consumer: String,
    claim_idle: Duration,
    group_ready: bool,
    /// Entries delivered to this consumer name before (a restart) come first.
    own_backlog: bool,
    last_claim: tokio::time::Instant,
}

impl Aggregator {
    /// At shutdown: applies what is already in the stream (this instance's last shipment
    /// included), for a bounded time: until a read of new entries comes back empty.
    async fn drain(&mut self) {
        let deadline = tokio::time::Instant::now() + DRAIN_AT_EXIT;
        while tokio::time::Instant::now() < deadline {
            self.last_claim = tokio::time::Instant::now();
            let reads_new = !self.own_backlog;
            match self.round().await {
                Ok(0) if reads_new => return,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "cannot drain the click stream at exit; other aggregators will");
                    return;
                }
            }
        }
    }

    async fn ensure_group(&mut self) -> Result<(), Unreachable> {
        if self.group_ready {
            return Ok(());
        }
        let created = self
            .redis
            .query::<String>(
                redis::cmd("XGROUP")
                    .arg("CREATE")
                    .arg(STREAM)
                    .arg(GROUP)
                    .arg("0")
                    .arg("MKSTREAM"),
            )
            .await;
        match created {
            Ok(_) => {}
            Err(Unreachable::Failed(e)) if e.code() == Some("BUSYGROUP") => {}
            Err(e) => return Err(e),
        }
        self.group_ready = true;
        Ok(())
    }

    /// One read, apply and acknowledge; returns how many entries were handled.
    async fn round(&mut self) -> Result<usize, RoundError> {
        self.ensure_group().await?;
        let entries = if self.last_claim.elapsed() >= CLAIM_EVERY {
            self.last_claim = tokio::time::Instant::now();
            let claimed: StreamAutoClaimReply = self
                .redis
                .query(
                    redis::cmd("XAUTOCLAIM")
                        .arg(STREAM)
                        .arg(GROUP)
                        .arg(&self.consumer)
                        .arg(self.claim_idle.as_millis() as u64)
                        .arg("0-0")
                        .arg("COUNT")
                        .arg(READ_COUNT),
                )
                .await?;
            if !claimed.claimed.is_empty() {
                tracing::info!(
                    entries = claimed.claimed.len(),
                    "took over click batches of an aggregator that stopped answering"
                );
            }
            claimed.claimed
        } else {
            let mut read = redis::cmd("XREADGROUP");
            read.arg("GROUP")
                .arg(GROUP)
                .arg(&self.consumer)
                .arg("COUNT")
                .arg(READ_COUNT);
            if !self.own_backlog {
                read.arg("BLOCK").arg(BLOCK_MS);
            }
            read.arg("STREAMS")
                .arg(STREAM)
                .arg(if self.own_backlog { "0" } else { ">" });
            let reply: Option<StreamReadReply> = self.redis.query(&read).await?;
            let entries: Vec<StreamId> = reply
                .into_iter()
                .flat_map(|r| r.keys)
                .flat_map(|k| k.ids)
                .collect();
            if self.own_backlog && entries.is_empty() {
                self.own_backlog = false;
            }
            entries
        };
        // Stream ids start with the milliseconds of their XADD: the oldest is the lag.
        let oldest_ms = entries
            .iter()
            .filter_map(|e| e.id.split('-').next()?.parse::<i64>().ok())
            .min();
        self.metrics
            .click_stream_lag_seconds
            .set(oldest_ms.map_or(0, |ms| (crate::now() - ms / 1000).max(0)));
        if entries.is_empty() {
            return Ok(0);
        }
        let batches: Vec<ClickBatch> = entries
            .iter()
            .filter_map(|entry| {
                let batch = to_batch(entry);
                if batch.is_none() {
                    tracing::error!(entry = %entry.id, "unreadable click batch; discarding it");
                }
                batch
            })
            .collect();
        let fresh = self.store.apply_click_batches(&batches).await?;
        self.metrics.click_batches_applied.inc_by(fresh as u64);
        self.metrics
            .click_batches_replayed
            .inc_by((batches.len() - fresh) as u64);
        let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
        let mut done = redis::pipe();
        done.cmd("XACK")
            .arg(STREAM)
            .arg(GROUP)
            .arg(&ids)
            .ignore()
            .cmd("XDEL")
            .arg(STREAM)
            .arg(&ids)
            .ignore();
        self.redis.pipeline::<()>(&done).await?;
        Ok(entries.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_survive_their_encoding_and_garbage_is_refused() {
        let deltas = vec![
            ClickDelta {
                code: "abc1234".into(),
                day: Day::from_number(20_000),
                human: 3,
                bot: 0,
                people: None,
            },
            ClickDelta {
                code: "spring-sale".into(),
                day: Day::from_number(20_001),
                human: 0,
                bot: 9,
                people: None,
            },
        ];
        assert_eq!(decode(&encode(&deltas)), Some(deltas.clone()));
        let mut with_people = deltas.clone();
        with_people[1].people.get_or_insert_default().count(
            42,
            &[(shortener_core::people::Dimension::Browsers, "Mobile Safari")],
        );
        let mut back = decode(&encode(&with_people)).unwrap();
        decode_people(&encode_people(&with_people), &mut back).unwrap();
        assert_eq!(back, with_people);
        assert_eq!(decode_people("[[7, \"\", \"\"]]", &mut back), None);
        assert_eq!(decode_people("not json", &mut back), None);
        assert_eq!(decode(""), Some(vec![]));
        assert_eq!(decode("abc 1 2"), None);
        assert_eq!(decode("abc 1 2 3 4"), None);
        assert_eq!(decode("abc x 2 3"), None);
    }
}
