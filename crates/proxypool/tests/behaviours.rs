//! The behaviour suite (`suite/behaviours.rs`) against the memory store.
#![allow(clippy::unwrap_used)]

mod common;

/// Where `common` builds this crate's pools.
const STORE: common::Store = common::Store::Memory;

/// Every test runs here.
macro_rules! not_on_redis {
    ($why:literal, $test:item) => {
        $test
    };
}

#[path = "suite/behaviours.rs"]
mod behaviours;
