//! The request-head timeout of [`crate::serve_connections`], kept per connection instead of
//! by hyper.
//!
//! hyper's own (`header_read_timeout`) makes, registers and drops a boxed timer for every
//! request: a measurable share of a small request's cost. Here a connection only notes when it
//! began waiting for a head (two stores per request, one clock read), and one sleep per
//! connection, re-armed when it wakes too early, closes it once a head has been awaited for the
//! whole timeout. The clock runs from the connection's start and from each answer's end (its
//! body handed to hyper whole), as hyper's did; it stands still while a request is answered.

use hyper::body::{Body, Frame, SizeHint};
use hyper::service::Service;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

/// What `since` holds while a request is being answered.
const ANSWERING: u64 = u64::MAX;

/// Milliseconds of the coarse monotonic clock (its ticks are a few milliseconds, nothing
/// beside a timeout of seconds): read at every answer's end, where `Instant`'s precise read
/// and arithmetic cost a small request several times as much. An unreadable clock (never on
/// Linux) reads 0, so nothing expires rather than everything.
fn now_ms() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC_COARSE).map_or(0, |t| {
        let ms = t.tv_sec() as u64 * 1000 + t.tv_nsec() as u64 / 1_000_000;
        ms.min(ANSWERING - 1)
    })
}

/// One connection's state: since when it has waited for a head, or [`ANSWERING`].
#[derive(Debug)]
pub(crate) struct HeadWatch {
    since: AtomicU64,
}

impl HeadWatch {
    /// A connection that starts waiting for its first head now.
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            since: AtomicU64::new(now_ms()),
        })
    }

    /// Resolves once a head has been awaited for `timeout` (the caller then drops the
    /// connection); never while a request is answered.
    pub(crate) async fn expired(&self, timeout: Duration) {
        let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX / 2);
        loop {
            let since = self.since.load(Ordering::Relaxed);
            let now = now_ms();
            // While answering, the head timer cannot end before a whole timeout after now.
            let from = if since == ANSWERING { now } else { since };
            let deadline = from.saturating_add(timeout_ms);
            if since != ANSWERING && now >= deadline {
                return;
            }
            tokio::time::sleep(Duration::from_millis(deadline - now)).await;
        }
    }
}

/// A connection's service, noting when each request's head arrived and its answer ended.
#[derive(Debug)]
pub struct Watched<S> {
    pub(crate) inner: S,
    pub(crate) watch: Arc<HeadWatch>,
}

impl<S, R, B> Service<R> for Watched<S>
where
    S: Service<R, Response = hyper::Response<B>>,
{
    type Response = hyper::Response<WatchedBody<B>>;
    type Error = S::Error;
    type Future = WatchedFuture<S::Future>;

    fn call(&self, request: R) -> Self::Future {
        // hyper calls the service once the head is read whole.
        self.watch.since.store(ANSWERING, Ordering::Relaxed);
        WatchedFuture {
            inner: self.inner.call(request),
            watch: Some(self.watch.clone()),
        }
    }
}

pin_project_lite::pin_project! {
    /// The service's answer; its body carries the connection's watch.
    pub struct WatchedFuture<F> {
        #[pin]
        inner: F,
        watch: Option<Arc<HeadWatch>>,
    }
}

impl<F, B, E> std::future::Future for WatchedFuture<F>
where
    F: std::future::Future<Output = Result<hyper::Response<B>, E>>,
{
    type Output = Result<hyper::Response<WatchedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = std::task::ready!(this.inner.poll(cx))?;
        let idle = AnswerEnd(this.watch.take());
        Poll::Ready(Ok(response.map(|inner| WatchedBody { inner, _end: idle })))
    }
}

/// Starts the head timer when dropped: hyper drops a body once it has all of it.
#[derive(Debug)]
struct AnswerEnd(Option<Arc<HeadWatch>>);

impl Drop for AnswerEnd {
    fn drop(&mut self) {
        if let Some(watch) = &self.0 {
            watch.since.store(now_ms(), Ordering::Relaxed);
        }
    }
}

pin_project_lite::pin_project! {
    /// A response body that starts the connection's head timer when hyper is done with it.
    #[derive(Debug)]
    pub struct WatchedBody<B> {
        #[pin]
        inner: B,
        _end: AnswerEnd,
    }
}

impl<B: Body> Body for WatchedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
