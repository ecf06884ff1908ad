//! Telling the pool how a request went, from places that cannot await (a response body being
//! polled, a `Drop`), and the response body that reports when it ends.

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use memchr::memmem::Finder;
use proxypool::{Lease, Outcome};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::net::TcpStream;

/// Releases the lease without awaiting: the in-memory pool answers on the first poll, so the
/// common case costs no task; a store that has to wait gets a task of its own.
pub(super) fn release_now(lease: Lease, outcome: Outcome) {
    let mut release = Box::pin(lease.release(outcome));
    match release
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(Ok(())) => {}
        Poll::Ready(Err(e)) => tracing::warn!(error = %e, "cannot release a lease"),
        Poll::Pending => {
            tokio::spawn(async move {
                if let Err(e) = release.await {
                    tracing::warn!(error = %e, "cannot release a lease");
                }
            });
        }
    }
}

/// Searches the first bytes of a body for captcha markers, across frame boundaries.
#[derive(Debug)]
pub(super) struct CaptchaScan {
    markers: Arc<[Finder<'static>]>,
    /// The last `longest - 1` bytes seen, so a marker split between frames is found.
    tail: Vec<u8>,
    longest: usize,
    left: usize,
}

impl CaptchaScan {
    pub(super) fn new(markers: Arc<[Finder<'static>]>, limit: usize) -> Option<Self> {
        let longest = markers.iter().map(|f| f.needle().len()).max()?;
        Some(Self {
            markers,
            tail: Vec::new(),
            longest,
            left: limit,
        })
    }

    /// Whether a marker has now been seen.
    fn feed(&mut self, data: &[u8]) -> bool {
        let data = &data[..data.len().min(self.left)];
        self.left -= data.len();
        if data.is_empty() {
            return false;
        }
        let found = |hay: &[u8]| self.markers.iter().any(|f| f.find(hay).is_some());
        if !self.tail.is_empty() {
            let mut joint = self.tail.clone();
            joint.extend_from_slice(&data[..data.len().min(self.longest - 1)]);
            if found(&joint) {
                return true;
            }
        }
        if found(data) {
            return true;
        }
        let keep = self.longest - 1;
        if data.len() >= keep {
            self.tail.clear();
            self.tail.extend_from_slice(&data[data.len() - keep..]);
        } else {
            self.tail.extend_from_slice(data);
            let excess = self.tail.len().saturating_sub(keep);
            self.tail.drain(..excess);
        }
        false
    }
}

/// What is still to be reported when the body ends.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) lease: Lease,
    /// Time to the response head.
    pub(super) latency: Duration,
    pub(super) scan: Option<CaptchaScan>,
}

/// The client side of a connection to an upstream, still to be driven (it may still be
/// sending the client's body, capped at `--max-body-bytes`).
pub(super) type UpstreamConnection = Pin<
    Box<
        hyper::client::conn::http1::Connection<
            TokioIo<TcpStream>,
            http_body_util::Limited<Incoming>,
        >,
    >,
>;

/// An upstream response body on its way to the client. With a pending report it releases the
/// lease when the body ends: captcha if a marker went by, a failure if the upstream broke off,
/// success otherwise (also when the client stops reading: the upstream did its part).
///
/// It also drives the upstream connection that feeds it: no task of its own, no hand-over
/// between workers per request. The connection is never reused, so it is dropped (closed)
/// with the body.
pub(crate) struct Reported {
    inner: Incoming,
    pending: Option<Pending>,
    connection: Option<UpstreamConnection>,
}

impl fmt::Debug for Reported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reported")
            .field("pending", &self.pending)
            .field("connection", &self.connection.is_some())
            .finish_non_exhaustive()
    }
}

impl Reported {
    pub(super) fn new(
        inner: Incoming,
        pending: Option<Pending>,
        connection: Option<UpstreamConnection>,
    ) -> Self {
        Self {
            inner,
            pending,
            connection,
        }
    }

    fn finish(&mut self, outcome: impl FnOnce(Duration) -> Outcome) {
        if let Some(p) = self.pending.take() {
            release_now(p.lease, outcome(p.latency));
        }
    }
}

impl Body for Reported {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        if let Some(connection) = this.connection.as_mut()
            && let Poll::Ready(ended) = connection.as_mut().poll(cx)
        {
            if let Err(e) = ended {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
            this.connection = None;
        }
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                let captcha = match (frame.data_ref(), this.pending.as_mut()) {
                    (
                        Some(data),
                        Some(Pending {
                            scan: Some(scan), ..
                        }),
                    ) => scan.feed(data),
                    _ => false,
                };
                if captcha {
                    this.finish(|_| Outcome::Captcha);
                }
            }
            Poll::Ready(Some(Err(_))) => this.finish(|_| Outcome::ConnectError),
            Poll::Ready(None) => this.finish(|latency| Outcome::Success { latency }),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Reported {
    fn drop(&mut self) {
        self.finish(|latency| Outcome::Success { latency });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(markers: &[&str], limit: usize) -> CaptchaScan {
        let finders: Vec<Finder<'static>> = markers
            .iter()
            .map(|m| Finder::new(m.as_bytes()).into_owned())
            .collect();
        CaptchaScan::new(finders.into(), limit).unwrap_or_else(|| panic!("no markers"))
    }

    #[test]
    fn markers_are_found_across_frames_and_within_the_limit() {
        let mut s = scan(&["g-recaptcha", "captcha-wall"], 1000);
        assert!(!s.feed(b"<html><div class=\"g-rec"));
        assert!(s.feed(b"aptcha\"></div>"));

        let mut s = scan(&["captcha-wall"], 1000);
        for chunk in [&b"cap"[..], b"tch", b"a-w", b"all"] {
            if s.feed(chunk) {
                return;
            }
        }
        panic!("marker split in four frames was missed");
    }

    #[test]
    fn bytes_past_the_limit_are_not_searched() {
        let mut s = scan(&["marker"], 10);
        assert!(!s.feed(b"0123456789marker"));
        assert!(CaptchaScan::new(Arc::from(Vec::new()), 1).is_none());
    }
}
