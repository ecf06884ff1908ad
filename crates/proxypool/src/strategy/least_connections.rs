//! Least-connections by the power of two choices: two random candidates, the less loaded wins;
//! between equally loaded ones, the one in the better state (see `Candidates::load`). Both are
//! read from the dense selection array, so weighing two candidates touches no record.

use rand::Rng;
use rand::rngs::StdRng;

use super::{Candidates, Slot};

/// Random draws before falling back to a scan: many ineligible members (at their cap, out of
/// service) would otherwise make sampling loop long.
const TRIES: usize = 16;

pub(crate) fn pick(members: &[Slot], c: &impl Candidates, rng: &mut StdRng) -> Option<Slot> {
    if members.is_empty() {
        return None;
    }
    let mut found: [Option<Slot>; 2] = [None, None];
    for _ in 0..TRIES {
        let s = members[rng.random_range(0..members.len())];
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

#[cfg(test)]
mod tests {
    use super::super::testing::Table;
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn p1_least_connections_prefers_idle_addresses() {
        let members: Vec<Slot> = (0..10).collect();
        let mut t = Table::uniform(10);
        t.leases = vec![5, 5, 5, 5, 5, 5, 5, 5, 5, 0];
        let mut rng = StdRng::seed_from_u64(3);
        let idle = (0..1000)
            .filter(|_| pick(&members, &t, &mut rng) == Some(9))
            .count();
        // P2C picks the idle one whenever it is one of the two draws: about 1 - (9/10)^2 = 19 %.
        assert!(idle > 120 && idle < 280, "{idle}");
        t.eligible = vec![false; 10];
        t.eligible[4] = true;
        assert_eq!(pick(&members, &t, &mut rng), Some(4));
    }

    #[test]
    fn p1_least_connections_breaks_ties_by_state() {
        let members: Vec<Slot> = (0..2).collect();
        let mut t = Table::uniform(2);
        t.unwell = vec![1, 0];
        let mut rng = StdRng::seed_from_u64(5);
        // Equally loaded, both drawn: the healthy one wins every time.
        assert!((0..100).all(|_| pick(&members, &t, &mut rng) == Some(1)));
        t.leases = vec![0, 1];
        assert!((0..100).all(|_| pick(&members, &t, &mut rng) == Some(0)));
    }
}
