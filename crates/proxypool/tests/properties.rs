//! The property suite (`suite/properties.rs`) against the memory store.
#![allow(clippy::unwrap_used)]

mod common;

/// Where `common` builds this crate's pools.
const STORE: common::Store = common::Store::Memory;

/// Random sequences per property.
const CASES: u32 = 64;

#[path = "suite/properties.rs"]
mod properties;
