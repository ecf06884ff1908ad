//! Stores of links and clicks. The embedded SQLite store is the default.

pub mod sqlite;

use shortener_core::store::{ClickSink, LinkStore};

/// Everything the service needs from one backend: links, tokens, ids and clicks.
pub trait Store: LinkStore + ClickSink + std::fmt::Debug {}

impl<T: LinkStore + ClickSink + std::fmt::Debug> Store for T {}
