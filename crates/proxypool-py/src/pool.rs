//! `Pool`: the engine in process, in memory or shared through Redis.

use std::borrow::Cow;
use std::sync::{Arc, Mutex, PoisonError};

use proxypool::Ticket;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use tokio::sync::OnceCell;

use crate::aio::{self, Finish, finish, finish_none};
use crate::config::Recipe;
use crate::errors::{self, InvalidConfig, PoolForked};
use crate::lease::Lease;
use crate::runtime;
use crate::tunables;

/// A pool of proxy addresses behind acquire and release.
#[pyclass(module = "proxypool", subclass)]
pub(crate) struct Pool {
    /// The pool built in the generation `generation`; `None` only while being dropped in a
    /// forked child.
    pool: Option<proxypool::Pool>,
    generation: u64,
    recipe: Recipe,
    /// A Redis pool connected anew in a forked child, per generation. Locked with the GIL held.
    child: Mutex<Option<(u64, Arc<OnceCell<proxypool::Pool>>)>>,
}

impl Pool {
    fn remote(&self) -> bool {
        self.recipe.redis.is_some()
    }

    /// The Redis library pool this process built or connected, if it did.
    fn used_here(&self) -> Option<proxypool::Pool> {
        if !self.remote() {
            return None;
        }
        let generation = runtime::generation();
        if generation == self.generation {
            return self.pool.clone();
        }
        let slot = self.child.lock().unwrap_or_else(PoisonError::into_inner);
        slot.as_ref()
            .filter(|(g, _)| *g == generation)
            .and_then(|(_, cell)| cell.get().cloned())
    }

