//! The embedded store: one SQLite file in WAL mode under the data directory.
//!
//! One writer thread owns the only writing connection and commits in groups, synced by
//! threads of their own before anyone is answered (`writer.rs`). Reads go to a few reader
//! threads with their own connections, which WAL lets run beside the writer; a link read by
//! its code runs on the caller's thread instead (`point_reads.rs`).

mod changes;
mod clicks;
mod creates;
mod import;
mod multi_row;
mod point_reads;
mod schema;
mod writer;

pub(crate) use schema::CURRENT_VERSION;

use super::{
    AUDIT_COLUMNS, CreatedRows, LINK_COLUMNS, PAGE_SEQ_INDEX, REPORT_SELECT, RawAudit, RawReport,
    SPENT_PRUNED_PER_SPEND, SqlValue, TOKEN_COLUMNS, audit_query_sql, disable_from, link_page_sql,
    merged_people, report_page_sql, stored_people, stored_token_id, update_state_sql,
};
use async_trait::async_trait;
use changes::{file_report, insert_audit, write_change};
use point_reads::PointReads;
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use shortener_core::audit::{AuditQuery, AuditRecord, AuditRow, Origin};
use shortener_core::day::{Day, UnixSeconds};
use shortener_core::link::{Link, LinkChange, RedirectTarget, Refusal};
use shortener_core::listing::{LinkQuery, PageOfLinks};
use shortener_core::report::{
    AutoDisable, NewReport, Report, ReportOutcome, ReportQuery, Resolution, ResolveOutcome,
};
use shortener_core::store::{
    ChangeNote, ChangeOutcome, ClickBatch, ClickDelta, ClickSink, DailyCount, FoundToken,
    ImportBatch, ImportOutcome, InsertOutcome, LinkStore, StoreError, TokenInfo, TokenRecord,
};
use shortener_core::token::{Principal, TOKEN_ID_BYTES, TokenHash, TokenId};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use writer::{Isolation, Op, WriteOp};

/// File name of the database inside the data directory.
pub const DB_FILE: &str = "shortener.db";

/// Links as read: `links` with their click totals (`clicks.rs`) added up (schema v9).
const COUNTED_LINKS: &str = "counted_links";
/// Most writes folded into one transaction.
const MAX_GROUP: usize = 512;
/// Reader threads; SQLite reads are short, and misses are all that reach them.
const READERS: usize = 4;
/// WAL pages before the writer copies them into the database (SQLite's default: 1 000).
/// Creates dirty leaves at random codes; a longer WAL holds many versions of the same
/// leaf, which a checkpoint writes once, so each create costs fewer page writes and syncs
/// (at 1 000 pages a checkpoint ran every few groups and took a third of a create's CPU).
const WAL_AUTOCHECKPOINT_PAGES: i64 = 16_384;
/// Each reader's page cache, KiB. The bundled SQLite keeps every connection's pages in one
/// group (`SQLITE_ENABLE_MEMORY_MANAGEMENT`) bounded by the sum of their `cache_size`s, so at
/// SQLite's default (2 MiB) four idle readers let the writer's click batches hold 11 MiB of
/// pages. Their reads (the change poll, the API's lists) find the rest in the OS's cache.
const READER_CACHE_KIB: i64 = 256;
/// How long a connection waits for another process's lock (e.g. `token create`).
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

type ReadJob = Box<dyn FnOnce(&Connection) + Send>;

/// Handle to the embedded store; cheap to clone, every clone talks to the same threads.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    writer: crossbeam_channel::Sender<Box<dyn WriteOp>>,
    readers: crossbeam_channel::Sender<ReadJob>,
    point_reads: Arc<PointReads>,
}

