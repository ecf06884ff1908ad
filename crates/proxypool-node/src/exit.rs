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

use std::sync::OnceLock;

use tokio::runtime::Handle;

use crate::settling;

/// The runtime the settles run on (napi's).
static RUNTIME: OnceLock<Handle> = OnceLock::new();

/// Settles `pool` on `runtime`, in a task [`wait_for_settles`] waits for.
pub(crate) fn settle_later(runtime: &Handle, pool: proxypool::Pool) {
    RUNTIME.get_or_init(|| runtime.clone());
    // A Node process never forks its runtime: one generation.
    settling::settle_later(0, runtime, pool);
}

/// Waits until every settle started in this process is done (the exit hook's end).
pub(crate) fn wait_for_settles() {
    if let (Some(runtime), Some(tasks)) = (RUNTIME.get(), settling::take(0)) {
        runtime.block_on(async {
            for task in tasks {
                let _ = task.await;
            }
        });
    }
}
