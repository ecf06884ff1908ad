//! Stores of links and clicks. The embedded SQLite store is the default; `--database` picks
//! PostgreSQL.

pub(crate) mod guarded;
pub mod postgres;
pub(crate) mod replicas;
pub mod sqlite;

use crate::config::StoreConfig;
use shortener_core::store::{ClickSink, LinkStore, StoreError};

/// The `links` columns in the order both stores' row readers expect.
const LINK_COLUMNS: &str = "code, long_url, owner, custom_alias, created_at, expires_at, \
                            disabled_at, clicks, bot_clicks, created_ip";
use std::sync::Arc;
use std::time::Duration;

/// Everything the service needs from one backend: links, tokens, ids and clicks.
pub trait Store: LinkStore + ClickSink + std::fmt::Debug {}

impl<T: LinkStore + ClickSink + std::fmt::Debug> Store for T {}

/// Why the configured store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The embedded store.
    #[error(transparent)]
    Embedded(#[from] StoreError),
    /// PostgreSQL: unreachable, or its schema is not this binary's.
    #[error(transparent)]
    Postgres(#[from] postgres::OpenError),
}

/// Opens the configured store, ready to serve: the embedded one brings its schema up to date,
/// PostgreSQL's must already be current (`shortener migrate`). `statement_timeout` bounds
/// PostgreSQL's statements on the server (the request path's deadline).
pub async fn open(
    config: &StoreConfig,
    statement_timeout: Option<Duration>,
) -> Result<Arc<dyn Store>, OpenError> {
    Ok(match config {
        StoreConfig::Embedded { data_dir } => Arc::new(sqlite::SqliteStore::open(data_dir)?),
        StoreConfig::Postgres { url, pool_size } => {
            Arc::new(postgres::PgStore::open_bounded(url, *pool_size, statement_timeout).await?)
        }
    })
}
