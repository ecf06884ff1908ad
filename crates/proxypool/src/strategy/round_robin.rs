//! Round-robin: each offered address in turn.

use super::{Candidates, Slot};

#[derive(Debug, Default)]
pub(crate) struct RoundRobin {
    cursor: usize,
}

impl RoundRobin {
    pub(crate) fn pick(&mut self, members: &[Slot], c: &impl Candidates) -> Option<Slot> {
        let n = members.len();
        for step in 0..n {
            let i = (self.cursor + step) % n;
            if c.eligible(members[i]) {
                self.cursor = (i + 1) % n;
                return Some(members[i]);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::Table;
    use super::*;

    #[test]
    fn p1_round_robin_takes_turns_and_skips_ineligible() {
        let members = [0, 1, 2, 3];
        let mut t = Table::uniform(4);
        let mut rr = RoundRobin::default();
        let picks: Vec<_> = (0..8).filter_map(|_| rr.pick(&members, &t)).collect();
        assert_eq!(picks, [0, 1, 2, 3, 0, 1, 2, 3]);
        t.eligible[2] = false;
        let picks: Vec<_> = (0..6).filter_map(|_| rr.pick(&members, &t)).collect();
        assert_eq!(picks, [0, 1, 3, 0, 1, 3]);
        t.eligible = vec![false; 4];
        assert_eq!(rr.pick(&members, &t), None);
    }
}
