//! The tokio runtime the bindings run Redis calls on, rebuilt after a fork.
//!
//! A forked child inherits the parent's memory but none of its threads: the parent's runtime
//! (its workers, its timers, the Redis connection tasks) is a husk there, and waiting on it
//! hangs. The package registers `after_fork_in_child` with `os.register_at_fork`: it bumps the
//! fork generation, and everything built in an older generation (runtime, Redis pools, leases)
//! is forgotten in the child, never used or dropped there, and built anew on first use.
//!
//! The slot is locked only while the GIL is held: the thread that forks holds the GIL, so no
//! other thread can hold the lock at that instant and the child never inherits it locked.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use pyo3::prelude::*;
use tokio::runtime::{Builder, Runtime};

static GENERATION: AtomicU64 = AtomicU64::new(0);
static RUNTIME: Mutex<Option<(u64, Arc<Runtime>)>> = Mutex::new(None);

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
pub(crate) fn runtime(_gil: Python<'_>) -> PyResult<Arc<Runtime>> {
    let generation = generation();
    let mut slot = RUNTIME.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((built_in, rt)) = slot.as_ref()
        && *built_in == generation
    {
        return Ok(Arc::clone(rt));
    }
    let rt = Arc::new(
        Builder::new_multi_thread()
            // The engine's own work is small; the thread mostly waits on Redis. One: the batch
            // worker and the connection's driver then share it, with no wake-up between them
            // (the asyncio bench: 0.63 -> 0.66 x the Rust caller, 13 -> 12 us of CPU a pair).
            // Blocking calls run their own futures on the caller's thread.
            .worker_threads(1)
            .thread_name("proxypool")
            .enable_all()
            .build()
            .map_err(|e| {
                pyo3::exceptions::PyRuntimeError::new_err(format!("cannot start the runtime: {e}"))
            })?,
    );
    if let Some((_, stale)) = slot.replace((generation, Arc::clone(&rt))) {
        // The parent's runtime: dropping it would wait for threads that do not exist here.
        std::mem::forget(stale);
    }
    Ok(rt)
}
