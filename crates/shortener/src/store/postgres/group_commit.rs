//! Group commit of creates on PostgreSQL, as the embedded store's writer does: creates that
//! arrive while earlier groups are committing queue up, and the next free slot writes all of
//! them in one transaction — one multi-row `INSERT … ON CONFLICT DO NOTHING RETURNING code`,
//! their audit rows in one more statement — so one commit (one WAL flush) makes many creates
//! durable. Every caller is answered after that commit: a 201 still means durable.
//!
//! A group runs in a task of its own: a caller that stops waiting (a request's deadline)
//! cannot cancel the writes of the others.

use super::import::insert_created;
use super::{LINK_COLUMNS, classify, to_i64};
use deadpool_postgres::Pool;
use shortener_core::audit::{AuditRecord, Origin};
use shortener_core::link::Link;
use shortener_core::store::{InsertOutcome, StoreError};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use tokio::sync::{Semaphore, oneshot};

/// Most groups committing at once (each on its own pooled connection); a quarter of the pool
/// at most, so that reads are never starved of connections.
const IN_FLIGHT: usize = 4;
/// Most creates in one group.
const MAX_GROUP: usize = 512;

struct Queued {
    link: Link,
    audit: AuditRecord,
    reply: oneshot::Sender<Result<InsertOutcome, StoreError>>,
}

/// The queue of creates and the slots of groups in flight; shared by a store's clones.
pub(super) struct Creates {
    queue: Mutex<Vec<Queued>>,
    slots: Arc<Semaphore>,
}

impl Creates {
    pub(super) fn new(pool_size: usize) -> Self {
        Self {
            queue: Mutex::new(Vec::new()),
            slots: Arc::new(Semaphore::new((pool_size / 4).clamp(1, IN_FLIGHT))),
        }
    }

    /// Stores `link` with its audit row in the next group; answers after its commit.
    pub(super) async fn insert(
        &self,
        pool: &Pool,
        link: &Link,
        origin: &Origin,
    ) -> Result<InsertOutcome, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.lock().push(Queued {
            audit: AuditRecord::created(link, origin),
            link: link.clone(),
            reply,
        });
        // Whoever gets a slot takes everything queued by then, ours included unless an
        // earlier slot holder took it already.
        let slot = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StoreError::Unavailable("the store is closing".into()))?;
        let group: Vec<Queued> = {
            let mut queue = self.lock();
            let n = queue.len().min(MAX_GROUP);
            queue.drain(..n).collect()
        };
        if group.is_empty() {
            drop(slot);
        } else {
            let pool = pool.clone();
            tokio::spawn(async move {
                write_group(&pool, group).await;
                drop(slot);
            });
        }
        answer
            .await
            .map_err(|_| StoreError::Unavailable("the create was dropped unanswered".into()))?
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Queued>> {
        // A poisoned queue is still a queue: every push and drain leaves it whole.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Writes one group and answers each of its callers.
async fn write_group(pool: &Pool, group: Vec<Queued>) {
    // A code twice in one group (the same alias from two clients): the first is written,
    // the later ones are taken whatever the first's fate (written now, or taken before).
    let mut seen = HashSet::new();
    let (first, repeats): (Vec<Queued>, Vec<Queued>) = group
        .into_iter()
        .partition(|q| seen.insert(q.link.code.clone()));
    for q in repeats {
        let _ = q.reply.send(Ok(InsertOutcome::CodeTaken));
    }
    match commit(pool, &first).await {
        Ok(stored) => {
            for q in first {
                let outcome = if stored.contains(&q.link.code) {
                    InsertOutcome::Inserted
                } else {
                    InsertOutcome::CodeTaken
                };
                let _ = q.reply.send(Ok(outcome));
            }
        }
        Err(e) => {
            for q in first {
                let _ = q.reply.send(Err(copy(&e)));
            }
        }
    }
}

/// The group's transaction; returns the codes it stored.
async fn commit(pool: &Pool, group: &[Queued]) -> Result<HashSet<String>, StoreError> {
    let mut client = pool
        .get()
        .await
        .map_err(|e| StoreError::Unavailable(super::describe_pool(&e).into()))?;
    let tx = client.transaction().await.map_err(classify)?;
    let links: Vec<&Link> = group.iter().map(|q| &q.link).collect();
    let text = |f: fn(&Link) -> Option<&str>| links.iter().map(|l| f(l)).collect::<Vec<_>>();
    let int = |f: fn(&Link) -> Option<i64>| links.iter().map(|l| f(l)).collect::<Vec<_>>();
    let flag = |f: fn(&Link) -> bool| links.iter().map(|l| f(l)).collect::<Vec<_>>();
    let (codes, urls, owners) = (
        text(|l| Some(&l.code)),
        text(|l| Some(&l.long_url)),
        text(|l| l.owner.as_deref()),
    );
    let aliases = flag(|l| l.custom_alias);
    let (created, expires, disabled_at) = (
        int(|l| Some(l.created_at)),
        int(|l| Some(l.expires_at)),
        int(|l| l.disabled.as_ref().map(|d| d.at)),
    );
    let (clicks, bot_clicks) = (
        int(|l| Some(to_i64(l.clicks))),
        int(|l| Some(to_i64(l.bot_clicks))),
    );
    let ips = text(|l| l.created_ip.as_deref());
    let versions = int(|l| Some(to_i64(l.version)));
    let (reasons, by, kinds) = (
        text(|l| l.disabled.as_ref().map(|d| d.reason.as_str())),
        text(|l| l.disabled.as_ref().map(|d| d.by.as_str())),
        text(|l| l.disabled.as_ref().map(|d| d.by_kind.as_str())),
    );
    let deleted = int(|l| l.deleted_at);
    let admins = flag(|l| l.owner_admin);
    let insert = tx
        .prepare_cached(&format!(
            "INSERT INTO links ({LINK_COLUMNS}) \
             SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::BOOL[], $5::INT8[], \
             $6::INT8[], $7::INT8[], $8::INT8[], $9::INT8[], $10::TEXT[], $11::INT8[], \
             $12::TEXT[], $13::TEXT[], $14::TEXT[], $15::INT8[], $16::BOOL[]) \
             ON CONFLICT (code) DO NOTHING RETURNING code"
        ))
        .await
        .map_err(classify)?;
    let rows = tx
        .query(
            &insert,
            &[
                &codes,
                &urls,
                &owners,
                &aliases,
                &created,
                &expires,
                &disabled_at,
                &clicks,
                &bot_clicks,
                &ips,
                &versions,
                &reasons,
                &by,
                &kinds,
                &deleted,
                &admins,
            ],
        )
        .await
        .map_err(classify)?;
    let stored: HashSet<String> = rows
        .iter()
        .map(|r| r.try_get::<_, String>(0))
        .collect::<Result<_, _>>()
        .map_err(classify)?;
    let (created, audits): (Vec<&Link>, Vec<AuditRecord>) = group
        .iter()
        .filter(|q| stored.contains(&q.link.code))
        .map(|q| (&q.link, q.audit.clone()))
        .unzip();
    insert_created(&tx, &created, &audits)
        .await
        .map_err(classify)?;
    tx.commit().await.map_err(classify)?;
    Ok(stored)
}

/// The same failure for each caller of a group (errors are not `Clone`).
fn copy(e: &StoreError) -> StoreError {
    match e {
        StoreError::Unavailable(inner) => StoreError::Unavailable(inner.to_string().into()),
        StoreError::Backend(inner) => StoreError::Backend(inner.to_string().into()),
        StoreError::IdSpaceExhausted => StoreError::IdSpaceExhausted,
    }
}
