//! Noticing changes other processes made to the store: the CLI, instances without Redis, an
//! instance that died between its commit and its announcement. Every change appends a note
//! (code, version) to the store's change sequence in its own transaction; each serving
//! process polls the notes after the last one it saw and forgets what its caches hold of
//! those codes (in the scale-out mode it also puts the stored state into L2).
//!
//! Creates and imports note their codes too, so that a code remembered as unknown is
//! forgotten when it is created elsewhere. On PostgreSQL a group of them writes notes of up to
//! 1 000 codes each (one position each), numbered after its commit by the next poll of any
//! serving process (`LinkStore::number_pending_changes`).

use crate::cache::LinkCache;
use crate::store::Store;
use shortener_core::store::StoreError;
use std::time::Duration;

/// How often the sequence is read: a change reaches every process within about this long.
pub(crate) const POLL_EVERY: Duration = Duration::from_millis(500);
/// Notes read per query.
const BATCH: usize = 1000;
/// Notes are kept this long (seconds); a process that could not poll for longer sees a gap
/// and forgets its whole cache instead.
const KEEP_SECONDS: i64 = 3600;
/// How often a process prunes old notes.
const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// Positions pruned per poll: embedded creates write one each, so a minute's can be many;
/// one batch a poll keeps the poll itself (and the embedded writer) from stalling on a long
/// delete, and still outpaces 15 000 creates/s.
const PRUNE_BATCH: usize = 10_000;

/// Reads the notes after `*last` and applies them to `cache`, advancing `*last` past each
/// batch applied. A gap (notes pruned before this process read them) forgets the whole cache.
pub(crate) async fn poll_once(
    cache: &LinkCache,
    store: &dyn Store,
    last: &mut u64,
) -> Result<(), StoreError> {
    loop {
        let notes = store.changes_after(*last, BATCH).await?;
        if notes.first().is_some_and(|first| first.seq != *last + 1) {
            tracing::warn!(
                after = *last,
                "change notes were pruned before this process read them; forgetting the cache"
            );
            cache.invalidate_all();
        }
        // Whole positions come back, so past the last once all are applied; a failure reads
        // them all again (applying a note twice is harmless).
        cache.changed_elsewhere(&notes).await?;
        if let Some(note) = notes.last() {
            *last = note.seq;
        }
        if notes.len() < BATCH {
            return Ok(());
        }
    }
}

/// Polls forever, pruning old notes now and then (a batch a poll until none is left).
pub(crate) async fn follow_forever(cache: &LinkCache, store: &dyn Store) {
    let mut last = loop {
        match store.last_change().await {
            Ok(seq) => break seq,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the change sequence yet");
                tokio::time::sleep(POLL_EVERY).await;
            }
        }
    };
    let mut tick = tokio::time::interval(POLL_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pruned = tokio::time::Instant::now();
    let mut pruning = false;
    loop {
        tick.tick().await;
        if let Err(e) = poll_once(cache, store, &mut last).await {
            tracing::debug!(error = %e, "cannot poll the change sequence; retrying");
        }
        // After the poll: the notes numbered now are read at the next one, by when their
        // writers' announcements (if any) have been heard and spare the L2 look. Those were
        // heard after the previous numbering (their commits came after it), so announcements
        // are kept from the previous poll's end until the next poll's end.
        cache.poll_done();
        if let Err(e) = store.number_pending_changes().await {
            tracing::debug!(error = %e, "cannot number change notes; retrying");
        }
        if pruned.elapsed() >= PRUNE_EVERY {
            pruned = tokio::time::Instant::now();
            pruning = true;
        }
        if pruning {
            pruning = match store
                .prune_changes_before(crate::now() - KEEP_SECONDS, PRUNE_BATCH)
                .await
            {
                Ok(n) => n == PRUNE_BATCH as u64,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot prune change notes");
                    false
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::tests::cache_on_sqlite_and_redis;
    use crate::store::sqlite::DB_FILE;
    use shortener_core::audit::Origin;
    use shortener_core::link::Link;

    /// A note newer than the stored link (what a poll reads from a replica behind the one
    /// that served the notes) fails the poll and leaves its cursor and L2 as they were; once
    /// the store has caught up, the same notes are read again and L2 gets the newer state.
    #[tokio::test]
    async fn a_store_read_older_than_its_notes_leaves_the_cursor_for_the_next_poll() {
        let (dir, _redis, store, l2, cache) = cache_on_sqlite_and_redis().await;
        let now = crate::now();
        let link = Link::new("behind1", "https://example.com/", now, now + 86_400);
        store
            .insert_link(&link, &Origin::system("test"))
            .await
            .unwrap();
        assert_eq!(store.last_change().await.unwrap(), 1);
        // A note of version 2 that the links table does not show yet, as another process's.
        let other = rusqlite::Connection::open(dir.path().join(DB_FILE)).unwrap();
        other
            .execute_batch(
                "UPDATE change_counter SET seq = seq + 1;
                 INSERT INTO link_changes (seq, code, version, at)
                 SELECT seq, 'behind1', 2, 0 FROM change_counter;",
            )
            .unwrap();

        let mut last = 0;
        let failed = poll_once(&cache, store.as_ref(), &mut last).await;
        assert!(
            matches!(&failed, Err(e @ StoreError::Unavailable(_))
                if e.to_string().contains("older than the change notes")),
            "{failed:?}"
        );
        assert_eq!(last, 0, "the notes of a failed poll are read again");
        assert!(
            l2.get("behind1", now).await.is_none(),
            "nothing older filled"
        );

        other
            .execute("UPDATE links SET version = 2 WHERE code = 'behind1'", [])
            .unwrap();
        poll_once(&cache, store.as_ref(), &mut last).await.unwrap();
        assert_eq!(last, 2);
        let filled = l2.get("behind1", now).await.unwrap();
        assert_eq!(filled.entry.version(), 2);
    }
}
