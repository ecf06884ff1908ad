//! The stress test (`suite/stress.rs`) against the memory store.
#![allow(clippy::unwrap_used)]

mod common;

/// Where `common` builds this crate's pools.
const STORE: common::Store = common::Store::Memory;

#[path = "suite/stress.rs"]
mod stress;
