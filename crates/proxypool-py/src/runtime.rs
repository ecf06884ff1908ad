//! The tokio runtime the bindings run Redis calls on, rebuilt after a fork.
//!
//! It has no threads of its own: whoever waits on it drives it. A blocking call runs its
//! future with `block_on` on the caller's thread (the GIL released), which also does the
//! runtime's I/O and runs its tasks (the store's batch worker, the connection's driver)
//! meanwhile. An asyncio loop drives it from its own thread ([`pump`]): the loop watches the
//! runtime's epoll descriptor ([`runtime_fd`]), so a Redis reply wakes the loop's
//! thread, which reads it, runs the batch to its end and resumes the tasks waiting on it, and
//! the calls they make leave for Redis from the same thread; no other thread takes part in a
//! round trip (the asyncio bench: 0.61 -> 0.97 x the Rust caller; each hand-off between
//! threads was a wake-up and the batches half as large, see BENCHMARKS.md). Between calls,
//! with no loop running, nothing drives it: its background work (a late reply's grants given
//! back, lost grants looked up again) waits for the next call or the exit's settle; the lease
//! TTL bounds what that delays. Where that descriptor cannot be found (no `/proc`), or
//! `PROXYPOOL_RUNTIME=threads` asks for it, the runtime has one worker thread of its own
//! instead, and asyncio calls are driven there.
//!
//! A forked child inherits the parent's memory but none of its threads: the parent's runtime
//! (its timers, the Redis connection tasks) is a husk there, and waiting on it hangs. The
//! package registers `after_fork_in_child` with `os.register_at_fork`: it bumps the fork
//! generation, and everything built in an older generation (runtime, Redis pools, leases) is
//! forgotten in the child, never used or dropped there, and built anew on first use.
//!
//! The slot is locked only while the GIL is held: the thread that forks holds the GIL, so no
//! other thread can hold the lock at that instant and the child never inherits it locked.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Poll, Waker};

use pyo3::prelude::*;
use tokio::runtime::{Builder, Runtime};

/// How the runtime is driven.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Driven {
    /// By its waiters; asyncio loops watch its epoll ([`runtime_fd`]).
    ByWaiters,
    /// By a worker thread of its own.
    OwnThread,
}

thread_local! {
    /// The [`pump`] driving the runtime on this thread, until the runtime runs out of work
    /// (`about_to_park` takes it then).
    static PUMP: Cell<Option<Waker>> = const { Cell::new(None) };
    /// This thread's watch on the runtime's epoll (see [`io_waiting`]).
    static WATCH: RefCell<Option<(i32, mio::Poll, mio::Events)>> = const { RefCell::new(None) };
}

/// The epoll descriptor of the runtime driven by its waiters (-1: it has a thread of its own).
static EPOLL: AtomicI32 = AtomicI32::new(-1);

/// Called by the runtime, driven on this thread, when it has no task to run and is about to
/// wait for I/O and timers. A [`pump`] ends there unless I/O is waiting: the runtime then reads
/// it and runs the tasks it wakes first. (It looks at its I/O once more before `block_on`
/// returns, without running what that wakes; only what arrives in between can be left for
/// the next pump, which the loop's epoll or its tick starts.)
fn about_to_park() {
    let Some(pump) = PUMP.take() else {
        return;
    };
    if io_waiting() {
        PUMP.set(Some(pump));
    } else {
        pump.wake();
    }
}

/// Whether the runtime's epoll has events waiting, without taking them: a second epoll of
/// this thread's watches it, its interest renewed each time so that it reports the current
/// state, not only changes. False when that cannot be known.
fn io_waiting() -> bool {
    let fd = EPOLL.load(Ordering::Relaxed);
    if fd < 0 {
        return false;
    }
    WATCH.with_borrow_mut(|watch| {
        // Made on first need, and again for another runtime's epoll (a forked child's).
        if watch.as_ref().is_none_or(|(watched, ..)| *watched != fd) {
            *watch = mio::Poll::new().ok().and_then(|poll| {
                let mut source = mio::unix::SourceFd(&fd);
                poll.registry()
                    .register(&mut source, mio::Token(0), mio::Interest::READABLE)
                    .ok()?;
                Some((fd, poll, mio::Events::with_capacity(1)))
            });
        }
        let Some((_, poll, events)) = watch.as_mut() else {
            return false;
        };
        let mut source = mio::unix::SourceFd(&fd);
        poll.registry()
            .reregister(&mut source, mio::Token(0), mio::Interest::READABLE)
            .and_then(|()| poll.poll(events, Some(std::time::Duration::ZERO)))
            .is_ok_and(|()| !events.is_empty())
    })
}