impl SqliteStore {
    /// Opens (creating if needed) the store in `data_dir` and brings its schema up to date.
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        Self::open_with(data_dir, false)
    }

    /// As [`Self::open`], for bulk writes (`shortener import`): the writer is tuned for
    /// large transactions (`import::tune_writer`). A serving process keeps SQLite's defaults.
    pub fn open_for_import(data_dir: &Path) -> Result<Self, StoreError> {
        Self::open_with(data_dir, true)
    }

    fn open_with(data_dir: &Path, bulk: bool) -> Result<Self, StoreError> {
        std::fs::create_dir_all(data_dir).map_err(|e| {
            StoreError::Unavailable(
                format!("cannot create data directory {}: {e}", data_dir.display()).into(),
            )
        })?;
        let path = data_dir.join(DB_FILE);
        let mut writer_conn = open_connection(&path, false)?;
        if bulk {
            import::tune_writer(&writer_conn).map_err(|e| StoreError::Unavailable(Box::new(e)))?;
        }
        schema::migrate(&mut writer_conn).map_err(|e| StoreError::Backend(Box::new(e)))?;

        // The migration read the file, so its WAL exists; it lives as long as a connection.
        let mut wal_name = path.clone().into_os_string();
        wal_name.push("-wal");
        let wal_path = std::path::PathBuf::from(wal_name);
        let wal = std::fs::File::open(&wal_path).map_err(|e| {
            StoreError::Unavailable(format!("cannot open {}: {e}", wal_path.display()).into())
        })?;
        let (writer, write_rx) = crossbeam_channel::unbounded::<Box<dyn WriteOp>>();
        writer::start(writer_conn, writer::wal_sync(wal), write_rx)
            .map_err(|e| StoreError::Unavailable(Box::new(e)))?;

        let (readers, read_rx) = crossbeam_channel::unbounded::<ReadJob>();
        for i in 0..READERS {
            let conn = open_connection(&path, true)?;
            conn.pragma_update(None, "cache_size", -READER_CACHE_KIB)
                .map_err(|e| StoreError::Unavailable(Box::new(e)))?;
            let rx = read_rx.clone();
            std::thread::Builder::new()
                .name(format!("sqlite-reader-{i}"))
                .spawn(move || {
                    for job in rx {
                        job(&conn);
                    }
                })
                .map_err(|e| StoreError::Unavailable(Box::new(e)))?;
        }
        Ok(Self {
            writer,
            readers,
            point_reads: Arc::new(PointReads::open(path)?),
        })
    }

    async fn write<T, F>(&self, run: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        self.write_op(run, Isolation::Savepoint, |_| true).await
    }

    /// As [`Self::write`], committed in a transaction of its own (see [`Isolation::Alone`]);
    /// a result that `keep` refuses is answered, and the transaction rolled back.
    async fn write_alone<T, F>(&self, run: F, keep: fn(&T) -> bool) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        self.write_op(run, Isolation::Alone, keep).await
    }

    async fn write_op<T, F>(
        &self,
        run: F,
        isolation: Isolation,
        keep: fn(&T) -> bool,
    ) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let op = Box::new(Op {
            run: Some(run),
            isolation,
            keep,
            result: None,
            reply,
        });
        self.send(op, rx).await
    }

    /// Queues `op` for the writer and waits for `rx`, its answer.
    async fn send<T>(
        &self,
        op: Box<dyn WriteOp>,
        rx: oneshot::Receiver<Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.writer
            .send(op)
            .map_err(|_| StoreError::Unavailable("the writer thread has stopped".into()))?;
        rx.await
            .map_err(|_| StoreError::Unavailable("the writer thread has stopped".into()))?
    }

    async fn read<T, F>(&self, run: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let job: ReadJob = Box::new(move |conn| {
            let _ = reply.send(run(conn).map_err(classify));
        });
        self.readers
            .send(job)
            .map_err(|_| StoreError::Unavailable("the reader threads have stopped".into()))?;
        rx.await
            .map_err(|_| StoreError::Unavailable("the reader threads have stopped".into()))?
    }
}

fn open_connection(path: &Path, read_only: bool) -> Result<Connection, StoreError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let unavailable = |e: rusqlite::Error| {
        StoreError::Unavailable(format!("cannot open {}: {e}", path.display()).into())
    };
    let conn = Connection::open_with_flags(path, flags).map_err(unavailable)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(unavailable)?;
    // Statement journals and sorters in memory: on disk, each group commit opened, wrote
    // and unlinked a temporary file.
    conn.pragma_update(None, "temp_store", "MEMORY")
        .map_err(unavailable)?;
    if read_only {
        // Readers open read-write (WAL needs the shared-memory file) but may not write.
        conn.pragma_update(None, "query_only", true)
            .map_err(unavailable)?;
    } else {
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(unavailable)?;
        // NORMAL: commits write the WAL without syncing it; the writer's sync threads sync it
        // before answering (`writer.rs`), so a 201 still survives a power cut.
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(unavailable)?;
        conn.pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES)
            .map_err(unavailable)?;
    }
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

