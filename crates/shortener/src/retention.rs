//! Retention of the audit trail: rows older than `--audit-retention-days` are deleted, a
//! small batch at a time so that no delete holds the store for long. This is the only code
//! path that deletes audit rows; none updates them.

use crate::store::Store;
use shortener_core::day::UnixSeconds;
use shortener_core::store::StoreError;
use std::time::Duration;

/// Rows deleted per statement.
const BATCH: usize = 1000;
/// Pause between batches, so that other writes interleave.
const BETWEEN_BATCHES: Duration = Duration::from_millis(20);
/// How often the trail is pruned.
const EVERY: Duration = Duration::from_secs(3600);

/// Deletes every audit row older than `retention_days` before `now`; returns how many went.
pub(crate) async fn prune_audit(
    store: &dyn Store,
    retention_days: u32,
    now: UnixSeconds,
) -> Result<u64, StoreError> {
    let cutoff = now - i64::from(retention_days) * 86_400;
    let mut total = 0;
    loop {
        let deleted = store.prune_audit_before(cutoff, BATCH).await?;
        total += deleted;
        if deleted < BATCH as u64 {
            return Ok(total);
        }
        tokio::time::sleep(BETWEEN_BATCHES).await;
    }
}

/// Prunes at start and then every hour, forever.
pub(crate) async fn prune_forever(store: &dyn Store, retention_days: u32) {
    let mut tick = tokio::time::interval(EVERY);
    loop {
        tick.tick().await;
        match prune_audit(store, retention_days, crate::now()).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(rows = n, "pruned audit rows past retention"),
            Err(e) => tracing::warn!(error = %e, "cannot prune the audit trail"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::SqliteStore;
    use shortener_core::audit::{AuditQuery, Origin};
    use shortener_core::link::Link;
    use shortener_core::store::LinkStore;

    /// More old rows than one batch: the loop goes on until every row past retention is
    /// gone, and a row inside it stays.
    #[tokio::test]
    async fn rows_past_retention_go_in_batches_and_younger_ones_stay() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path()).unwrap();
        let now = 1_800_000_000;
        let day = 86_400;
        let origin = Origin::system("test");
        for i in 0..BATCH + 7 {
            let link = Link::new(
                &format!("old{i}"),
                "https://example.com/",
                now - 401 * day,
                now,
            );
            store.insert_link(&link, &origin).await.unwrap();
        }
        let young = Link::new("young", "https://example.com/", now - 399 * day, now);
        store.insert_link(&young, &origin).await.unwrap();
        assert_eq!(
            prune_audit(&store, 400, now).await.unwrap(),
            BATCH as u64 + 7
        );
        let query = AuditQuery {
            limit: 10,
            ..AuditQuery::default()
        };
        let left = store.audit(&query).await.unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].record.code.as_deref(), Some("young"));
    }
}
