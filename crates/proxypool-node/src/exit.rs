//! What a process queued for Redis reaches it before the process ends.
//!
//! A lease the garbage collector takes unreleased only queues its abandon for the next batch,
//! and nothing waits for it: a process that ends first (`process.exit`, or its event loop
//! running dry while Redis is slow) takes it along, and the slot stays taken until the lease
//! TTL. So such a drop also starts settling its pool ([`settle_later`]), which keeps the
//! store until the abandon has gone out, and `lib.js` hooks the process's `exit` event: it
//! settles every live Redis pool the same way (`Pool::settle_at_exit`) and waits for all those
//! settles ([`wait_for_settles`]). The wait blocks the JavaScript thread, bounded: each settle
//! gives up after the pool's Redis timeout, and then the lease TTL frees what it held.

use std::sync::{Mutex, PoisonError};

use tokio::runtime::Handle;
use tokio::task::JoinHandle;

/// Settling tasks of this process, and the runtime they run on.
static SETTLING: Mutex<Option<(Handle, Vec<JoinHandle<()>>)>> = Mutex::new(None);

/// Settles `pool` on `runtime`, in a task [`wait_for_settles`] waits for.
pub(crate) fn settle_later(runtime: &Handle, pool: proxypool::Pool) {
    let task = runtime.spawn(async move {
        // A failure leaves the slots to the lease TTL.
        let _ = pool.settle().await;
    });
    let mut slot = SETTLING.lock().unwrap_or_else(PoisonError::into_inner);
    let (_, tasks) = slot.get_or_insert_with(|| (runtime.clone(), Vec::new()));
    tasks.retain(|t| !t.is_finished());
    tasks.push(task);
}

/// Waits until every settle started in this process is done (the exit hook's end).
pub(crate) fn wait_for_settles() {
    let Some((runtime, tasks)) = SETTLING
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_mut()
        .map(|(runtime, tasks)| (runtime.clone(), std::mem::take(tasks)))
    else {
        return;
    };
    // On one of the runtime's own threads nothing can be waited for (never the case from
    // JavaScript, which runs on its own thread).
    if tasks.is_empty() || Handle::try_current().is_ok() {
        return;
    }
    runtime.block_on(async {
        for task in tasks {
            let _ = task.await;
        }
    });
}
