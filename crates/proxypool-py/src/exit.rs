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

use pyo3::prelude::*;

use crate::{runtime, settling};

/// Settles `pool` in a task that [`wait_for_settles`] waits for.
pub(crate) fn settle_later(py: Python<'_>, pool: proxypool::Pool) -> PyResult<()> {
    let rt = runtime::runtime(py)?;
    settling::settle_later(runtime::generation(), rt.handle(), pool);
    Ok(())
}

/// Waits until every settle started in this process is done (the exit hook's end).
#[pyfunction]
pub(crate) fn wait_for_settles(py: Python<'_>) -> PyResult<()> {
    let Some(tasks) = settling::take(runtime::generation()) else {
        return Ok(());
    };
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
