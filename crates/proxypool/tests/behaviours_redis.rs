//! The behaviour suite (`suite/behaviours.rs`) against the Redis store, on a redis-server of
//! its own: one suite for both stores. Tests the Redis store does not pass yet are ignored
//! here with the reason (`cargo test --test behaviours_redis -- --ignored` runs them).
#![allow(clippy::unwrap_used)]

mod common;

/// Where `common` builds this crate's pools.
const STORE: common::Store = common::Store::Redis;

/// Ignored here, with why the Redis store differs.
macro_rules! not_on_redis {
    ($why:literal, $test:item) => {
        #[ignore = $why]
        $test
    };
}

#[path = "suite/behaviours.rs"]
mod behaviours;
