//! What a driver or pool error means: one line to show, and whether the database is out of
//! reach (503) or refused the statement (500).

use super::WAIT_TIMEOUT;
use deadpool_postgres::{PoolError, TimeoutType};
use shortener_core::store::StoreError;
use tokio_postgres::error::SqlState;

/// One line for a driver error: its kind, then the server's message or the I/O cause.
pub(super) fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{} {}: {}", db.severity(), db.code().code(), db.message());
    }
    let mut out = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out.replace('\n', " ")
}

pub(super) fn describe_pool(e: &PoolError) -> String {
    match e {
        PoolError::Backend(e) => describe(e),
        PoolError::Timeout(TimeoutType::Create) => {
            "no answer within the connect timeout (set connect_timeout=SECONDS in the URL)".into()
        }
        PoolError::Timeout(TimeoutType::Wait) => {
            format!("every pooled connection stayed busy for {WAIT_TIMEOUT:?}")
        }
        PoolError::Timeout(TimeoutType::Recycle) => "a pooled connection stopped answering".into(),
        other => other.to_string(),
    }
}

/// Whether a failed statement means the database is out of reach (503) rather than that it
/// refused the statement (500).
fn is_unavailable(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    if let Some(code) = e.code() {
        let code = code.code();
        // 08: connection exception; 57P0x: shutting down or starting; 53300: too many
        // connections. A lost serialization race or deadlock (after our own retries) is
        // also "try again shortly" rather than a fault.
        return code.starts_with("08")
            || code.starts_with("57P0")
            || code == SqlState::TOO_MANY_CONNECTIONS.code()
            // 57014: our statement timeout (or an operator) cancelled it; the store is slow.
            || code == SqlState::QUERY_CANCELED.code()
            || is_retryable(e);
    }
    // No server error: unavailable only if the socket itself failed.
    std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
}

pub(super) fn is_retryable(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(&SqlState::T_R_SERIALIZATION_FAILURE | &SqlState::T_R_DEADLOCK_DETECTED)
    )
}

pub(super) fn classify(e: tokio_postgres::Error) -> StoreError {
    let message = describe(&e);
    if is_unavailable(&e) {
        StoreError::Unavailable(message.into())
    } else {
        StoreError::Backend(message.into())
    }
}
