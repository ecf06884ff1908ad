//! The behaviour suite (`suite/behaviours.rs`) against the memory store.
#![allow(clippy::unwrap_used)]

mod common;

/// Where `common` builds this crate's pools.
const STORE: common::Store = common::Store::Memory;

#[path = "suite/behaviours.rs"]
mod behaviours;
