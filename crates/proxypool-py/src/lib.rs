//! Python bindings of `proxypool`: the `proxypool._native` extension module behind the
//! `proxypool` package (see `python/proxypool/`). The same engine as the Rust crate, in
//! process, in memory or sharing state with every other process through Redis.
//!
//! Blocking calls release the GIL around their Redis round trips; the `*_async` methods return
//! asyncio futures whose Rust side is polled on the loop's thread, the I/O done by a tokio
//! runtime of this process (see `aio`). A fork bumps a
//! generation (see `runtime`): the child connects anew instead of waiting on the parent's
//! threads.

mod aio;
mod call;
mod config;
mod errors;
mod exit;
mod lease;
mod outcome;
mod pool;
mod redis_url;
mod runtime;
mod settling;
mod tunables;

use std::pin::pin;
use std::task::{Context, Poll, Waker};

use pyo3::prelude::*;

// The Rust side's allocations (boxed calls, results, Redis buffers) are often made on one thread
// and freed on another: under callgrind glibc's malloc and free were about 6 000 of an asyncio
// pair's 57 000 instructions through Redis; mimalloc cut the pair to about 51 000.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Completes a future that never waits (the in-memory store's calls) by polling it once.
fn ready<F: Future>(f: F) -> PyResult<F::Output> {
    match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => Ok(v),
        Poll::Pending => Err(pyo3::exceptions::PyRuntimeError::new_err(
            "an in-memory pool call waited: this is a bug of proxypool, please report it",
        )),
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<pool::Pool>()?;
    m.add_class::<lease::Lease>()?;
    m.add_class::<aio::Completions>()?;
    m.add_class::<call::Call>()?;
    m.add_function(wrap_pyfunction!(runtime::after_fork_in_child, m)?)?;
    m.add_function(wrap_pyfunction!(exit::wait_for_settles, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::runtime_fd, m)?)?;
    errors::register(m)?;
    Ok(())
}
