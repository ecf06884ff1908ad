//! `Lease`: one address handed out, released with an outcome named as in the JSON API.

use std::time::Instant;

use proxypool::Outcome;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::aio::{self, finish_none};
use crate::errors::{self, LeaseReleased, PoolForked};
use crate::runtime;

/// An address leased from the pool. Release it with the outcome of the work done through it;
/// one dropped unreleased frees its slot and counts as abandoned.
#[pyclass(module = "proxypool")]
pub(crate) struct Lease {
    /// `None` once released (or forgotten in a forked child).
    inner: Option<proxypool::Lease>,
    /// Kept past the release (a clone is a reference count, made on the loop's thread).
    address: proxypool::ProxyAddress,
    id: u64,
    choice: &'static str,
    acquired: Instant,
    /// Whether release goes to Redis (blocking I/O: the GIL is released around it).
    remote: bool,
    generation: u64,
}

impl Lease {
    pub(crate) fn new(lease: proxypool::Lease, remote: bool, generation: u64) -> Self {
        Self {
            address: lease.address().clone(),
            id: lease.id().get(),
            choice: choice_name(lease.choice()),
            inner: Some(lease),
            acquired: Instant::now(),
            remote,
            generation,
        }
    }

    /// The library lease and its outcome, checking that it can still be released here.
    fn take(
        &mut self,
        outcome: &str,
        latency: Option<f64>,
        retry_after: Option<f64>,
    ) -> PyResult<(proxypool::Lease, Outcome)> {
        if self.generation != runtime::generation() {
            return Err(PoolForked::new_err(
                "this lease was taken before a fork: only the process that took it releases it",
            ));
        }
        let outcome = crate::outcome::parse(outcome, latency, retry_after, self.acquired)
            .map_err(PyValueError::new_err)?;
        let lease = self.inner.take().ok_or_else(|| {
            LeaseReleased::new_err(format!("lease {} was released already", self.id))
        })?;
        Ok((lease, outcome))
    }
}

#[pymethods]
impl Lease {
    /// The proxy URL to send the work through, credentials included.
    #[getter]
    fn address(&self) -> &str {
        self.address.as_str()
    }

    /// The lease's id.
    #[getter]
    fn id(&self) -> u64 {
        self.id
    }

    /// Why the pool chose the address (`bound`, `hashed`, `weighted`, …).
    #[getter]
    fn choice(&self) -> &'static str {
        self.choice
    }

    /// Whether it was released.
    #[getter]
    fn released(&self) -> bool {
        self.inner.is_none()
    }

    /// Returns the address with the outcome of the work.
    #[pyo3(signature = (outcome = "success", latency = None, retry_after = None))]
    fn release(
        &mut self,
        py: Python<'_>,
        outcome: &str,
        latency: Option<f64>,
        retry_after: Option<f64>,
    ) -> PyResult<()> {
        let (lease, outcome) = self.take(outcome, latency, retry_after)?;
        let done = if self.remote {
            let rt = runtime::runtime(py)?;
            py.detach(|| rt.block_on(lease.release(outcome)))
        } else {
            crate::ready(lease.release(outcome))?
        };
        done.map_err(errors::pool)
    }

    /// `release` as an asyncio awaitable.
    #[pyo3(signature = (outcome = "success", latency = None, retry_after = None))]
    fn release_async<'py>(
        &mut self,
        py: Python<'py>,
        outcome: &str,
        latency: Option<f64>,
        retry_after: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (lease, outcome) = self.take(outcome, latency, retry_after)?;
        aio::spawn(py, async move {
            finish_none(lease.release(outcome).await, errors::pool)
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "<Lease {} {} {}{}>",
            self.id,
            self.address,
            self.choice,
            if self.inner.is_none() {
                " released"
            } else {
                ""
            }
        )
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some(lease) = self.inner.take() else {
            return;
        };
        if self.generation != runtime::generation() {
            // The parent's lease: the parent releases its own copy; touching its store from
            // here would reach a runtime without threads.
            std::mem::forget(lease);
        } else if self.remote && tokio::runtime::Handle::try_current().is_err() {
            // Awaited, not queued: a worker process often drops its last lease and exits at
            // once (`os._exit` in multiprocessing), and a queued abandon would die with it,
            // holding the slot until the lease TTL. Dropped inside the runtime's context (a
            // loop's drain: a cancelled call's result), it can only be queued; the drain's pump
            // sends it.
            Python::attach(|py| match runtime::runtime(py) {
                Ok(rt) => {
                    // Failed: the lease TTL frees the slot, as for a lost queue.
                    let _ = py.detach(|| rt.block_on(lease.abandon()));
                }
                Err(_) => drop(lease),
            });
        }
    }
}

fn choice_name(choice: proxypool::Choice) -> &'static str {
    match choice {
        proxypool::Choice::Bound => "bound",
        proxypool::Choice::Hashed => "hashed",
        proxypool::Choice::RoundRobin => "round_robin",
        proxypool::Choice::Weighted => "weighted",
        proxypool::Choice::LeastConnections => "least_connections",
        _ => "other",
    }
}
