//! `Call`: what an `*_async` method returns, an asyncio-compatible future (the protocol
//! asyncio's tasks, `gather`, `wait_for` and `shield` use: `_asyncio_future_blocking`,
//! `add_done_callback`, `result`, `cancel`, …) that the loop's bridge (see `aio`) completes.
//!
//! Why not `loop.create_future()`: an asyncio future schedules each done callback with
//! `loop.call_soon` (Python frames and a `Handle` per future), so the task it wakes runs one loop
//! iteration later. The bridge completes calls from a loop callback, outside any task, and runs
//! their callbacks there in their contexts: the waiting task resumes at once, and its next call
//! is on its way to Redis before the next task of the drain resumes. Callbacks added after completion, and those of a
//! cancel (made from inside some task), go through `call_soon` as asyncio's own do.

use pyo3::exceptions::asyncio::{CancelledError, InvalidStateError};
use pyo3::exceptions::{PyBaseException, PyException, PyStopIteration};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;
use pyo3::{PyTraverseError, PyVisit};

use crate::aio::Finish;

enum State {
    Pending,
    /// The error kept as its exception object, which the garbage collector can see (a
    /// traceback's frames may hold the call).
    Done(Result<Py<PyAny>, Py<PyBaseException>>),
    /// With the message given to `cancel`.
    Cancelled(Option<Py<PyAny>>),
}

/// A done callback and the context it runs in.
type Callback = (Py<PyAny>, Option<Py<PyAny>>);

/// A pending proxypool call on an asyncio loop: await it.
#[pyclass(module = "proxypool")]
pub(crate) struct Call {
    event_loop: Py<PyAny>,
    state: State,
    callbacks: Vec<Callback>,
    /// asyncio's mark of a future (a task sets it back to false when it waits on it).
    #[pyo3(get, set, name = "_asyncio_future_blocking")]
    blocking: bool,
}

impl Call {
    pub(crate) fn new(event_loop: Py<PyAny>) -> Self {
        Self {
            event_loop,
            state: State::Pending,
            callbacks: Vec::new(),
            blocking: false,
        }
    }

