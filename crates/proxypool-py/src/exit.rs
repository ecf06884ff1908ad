//! What a process queued for Redis reaches it before the process ends.
//!
//! A lease dropped unreleased inside a coroutine only queues its abandon for the next batch,
//! and a pool dropped meanwhile would take its batch worker, and the queue, with it. So a Redis
//! pool dropped in the process that uses it hands its library pool to a runtime task that
//! settles it (the task holds the pool, and so its worker, until Redis has everything queued),
//! and the package's exit hook (`proxypool._settle_at_exit`: at the interpreter's exit, and at
//! the end of a multiprocessing worker, before its `os._exit`) settles the live pools and
//! waits for those tasks. Bounded: each settle gives up after the pool's Redis timeout, and
//! then the lease TTL frees what it held.

use std::sync::{Mutex, PoisonError};

use pyo3::prelude::*;
use tokio::task::JoinHandle;

use crate::runtime;

/// The settling tasks of pools dropped in this process (the generation they were spawned in).
static DROPPED: Mutex<Option<(u64, Vec<JoinHandle<()>>)>> = Mutex::new(None);

/// Settles `pool`, dropped in this process, on the runtime.
pub(crate) fn settle_dropped(py: Python<'_>, pool: proxypool::Pool) -> PyResult<()> {
    let rt = runtime::runtime(py)?;
    let task = rt.spawn(async move {
        // A failure leaves the slots to the lease TTL.
        let _ = pool.settle().await;
    });
    let generation = runtime::generation();
    let mut slot = DROPPED.lock().unwrap_or_else(PoisonError::into_inner);
    match slot.as_mut() {
        Some((spawned_in, tasks)) if *spawned_in == generation => {
            tasks.retain(|t| !t.is_finished());
            tasks.push(task);
        }
        _ => {
            // A parent's tasks: their runtime has no threads here.
            std::mem::forget(slot.replace((generation, vec![task])));
        }
    }
    Ok(())
}

/// Waits until the pools dropped in this process are settled (the exit hook's second half).
#[pyfunction]
pub(crate) fn settle_dropped_pools(py: Python<'_>) -> PyResult<()> {
    let generation = runtime::generation();
    let tasks = match DROPPED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_mut()
    {
        Some((spawned_in, tasks)) if *spawned_in == generation => std::mem::take(tasks),
        _ => return Ok(()),
    };
    // Inside a runtime (an exit from one of its threads) nothing can be waited for.
    if tasks.is_empty() || tokio::runtime::Handle::try_current().is_ok() {
        return Ok(());
    }
    let rt = runtime::runtime(py)?;
    py.detach(|| {
        rt.block_on(async {
            for task in tasks {
                let _ = task.await;
            }
        })
    });
    Ok(())
}
