//! P2: sticky bindings key → address with a TTL renewed on every use.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

use crate::address::ProxyAddress;
use crate::clock::Timestamp;
use crate::strategy::Slot;

#[derive(Debug, Clone)]
pub(crate) struct Binding {
    pub(crate) slot: Slot,
    /// Kept so a session whose address was removed can still be reported broken by name.
    pub(crate) address: ProxyAddress,
    pub(crate) sub_pool: u32,
    pub(crate) expires: Timestamp,
    generation: u64,
}

/// Bindings and their expiry. Renewal only moves `expires` (through `get_mut`, one lookup); the heap entry is checked when it
/// comes due and pushed again if the binding was renewed meanwhile, so a renewal costs O(1).
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    map: HashMap<Arc<str>, Binding>,
    expiry: BinaryHeap<Reverse<(Timestamp, u64, Arc<str>)>>,
    next_generation: u64,
}

impl Sessions {
    pub(crate) fn get_mut(&mut self, key: &str) -> Option<&mut Binding> {
        self.map.get_mut(key)
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn bind(
        &mut self,
        key: Arc<str>,
        slot: Slot,
        address: ProxyAddress,
        sub_pool: u32,
        expires: Timestamp,
    ) {
        self.next_generation += 1;
        let generation = self.next_generation;
        self.expiry
            .push(Reverse((expires, generation, Arc::clone(&key))));
        self.map.insert(
            key,
            Binding {
                slot,
                address,
                sub_pool,
                expires,
                generation,
            },
        );
    }

    pub(crate) fn unbind(&mut self, key: &str) -> Option<Binding> {
        self.map.remove(key)
    }

    /// Whether a binding may have run out by `now` (renewed ones are pushed back on expiry).
    pub(crate) fn due(&self, now: Timestamp) -> bool {
        self.expiry
            .peek()
            .is_some_and(|Reverse((due, ..))| *due <= now)
    }

    /// Removes and returns the bindings whose TTL ran out by `now`.
    pub(crate) fn expire(&mut self, now: Timestamp) -> Vec<Binding> {
        let mut gone = Vec::new();
        while let Some(Reverse((due, generation, _))) = self.expiry.peek() {
            if *due > now {
                break;
            }
            let generation = *generation;
            let Some(Reverse((_, _, key))) = self.expiry.pop() else {
                break;
            };
            match self.map.get(&key) {
                Some(b) if b.generation == generation && b.expires <= now => {
                    if let Some(b) = self.map.remove(&key) {
                        gone.push(b);
                    }
                }
                Some(b) if b.generation == generation => {
                    self.expiry.push(Reverse((b.expires, generation, key)));
                }
                // Unbound, or bound again under a newer generation with its own entry.
                _ => {}
            }
        }
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p2_renewed_bindings_outlive_their_first_deadline() {
        let a = ProxyAddress::parse("http://h:1").unwrap();
        let mut s = Sessions::default();
        s.bind("k".into(), 0, a.clone(), 0, Timestamp::from_millis(100));
        s.bind("j".into(), 1, a, 0, Timestamp::from_millis(100));
        s.get_mut("k").unwrap().expires = Timestamp::from_millis(300);
        let gone = s.expire(Timestamp::from_millis(150));
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].slot, 1);
        assert!(s.get_mut("k").is_some());
        assert_eq!(s.expire(Timestamp::from_millis(300)).len(), 1);
        assert_eq!(s.len(), 0);
    }
}