static GENERATION: AtomicU64 = AtomicU64::new(0);
static RUNTIME: Mutex<Option<(u64, Arc<Runtime>, Driven)>> = Mutex::new(None);

/// How many forks this process descends from (0 in the process that imported the package).
pub(crate) fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// Called in the child right after `os.fork()`, before any other Python code runs there.
#[pyfunction]
pub(crate) fn after_fork_in_child() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// The runtime of this process (built on first use, and anew in a forked child).
pub(crate) fn runtime(py: Python<'_>) -> PyResult<Arc<Runtime>> {
    Ok(current(py)?.0)
}

/// The runtime of this process and how it is driven.
pub(crate) fn current(_gil: Python<'_>) -> PyResult<(Arc<Runtime>, Driven)> {
    let generation = generation();
    let mut slot = RUNTIME.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((built_in, rt, driven)) = slot.as_ref()
        && *built_in == generation
    {
        return Ok((Arc::clone(rt), *driven));
    }
    let (rt, driven) = build().map_err(|e| {
        pyo3::exceptions::PyRuntimeError::new_err(format!("cannot start the runtime: {e}"))
    })?;
    let rt = Arc::new(rt);
    if let Some((_, stale, _)) = slot.replace((generation, Arc::clone(&rt), driven)) {
        // The parent's runtime: dropping it would wait for threads that do not exist here.
        std::mem::forget(stale);
    }
    Ok((rt, driven))
}

fn build() -> std::io::Result<(Runtime, Driven)> {
    let threads = std::env::var("PROXYPOOL_RUNTIME").is_ok_and(|v| v == "threads");
    if !threads {
        let before = epoll_fds();
        let rt = Builder::new_current_thread()
            .enable_all()
            .on_thread_park(about_to_park)
            .build()?;
        // The epoll the runtime's driver made, among the descriptors of that kind that are new
        // (the driver keeps a clone of it, a second descriptor of the same epoll).
        if let (Some(before), Some(after)) = (before, epoll_fds())
            && let Some(&fd) = after.difference(&before).min()
        {
            EPOLL.store(fd, Ordering::Relaxed);
            return Ok((rt, Driven::ByWaiters));
        }
    }
    EPOLL.store(-1, Ordering::Relaxed);
    let rt = Builder::new_multi_thread()
        // The engine's own work is small; the thread mostly waits on Redis. One: the batch
        // worker and the connection's driver then share it, with no wake-up between them.
        .worker_threads(1)
        .thread_name("proxypool")
        .enable_all()
        .build()?;
    Ok((rt, Driven::OwnThread))
}

/// This process's epoll descriptors, where `/proc` lists them.
fn epoll_fds() -> Option<HashSet<i32>> {
    let entries = std::fs::read_dir("/proc/self/fd").ok()?;
    Some(
        entries
            .flatten()
            .filter(|e| {
                std::fs::read_link(e.path())
                    .is_ok_and(|target| target.as_os_str() == "anon_inode:[eventpoll]")
            })
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect(),
    )
}

/// The descriptor an asyncio loop watches to drive the runtime (see `proxypool._aio`); None
/// when the runtime has a thread of its own.
#[pyfunction]
pub(crate) fn runtime_fd(py: Python<'_>) -> PyResult<Option<i32>> {
    current(py)?;
    Ok(Some(EPOLL.load(Ordering::Relaxed)).filter(|fd| *fd >= 0))
}

/// Drives a runtime driven by its waiters on this thread until it has nothing left to run:
/// its ready I/O read, its due timers fired, its woken tasks run (whatever they wake of ours
/// lands in a loop's inbox). Waits while another thread drives it (a blocking call), until
/// that one is done.
pub(crate) fn pump(rt: &Runtime) {
    let mut armed = false;
    rt.block_on(std::future::poll_fn(|cx| {
        // Armed and taken: the runtime ran out of work (woken otherwise, it is still there).
        if armed && PUMP.take().is_none() {
            return Poll::Ready(());
        }
        PUMP.set(Some(cx.waker().clone()));
        armed = true;
        Poll::Pending
    }));
}
