//! The behaviour suite (`suite/behaviours.rs`) against the Redis store, on a redis-server of
//! its own: one suite for both stores, every test on both.
#![allow(clippy::unwrap_used)]

mod common;

/// Where `common` builds this crate's pools.
const STORE: common::Store = common::Store::Redis;

#[path = "suite/behaviours.rs"]
mod behaviours;
