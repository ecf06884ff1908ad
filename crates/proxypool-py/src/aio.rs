//! asyncio awaitables whose Rust side is polled on the loop's own thread and completed in
//! batches.
//!
//! A call creates a `Call` (an asyncio-compatible future, see `call`) and a `Task` holding its
//! Rust future, which it polls on the loop's thread (at once, or when the drain that resumed
//! its caller lets its calls leave), in the runtime's context. The library's calls poll in
//! microseconds: they queue an operation for the store's batch worker, a runtime task that does
//! the Redis I/O, and wait for its answer. The answer's waker puts the task in the loop's inbox,
//! which no Python thread state guards. The loop's callback (`drive`) drains the inbox, polls
//! each task again under the GIL it already holds, converts the results and resumes the tasks
//! waiting on them in place.
//!
//! Where the loop drives the runtime (see `runtime`), that is all one thread: the loop watches
//! the runtime's epoll, and its callback pumps the runtime (the reply is read, the batch ends,
//! our tasks land in the inbox), drains, lets the calls made leave (the batch worker writes
//! them to Redis in the next pump), and goes on while calls finish. A tick drives it while
//! calls are out, for their deadlines. Where the runtime has a thread of its own, the answer
//! wakes the task there, and the first task into an empty inbox writes one byte to a socket
//! the loop watches. Either way the runtime never takes the GIL, and the GIL is never held
//! across I/O (a poll does not wait; a pump releases it).
//!
//! History (benches/bench.py, 50 tasks through Redis): per-future GIL hand-offs from foreign
//! threads and a wake-up per future made `pyo3-async-runtimes` 8 times slower than the Rust
//! caller. Batched hand-offs to the runtime (one `flush` per loop iteration, one task driving
//! its calls) came next; `Call` instead of `loop.create_future()` cut the loop thread's
//! instructions per pair by about a fifth. Polling on the loop's thread replaced the hand-off:
//! the loop's calls then reached the batch worker in a herd once per iteration, so one batch
//! was out at a time and Redis waited while the loop ran; now they reach it as they are made
//! (pairs per FCALL about 20 -> 9, the Rust caller's 12), and no spawn, runtime task or
//! `call_soon` per iteration is left. Instructions per pair did not change (about 46 000): the
//! library's polls moved from the runtime's threads to the loop's. The calls a drain's tasks
//! make are polled when it ends (see `drain`): under callgrind the runtime's threads went from
//! about 17 800 to 12 700 instructions per pair, and pairs per FCALL rose (9.0 -> 10.9). The
//! loop thread's share then went 32 300 -> 29 000: a call without a value (a release) ends its
//! await with no `StopIteration`, callbacks run through `Context.run` unbound (no bound method
//! each), a drain enters the runtime's context once, a lease shares its address. The loop
//! driving the runtime itself (no thread hand-off in a round trip, its calls leaving in two
//! batches a drain) took the bench from 0.61-0.70 to 0.91-0.97 x the Rust caller, at 10-13
//! instead of 12-23 us of CPU a pair.

use std::cell::{Cell, RefCell};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

use pyo3::IntoPyObjectExt;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::call::Call;
use crate::runtime::{self, Driven};
use tokio::runtime::Runtime;

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

/// A result without a value: None, as the blocking call returns (`()` converts to an empty
/// tuple; None also leaves the await without an exception, see `Call::__next__`).
pub(crate) fn finish_none<E>(result: Result<(), E>, error: fn(E) -> PyErr) -> Finish
where
    E: Send + 'static,
{
    Box::new(move |py| {
        result.map_err(error)?;
        Ok(py.None())
    })
}

/// Tasks to poll (woken, or finished at their first poll), and the socket that wakes the loop.
struct Inbox {
    woken: Mutex<Vec<Arc<Task>>>,
    wake: UnixStream,
}

