//! P1: how an address is picked. Keyless work uses the sub-pool's configured strategy; keyed
//! work uses the consistent-hash ring (see `consistent_hash`).

pub(crate) mod consistent_hash;
pub(crate) mod least_connections;
pub(crate) mod round_robin;
pub(crate) mod smooth_weighted;

use rand::RngCore;

use crate::config::Strategy;
use crate::lease::Choice;

use least_connections::Lookahead;

/// Index of an address in the pool's table; never reused, so it identifies one address forever.
pub(crate) type Slot = u32;

/// What a strategy may ask about a candidate for the ticket at hand.
pub(crate) trait Candidates {
    /// Offered, below its lease cap, not cooling down for the ticket's site.
    fn eligible(&self, slot: Slot) -> bool;
    /// The whole-number step of a weighted pick for the ticket's site: the inverse of its
    /// weight (see `health::weight::step`).
    fn step(&self, slot: Slot) -> u32;
    /// Active leases, then how unwell (0 healthy, 1 degraded, 2 probing): lower is lighter.
    fn load(&self, slot: Slot) -> (u32, u8);
    /// `slot` is likely the next pick: start loading what picking it reads, without waiting
    /// (a hint only; it changes no pick).
    fn upcoming(&self, _slot: Slot) {}
}

/// The keyless picker of one sub-pool.
#[derive(Debug)]
pub(crate) enum Keyless {
    RoundRobin(round_robin::RoundRobin),
    Weighted(smooth_weighted::SmoothWeighted),
    LeastConnections,
}

impl Keyless {
    pub(crate) fn new(strategy: Strategy) -> Self {
        match strategy {
            Strategy::RoundRobin => Self::RoundRobin(round_robin::RoundRobin::default()),
            Strategy::Weighted => Self::Weighted(smooth_weighted::SmoothWeighted::default()),
            Strategy::LeastConnections => Self::LeastConnections,
        }
    }

    /// The address became offered.
    pub(crate) fn join(&mut self, slot: Slot) {
        if let Self::Weighted(w) = self {
            w.join(slot);
        }
    }

    /// The address stopped being offered or left the pool.
    pub(crate) fn leave(&mut self, slot: Slot) {
        if let Self::Weighted(w) = self {
            w.leave(slot);
        }
    }

    /// The address is no longer avoided on `site`: its turn there comes at once.
    pub(crate) fn forgive(&mut self, slot: Slot, site: u32) {
        if let Self::Weighted(w) = self {
            w.forgive(slot, site);
        }
    }

    /// Picks for a ticket of `site`; `c` answers for that ticket.
    pub(crate) fn pick(
        &mut self,
        members: &[Slot],
        site: u32,
        c: &impl Candidates,
        rng: &mut Lookahead,
    ) -> Option<Slot> {
        match self {
            Self::RoundRobin(rr) => rr.pick(members, c),
            Self::Weighted(w) => w.pick(site, c),
            // One seed per pick, whatever it finds: the generator's stream stays aligned with
            // the Redis store's, which draws it before its call.
            Self::LeastConnections => {
                let picked = least_connections::pick(members, c, rng.next_u32());
                // The seed the next pick will draw: its first two candidates load while this
                // pair goes on.
                least_connections::upcoming(members, c, rng.peek_u32());
                picked
            }
        }
    }

    pub(crate) fn choice(&self) -> Choice {
        match self {
            Self::RoundRobin(_) => Choice::RoundRobin,
            Self::Weighted(_) => Choice::Weighted,
            Self::LeastConnections => Choice::LeastConnections,
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use super::{Candidates, Slot};

    /// Candidates described by plain vectors, for strategy unit tests.
    #[derive(Debug, Default)]
    pub(crate) struct Table {
        pub(crate) eligible: Vec<bool>,
        pub(crate) weight: Vec<f64>,
        pub(crate) leases: Vec<u32>,
        pub(crate) unwell: Vec<u8>,
    }

    impl Table {
        pub(crate) fn uniform(n: usize) -> Self {
            Self {
                eligible: vec![true; n],
                weight: vec![1.0; n],
                leases: vec![0; n],
                unwell: vec![0; n],
            }
        }
    }

    impl Candidates for Table {
        fn eligible(&self, slot: Slot) -> bool {
            self.eligible[slot as usize]
        }
        fn step(&self, slot: Slot) -> u32 {
            crate::health::weight::step(self.weight[slot as usize])
        }
        fn load(&self, slot: Slot) -> (u32, u8) {
            (self.leases[slot as usize], self.unwell[slot as usize])
        }
    }
}