fn token_info(r: &rusqlite::Row<'_>) -> rusqlite::Result<TokenInfo> {
    let hash: Vec<u8> = r.get(0)?;
    let id = stored_token_id(&hash).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Blob, e.into())
    })?;
    Ok(TokenInfo {
        id,
        principal: Principal {
            user: r.get(1)?,
            admin: r.get(2)?,
        },
        name: r.get(3)?,
        created_at: r.get(4)?,
        last_used_at: r.get(5)?,
    })
}

fn classify(e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(
            rusqlite::ErrorCode::DatabaseBusy
            | rusqlite::ErrorCode::DatabaseLocked
            | rusqlite::ErrorCode::CannotOpen
            | rusqlite::ErrorCode::DiskFull
            | rusqlite::ErrorCode::SystemIoFailure,
        ) => StoreError::Unavailable(Box::new(e)),
        _ => StoreError::Backend(Box::new(e)),
    }
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn to_u64(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn link_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Link> {
    Ok(Link {
        code: row.get(0)?,
        long_url: row.get(1)?,
        owner: row.get(2)?,
        custom_alias: row.get(3)?,
        created_at: row.get(4)?,
        expires_at: row.get(5)?,
        disabled: disable_from(row.get(6)?, row.get(11)?, row.get(12)?, row.get(13)?),
        clicks: to_u64(row.get(7)?),
        bot_clicks: to_u64(row.get(8)?),
        created_ip: row.get(9)?,
        version: to_u64(row.get(10)?),
        deleted_at: row.get(14)?,
        owner_admin: row.get(15)?,
    })
}

fn report_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawReport> {
    Ok(RawReport {
        id: r.get(0)?,
        code: r.get(1)?,
        at: r.get(2)?,
        ip: r.get(3)?,
        category: r.get(4)?,
        comment: r.get(5)?,
        resolved_at: r.get(6)?,
        resolved_by: r.get(7)?,
        resolution: r.get(8)?,
        disabled_at: r.get(9)?,
        disabled_reason: r.get(10)?,
        disabled_by: r.get(11)?,
        disabled_by_kind: r.get(12)?,
        deleted_at: r.get(13)?,
    })
}

fn read_report(c: &Connection, id: i64) -> rusqlite::Result<Option<RawReport>> {
    c.prepare_cached(&format!("{REPORT_SELECT} WHERE r.id = ?1"))?
        .query_row([id], report_from_row)
        .optional()
}

fn placeholder(i: usize) -> String {
    format!("?{i}")
}

/// A shared query's values as SQLite parameters.
fn bound(values: Vec<SqlValue>) -> rusqlite::ParamsFromIter<Vec<rusqlite::types::Value>> {
    rusqlite::params_from_iter(
        values
            .into_iter()
            .map(|v| match v {
                SqlValue::Text(t) => rusqlite::types::Value::Text(t),
                SqlValue::Int(i) => rusqlite::types::Value::Integer(i),
            })
            .collect::<Vec<_>>(),
    )
}

fn read_link(c: &Connection, code: &str) -> rusqlite::Result<Option<Link>> {
    c.prepare_cached(&format!(
        "SELECT {LINK_COLUMNS} FROM {COUNTED_LINKS} WHERE code = ?1"
    ))?
    .query_row([code], link_from_row)
    .optional()
}

#[async_trait]
impl LinkStore for SqliteStore {
    async fn lease_ids(&self, count: u64) -> Result<Range<u64>, StoreError> {
        let count = to_i64(count);
        let end: i64 = self
            .write(move |c| {
                c.prepare_cached("UPDATE id_counter SET next_id = next_id + ?1 RETURNING next_id")?
                    .query_row([count], |r| r.get(0))
            })
            .await?;
        Ok(to_u64(end - count)..to_u64(end))
    }

    async fn secret(&self, name: &'static str, candidate: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        self.write(move |c| {
            c.execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
                params![name, candidate],
            )?;
            c.query_row("SELECT value FROM meta WHERE key = ?1", [name], |r| {
                r.get(0)
            })
        })
        .await
    }

    async fn spend_once(
        &self,
        token: &str,
        until: UnixSeconds,
        now: UnixSeconds,
    ) -> Result<bool, StoreError> {
        let token = token.to_owned();
        self.write(move |c| {
            c.prepare_cached(
                "DELETE FROM spent_tokens WHERE token IN \
                 (SELECT token FROM spent_tokens WHERE until <= ?1 LIMIT ?2)",
            )?
            .execute(params![now, SPENT_PRUNED_PER_SPEND])?;
            let inserted = c
                .prepare_cached(
                    "INSERT INTO spent_tokens (token, until) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
                )?
                .execute(params![token, until])?;
            Ok(inserted == 1)
        })
        .await
    }

    async fn take_lease(
        &self,
        name: &str,
        holder: &str,
        work: &str,
        until: UnixSeconds,
        now: UnixSeconds,
    ) -> Result<bool, StoreError> {
        let (name, holder, work) = (name.to_owned(), holder.to_owned(), work.to_owned());
        self.write(move |c| {
            let taken = c
                .prepare_cached(
                    "INSERT INTO leases (name, holder, until) VALUES (?1, ?2, ?4) \
                     ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, until = excluded.until \
                     WHERE leases.until <= ?5 AND leases.done IS NOT ?3",
                )?
                .execute(params![name, holder, work, until, now])?;
            Ok(taken == 1)
        })
        .await
    }

    async fn end_lease(
        &self,
        name: &str,
        holder: &str,
        done: Option<&str>,
    ) -> Result<(), StoreError> {
        let (name, holder, done) = (name.to_owned(), holder.to_owned(), done.map(str::to_owned));
        self.write(move |c| {
            c.prepare_cached(
                "UPDATE leases SET until = 0, done = coalesce(?3, done) \
                 WHERE name = ?1 AND holder = ?2",
            )?
            .execute(params![name, holder, done])?;
            Ok(())
        })
        .await
    }

    async fn insert_link(&self, link: &Link, origin: &Origin) -> Result<InsertOutcome, StoreError> {
        let (reply, rx) = oneshot::channel();
        let create = creates::Create::new(link.clone(), AuditRecord::created(link, origin), reply);
        self.send(Box::new(create), rx).await
    }

    async fn import_links(&self, batch: Arc<ImportBatch>) -> Result<ImportOutcome, StoreError> {
        // Alone: in a group's savepoint, every page the batch touched would first be copied
        // into the savepoint's journal. A batch refused for a taken code is rolled back whole.
        self.write_alone(
            move |c| import::write_batch(c, &batch),
            |outcome| matches!(outcome, ImportOutcome::Committed(_)),
        )
        .await
    }

    async fn after_import(&self) -> Result<Option<&'static str>, StoreError> {
        // No statistics kept (no `ANALYZE`): the planner's choices here are by index.
        Ok(None)
    }

    async fn meta(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let key = key.to_owned();
        self.read(move |c| {
            c.prepare_cached("SELECT value FROM meta WHERE key = ?1")?
                .query_row([key], |r| r.get(0))
                .optional()
        })
        .await
    }

    async fn get_link(&self, code: &str) -> Result<Option<Link>, StoreError> {
        if let Some(read) = self.point_reads.read(|c| read_link(c, code)) {
            return read.map_err(classify);
        }
        let code = code.to_owned();
        self.read(move |c| read_link(c, &code)).await
    }

    async fn redirect_target(&self, code: &str) -> Result<Option<RedirectTarget>, StoreError> {
        if let Some(read) = self.point_reads.read(|c| point_reads::read_target(c, code)) {
            return read.map_err(classify);
        }
        let code = code.to_owned();
        self.read(move |c| point_reads::read_target(c, &code)).await
    }

    async fn redirect_targets(
        &self,
        codes: &[String],
    ) -> Result<Vec<Option<RedirectTarget>>, StoreError> {
        // On a reader thread: a batch (the cache's renewals, the change poll's notes) would
        // hold a request's worker thread for milliseconds.
        let codes = codes.to_vec();
        self.read(move |c| {
            codes
                .iter()
                .map(|code| point_reads::read_target(c, code))
                .collect()
        })
        .await
    }

    async fn list_links(&self, query: &LinkQuery) -> Result<PageOfLinks, StoreError> {
        let (sql, values) = link_page_sql(query, COUNTED_LINKS, placeholder, "instr");
        let rows = self
            .read(move |c| {
                c.prepare_cached(&sql)?
                    .query_map(bound(values), |r| {
                        Ok((link_from_row(r)?, r.get(PAGE_SEQ_INDEX)?))
                    })?
                    .collect()
            })
            .await?;
        Ok(PageOfLinks::new(query, rows))
    }

    async fn change_link(
        &self,
        code: &str,
        change: &LinkChange,
        origin: &Origin,
        now: UnixSeconds,
    ) -> Result<ChangeOutcome, StoreError> {
        let (code, change, origin) = (code.to_owned(), change.clone(), origin.clone());
        self.write(move |c| {
            // Read inside the writer's transaction: nothing changes the row in between.
            let Some(before) = read_link(c, &code)? else {
                return Ok(ChangeOutcome::Refused(Refusal::NotFound));
            };
            match before.apply(&change, &origin.actor, now) {
                Err(refusal) => Ok(ChangeOutcome::Refused(refusal)),
                Ok(None) => Ok(ChangeOutcome::Unchanged(before)),
                Ok(Some(after)) => {
                    let audit = AuditRecord::changed(&before, &after, &change, &origin, now);
                    write_change(c, &before, &after, &audit)?;
                    Ok(ChangeOutcome::Changed { before, after })
                }
            }
        })
        .await
    }

    async fn last_change(&self) -> Result<u64, StoreError> {
        self.read(|c| c.query_row("SELECT seq FROM change_counter", [], |r| r.get(0)))
            .await
            .map(to_u64)
    }

    async fn changes_after(&self, seq: u64, limit: usize) -> Result<Vec<ChangeNote>, StoreError> {
        let (seq, limit) = (to_i64(seq), to_i64(limit as u64));
        self.read(move |c| {
            c.prepare_cached(
                "SELECT seq, code, version FROM link_changes WHERE seq > ?1 ORDER BY seq LIMIT ?2",
            )?
            .query_map(params![seq, limit], |r| {
                Ok(ChangeNote {
                    seq: to_u64(r.get(0)?),
                    code: r.get(1)?,
                    version: to_u64(r.get(2)?),
                })
            })?
            .collect()
        })
        .await
    }

    // The one writer numbers notes as it writes them (its transactions never overlap).
    async fn number_pending_changes(&self) -> Result<u64, StoreError> {
        Ok(0)
    }

    async fn prune_changes_before(&self, at: UnixSeconds, batch: usize) -> Result<u64, StoreError> {
        let batch = to_i64(batch as u64);
        self.write(move |c| {
            c.prepare_cached(
                "DELETE FROM link_changes WHERE seq IN \
                 (SELECT seq FROM link_changes WHERE at < ?1 ORDER BY at LIMIT ?2)",
            )?
            .execute(params![at, batch])
            .map(|n| n as u64)
        })
        .await
    }

    async fn live_destinations_after(
        &self,
        after: &str,
        limit: usize,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let (after, limit) = (after.to_owned(), to_i64(limit as u64));
        self.read(move |c| {
            c.prepare_cached(
                "SELECT code, long_url FROM links WHERE code > ?1 \
                 AND disabled_at IS NULL AND deleted_at IS NULL ORDER BY code LIMIT ?2",
            )?
            .query_map(params![after, limit], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect()
        })
        .await
    }

    async fn audit(&self, query: &AuditQuery) -> Result<Vec<AuditRow>, StoreError> {
        let (sql, values) = audit_query_sql(query, placeholder, CreatedRows::ThroughLink);
        let raw: Vec<RawAudit> = self
            .read(move |c| {
                c.prepare_cached(&sql)?
                    .query_map(bound(values), |r| {
                        Ok(RawAudit {
                            id: r.get(0)?,
                            at: r.get(1)?,
                            actor: r.get(2)?,
                            ip: r.get(3)?,
                            user_agent: r.get(4)?,
                            action: r.get(5)?,
                            code: r.get(6)?,
                            old_url: r.get(7)?,
                            new_url: r.get(8)?,
                            detail: r.get(9)?,
                        })
                    })?
                    .collect()
            })
            .await?;
        raw.into_iter().map(RawAudit::into_row).collect()
    }

    async fn prune_audit_before(&self, at: UnixSeconds, batch: usize) -> Result<u64, StoreError> {
        let batch = to_i64(batch as u64);
        self.write(move |c| {
            c.prepare_cached(
                // In `at` order the `audit_at` index finds the batch; in id order SQLite
                // scanned the whole table in the writer, at every prune, to find none.
                "DELETE FROM audit WHERE id IN \
                 (SELECT id FROM audit WHERE at < ?1 ORDER BY at, id LIMIT ?2)",
            )?
            .execute(params![at, batch])
            .map(|n| n as u64)
        })
        .await
    }

    async fn daily_clicks(&self, code: &str, since: Day) -> Result<Vec<DailyCount>, StoreError> {
        let code = code.to_owned();
        self.read(move |c| {
            c.prepare_cached(
                "SELECT day, clicks, bot_clicks, visitors, tops FROM daily_clicks \
                 WHERE code = ?1 AND day >= ?2",
            )?
            .query_map(params![code, since.number()], |r| {
                Ok(DailyCount {
                    day: Day::from_number(r.get(0)?),
                    human: to_u64(r.get(1)?),
                    bot: to_u64(r.get(2)?),
                    people: stored_people(
                        r.get_ref(3)?.as_blob_or_null()?,
                        r.get_ref(4)?.as_str_or_null()?,
                    ),
                })
            })?
            .collect()
        })
        .await
    }

    async fn insert_report(
        &self,
        report: &NewReport,
        origin: &Origin,
        auto: Option<AutoDisable>,
    ) -> Result<ReportOutcome, StoreError> {
        let (report, origin) = (report.clone(), origin.clone());
        self.write(move |c| file_report(c, &report, &origin, auto))
            .await
    }

    async fn reports(&self, query: &ReportQuery) -> Result<Vec<Report>, StoreError> {
        let sql = report_page_sql(query.open, placeholder);
        let (before, limit) = (query.before.unwrap_or(i64::MAX), to_i64(query.limit as u64));
        let raw: Vec<RawReport> = self
            .read(move |c| {
                c.prepare_cached(&sql)?
                    .query_map(params![before, limit], report_from_row)?
                    .collect()
            })
            .await?;
        raw.into_iter().map(RawReport::into_report).collect()
    }

    async fn resolve_report(
        &self,
        id: i64,
        resolution: &Resolution,
    ) -> Result<ResolveOutcome, StoreError> {
        let resolution = resolution.clone();
        let outcome = self
            .write(move |c| {
                let resolved = c
                    .prepare_cached(
                        "UPDATE reports SET resolved_at = ?2, resolved_by = ?3, resolution = ?4 \
                         WHERE id = ?1 AND resolved_at IS NULL",
                    )?
                    .execute(params![id, resolution.at, resolution.by, resolution.text])?;
                Ok((resolved == 1, read_report(c, id)?))
            })
            .await?;
        Ok(match outcome {
            (_, None) => ResolveOutcome::NotFound,
            (true, Some(raw)) => ResolveOutcome::Resolved(raw.into_report()?),
            (false, Some(raw)) => ResolveOutcome::AlreadyResolved(raw.into_report()?),
        })
    }

    async fn insert_token(&self, token: &TokenRecord, origin: &Origin) -> Result<(), StoreError> {
        let token = token.clone();
        let audit = AuditRecord::token_issued(&token, origin);
        self.write(move |c| {
            c.execute(
                "INSERT INTO tokens (hash, user_name, admin, created_at, name)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    &token.hash.0[..],
                    token.principal.user,
                    token.principal.admin,
                    token.created_at,
                    token.name
                ],
            )?;
            insert_audit(c, &audit)
        })
        .await
    }

    async fn find_token(&self, hash: &TokenHash) -> Result<Option<FoundToken>, StoreError> {
        let hash = *hash;
        self.read(move |c| {
            c.prepare_cached("SELECT user_name, admin, last_used_at FROM tokens WHERE hash = ?1")?
                .query_row([&hash.0[..]], |r| {
                    Ok(FoundToken {
                        principal: Principal {
                            user: r.get(0)?,
                            admin: r.get(1)?,
                        },
                        last_used_at: r.get(2)?,
                    })
                })
                .optional()
        })
        .await
    }

    async fn touch_token(&self, hash: &TokenHash, at: UnixSeconds) -> Result<(), StoreError> {
        let hash = *hash;
        self.write(move |c| {
            c.execute(
                "UPDATE tokens SET last_used_at = ?2
                 WHERE hash = ?1 AND (last_used_at IS NULL OR last_used_at < ?2)",
                params![&hash.0[..], at],
            )?;
            Ok(())
        })
        .await
    }

    async fn list_tokens(&self) -> Result<Vec<TokenInfo>, StoreError> {
        self.read(|c| {
            c.prepare_cached(&format!(
                "SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY created_at, hash"
            ))?
            .query_map([], token_info)?
            .collect()
        })
        .await
    }

    async fn revoke_token(
        &self,
        id: TokenId,
        origin: &Origin,
        at: UnixSeconds,
    ) -> Result<Option<TokenInfo>, StoreError> {
        let origin = origin.clone();
        self.write(move |c| {
            let found = c
                .prepare_cached(&format!(
                    "SELECT {TOKEN_COLUMNS} FROM tokens WHERE substr(hash, 1, {TOKEN_ID_BYTES}) = ?1"
                ))?
                .query_map([&id.0[..]], token_info)?
                .collect::<Result<Vec<_>, _>>()?;
            let token = match <[TokenInfo; 1]>::try_from(found) {
                Ok([token]) => token,
                Err(found) if found.is_empty() => return Ok(None),
                // Two tokens sharing 48 bits of hash: an id that does not say which revokes
                // neither.
                Err(_) => return Err(rusqlite::Error::QueryReturnedMoreThanOneRow),
            };
            c.execute(
                &format!("DELETE FROM tokens WHERE substr(hash, 1, {TOKEN_ID_BYTES}) = ?1"),
                [&id.0[..]],
            )?;
            insert_audit(c, &AuditRecord::token_revoked(&token, &origin, at))?;
            Ok(Some(token))
        })
        .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.read(|c| c.query_row("SELECT 1", [], |_| Ok(()))).await
    }
}

#[async_trait]
impl ClickSink for SqliteStore {
    async fn apply_clicks(&self, deltas: Vec<ClickDelta>) -> Result<(), StoreError> {
        self.write_alone(move |c| clicks::add_clicks(c, deltas), |_| true)
            .await
    }

    async fn apply_click_batches(&self, batches: &[ClickBatch]) -> Result<usize, StoreError> {
        let batches = batches.to_vec();
        let today = Day::from_unix(crate::now()).number();
        self.write_alone(
            move |c| {
                let mut mark = c.prepare_cached(
                    "INSERT INTO applied_click_batches (id, day) VALUES (?1, ?2) \
                 ON CONFLICT (id) DO NOTHING",
                )?;
                let (mut fresh, mut deltas) = (0, Vec::new());
                for batch in batches {
                    if mark.execute(params![batch.id, today])? == 1 {
                        fresh += 1;
                        deltas.extend(batch.deltas);
                    }
                }
                clicks::add_clicks(c, deltas)?;
                Ok(fresh)
            },
            |_| true,
        )
        .await
    }

    async fn prune_clicks_before(&self, day: Day) -> Result<u64, StoreError> {
        self.write(move |c| clicks::prune_days_before(c, day)).await
    }
}

#[cfg(test)]
mod tests;
