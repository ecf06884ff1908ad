//! What `benches/pool.rs` and `examples/pairs.rs` (its cases under callgrind) share: the
//! pool they build and the pair they time.

use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use proxypool::{ManualClock, Outcome, Pool, Strategy, Ticket};

pub(crate) const OK: Outcome = Outcome::Success {
    latency: Duration::from_millis(120),
};

pub(crate) fn url(i: usize) -> String {
    format!(
        "http://10.{}.{}.{}:3128",
        i / 65536,
        (i / 256) % 256,
        i % 256
    )
}

pub(crate) fn pool(n: usize, strategy: Strategy) -> Pool {
    Pool::builder()
        .addresses((0..n).map(url))
        .strategy(strategy)
        .clock(ManualClock::new())
        .seed(1)
        .build()
        .unwrap()
}

/// The in-memory store never waits: one poll with a no-op waker runs a call to completion,
/// so the timings are the pool's and not an executor's.
pub(crate) fn ready<F: Future>(f: F) -> F::Output {
    match pin!(f)
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("the in-memory store never waits"),
    }
}

pub(crate) fn pair(pool: &Pool, ticket: Ticket) {
    ready(async {
        let lease = pool.acquire(ticket).await.unwrap();
        lease.release(OK).await.unwrap();
    });
}
