//! The property suite (`suite/properties.rs`) against the Redis store, on a redis-server of its
//! own (one per test thread, a pool per case).
#![allow(clippy::unwrap_used)]

mod common;

/// Where `common` builds this crate's pools.
const STORE: common::Store = common::Store::Redis;

/// Random sequences per property: fewer than in memory, each operation being a round trip.
const CASES: u32 = 16;

#[path = "suite/properties.rs"]
mod properties;