impl Inbox {
    fn push(&self, task: Arc<Task>) {
        let was_empty = {
            let mut woken = self.woken.lock().unwrap_or_else(PoisonError::into_inner);
            woken.push(task);
            woken.len() == 1
        };
        // Full means a wake-up is already pending: the loop drains everything then. A loop's
        // own pump drains right after (see `drive`): no wake-up needed.
        if was_empty && !QUIET.get() {
            self.wake_loop();
        }
    }

    fn is_empty(&self) -> bool {
        self.woken
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }

    fn wake_loop(&self) {
        let _ = (&self.wake).write(&[1]);
    }
}

/// A call's Rust side.
type Work = Pin<Box<dyn Future<Output = Finish> + Send>>;

enum Stage {
    Running(Work),
    /// Done at its first poll: completed by the next drain all the same, so that a call is
    /// never done when made (one can still cancel it, or add callbacks, as with any future).
    Finished(Finish),
}

/// A call's future, polled on the loop's thread and woken from any.
struct Task {
    call: Py<Call>,
    /// Locked on the loop's thread only (the lock makes the task shareable with its waker).
    stage: Mutex<Option<Stage>>,
    /// In the inbox already: a second wake-up before the poll adds nothing.
    queued: AtomicBool,
    inbox: Arc<Inbox>,
}

impl Task {
    fn queue(self: Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            let inbox = Arc::clone(&self.inbox);
            inbox.push(self);
        }
    }

    /// Polls the future (the caller has entered the runtime's context); its result once it
    /// has one.
    fn step(self: &Arc<Self>) -> Option<Finish> {
        // Cleared before the poll: a wake-up during it queues the task again.
        self.queued.store(false, Ordering::Release);
        let mut stage = self.stage.lock().unwrap_or_else(PoisonError::into_inner);
        match stage.take() {
            Some(Stage::Running(mut work)) => {
                let waker = Waker::from(Arc::clone(self));
                match work.as_mut().poll(&mut Context::from_waker(&waker)) {
                    Poll::Ready(finish) => Some(finish),
                    Poll::Pending => {
                        *stage = Some(Stage::Running(work));
                        None
                    }
                }
            }
            Some(Stage::Finished(finish)) => Some(finish),
            // Woken after it finished: nothing left.
            None => None,
        }
    }
}

impl Wake for Task {
    fn wake(self: Arc<Self>) {
        self.queue();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.load(Ordering::Acquire) {
            Arc::clone(self).queue();
        }
    }
}

thread_local! {
    /// Set while a loop's thread drives the runtime and drains what that completes right
    /// after (see `drive`).
    static QUIET: Cell<bool> = const { Cell::new(false) };
    /// The loop and bridge of the drain running on this thread. The calls its resumed tasks
    /// make (nearly all of them under load) take them from here: `asyncio.get_running_loop()`
    /// costs a `getpid` system call per call on Python 3.11 (its check for a fork), and the
    /// bridge an attribute lookup.
    static DRAINING: RefCell<Option<(Py<PyAny>, Py<Completions>)>> = const { RefCell::new(None) };
}

/// Clears `DRAINING` when a drain ends, however it ends.
struct Draining;

impl Drop for Draining {
    fn drop(&mut self) {
        DRAINING.set(None);
    }
}

/// The bridge of one event loop (made by `proxypool._aio.bridge`).
#[pyclass(module = "proxypool", frozen)]
pub(crate) struct Completions {
    inbox: Arc<Inbox>,
    ready: UnixStream,
    /// While a drain runs: the calls its resumed tasks made, first polled when it ends (or
    /// every [`LEAVE_EVERY`], see `drain_woken`).
    made_in_drain: Mutex<Option<Vec<Arc<Task>>>>,
    /// Calls made and not finished yet.
    out: AtomicUsize,
    /// A `tick` is scheduled.
    ticking: AtomicBool,
}

impl Completions {
    /// Keeps a call made during a drain for its end (see `drain`); gives back one made outside.
    fn defer(&self, task: Arc<Task>) -> Option<Arc<Task>> {
        match self
            .made_in_drain
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
        {
            Some(made) => {
                made.push(task);
                None
            }
            None => Some(task),
        }
    }