    /// The library pool of this process: the one built here, or (Redis, forked child) one
    /// connected anew; an in-memory pool is refused in a child.
    fn current(&self, py: Python<'_>) -> PyResult<Cow<'_, proxypool::Pool>> {
        let generation = runtime::generation();
        if generation == self.generation
            && let Some(pool) = &self.pool
        {
            return Ok(Cow::Borrowed(pool));
        }
        if !self.remote() {
            return Err(PoolForked::new_err(
                "this in-memory pool belongs to the process that built it (before a fork): \
                 build one in this process, or share one through Redis (Pool(redis=...))",
            ));
        }
        let cell = {
            let mut slot = self.child.lock().unwrap_or_else(PoisonError::into_inner);
            match slot.as_ref() {
                Some((g, cell)) if *g == generation => Arc::clone(cell),
                _ => {
                    let cell = Arc::new(OnceCell::new());
                    *slot = Some((generation, Arc::clone(&cell)));
                    cell
                }
            }
        };
        let rt = runtime::runtime(py)?;
        let recipe = &self.recipe;
        let pool = py
            .detach(|| rt.block_on(cell.get_or_try_init(|| recipe.builder().connect())))
            .map_err(errors::build)?;
        Ok(Cow::Owned(pool.clone()))
    }

    /// Runs a library call: awaited on the runtime with the GIL released for Redis, polled
    /// once in place for the in-memory store (whose calls never wait).
    fn run<T: Send, F>(&self, py: Python<'_>, f: impl FnOnce(proxypool::Pool) -> F) -> PyResult<T>
    where
        F: Future<Output = T> + Send,
    {
        let pool = self.current(py)?.into_owned();
        if self.remote() {
            let (rt, work) = (runtime::runtime(py)?, f(pool));
            Ok(py.detach(|| rt.block_on(work)))
        } else {
            crate::ready(f(pool))
        }
    }

    /// Runs a library call as an asyncio awaitable.
    fn run_async<'py, F>(
        &self,
        py: Python<'py>,
        f: impl FnOnce(proxypool::Pool) -> F,
    ) -> PyResult<Bound<'py, PyAny>>
    where
        F: Future<Output = Finish> + Send + 'static,
    {
        let pool = self.current(py)?.into_owned();
        aio::spawn(py, f(pool))
    }
}

fn ticket(key: Option<&str>, site: Option<&str>, sub_pool: Option<&str>) -> Ticket {
    let mut t = Ticket::new();
    if let Some(key) = key {
        t = t.key(key);
    }
    if let Some(site) = site {
        t = t.site(site);
    }
    if let Some(sub_pool) = sub_pool {
        t = t.sub_pool(sub_pool);
    }
    t
}

/// `json.loads` of the snapshot's serde form: the same shape as `GET /v1/snapshot`'s
/// `snapshot` object.
fn snapshot_dict(py: Python<'_>, snapshot: &proxypool::Snapshot) -> PyResult<Py<PyAny>> {
    let text = serde_json::to_string(snapshot)
        .map_err(|e| errors::ProxyPoolError::new_err(format!("snapshot: {e}")))?;
    Ok(py
        .import("json")?
        .call_method1("loads", (PyString::new(py, &text),))?
        .unbind())
}

/// Parses `addresses`: each a URL, or a `(URL, [sub-pool, …])` pair.
fn addresses(items: Vec<Bound<'_, PyAny>>) -> PyResult<Vec<(String, Vec<String>)>> {
    items
        .into_iter()
        .map(|item| {
            if let Ok(url) = item.extract::<String>() {
                return Ok((url, Vec::new()));
            }
            item.extract::<(String, Vec<String>)>().map_err(|_| {
                PyValueError::new_err(format!(
                    "an address is a proxy URL or a (URL, [sub_pool, ...]) pair, not {item}"
                ))
            })
        })
        .collect()
}

#[pymethods]
impl Pool {
    #[new]
    #[pyo3(signature = (
        addresses = Vec::new(), *, redis = None, name = "default", sub_pools = None,
        seed = None, redis_timeout = 0.5, **tunables
    ))]
    #[allow(clippy::too_many_arguments, reason = "Python keyword arguments")]
    fn new(
        py: Python<'_>,
        addresses: Vec<Bound<'_, PyAny>>,
        redis: Option<String>,
        name: &str,
        sub_pools: Option<std::collections::BTreeMap<String, String>>,
        seed: Option<u64>,
        redis_timeout: f64,
        tunables: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let tunables = match tunables {
            Some(t) => {
                let text: String = py.import("json")?.call_method1("dumps", (t,))?.extract()?;
                serde_json::from_str(&text).map_err(|e| InvalidConfig::new_err(e.to_string()))?
            }
            None => serde_json::Value::Object(Default::default()),
        };
        let config = tunables::pool_config(tunables).map_err(InvalidConfig::new_err)?;
        let sub_pools = sub_pools
            .unwrap_or_default()
            .into_iter()
            .map(|(n, s)| Ok((n, tunables::strategy(&s).map_err(InvalidConfig::new_err)?)))
            .collect::<PyResult<Vec<_>>>()?;
        let redis = redis
            .map(|url| crate::redis_url::options(&url, name, redis_timeout))
            .transpose()
            .map_err(InvalidConfig::new_err)?;
        let recipe = Recipe {
            config,
            addresses: self::addresses(addresses)?,
            sub_pools,
            seed,
            redis,
        };
        let pool = if recipe.redis.is_some() {
            let rt = runtime::runtime(py)?;
            let builder = recipe.builder();
            py.detach(|| rt.block_on(builder.connect()))
        } else {
            recipe.builder().build()
        }
        .map_err(errors::build)?;
        Ok(Self {
            pool: Some(pool),
            generation: runtime::generation(),
            recipe,
            child: Mutex::new(None),
        })
    }

    /// A lease for the ticket, or why there is none.
    #[pyo3(signature = (key = None, site = None, sub_pool = None))]
    fn acquire(
        &self,
        py: Python<'_>,
        key: Option<&str>,
        site: Option<&str>,
        sub_pool: Option<&str>,
    ) -> PyResult<Lease> {
        let t = ticket(key, site, sub_pool);
        let remote = self.remote();
        let lease = if remote {
            self.run(py, |p| async move { p.acquire(t).await })?
        } else {
            // The hot in-memory path: no clone of the pool, no runtime.
            crate::ready(self.current(py)?.acquire(t))?
        };
        Ok(Lease::new(
            lease.map_err(errors::acquire)?,
            remote,
            runtime::generation(),
        ))
    }

    /// `acquire` as a coroutine.
    #[pyo3(signature = (key = None, site = None, sub_pool = None))]
    fn acquire_async<'py>(
        &self,
        py: Python<'py>,
        key: Option<&str>,
        site: Option<&str>,
        sub_pool: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let t = ticket(key, site, sub_pool);
        let (remote, generation) = (self.remote(), runtime::generation());
        self.run_async(py, move |p| async move {
            let lease = p.acquire(t).await;
            finish(
                lease.map(|l| Lease::new(l, remote, generation)),
                errors::acquire,
            )
        })
    }

    /// Returns once the store has every operation this process queued before the call: with
    /// Redis, the abandons of leases dropped unreleased inside a coroutine, which travel with
    /// the next batch (a blocking drop waits for its own). The package does this when the
    /// process exits, a multiprocessing worker's end included; call it before a bare
    /// `os._exit`, else the lease TTL frees those slots.
    fn settle(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |p| async move { p.settle().await })?
            .map_err(errors::pool)
    }

    /// `settle` as a coroutine.
    fn settle_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.run_async(py, |p| async move {
            finish_none(p.settle().await, errors::pool)
        })
    }

    /// At the process's exit (the package's exit hook): settles the pool in a task the hook
    /// then waits for, if this process used it (a Redis pool inherited through a fork and never
    /// used here has nothing queued, and is not connected for it).
    fn _settle_at_exit(&self, py: Python<'_>) -> PyResult<()> {
        match self.used_here() {
            Some(pool) => crate::exit::settle_later(py, pool),
            None => Ok(()),
        }
    }

    /// The whole state as plain dicts, shaped like `GET /v1/snapshot`'s `snapshot`.
    fn snapshot(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let snapshot = self.run(py, |p| async move { p.snapshot().await })?;
        snapshot_dict(py, &snapshot)
    }

    /// `snapshot` as a coroutine.
    fn snapshot_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.run_async(py, |p| async move {
            let snapshot = p.snapshot().await;
            Box::new(move |py: Python<'_>| snapshot_dict(py, &snapshot)) as Finish
        })
    }

    /// Adds an address to the whole pool and the named sub-pools.
    #[pyo3(signature = (address, sub_pools = Vec::new()))]
    fn add(&self, py: Python<'_>, address: String, sub_pools: Vec<String>) -> PyResult<()> {
        self.run(py, |p| async move {
            let names: Vec<&str> = sub_pools.iter().map(String::as_str).collect();
            p.add_to(&address, &names).await
        })?
        .map_err(errors::pool)
    }

    /// `add` as a coroutine.
    #[pyo3(signature = (address, sub_pools = Vec::new()))]
    fn add_async<'py>(
        &self,
        py: Python<'py>,
        address: String,
        sub_pools: Vec<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.run_async(py, |p| async move {
            let names: Vec<&str> = sub_pools.iter().map(String::as_str).collect();
            finish_none(p.add_to(&address, &names).await, errors::pool)
        })
    }

    /// Removes an address; sessions bound to it are reported broken on their next acquire.
    fn remove(&self, py: Python<'_>, address: String) -> PyResult<()> {
        self.run(py, |p| async move { p.remove(&address).await })?
            .map_err(errors::pool)
    }

    /// `remove` as a coroutine.
    fn remove_async<'py>(&self, py: Python<'py>, address: String) -> PyResult<Bound<'py, PyAny>> {
        self.run_async(py, |p| async move {
            finish_none(p.remove(&address).await, errors::pool)
        })
    }

    /// Feeds the result of an active probe of `address` (a check of your own through it): a
    /// probing address needs `rise_successes` passes in a row to return to service, a failure
    /// sends it back to quarantine, and a dead address comes back only this way. Ignored in
    /// other states.
    fn report_probe(&self, py: Python<'_>, address: String, passed: bool) -> PyResult<()> {
        self.run(
            py,
            |p| async move { p.report_probe(&address, passed).await },
        )?
        .map_err(errors::pool)
    }

    /// `report_probe` as a coroutine.
    fn report_probe_async<'py>(
        &self,
        py: Python<'py>,
        address: String,
        passed: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.run_async(py, move |p| async move {
            finish_none(p.report_probe(&address, passed).await, errors::pool)
        })
    }

    /// Ends a key's session now; whether it had one.
    fn end_session(&self, py: Python<'_>, key: String) -> PyResult<bool> {
        self.run(py, |p| async move { p.end_session(&key).await })
    }

    /// `end_session` as a coroutine.
    fn end_session_async<'py>(&self, py: Python<'py>, key: String) -> PyResult<Bound<'py, PyAny>> {
        self.run_async(py, |p| async move {
            let ended = p.end_session(&key).await;
            finish(Ok::<_, PyErr>(ended), |e| e)
        })
    }

    fn __repr__(&self) -> String {
        match &self.recipe.redis {
            Some(_) => "<proxypool.Pool in Redis>".to_owned(),
            None => "<proxypool.Pool in memory>".to_owned(),
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // What it queued (dropped leases' abandons) is waited for at exit all the same.
        if let Some(pool) = self.used_here() {
            Python::attach(|py| {
                let _ = crate::exit::settle_later(py, pool);
            });
        }
        if self.generation != runtime::generation()
            && let Some(pool) = self.pool.take()
        {
            // Built before a fork: its tasks ran on the parent's runtime, absent here.
            std::mem::forget(pool);
        }
    }
}
