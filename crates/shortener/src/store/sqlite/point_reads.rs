//! Point reads by primary key on the caller's thread.
//!
//! A redirect that misses the cache reads one row by its code: a few B-tree pages, most of
//! them in SQLite's page cache, the rest in the OS's. Sending that read to a reader thread
//! and waking the caller again cost more than the read itself (two thread hops per miss on
//! a loaded machine), so these reads run where they are asked, on idle connections kept
//! here. Such a connection never waits for a lock: if SQLite reports one (another process
//! recovering the WAL, say), the read goes to the reader threads, which wait up to the
//! store's busy timeout without holding up the caller's thread.

use super::{open_connection, to_u64};
use crate::store::TARGET_COLUMNS;
use crossbeam_queue::ArrayQueue;
use rusqlite::{Connection, ErrorCode, OptionalExtension};
use shortener_core::link::RedirectTarget;
use shortener_core::store::StoreError;
use std::path::PathBuf;
use std::time::Duration;

/// Idle connections kept; more callers at once open more, and the surplus is closed.
const KEPT: usize = 8;
/// Each connection's page cache, KiB. A read by code walks the B-trees' interior pages (a
/// few hundred KiB at a million links, kept here) down to a leaf that is seldom the one
/// read before (it comes from the OS's cache): SQLite's default 2 MiB per connection
/// bought no hits and cost resident memory.
const CACHE_KIB: i64 = 1024;

pub(super) struct PointReads {
    path: PathBuf,
    idle: ArrayQueue<Connection>,
}

impl std::fmt::Debug for PointReads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PointReads")
            .field("idle", &self.idle.len())
            .finish_non_exhaustive()
    }
}

impl PointReads {
    /// Opens one connection per CPU up front, so that no request pays for opening one.
    pub(super) fn open(path: PathBuf) -> Result<Self, StoreError> {
        let reads = Self {
            path,
            idle: ArrayQueue::new(KEPT),
        };
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        for _ in 0..cpus.min(KEPT) {
            // The queue has room for these: `cpus.min(KEPT)` ≤ its capacity.
            let _ = reads.idle.push(reads.connect()?);
        }
        Ok(reads)
    }

    fn connect(&self) -> Result<Connection, StoreError> {
        let conn = open_connection(&self.path, true)?;
        conn.busy_timeout(Duration::ZERO)
            .map_err(|e| StoreError::Unavailable(Box::new(e)))?;
        conn.pragma_update(None, "cache_size", -CACHE_KIB)
            .map_err(|e| StoreError::Unavailable(Box::new(e)))?;
        Ok(conn)
    }

    /// Runs `read` here; `None` when SQLite would have had to wait for a lock (or no
    /// connection could be opened), and the caller should read on a reader thread instead.
    pub(super) fn read<T>(
        &self,
        read: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Option<rusqlite::Result<T>> {
        let conn = match self.idle.pop() {
            Some(conn) => conn,
            None => self.connect().ok()?,
        };
        let result = read(&conn);
        let waits = matches!(
            result
                .as_ref()
                .err()
                .and_then(rusqlite::Error::sqlite_error_code),
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
        );
        // Full: more callers than `KEPT` read at once; this one closes.
        let _ = self.idle.push(conn);
        (!waits).then_some(result)
    }
}

/// What a redirect needs of a link: one row of `links`, without the view's click totals,
/// whose table a redirect has no use for (a second B-tree walk per miss).
pub(super) fn read_target(c: &Connection, code: &str) -> rusqlite::Result<Option<RedirectTarget>> {
    c.prepare_cached(&format!(
        "SELECT {TARGET_COLUMNS} FROM links WHERE code = ?1"
    ))?
    .query_row([code], |r| {
        Ok(RedirectTarget {
            long_url: r.get(0)?,
            expires_at: r.get(1)?,
            version: to_u64(r.get(2)?),
            disabled: r.get(3)?,
            deleted: r.get(4)?,
        })
    })
    .optional()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::{SqliteStore, read_link};
    use rusqlite::ffi;
    use shortener_core::link::Link;
    use shortener_core::store::LinkStore;

    fn failure(code: i32) -> rusqlite::Error {
        rusqlite::Error::SqliteFailure(ffi::Error::new(code), None)
    }

    #[tokio::test]
    async fn reads_run_here_unless_sqlite_would_wait_for_a_lock() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path()).unwrap();
        let origin = shortener_core::audit::Origin::system("test");
        let now = crate::now();
        let link = Link::new("promo", "https://example.com/", now, now + 86_400);
        store.insert_link(&link, &origin).await.unwrap();

        let here = store.point_reads.read(|c| read_link(c, "promo"));
        assert_eq!(here.unwrap().unwrap().unwrap().code, "promo");
        // A lock another connection holds: the caller is told to read elsewhere.
        for code in [ffi::SQLITE_BUSY, ffi::SQLITE_LOCKED] {
            assert!(
                store
                    .point_reads
                    .read(|_| Err::<(), _>(failure(code)))
                    .is_none()
            );
        }
        // Any other failure is the answer.
        let corrupt = store
            .point_reads
            .read(|_| Err::<(), _>(failure(ffi::SQLITE_CORRUPT)));
        assert!(matches!(corrupt, Some(Err(_))));
        // The connections went back: more reads than were opened still run here.
        for _ in 0..3 * KEPT {
            assert!(store.point_reads.read(|c| read_link(c, "nope")).is_some());
        }
        assert!(store.point_reads.idle.len() <= KEPT);
    }
}
