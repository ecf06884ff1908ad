//! A sub-pool: the addresses serving one site or task type, with their own strategy state.
//! The whole pool is sub-pool 0.

use std::sync::Arc;

use crate::config::Strategy;
use crate::strategy::consistent_hash::Ring;
use crate::strategy::{Keyless, Slot};

#[derive(Debug)]
pub(crate) struct SubPool {
    pub(crate) name: Arc<str>,
    pub(crate) members: Vec<Slot>,
    /// Members selection may pick now (P8 is checked against this).
    pub(crate) offered: usize,
    /// Keys bound through this sub-pool (the mean of bounded loads).
    pub(crate) bound_keys: u64,
    pub(crate) keyless: Keyless,
    pub(crate) ring: Ring,
}

impl SubPool {
    pub(crate) fn new(name: Arc<str>, strategy: Strategy, vnodes: u32) -> Self {
        Self {
            name,
            members: Vec::new(),
            offered: 0,
            bound_keys: 0,
            keyless: Keyless::new(strategy),
            ring: Ring::new(vnodes),
        }
    }

    /// How many more members may leave service before P8 bites (negative: already short).
    pub(crate) fn spare(&self, min_in_service: usize) -> isize {
        self.offered as isize - min_in_service.min(self.members.len()) as isize
    }
}
