//! Least-connections by the power of two choices: two random candidates, the less loaded wins;
//! between equally loaded ones, the one in the better state (see `Candidates::load`). Both are
//! read from the dense selection array, so weighing two candidates touches no record.
//!
//! The draws come from one 32-bit seed per pick, taken from the caller's seeded generator, by
//! [`Draws`]: the Redis library (`least` in `library.lua`) computes the same sequence from the
//! same seed over the same members (by id, which orders them as slots do), so the two stores
//! pick alike (held together by `tests/differential.rs`).

use rand::RngCore;
use rand::rngs::StdRng;

use super::{Candidates, Slot};

/// Random draws before falling back to a scan: many ineligible members (at their cap, out of
/// service) would otherwise make sampling loop long.
pub(crate) const TRIES: usize = 16;

/// Member indices drawn from a seed: a 32-bit LCG (Numerical Recipes' constants: its products
/// stay below 2^53, exact in Lua's doubles), each state scaled to `0..len` by its high bits
/// (multiply and shift, no rejection: with pools of at most millions the bias is below 10^-3).
pub(crate) struct Draws {
    state: u32,
    len: u64,
}

impl Draws {
    pub(crate) fn new(seed: u32, len: usize) -> Self {
        Self {
            state: seed,
            len: len as u64,
        }
    }
}

impl Iterator for Draws {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        let index = (u64::from(self.state) * self.len) >> 32;
        self.state = self
            .state
            .wrapping_mul(1_664_525)
            .wrapping_add(1_013_904_223);
        Some(index as usize)
    }
}

pub(crate) fn pick(members: &[Slot], c: &impl Candidates, seed: u32) -> Option<Slot> {
    if members.is_empty() {
        return None;
    }
    let mut found: [Option<Slot>; 2] = [None, None];
    for i in Draws::new(seed, members.len()).take(TRIES) {
        let s = members[i];
        if !c.eligible(s) || found[0] == Some(s) {
            continue;
        }
        if found[0].is_none() {
            found[0] = Some(s);
        } else {
            found[1] = Some(s);
            break;
        }
    }
    let better = |a: Slot, b: Slot| if c.load(b) < c.load(a) { b } else { a };
    match found {
        [Some(a), Some(b)] => Some(better(a, b)),
        _ => members
            .iter()
            .copied()
            .filter(|s| c.eligible(*s))
            .reduce(better),
    }
}

/// The engine's generator with its next 32-bit word visible: a pick reads the seed the next
/// one will draw ([`Lookahead::peek_u32`]) to start loading that pick's candidates a pair
/// ahead. Draws take the same words in the same order as the generator alone would (a `u64`
/// is two words, the earlier one low, as `rand`'s block generators make it; bytes come in
/// whole words), so the stream stays aligned with the Redis store's.
#[derive(Debug)]
pub(crate) struct Lookahead {
    rng: StdRng,
    next: Option<u32>,
}

impl Lookahead {
    pub(crate) fn new(rng: StdRng) -> Self {
        Self { rng, next: None }
    }

    /// The word the next draw starts with, left for it.
    pub(crate) fn peek_u32(&mut self) -> u32 {
        *self.next.get_or_insert_with(|| self.rng.next_u32())
    }
}

impl RngCore for Lookahead {
    fn next_u32(&mut self) -> u32 {
        self.next.take().unwrap_or_else(|| self.rng.next_u32())
    }

    fn next_u64(&mut self) -> u64 {
        match self.next.take() {
            Some(low) => u64::from(low) | (u64::from(self.rng.next_u32()) << 32),
            None => self.rng.next_u64(),
        }
    }

    fn fill_bytes(&mut self, dst: &mut [u8]) {
        let Some(word) = self.next.filter(|_| !dst.is_empty()) else {
            return self.rng.fill_bytes(dst);
        };
        self.next = None;
        let (head, rest) = dst.split_at_mut(dst.len().min(4));
        head.copy_from_slice(&word.to_le_bytes()[..head.len()]);
        self.rng.fill_bytes(rest);
    }
}

/// Hints the first two candidates a pick with `seed` would draw (see `Candidates::upcoming`).
pub(crate) fn upcoming(members: &[Slot], c: &impl Candidates, seed: u32) {
    for i in Draws::new(seed, members.len()).take(2) {
        if let Some(&s) = members.get(i) {
            c.upcoming(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::Table;
    use super::*;
    use rand::rngs::StdRng;
    use rand::{RngCore, SeedableRng};

    #[test]
    fn p1_least_connections_prefers_idle_addresses() {
        let members: Vec<Slot> = (0..10).collect();
        let mut t = Table::uniform(10);
        t.leases = vec![5, 5, 5, 5, 5, 5, 5, 5, 5, 0];
        let mut rng = StdRng::seed_from_u64(3);
        let idle = (0..1000)
            .filter(|_| pick(&members, &t, rng.next_u32()) == Some(9))
            .count();
        // P2C picks the idle one whenever it is one of the two draws: about 1 - (9/10)^2 = 19 %.
        assert!(idle > 120 && idle < 280, "{idle}");
        t.eligible = vec![false; 10];
        t.eligible[4] = true;
        assert_eq!(pick(&members, &t, rng.next_u32()), Some(4));
    }

    #[test]
    fn p1_least_connections_breaks_ties_by_state() {
        let members: Vec<Slot> = (0..2).collect();
        let mut t = Table::uniform(2);
        t.unwell = vec![1, 0];
        let mut rng = StdRng::seed_from_u64(5);
        // Equally loaded, both drawn: the healthy one wins every time.
        assert!((0..100).all(|_| pick(&members, &t, rng.next_u32()) == Some(1)));
        t.leases = vec![0, 1];
        assert!((0..100).all(|_| pick(&members, &t, rng.next_u32()) == Some(0)));
    }

    #[test]
    fn a_lookahead_draws_the_generators_stream() {
        let mut plain = StdRng::seed_from_u64(9);
        let mut ahead = Lookahead::new(StdRng::seed_from_u64(9));
        // Through several refills of the generator's block, with words of u64s split by a
        // refill, and bytes not a whole number of words.
        for i in 0..500u32 {
            if i % 3 == 0 {
                let peeked = ahead.peek_u32();
                assert_eq!(ahead.peek_u32(), peeked);
            }
            match i % 4 {
                0 | 1 => assert_eq!(ahead.next_u32(), plain.next_u32()),
                2 => assert_eq!(ahead.next_u64(), plain.next_u64()),
                _ => {
                    let (mut a, mut b) = ([0u8; 7], [0u8; 7]);
                    ahead.fill_bytes(&mut a);
                    plain.fill_bytes(&mut b);
                    assert_eq!(a, b);
                }
            }
        }
    }

    #[test]
    fn draws_are_the_lcg_scaled_by_its_high_bits_and_cover_every_index() {
        // The sequence the Lua library computes too (`least` in library.lua).
        let d: Vec<usize> = Draws::new(0, 10).take(3).collect();
        // 0; 1013904223 × 10 ÷ 2^32 = 2.36; (1013904223 × 1664525 + 1013904223) mod 2^32 =
        // 1196435762, × 10 ÷ 2^32 = 2.79.
        assert_eq!(d, [0, 2, 2]);
        assert_eq!(Draws::new(u32::MAX, 7).next(), Some(6));
        let mut seen = [0usize; 7];
        for i in Draws::new(12_345, 7).take(7_000) {
            seen[i] += 1;
        }
        assert!(seen.iter().all(|&n| (800..1200).contains(&n)), "{seen:?}");
    }
}
