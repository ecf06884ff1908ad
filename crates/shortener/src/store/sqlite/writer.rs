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

use super::creates::{self, Create};
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
    /// Runs inside the group's transaction; `false` means it failed (or refused its result)
    /// and is rolled back alone.
    fn apply(&mut self, conn: &Connection) -> bool;
    /// How it shares the group's transaction.
    fn isolation(&self) -> Isolation;
    /// Replies once the group's commit is known (and, if it committed, synced); `Err` says
    /// why it is not durable.
    fn finish(self: Box<Self>, durable: Result<(), &str>);
    /// A create, which a group inserts with its other creates in multi-row statements
    /// before its other writes (none of them has been answered, so none precedes another).
    fn as_create(&mut self) -> Option<&mut Create> {
        None
    }
}

/// How a write shares a group's transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Isolation {
    /// In a savepoint of its own: if it fails, it alone is rolled back.
    Savepoint,
    /// Without a savepoint (its pages are not copied into a savepoint's journal first): if
    /// it fails, the whole group is rolled back and every write of it fails. For writes that
    /// fail only when the store does (a create: a conditional insert and its audit row).
    Shared,
    /// In a transaction of its own: a large write (a click batch, an import batch) that
    /// would otherwise copy every page it changes into the savepoint's journal.
    Alone,
}

pub(super) struct Op<T, F> {
    pub(super) run: Option<F>,
    pub(super) isolation: Isolation,
    /// Whether a result is to be committed; one it refuses is answered but rolled back
    /// (an import batch whose generated codes clash with aliases, say).
    pub(super) keep: fn(&T) -> bool,
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
        let ok = matches!(&result, Some(Ok(value)) if (self.keep)(value));
        self.result = result;
        ok
    }

    fn isolation(&self) -> Isolation {
        self.isolation
    }

    fn finish(self: Box<Self>, durable: Result<(), &str>) {
        answer(self.reply, durable, self.result);
    }
}

