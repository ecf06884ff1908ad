//! What a process queued for Redis reaches it before the process ends.
//!
//! A lease dropped unreleased inside a coroutine only queues its abandon for the next batch
//! (the library keeps the store until it is sent, even past the pool's drop), and nothing would
//! wait for it: a process that ends first takes it along, and the slot stays taken until the
//! lease TTL. So the package's exit hook (`proxypool._settle_at_exit`: at the interpreter's
//! exit, and at the end of a multiprocessing worker, before its `os._exit`) settles every Redis
//! pool this process used, live ones and those dropped before (each dropped one hands its
//! library pool here), in tasks on the runtime, and waits for them. Bounded: each settle gives
//! up after the pool's Redis timeout, and then the lease TTL frees what it held.

use std::sync::{Mutex, PoisonError};

use pyo3::prelude::*;
use tokio::task::JoinHandle;

use crate::runtime;

/// Settling tasks of this process (the generation they were spawned in).
static SETTLING: Mutex<Option<(u64, Vec<JoinHandle<()>>)>> = Mutex::new(None);

/// Settles `pool` in a task that [`wait_for_settles`] waits for.
pub(crate) fn settle_later(py: Python<'_>, pool: proxypool::Pool) -> PyResult<()> {
    let rt = runtime::runtime(py)?;
    let task = rt.spawn(async move {
        // A failure leaves the slots to the lease TTL.
        let _ = pool.settle().await;
    });
    let generation = runtime::generation();
    let mut slot = SETTLING.lock().unwrap_or_else(PoisonError::into_inner);
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

/// Waits until every settle started in this process is done (the exit hook's end).
#[pyfunction]
pub(crate) fn wait_for_settles(py: Python<'_>) -> PyResult<()> {
    let generation = runtime::generation();
    let tasks = match SETTLING
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
