//! The embedded store's writer: one thread owns the only writing connection and commits in
//! groups (every write that queued meanwhile, one transaction), and a few sync threads make
//! the commits durable before anyone is answered.
//!
//! The connection commits with `synchronous=NORMAL`: the WAL frames are written, not synced.
//! A sync thread then takes every commit not yet synced, calls `fdatasync` on the WAL file
//! (covering every frame written before the call) and only then answers those writes. So the
//! writer applies the next group while earlier ones wait for the disk, and syncs issued
//! while one is in flight overlap (the disk flushes concurrent requests together): a 201
//! still follows the sync of its commit, as with `synchronous=FULL`, without one group's
//! fsync stalling every write behind it. SQLite itself syncs around checkpoints (before
//! copying the WAL into the database, the database after, the WAL header on reuse), so a
//! synced commit survives a checkpoint and a WAL restart. Readers may see a commit before
//! its sync; nobody is told it happened until after.

use super::{MAX_GROUP, classify};
use rusqlite::Connection;
use shortener_core::store::StoreError;
use std::fs::File;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use tokio::sync::oneshot;

/// Sync threads: each takes the commits made since the last one started. Two or three
/// overlapping `fdatasync`s keep the disk's flush queue busy without a thread per commit.
const SYNCERS: usize = 3;

/// A write queued for the writer thread.
pub(super) trait WriteOp: Send {
    /// Runs inside the group's transaction; `false` means it failed and is rolled back alone.
    fn apply(&mut self, conn: &Connection) -> bool;
    /// Replies once the group's commit is known (and, if it committed, synced); `Err` says
    /// why it is not durable.
    fn finish(self: Box<Self>, durable: Result<(), &str>);
}

pub(super) struct Op<T, F> {
    pub(super) run: Option<F>,
    pub(super) result: Option<rusqlite::Result<T>>,
    pub(super) reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<T, F> WriteOp for Op<T, F>
where
    T: Send,
    F: FnOnce(&Connection) -> rusqlite::Result<T> + Send,
{
    fn apply(&mut self, conn: &Connection) -> bool {
        let result = self.run.take().map(|run| run(conn));
        let ok = matches!(result, Some(Ok(_)));
        self.result = result;
        ok
    }

    fn finish(self: Box<Self>, durable: Result<(), &str>) {
        let out = match (durable, self.result) {
            (Err(e), _) => Err(StoreError::Unavailable(e.to_owned().into())),
            (Ok(()), Some(result)) => result.map_err(classify),
            (Ok(()), None) => Err(StoreError::Backend("write was never applied".into())),
        };
        // The caller may have gone away (request cancelled); the write stands regardless.
        let _ = self.reply.send(out);
    }
}

/// Committed writes waiting for a sync, shared by the writer and the sync threads.
#[derive(Default)]
struct Unsynced {
    state: Mutex<Waiting>,
    arrived: Condvar,
}

#[derive(Default)]
struct Waiting {
    ops: Vec<Box<dyn WriteOp>>,
    /// The writer has stopped: sync what is left, then end.
    closed: bool,
}

impl Unsynced {
    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting> {
        // Every push and take leaves the list whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, ops: Vec<Box<dyn WriteOp>>) {
        self.lock().ops.extend(ops);
        self.arrived.notify_one();
    }

    fn close(&self) {
        self.lock().closed = true;
        self.arrived.notify_all();
    }

