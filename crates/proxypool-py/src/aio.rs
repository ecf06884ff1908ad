//! asyncio awaitables whose Rust side runs on the tokio runtime, handed over and completed in
//! batches.
//!
//! A call creates a `Call` (an asyncio-compatible future, see `call`) on the running loop and
//! queues its Rust work on the loop's bridge; the first call of a loop iteration schedules
//! `flush` (`loop.call_soon`), which hands everything queued to the runtime at once. The
//! work's result goes, with its call, to an inbox that no Python thread state guards; the
//! first result into an empty inbox writes one byte to a socket the loop watches
//! (`loop.add_reader`), and the loop's callback drains the inbox, converting each result under
//! the GIL it already holds and resuming the tasks waiting on them. Runtime threads never
//! take the GIL: per-future GIL hand-offs from foreign threads and a wake-up per future are
//! what made `pyo3-async-runtimes` 8 times slower than the Rust caller in the Redis bench
//! (benches/bench.py); one hand-off to the runtime per iteration instead of one per call cut
//! the runtime threads' CPU per acquire + release pair by about a tenth, and one task driving
//! an iteration's calls instead of a task per call by about half again.
//!
//! The loop thread is the larger part of a pair's CPU, much of it asyncio's Python code: `Call`
//! instead of `loop.create_future()` and a `call_soon` per completion cut that thread's
//! instructions per pair by about a fifth (callgrind, 42 000 -> 34 000).

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, PoisonError};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use pyo3::IntoPyObjectExt;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::call::Call;
use crate::runtime;

/// How a result becomes a Python object, run on the loop's thread.
pub(crate) type Finish = Box<dyn FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send>;

/// A result converted on the loop's thread: its error through `error` (which may need the
/// GIL to set attributes), its value by `IntoPyObject`.
pub(crate) fn finish<T, E>(result: Result<T, E>, error: fn(E) -> PyErr) -> Finish
where
    T: for<'py> IntoPyObject<'py> + Send + 'static,
    E: Send + 'static,
{
    Box::new(move |py| result.map_err(error)?.into_py_any(py))
}

/// Results waiting for the loop, each with its call, and the socket that wakes it.
struct Inbox {
    done: Mutex<Vec<(Py<Call>, Finish)>>,
    wake: UnixStream,
}

impl Inbox {
    fn push(&self, call: Py<Call>, finish: Finish) {
        let was_empty = {
            let mut done = self.done.lock().unwrap_or_else(PoisonError::into_inner);
            done.push((call, finish));
            done.len() == 1
        };
        if was_empty {
            // Full means a wake-up is already pending: the loop drains everything then.
            let _ = (&self.wake).write(&[1]);
        }
    }
}

/// A call's Rust side, waiting to be spawned with the others of its loop iteration.
type Work = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// The bridge of one event loop (made by `proxypool._aio.bridge`).
#[pyclass(module = "proxypool", frozen)]
pub(crate) struct Completions {
    inbox: Arc<Inbox>,
    ready: UnixStream,
    /// Calls made since the last `flush`; touched with the GIL held only.
    outbox: Mutex<Vec<Work>>,
}

#[pymethods]
impl Completions {
    #[new]
    fn new() -> PyResult<Self> {
        let (ready, wake) = UnixStream::pair()?;
        ready.set_nonblocking(true)?;
        wake.set_nonblocking(true)?;
        Ok(Self {
            inbox: Arc::new(Inbox {
                done: Mutex::new(Vec::new()),
                wake,
            }),
            ready,
            outbox: Mutex::new(Vec::new()),
        })
    }

    /// Hands the calls made since the last flush to the runtime: one hand-off per loop
    /// iteration instead of one per call, and one task driving them all instead of a task
    /// per call (each woken call alone is polled).
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let mut calls: FuturesUnordered<Work> =
            std::mem::take(&mut *self.outbox.lock().unwrap_or_else(PoisonError::into_inner))
                .into_iter()
                .collect();
        runtime::runtime(py)?.spawn(async move { while calls.next().await.is_some() {} });
        Ok(())
    }

    /// The descriptor the loop watches.
    fn fileno(&self) -> i32 {
        self.ready.as_raw_fd()
    }

    /// The loop's reader callback: completes every call whose result arrived.
    fn drain(&self, py: Python<'_>) -> PyResult<()> {
        let mut bytes = [0u8; 256];
        while matches!((&self.ready).read(&mut bytes), Ok(n) if n > 0) {}
        let done = std::mem::take(
            &mut *self
                .inbox
                .done
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        let mut done = done.into_iter();
        while let Some((call, finish)) = done.next() {
            if let Err(e) = Call::complete(call.bind(py), finish) {
                // A KeyboardInterrupt or SystemExit leaves as from any loop callback; the
                // other results wait for the next drain.
                for (call, finish) in done {
                    self.inbox.push(call, finish);
                }
                return Err(e);
            }
        }
        Ok(())
    }
}

/// An awaitable for `work`, on the running loop.
pub(crate) fn spawn<'py, F>(py: Python<'py>, work: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Finish> + Send + 'static,
{
    static GET_LOOP: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    static BRIDGE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let event_loop = GET_LOOP
        .import(py, "asyncio", "get_running_loop")?
        .call0()?;
    // The loop keeps its bridge as an attribute where it can (asyncio's loops): one lookup.
    let bridge = match event_loop.getattr(intern!(py, "_proxypool_bridge")) {
        Ok(bridge) => bridge,
        Err(_) => BRIDGE
            .import(py, "proxypool._aio", "bridge")?
            .call1((&event_loop,))?,
    };
    let bridge = bridge.cast_into::<Completions>()?;
    let call = Bound::new(py, Call::new(event_loop.clone().unbind()))?;
    let (inbox, done) = (Arc::clone(&bridge.get().inbox), call.clone().unbind());
    let first = {
        let mut outbox = bridge
            .get()
            .outbox
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        outbox.push(Box::pin(async move {
            let finish = work.await;
            inbox.push(done, finish);
        }));
        outbox.len() == 1
    };
    if first {
        let flush = bridge.getattr(intern!(py, "flush"))?;
        event_loop.call_method1(intern!(py, "call_soon"), (flush,))?;
    }
    Ok(call.into_any())
}
