//! The stress test (`suite/stress.rs`) against the Redis store, on a redis-server of its own.
#![allow(clippy::unwrap_used)]

mod common;

/// Where `common` builds this crate's pools.
const STORE: common::Store = common::Store::Redis;

#[path = "suite/stress.rs"]
mod stress;