    /// Polls the calls made so far in the drain; `more`: the drain goes on, collecting again.
    fn start_made_in_drain(&self, more: bool) {
        let made = {
            let mut slot = self
                .made_in_drain
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if more {
                slot.replace(Vec::new())
            } else {
                slot.take()
            }
        };
        for task in made.into_iter().flatten() {
            first_poll(task);
        }
    }

    /// Resumes the tasks woken so far. On a runtime the loop drives (`pumped`), the calls
    /// they make leave for Redis every [`LEAVE_EVERY`] resumed tasks, while the others resume.
    fn drain_woken(&self, py: Python<'_>, pumped: Option<&Runtime>) -> PyResult<()> {
        let mut bytes = [0u8; 256];
        while matches!((&self.ready).read(&mut bytes), Ok(n) if n > 0) {}
        let woken = std::mem::take(
            &mut *self
                .inbox
                .woken
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        let mut woken = woken.into_iter();
        let mut resumed = 0;
        while let Some(task) = woken.next() {
            let Some(finish) = task.step() else {
                continue;
            };
            self.out.fetch_sub(1, Ordering::Relaxed);
            if let Err(e) = Call::complete(task.call.bind(py), finish) {
                // A KeyboardInterrupt or SystemExit leaves as from any loop callback; the
                // other tasks wait for the next drain.
                for task in woken {
                    self.inbox.push(task);
                }
                return Err(e);
            }
            resumed += 1;
            if let Some(rt) = pumped
                && resumed % LEAVE_EVERY == 0
            {
                self.start_made_in_drain(true);
                quiet_pump(py, rt);
            }
        }
        Ok(())
    }
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
                woken: Mutex::new(Vec::new()),
                wake,
            }),
            ready,
            made_in_drain: Mutex::new(None),
            out: AtomicUsize::new(0),
            ticking: AtomicBool::new(false),
        })
    }

    /// The descriptor the loop watches.
    fn fileno(&self) -> i32 {
        self.ready.as_raw_fd()
    }

    /// The loop's reader callback, for the bridge's socket and, on a runtime the loop drives,
    /// the runtime's epoll; and the `tick`'s. Drives the runtime (see `runtime::pump`) and
    /// resumes the tasks waiting on the calls that finished, in rounds while they finish; on a
    /// runtime with a thread of its own, drains once. `event_loop` is the loop the bridge
    /// belongs to (the one running the callback).
    fn drive(slf: &Bound<'_, Self>, event_loop: Py<PyAny>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        let (rt, driven) = runtime::current(py)?;
        if driven == Driven::OwnThread {
            return Self::drain(slf, &rt, &event_loop, false);
        }
        for round in 0.. {
            quiet_pump(py, &rt);
            if this.inbox.is_empty() {
                break;
            }
            if round == ROUNDS {
                // The loop's other callbacks get their turn first.
                this.inbox.wake_loop();
                break;
            }
            Self::drain(slf, &rt, &event_loop, true)?;
        }
        Self::tick_while_out(slf, &event_loop)
    }

    /// Scheduled by `tick_while_out`.
    fn tick(slf: &Bound<'_, Self>, event_loop: Py<PyAny>) -> PyResult<()> {
        slf.get().ticking.store(false, Ordering::Relaxed);
        Self::drive(slf, event_loop)
    }
}

/// Calls a drain lets leave for Redis together while its other tasks resume, on a runtime the
/// loop drives: Redis works on them meanwhile, as on another batch in flight. All of a drain's
/// calls in one batch left Redis and the loop taking turns (0.65 x the Rust caller on the
/// asyncio bench, 50 tasks); every 16 calls 0.90, 20 1.00, 24 0.97, 32 0.96, 40 0.82 (three
/// rounds each, one run): fewer make small batches (more server time a pair), more leave
/// Redis idle.
const LEAVE_EVERY: usize = 24;
/// Rounds of driving and draining in one callback before the loop's other callbacks run.
const ROUNDS: usize = 16;
/// How often a loop with calls out drives the runtime though nothing woke it: the calls'
/// deadlines (and reconnections) are the runtime's timers, which fire only when it is driven.
const TICK_SECONDS: f64 = 0.05;