    /// Completes the call with `finish`'s value and runs its done callbacks in place; a
    /// cancelled call takes no result (a lease in it is dropped: abandoned). An exception a
    /// callback raises goes to the loop's exception handler, as from any loop callback;
    /// `KeyboardInterrupt` and `SystemExit` are returned, the callbacks not run yet scheduled.
    pub(crate) fn complete(slf: &Bound<'_, Self>, finish: Finish) -> PyResult<()> {
        let py = slf.py();
        // `Context.run` unbound: `context.run` would make a bound method per callback.
        static CONTEXT_RUN: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
        let context_run = CONTEXT_RUN
            .get_or_try_init(py, || {
                let context_type = py.import("contextvars")?.getattr("Context")?;
                PyResult::Ok(context_type.getattr("run")?.unbind())
            })?
            .bind(py);
        let callbacks = {
            let mut this = slf.borrow_mut();
            if !matches!(this.state, State::Pending) {
                return Ok(());
            }
            this.state = State::Done(finish(py).map_err(|e| e.into_value(py)));
            std::mem::take(&mut this.callbacks)
        };
        let mut callbacks = callbacks.into_iter();
        while let Some((callback, context)) = callbacks.next() {
            let ran = match &context {
                Some(context) => context_run.call1((context, &callback, slf)),
                None => callback.bind(py).call1((slf,)),
            };
            match ran {
                Ok(_) => {}
                Err(e) if e.is_instance_of::<PyException>(py) => {
                    let report = PyDict::new(py);
                    report.set_item(
                        "message",
                        "exception in a done callback of a proxypool call",
                    )?;
                    report.set_item("exception", e.into_value(py))?;
                    report.set_item("future", slf)?;
                    let event_loop = slf.borrow().event_loop.clone_ref(py);
                    event_loop
                        .bind(py)
                        .call_method1(intern!(py, "call_exception_handler"), (report,))?;
                }
                Err(e) => {
                    for (callback, context) in callbacks {
                        schedule(slf, callback, context)?;
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn cancelled_error(&self, py: Python<'_>) -> PyErr {
        match &self.state {
            State::Cancelled(Some(message)) => CancelledError::new_err((message.clone_ref(py),)),
            _ => CancelledError::new_err(()),
        }
    }
}

/// Runs `callback(call)` in `context` on a later loop iteration.
fn schedule(
    call: &Bound<'_, Call>,
    callback: Py<PyAny>,
    context: Option<Py<PyAny>>,
) -> PyResult<()> {
    let py = call.py();
    let kwargs = PyDict::new(py);
    kwargs.set_item("context", context)?;
    let event_loop = call.borrow().event_loop.clone_ref(py);
    event_loop
        .bind(py)
        .call_method(intern!(py, "call_soon"), (callback, call), Some(&kwargs))?;
    Ok(())
}

#[pymethods]
impl Call {
    fn get_loop(&self, py: Python<'_>) -> Py<PyAny> {
        self.event_loop.clone_ref(py)
    }

    fn done(&self) -> bool {
        !matches!(self.state, State::Pending)
    }

    fn cancelled(&self) -> bool {
        matches!(self.state, State::Cancelled(_))
    }

    /// The call's value; raises its error, `CancelledError`, or `InvalidStateError` if pending.
    fn result(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match &self.state {
            State::Pending => Err(InvalidStateError::new_err("Result is not ready.")),
            State::Cancelled(_) => Err(self.cancelled_error(py)),
            State::Done(Ok(value)) => Ok(value.clone_ref(py)),
            State::Done(Err(e)) => Err(PyErr::from_value(e.bind(py).clone().into_any())),
        }
    }

    /// The call's error, or None.
    fn exception(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        match &self.state {
            State::Pending => Err(InvalidStateError::new_err("Exception is not set.")),
            State::Cancelled(_) => Err(self.cancelled_error(py)),
            State::Done(Ok(_)) => Ok(None),
            State::Done(Err(e)) => Ok(Some(e.clone_ref(py).into_any())),
        }
    }

    #[pyo3(signature = (callback, *, context = None))]
    fn add_done_callback(
        slf: &Bound<'_, Self>,
        callback: Py<PyAny>,
        context: Option<Py<PyAny>>,
    ) -> PyResult<()> {
        if slf.borrow().done() {
            return schedule(slf, callback, context);
        }
        slf.borrow_mut().callbacks.push((callback, context));
        Ok(())
    }

    /// Removes every registration of `callback`; how many there were.
    fn remove_done_callback(&mut self, callback: &Bound<'_, PyAny>) -> PyResult<usize> {
        let before = self.callbacks.len();
        let mut kept = Vec::with_capacity(before);
        for registered in std::mem::take(&mut self.callbacks) {
            if !registered.0.bind(callback.py()).eq(callback)? {
                kept.push(registered);
            }
        }
        self.callbacks = kept;
        Ok(before - self.callbacks.len())
    }

    /// Cancels the call unless it is done; its result, when it comes, is dropped.
    #[pyo3(signature = (msg = None))]
    fn cancel(slf: &Bound<'_, Self>, msg: Option<Py<PyAny>>) -> PyResult<bool> {
        let callbacks = {
            let mut this = slf.borrow_mut();
            if this.done() {
                return Ok(false);
            }
            this.state = State::Cancelled(msg);
            std::mem::take(&mut this.callbacks)
        };
        for (callback, context) in callbacks {
            schedule(slf, callback, context)?;
        }
        Ok(true)
    }

    /// What `asyncio.gather` reads of a cancelled future.
    #[getter]
    fn _cancel_message(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        match &self.state {
            State::Cancelled(Some(message)) => Some(message.clone_ref(py)),
            _ => None,
        }
    }

    fn _make_cancelled_error(&self, py: Python<'_>) -> Py<PyAny> {
        self.cancelled_error(py).into_value(py).into_any()
    }

    fn __await__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    /// Yields itself to the task until done, then returns the result (`StopIteration`).
    fn __next__(slf: &Bound<'_, Self>) -> PyResult<Option<Py<PyAny>>> {
        let py = slf.py();
        let mut this = slf.borrow_mut();
        if !this.done() {
            this.blocking = true;
            return Ok(Some(slf.clone().into_any().unbind()));
        }
        let value = this.result(py)?;
        // None ends the iteration with no exception, which the interpreter reads as None:
        // no `StopIteration` made and dropped (a pair's release, about 1 000 instructions).
        if value.is_none(py) {
            Ok(None)
        } else {
            Err(PyStopIteration::new_err((value,)))
        }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.event_loop)?;
        for (callback, context) in &self.callbacks {
            visit.call(callback)?;
            visit.call(context)?;
        }
        match &self.state {
            State::Done(Ok(value)) | State::Cancelled(Some(value)) => visit.call(value),
            State::Done(Err(e)) => visit.call(e),
            State::Pending | State::Cancelled(None) => Ok(()),
        }
    }

    fn __clear__(&mut self) {
        self.callbacks.clear();
        // Garbage: what it says of itself no longer matters.
        self.state = State::Cancelled(None);
    }

    fn __repr__(&self) -> &'static str {
        match self.state {
            State::Pending => "<proxypool call pending>",
            State::Done(_) => "<proxypool call done>",
            State::Cancelled(_) => "<proxypool call cancelled>",
        }
    }
}