    /// Everything committed so far, once there is something (`None`: closed and empty).
    fn take(&self) -> Option<Vec<Box<dyn WriteOp>>> {
        let mut waiting = self.lock();
        loop {
            if !waiting.ops.is_empty() {
                return Some(std::mem::take(&mut waiting.ops));
            }
            if waiting.closed {
                return None;
            }
            waiting = self
                .arrived
                .wait(waiting)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Makes every commit made before the call durable: `fdatasync` of the WAL file.
pub(super) type Sync = Arc<dyn Fn() -> std::io::Result<()> + Send + std::marker::Sync>;

/// The sync of `wal`, the connection's WAL file.
pub(super) fn wal_sync(wal: File) -> Sync {
    Arc::new(move || wal.sync_data())
}

/// Starts the writer thread over `conn` and the sync threads; the writer ends when every
/// sender of `rx` is gone, the syncers after it.
pub(super) fn start(
    conn: Connection,
    sync: Sync,
    rx: crossbeam_channel::Receiver<Box<dyn WriteOp>>,
) -> std::io::Result<()> {
    let unsynced = Arc::new(Unsynced::default());
    for i in 0..SYNCERS {
        let (unsynced, sync) = (unsynced.clone(), sync.clone());
        std::thread::Builder::new()
            .name(format!("sqlite-sync-{i}"))
            .spawn(move || sync_loop(&*sync, &unsynced))?;
    }
    std::thread::Builder::new()
        .name("sqlite-writer".into())
        .spawn(move || {
            write_loop(&conn, &rx, &unsynced);
            unsynced.close();
        })?;
    Ok(())
}

fn sync_loop(
    sync: &(dyn Fn() -> std::io::Result<()> + Send + std::marker::Sync),
    unsynced: &Unsynced,
) {
    while let Some(ops) = unsynced.take() {
        // Taken after their commits wrote the frames: this sync covers them all.
        let synced = sync().map_err(|e| format!("WAL sync failed: {e}"));
        if let Err(e) = &synced {
            tracing::error!(error = %e, "cannot make commits durable");
        }
        for op in ops {
            op.finish(synced.as_ref().map(|_| ()).map_err(String::as_str));
        }
    }
}

fn write_loop(
    conn: &Connection,
    rx: &crossbeam_channel::Receiver<Box<dyn WriteOp>>,
    unsynced: &Unsynced,
) {
    while let Ok(first) = rx.recv() {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(op) => group.push(op),
                Err(_) => break,
            }
        }
        match run_group(conn, &mut group) {
            Ok(()) => unsynced.push(group),
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                let failed = format!("commit failed: {e}");
                for op in group {
                    op.finish(Err(&failed));
                }
            }
        }
    }
}

fn run_group(conn: &Connection, group: &mut [Box<dyn WriteOp>]) -> rusqlite::Result<()> {
    conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
    // Prepared once: a group of hundreds of writes parses no SQL of its own.
    let mut savepoint = conn.prepare_cached("SAVEPOINT op")?;
    let mut release = conn.prepare_cached("RELEASE op")?;
    let mut rollback = conn.prepare_cached("ROLLBACK TO op")?;
    for op in group.iter_mut() {
        savepoint.execute([])?;
        if !op.apply(conn) {
            rollback.execute([])?;
        }
        release.execute([])?;
    }
    drop((savepoint, release, rollback));
    conn.prepare_cached("COMMIT")?.execute([])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sync that says when it starts and returns only when the test lets it.
    fn gated(
        result: fn() -> std::io::Result<()>,
    ) -> (
        Sync,
        std::sync::mpsc::Receiver<()>,
        std::sync::mpsc::Sender<()>,
    ) {
        let (started, on_start) = std::sync::mpsc::channel();
        let (open, gate) = std::sync::mpsc::channel::<()>();
        let gate = Mutex::new(gate);
        let sync: Sync = Arc::new(move || {
            let _ = started.send(());
            let _ = gate.lock().unwrap_or_else(PoisonError::into_inner).recv();
            result()
        });
        (sync, on_start, open)
    }

    fn insert(
        tx: &crossbeam_channel::Sender<Box<dyn WriteOp>>,
        value: i64,
    ) -> oneshot::Receiver<Result<usize, StoreError>> {
        let (reply, answer) = oneshot::channel();
        let op = Op {
            run: Some(move |c: &Connection| c.execute("INSERT INTO t (v) VALUES (?1)", [value])),
            result: None,
            reply,
        };
        tx.send(Box::new(op)).unwrap();
        answer
    }

    fn store(dir: &std::path::Path) -> (Connection, Connection) {
        let path = dir.join("w.db");
        let writer = Connection::open(&path).unwrap();
        writer.pragma_update(None, "journal_mode", "WAL").unwrap();
        writer.execute_batch("CREATE TABLE t (v INTEGER)").unwrap();
        (writer, Connection::open(&path).unwrap())
    }

    #[test]
    fn a_write_is_answered_only_after_a_sync_that_began_after_its_commit() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, reader) = store(dir.path());
        let (sync, on_start, open) = gated(|| Ok(()));
        let (tx, rx) = crossbeam_channel::unbounded();
        start(writer, sync, rx).unwrap();
        let mut answer = insert(&tx, 7);
        on_start.recv().unwrap();
        // Committed (another connection sees it), not yet answered.
        let n: i64 = reader
            .query_row("SELECT count(*) FROM t WHERE v = 7", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 1);
        assert!(matches!(
            answer.try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        ));
        open.send(()).unwrap();
        assert_eq!(answer.blocking_recv().unwrap().unwrap(), 1);
    }

    #[test]
    fn a_failed_sync_answers_unavailable() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, _reader) = store(dir.path());
        let (sync, on_start, open) = gated(|| Err(std::io::Error::other("disk gone")));
        let (tx, rx) = crossbeam_channel::unbounded();
        start(writer, sync, rx).unwrap();
        let answer = insert(&tx, 1);
        on_start.recv().unwrap();
        open.send(()).unwrap();
        match answer.blocking_recv().unwrap() {
            Err(StoreError::Unavailable(e)) => assert!(e.to_string().contains("disk gone"), "{e}"),
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }
}