/// Answers a write: its result if its commit is durable, else why not.
pub(super) fn answer<T>(
    reply: oneshot::Sender<Result<T, StoreError>>,
    durable: Result<(), &str>,
    result: Option<rusqlite::Result<T>>,
) {
    let out = match (durable, result) {
        (Err(e), _) => Err(StoreError::Unavailable(e.to_owned().into())),
        (Ok(()), Some(result)) => result.map_err(classify),
        (Ok(()), None) => Err(StoreError::Backend("write was never applied".into())),
    };
    // The caller may have gone away (request cancelled); the write stands regardless.
    let _ = reply.send(out);
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
    // A write that goes alone, taken while a group was being gathered: the next group.
    let mut next: Option<Box<dyn WriteOp>> = None;
    while let Some(first) = next.take().or_else(|| rx.recv().ok()) {
        let mut group = vec![first];
        while group[0].isolation() != Isolation::Alone && group.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(op) if op.isolation() == Isolation::Alone => {
                    next = Some(op);
                    break;
                }
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

/// Why a group did not commit.
#[derive(Debug, thiserror::Error)]
enum GroupError {
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    #[error("a write that shares the group's transaction failed")]
    SharedWriteFailed,
}

fn run_group(conn: &Connection, group: &mut [Box<dyn WriteOp>]) -> Result<(), GroupError> {
    conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
    if let [only] = group {
        // Alone, a write needs no savepoint: if it fails, the whole transaction goes.
        let end = if only.apply(conn) {
            "COMMIT"
        } else {
            "ROLLBACK"
        };
        return Ok(conn.prepare_cached(end)?.execute([]).map(drop)?);
    }
    let mut batched: Vec<&mut Create> = group.iter_mut().filter_map(|op| op.as_create()).collect();
    if !batched.is_empty() && !creates::apply(conn, &mut batched) {
        return Err(GroupError::SharedWriteFailed);
    }
    drop(batched);
    // Prepared once: a group of hundreds of writes parses no SQL of its own.
    let mut savepoint = conn.prepare_cached("SAVEPOINT op")?;
    let mut release = conn.prepare_cached("RELEASE op")?;
    let mut rollback = conn.prepare_cached("ROLLBACK TO op")?;
    for op in group.iter_mut() {
        if op.as_create().is_some() {
            continue;
        }
        if op.isolation() == Isolation::Shared {
            if !op.apply(conn) {
                return Err(GroupError::SharedWriteFailed);
            }
            continue;
        }
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
        insert_into(tx, "t", value, Isolation::Savepoint)
    }

    fn insert_into(
        tx: &crossbeam_channel::Sender<Box<dyn WriteOp>>,
        table: &'static str,
        value: i64,
        isolation: Isolation,
    ) -> oneshot::Receiver<Result<usize, StoreError>> {
        let (reply, answer) = oneshot::channel();
        let op = Op {
            run: Some(move |c: &Connection| {
                c.execute(&format!("INSERT INTO {table} (v) VALUES (?1)"), [value])
            }),
            isolation,
            keep: |_| true,
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
    fn a_lone_write_that_fails_leaves_nothing_and_the_next_one_commits() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, reader) = store(dir.path());
        let (tx, rx) = crossbeam_channel::unbounded();
        start(writer, Arc::new(|| Ok(())), rx).unwrap();
        let (reply, failed) = oneshot::channel();
        let op = Op {
            run: Some(|c: &Connection| {
                c.execute("INSERT INTO t (v) VALUES (1)", [])?;
                c.execute("INSERT INTO missing (v) VALUES (1)", [])
            }),
            isolation: Isolation::Alone,
            keep: |_| true,
            result: None,
            reply,
        };
        tx.send(Box::new(op)).unwrap();
        assert!(failed.blocking_recv().unwrap().is_err());
        assert_eq!(insert(&tx, 2).blocking_recv().unwrap().unwrap(), 1);
        assert_eq!(values(&reader), [2]);
    }

    fn values(reader: &Connection) -> Vec<i64> {
        reader
            .prepare("SELECT v FROM t ORDER BY v")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    #[test]
    fn a_failed_write_in_a_savepoint_is_rolled_back_alone_and_a_failed_shared_one_fails_its_group()
    {
        let dir = tempfile::tempdir().unwrap();
        let (writer, reader) = store(dir.path());
        let (tx, rx) = crossbeam_channel::unbounded();
        // Queued before the writer starts, so each trio is one group.
        let answers = [
            insert_into(&tx, "t", 1, Isolation::Shared),
            insert_into(&tx, "missing", 2, Isolation::Savepoint),
            insert_into(&tx, "t", 3, Isolation::Savepoint),
        ];
        start(writer, Arc::new(|| Ok(())), rx).unwrap();
        let [one, two, three] = answers.map(|a| a.blocking_recv().unwrap());
        assert_eq!((one.unwrap(), three.unwrap()), (1, 1));
        assert!(matches!(two, Err(StoreError::Backend(_))), "{two:?}");
        assert_eq!(values(&reader), [1, 3]);

        // A group whose shared write fails: every write of it fails, none is stored.
        let (tx, rx) = crossbeam_channel::unbounded();
        let answers = [
            insert_into(&tx, "t", 4, Isolation::Savepoint),
            insert_into(&tx, "missing", 5, Isolation::Shared),
            insert_into(&tx, "t", 6, Isolation::Shared),
        ];
        let writer = Connection::open(dir.path().join("w.db")).unwrap();
        start(writer, Arc::new(|| Ok(())), rx).unwrap();
        for answer in answers {
            match answer.blocking_recv().unwrap() {
                Err(StoreError::Unavailable(e)) => {
                    assert!(e.to_string().contains("commit failed"), "{e}")
                }
                other => panic!("expected Unavailable, got {other:?}"),
            }
        }
        assert_eq!(values(&reader), [1, 3]);
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
