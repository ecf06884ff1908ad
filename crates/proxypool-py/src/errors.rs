//! The typed exceptions, and the library's errors mapped onto them.

use proxypool::{AcquireError, BuildError, PoolError};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    proxypool,
    ProxyPoolError,
    PyException,
    "Every error of the pool."
);
create_exception!(
    proxypool,
    NoAddressAvailable,
    ProxyPoolError,
    "No address can take the ticket now (all out of service, at their lease cap or cooling)."
);
create_exception!(
    proxypool,
    SessionBroken,
    ProxyPoolError,
    "The key's address left service: end the session (`.key`, `.address`); the next acquire starts a new one."
);
create_exception!(
    proxypool,
    BoundAddressBusy,
    ProxyPoolError,
    "The key's address is at its lease cap; the session is kept (`.key`, `.address`)."
);
create_exception!(
    proxypool,
    BoundAddressCooling,
    ProxyPoolError,
    "The site rate-limited the key's address; the session is kept (`.key`, `.address`, `.retry_in` seconds)."
);
create_exception!(
    proxypool,
    UnknownSubPool,
    ProxyPoolError,
    "A sub-pool that was never declared."
);
create_exception!(
    proxypool,
    StoreUnavailable,
    ProxyPoolError,
    "Redis did not answer within its timeout or refused the call."
);
create_exception!(
    proxypool,
    InvalidConfig,
    ProxyPoolError,
    "A tunable out of its range, unknown, or of the wrong type."
);
create_exception!(
    proxypool,
    InvalidAddress,
    ProxyPoolError,
    "Not a proxy URL (http, https, socks5, socks5h; no path or query)."
);
create_exception!(
    proxypool,
    DuplicateAddress,
    ProxyPoolError,
    "The address is already in the pool."
);
create_exception!(
    proxypool,
    UnknownAddress,
    ProxyPoolError,
    "The address is not in the pool."
);
create_exception!(
    proxypool,
    LeaseReleased,
    ProxyPoolError,
    "The lease was released already."
);
create_exception!(
    proxypool,
    PoolForked,
    ProxyPoolError,
    "The object belongs to the process it was made in (before a fork)."
);

/// Registers every exception on the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("ProxyPoolError", py.get_type::<ProxyPoolError>())?;
    m.add("NoAddressAvailable", py.get_type::<NoAddressAvailable>())?;
    m.add("SessionBroken", py.get_type::<SessionBroken>())?;
    m.add("BoundAddressBusy", py.get_type::<BoundAddressBusy>())?;
    m.add("BoundAddressCooling", py.get_type::<BoundAddressCooling>())?;
    m.add("UnknownSubPool", py.get_type::<UnknownSubPool>())?;
    m.add("StoreUnavailable", py.get_type::<StoreUnavailable>())?;
    m.add("InvalidConfig", py.get_type::<InvalidConfig>())?;
    m.add("InvalidAddress", py.get_type::<InvalidAddress>())?;
    m.add("DuplicateAddress", py.get_type::<DuplicateAddress>())?;
    m.add("UnknownAddress", py.get_type::<UnknownAddress>())?;
    m.add("LeaseReleased", py.get_type::<LeaseReleased>())?;
    m.add("PoolForked", py.get_type::<PoolForked>())?;
    Ok(())
}

/// An exception carrying the session it is about as attributes.
fn with_session(err: PyErr, key: &str, address: &proxypool::ProxyAddress) -> PyErr {
    Python::attach(|py| {
        let value = err.value(py);
        // Setting attributes on a fresh exception instance cannot fail short of memory.
        let _ = value.setattr("key", key);
        let _ = value.setattr("address", address.as_str());
    });
    err
}

pub(crate) fn acquire(e: AcquireError) -> PyErr {
    let message = e.to_string();
    match e {
        AcquireError::NoAddressAvailable => NoAddressAvailable::new_err(message),
        AcquireError::SessionBroken { key, address } => {
            with_session(SessionBroken::new_err(message), &key, &address)
        }
        AcquireError::BoundAddressBusy { key, address } => {
            with_session(BoundAddressBusy::new_err(message), &key, &address)
        }
        AcquireError::BoundAddressCooling {
            key,
            address,
            retry_in,
        } => {
            let err = with_session(BoundAddressCooling::new_err(message), &key, &address);
            Python::attach(|py| {
                let _ = err.value(py).setattr("retry_in", retry_in.as_secs_f64());
            });
            err
        }
        AcquireError::UnknownSubPool(_) => UnknownSubPool::new_err(message),
        AcquireError::StoreUnavailable(_) => StoreUnavailable::new_err(message),
        _ => ProxyPoolError::new_err(message),
    }
}

pub(crate) fn pool(e: PoolError) -> PyErr {
    let message = e.to_string();
    match e {
        PoolError::Address(_) => InvalidAddress::new_err(message),
        PoolError::Duplicate(_) => DuplicateAddress::new_err(message),
        PoolError::UnknownAddress(_) => UnknownAddress::new_err(message),
        PoolError::UnknownSubPool(_) => UnknownSubPool::new_err(message),
        PoolError::StoreUnavailable(_) => StoreUnavailable::new_err(message),
        _ => ProxyPoolError::new_err(message),
    }
}

pub(crate) fn build(e: BuildError) -> PyErr {
    match e {
        BuildError::Pool(e) => pool(e),
        other => InvalidConfig::new_err(other.to_string()),
    }
}