impl Completions {
    /// Resumes the tasks woken so far, then polls the calls they made (see `drain_woken`;
    /// `pumped`: the loop drives `rt`).
    fn drain(
        slf: &Bound<'_, Self>,
        rt: &Runtime,
        event_loop: &Py<PyAny>,
        pumped: bool,
    ) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        // Entered once for all the drain's polls (their timers and spawns need the runtime),
        // not once per poll.
        let _context = rt.enter();
        DRAINING.set(Some((event_loop.clone_ref(py), slf.clone().unbind())));
        let _draining = Draining;
        *this
            .made_in_drain
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Vec::new());
        let drained = this.drain_woken(py, pumped.then_some(rt));
        this.start_made_in_drain(false);
        drained
    }

    /// Schedules a `tick` while calls are out on a runtime the loop drives.
    fn tick_while_out(slf: &Bound<'_, Self>, event_loop: &Py<PyAny>) -> PyResult<()> {
        let py = slf.py();
        let this = slf.get();
        if this.out.load(Ordering::Relaxed) == 0 || this.ticking.swap(true, Ordering::Relaxed) {
            return Ok(());
        }
        let tick = slf.getattr(intern!(py, "tick"))?;
        event_loop.call_method1(
            py,
            intern!(py, "call_later"),
            (TICK_SECONDS, tick, event_loop.clone_ref(py)),
        )?;
        Ok(())
    }
}

/// [`runtime::pump`] on a loop's thread, the GIL released (another thread may be driving:
/// it waits for that one), whatever it completes of ours drained right after.
fn quiet_pump(py: Python<'_>, rt: &Runtime) {
    /// Clears `QUIET` however the pump ends.
    struct Quiet;
    impl Drop for Quiet {
        fn drop(&mut self) {
            QUIET.set(false);
        }
    }
    QUIET.set(true);
    let _quiet = Quiet;
    py.detach(|| runtime::pump(rt));
}

/// Polls a new call (the caller has entered the runtime's context).
fn first_poll(task: Arc<Task>) {
    if let Some(finish) = task.step() {
        *task.stage.lock().unwrap_or_else(PoisonError::into_inner) = Some(Stage::Finished(finish));
        task.queue();
    }
}

/// The running loop and its bridge, looked up.
fn running_bridge(py: Python<'_>) -> PyResult<(Bound<'_, PyAny>, Bound<'_, Completions>)> {
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
    Ok((event_loop, bridge.cast_into::<Completions>()?))
}

/// An awaitable for `work`, on the running loop.
pub(crate) fn spawn<'py, F>(py: Python<'py>, work: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Finish> + Send + 'static,
{
    let draining = DRAINING.with_borrow(|d| {
        d.as_ref()
            .map(|(event_loop, bridge)| (event_loop.clone_ref(py), bridge.clone_ref(py)))
    });
    let (event_loop, bridge) = match draining {
        Some((event_loop, bridge)) => (event_loop.into_bound(py), bridge.into_bound(py)),
        None => running_bridge(py)?,
    };
    let call = Bound::new(py, Call::new(event_loop.clone().unbind()))?;
    let task = Arc::new(Task {
        call: call.clone().unbind(),
        stage: Mutex::new(Some(Stage::Running(Box::pin(work)))),
        queued: AtomicBool::new(false),
        inbox: Arc::clone(&bridge.get().inbox),
    });
    bridge.get().out.fetch_add(1, Ordering::Relaxed);
    if let Some(task) = bridge.get().defer(task) {
        // Made outside a drain: it leaves now.
        let (rt, driven) = runtime::current(py)?;
        {
            let _context = rt.enter();
            first_poll(task);
        }
        if driven == Driven::ByWaiters {
            // What this completes wakes the loop as any completion does (not QUIET: no drain
            // follows here).
            py.detach(|| runtime::pump(&rt));
            Completions::tick_while_out(&bridge, &event_loop.clone().unbind())?;
        }
    }
    Ok(call.into_any())
}
