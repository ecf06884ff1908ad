//! A connection and the two things that may end it early — the start of a drain at shutdown
//! and its head timeout — polled as one future that looks at those two only when they woke it.
//!
//! `select!`ing the connection with a shutdown watch and a timer (and hyper-util's graceful
//! wrapper, which polls its watch on every poll) re-polled both of them on every wake-up of
//! the connection: a tokio `Notified`, a `Sleep` and their waker bookkeeping on every
//! request, several hundred instructions of a redirect's few thousand. Here they are polled
//! with a waker of their own, which flags them before waking the connection's task; a wake-up
//! for the connection alone costs one atomic swap (and a lock only when the task's waker
//! changed, which a tokio task's does not: it was a lock per poll, ~20 ns a request).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

/// The waker the side futures see: flags them, then wakes the task.
#[derive(Debug)]
struct SideWake {
    fired: AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl SideWake {
    fn remember(&self, waker: &Waker) {
        *self.task.lock().unwrap_or_else(PoisonError::into_inner) = Some(waker.clone());
    }
}

impl Wake for SideWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, Ordering::Release);
        let task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(waker) = task.as_ref() {
            waker.wake_by_ref();
        }
    }
}

pin_project_lite::pin_project! {
    /// Runs `conn` until it ends, or until `expired` resolves (then drops it, which closes
    /// it); once `drain` resolves, `begin_drain` is called on it once and it runs to its end.
    pub(crate) struct Supervised<C, D: Future, E> {
        #[pin]
        conn: C,
        #[pin]
        drain: D,
        #[pin]
        expired: E,
        begin_drain: fn(Pin<&mut C>),
        // What `drain` resolved to, kept as long as the connection runs (the server's
        // drain waits for every connection's watch to be dropped).
        drained: Option<D::Output>,
        side: Arc<SideWake>,
        // The waker `side` holds, read here without its lock (only `poll` changes it).
        known: Option<Waker>,
    }
}

impl<C, D: Future, E> Supervised<C, D, E> {
    pub(crate) fn new(conn: C, drain: D, expired: E, begin_drain: fn(Pin<&mut C>)) -> Self {
        Self {
            conn,
            drain,
            expired,
            begin_drain,
            drained: None,
            side: Arc::new(SideWake {
                // Polled once at the start, so that they register.
                fired: AtomicBool::new(true),
                task: Mutex::new(None),
            }),
            known: None,
        }
    }
}

impl<C, D, E> Future for Supervised<C, D, E>
where
    C: Future,
    D: Future,
    E: Future<Output = ()>,
{
    /// `None`: the head timeout ended the connection.
    type Output = Option<C::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if !this.known.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            this.side.remember(cx.waker());
            *this.known = Some(cx.waker().clone());
        }
        if this.side.fired.swap(false, Ordering::AcqRel) {
            let waker = Waker::from(this.side.clone());
            let mut side = Context::from_waker(&waker);
            if this.drained.is_none()
                && let Poll::Ready(held) = this.drain.poll(&mut side)
            {
                *this.drained = Some(held);
                (this.begin_drain)(this.conn.as_mut());
            }
            if this.expired.poll(&mut side).is_ready() {
                return Poll::Ready(None);
            }
        }
        this.conn.poll(cx).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use tokio::sync::{oneshot, watch};

    /// A connection that ends once told to drain and then polled; counts its polls.
    struct Fake {
        draining: bool,
        polls: Arc<AtomicUsize>,
    }

    impl Future for Fake {
        type Output = &'static str;
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
            self.polls.fetch_add(1, Ordering::Relaxed);
            if self.draining {
                Poll::Ready("drained")
            } else {
                Poll::Pending
            }
        }
    }

    fn begin_drain(mut fake: Pin<&mut Fake>) {
        fake.draining = true;
    }

    fn fake() -> (Fake, Arc<AtomicUsize>) {
        let polls = Arc::new(AtomicUsize::new(0));
        let fake = Fake {
            draining: false,
            polls: polls.clone(),
        };
        (fake, polls)
    }

    #[tokio::test]
    async fn a_drain_started_after_the_first_poll_reaches_the_connection() {
        let (tx, mut rx) = watch::channel(());
        let (conn, _) = fake();
        let drain = async move {
            let _ = rx.changed().await;
            rx
        };
        let task = tokio::spawn(Supervised::new(
            conn,
            drain,
            std::future::pending(),
            begin_drain,
        ));
        tokio::task::yield_now().await;
        assert!(!task.is_finished());
        tx.send(()).unwrap();
        assert_eq!(task.await.unwrap(), Some("drained"));
        // The watch was held until the connection ended, and dropped with it.
        tx.closed().await;
    }

    #[tokio::test]
    async fn an_expiry_ends_the_connection_without_a_drain() {
        let (conn, _) = fake();
        let (expire, expired) = oneshot::channel::<()>();
        let task = tokio::spawn(Supervised::new(
            conn,
            std::future::pending::<()>(),
            async move {
                let _ = expired.await;
            },
            begin_drain,
        ));
        tokio::task::yield_now().await;
        assert!(!task.is_finished());
        expire.send(()).unwrap();
        assert_eq!(task.await.unwrap(), None);
    }

    #[test]
    fn wake_ups_for_the_connection_alone_do_not_poll_the_side_futures() {
        let (conn, polls) = fake();
        let side_polls = Arc::new(AtomicUsize::new(0));
        let counted = side_polls.clone();
        let expired = std::future::poll_fn(move |_| {
            counted.fetch_add(1, Ordering::Relaxed);
            Poll::<()>::Pending
        });
        let mut supervised = Box::pin(Supervised::new(
            conn,
            std::future::pending::<()>(),
            expired,
            begin_drain,
        ));
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..5 {
            assert!(supervised.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(polls.load(Ordering::Relaxed), 5);
        assert_eq!(side_polls.load(Ordering::Relaxed), 1);
        // A side wake-up makes the next poll look at them again, once.
        Waker::from(supervised.side.clone()).wake();
        for _ in 0..2 {
            assert!(supervised.as_mut().poll(&mut cx).is_pending());
        }
        assert_eq!(side_polls.load(Ordering::Relaxed), 2);
    }
}
