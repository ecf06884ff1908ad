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
