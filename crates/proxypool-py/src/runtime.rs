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

use std::cell::OnceCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use pyo3::prelude::*;
use pyo3_async_runtimes::TaskLocals;
use pyo3_async_runtimes::generic::{ContextExt, Runtime as GenericRuntime};
use tokio::runtime::{Builder, Handle, Runtime};

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
            // The engine's own work is small; the threads mostly wait on Redis.
            .worker_threads(2)
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

/// `pyo3-async-runtimes`' view of [`runtime`]: asyncio futures whose Rust side runs there.
pub(crate) struct Tokio;

tokio::task_local! {
    static TASK_LOCALS: OnceCell<TaskLocals>;
}

impl GenericRuntime for Tokio {
    type JoinError = tokio::task::JoinError;
    type JoinHandle = tokio::task::JoinHandle<()>;

    fn spawn<F>(fut: F) -> Self::JoinHandle
    where
        F: Future<Output = ()> + Send + 'static,
    {
        // Inside a task (the library spawns from its own tasks) the current handle; from
        // Python (the GIL is held there) this process's runtime, which every caller of
        // `future_into_py` has already started with `runtime`.
        match Handle::try_current() {
            Ok(handle) => handle.spawn(fut),
            Err(_) => Python::attach(runtime)
                .expect("the runtime was started before any future is handed to asyncio")
                .spawn(fut),
        }
    }

    fn spawn_blocking<F>(f: F) -> Self::JoinHandle
    where
        F: FnOnce() + Send + 'static,
    {
        tokio::task::spawn_blocking(f)
    }
}

impl ContextExt for Tokio {
    fn scope<F, R>(locals: TaskLocals, fut: F) -> Pin<Box<dyn Future<Output = R> + Send>>
    where
        F: Future<Output = R> + Send + 'static,
    {
        let cell = OnceCell::new();
        let _ = cell.set(locals);
        Box::pin(TASK_LOCALS.scope(cell, fut))
    }

    fn get_task_locals() -> Option<TaskLocals> {
        TASK_LOCALS
            .try_with(|c| c.get().cloned())
            .unwrap_or_default()
    }
}
