//! The settles of Redis pools a process started, for its exit to wait for: one registry for
//! both bindings (each binding's `exit.rs` says when to settle and waits in its own way).

use std::sync::{Mutex, PoisonError};

use tokio::runtime::Handle;
use tokio::task::JoinHandle;

/// Settling tasks of this process, and the fork generation they were spawned in.
static SETTLING: Mutex<Option<(u64, Vec<JoinHandle<()>>)>> = Mutex::new(None);

/// Settles `pool` in a task on `runtime`, kept for [`take`]. `generation`: the process's fork
/// generation (0 where it never forks).
pub(crate) fn settle_later(generation: u64, runtime: &Handle, pool: proxypool::Pool) {
    let task = runtime.spawn(async move {
        // A failure leaves the slots to the lease TTL.
        let _ = pool.settle().await;
    });
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
}

/// The settles started in `generation` and not taken yet, to wait for; None when there are
/// none, or on a thread inside the runtime (nothing can be waited for there).
pub(crate) fn take(generation: u64) -> Option<Vec<JoinHandle<()>>> {
    let tasks = match SETTLING
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_mut()
    {
        Some((spawned_in, tasks)) if *spawned_in == generation => std::mem::take(tasks),
        _ => return None,
    };
    (!tasks.is_empty() && Handle::try_current().is_err()).then_some(tasks)
}
