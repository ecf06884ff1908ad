//! P2: sticky bindings key → address with a TTL renewed on every use.

use std::borrow::Borrow;
use std::cell::Cell;
use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashSet};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

use crate::address::ProxyAddress;
use crate::clock::Timestamp;
use crate::strategy::Slot;

use super::NO_SLOT;

/// Keys up to this long are stored inside the map's bucket.
const INLINE: usize = 22;

/// A session key as the map stores it: inline when short (most account ids), so that a
/// lookup compares it in the bucket it already read instead of following a pointer to a
/// string elsewhere in memory; shared otherwise. Hashes and compares as its bytes (no UTF-8
/// check on the lookup path).
#[derive(Debug, Clone)]
enum Key {
    Inline { len: u8, bytes: [u8; INLINE] },
    Shared(Arc<str>),
}

impl Key {
    fn new(key: &Arc<str>) -> Self {
        match u8::try_from(key.len()) {
            Ok(len) if key.len() <= INLINE => {
                let mut bytes = [0; INLINE];
                bytes[..key.len()].copy_from_slice(key.as_bytes());
                Self::Inline { len, bytes }
            }
            _ => Self::Shared(Arc::clone(key)),
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Self::Shared(s) => s.as_bytes(),
        }
    }
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Key {}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Binding {
    pub(crate) slot: Slot,
    pub(crate) sub_pool: u32,
    /// Kept so a session whose address was removed can still be reported broken by name.
    pub(crate) address: ProxyAddress,
    /// Moved on renewal, in place (see [`Sessions::get`]).
    pub(crate) expires: Cell<Timestamp>,
    generation: u64,
}

/// A binding with its key, as the map holds it: 56 bytes in one aligned 64-byte bucket, so
/// that a lookup reads one line of bindings (and one of the map's control bytes). Hashes
/// and compares as its key.
#[derive(Debug)]
#[repr(align(64))]
struct Entry {
    key: Key,
    binding: Binding,
}

impl Borrow<[u8]> for Entry {
    fn borrow(&self) -> &[u8] {
        self.key.as_bytes()
    }
}

impl Hash for Entry {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key.hash(state);
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl Eq for Entry {}

/// Bindings and their expiry. Renewal only moves `expires` (one lookup); the heap entry is
/// checked when it comes due and pushed again if the binding was renewed meanwhile, so a
/// renewal costs O(1).
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    /// Hashed with foldhash, seeded per map: SipHash was a third of a renewal's acquire.
    /// Keys come from callers, so the seed (not a fixed function like Fx) keeps collisions
    /// from being precomputed. A set of key-and-binding entries rather than a map of keys to
    /// bindings: a map's buckets would be 56 bytes, most of them across two lines.
    map: HashSet<Entry, foldhash::fast::RandomState>,
    expiry: BinaryHeap<Reverse<(Timestamp, u64, Key)>>,
    next_generation: u64,
    /// A slot bound under each hash's low bits (`NO_SLOT` where none; the latest binding's,
    /// or after a refill any one's), at least two places a binding: read beside the map's
    /// lookup, it lets the record's lines load while the lookup's control bytes and bucket
    /// do, one miss sooner. Stale or shared places only waste a hint. Grown with the
    /// bindings, as the map is, and never shrunk (16 bytes at most a binding at its peak).
    hints: Vec<Slot>,
}

impl Sessions {
    /// The key's binding; renew it by setting its `expires`.
    pub(crate) fn get(&self, key: &str) -> Option<&Binding> {
        self.map.get(key.as_bytes()).map(|e| &e.binding)
    }

    /// The slot the key was last bound to, likely (see `hints`), read without waiting on the
    /// map.
    pub(crate) fn hint(&self, key: &str) -> Option<Slot> {
        let at = self.place(key)?;
        self.hints.get(at).copied().filter(|s| *s != NO_SLOT)
    }

    fn place(&self, key: &str) -> Option<usize> {
        let mask = self.hints.len().checked_sub(1)?;
        Some(self.place_in(key.as_bytes(), mask))
    }

    /// The key's place among `mask + 1` (a power of two) places.
    fn place_in(&self, key: &[u8], mask: usize) -> usize {
        self.map.hasher().hash_one(key) as usize & mask
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn bind(
        &mut self,
        key: &Arc<str>,
        slot: Slot,
        address: ProxyAddress,
        sub_pool: u32,
        expires: Timestamp,
    ) {
        self.next_generation += 1;
        let generation = self.next_generation;
        if self.hints.len() < 2 * (self.map.len() + 1) {
            self.rehint();
        }
        if let Some(at) = self.place(key) {
            self.hints[at] = slot;
        }
        let key = Key::new(key);
        self.expiry
            .push(Reverse((expires, generation, key.clone())));
        self.map.replace(Entry {
            key,
            binding: Binding {
                slot,
                sub_pool,
                address,
                expires: Cell::new(expires),
                generation,
            },
        });
    }

    /// Doubles `hints` (at least 1 024 places) and fills it from the bindings.
    fn rehint(&mut self) {
        let len = (2 * self.hints.len()).max(1024);
        let mut hints = vec![NO_SLOT; len];
        for e in &self.map {
            hints[self.place_in(e.key.as_bytes(), len - 1)] = e.binding.slot;
        }
        self.hints = hints;
    }

    pub(crate) fn unbind(&mut self, key: &str) -> Option<Binding> {
        self.map.take(key.as_bytes()).map(|e| e.binding)
    }

    /// Whether a binding may have run out by `now` (renewed ones are pushed back on expiry).
    pub(crate) fn due(&self, now: Timestamp) -> bool {
        self.expiry
            .peek()
            .is_some_and(|Reverse((due, ..))| *due <= now)
    }

    /// When the earliest binding may run out (one renewed since runs out later).
    pub(crate) fn next_due(&self) -> Option<Timestamp> {
        self.expiry.peek().map(|Reverse((due, ..))| *due)
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
            match self.map.get(key.as_bytes()).map(|e| &e.binding) {
                Some(b) if b.generation == generation && b.expires.get() <= now => {
                    if let Some(e) = self.map.take(key.as_bytes()) {
                        gone.push(e.binding);
                    }
                }
                Some(b) if b.generation == generation => {
                    self.expiry
                        .push(Reverse((b.expires.get(), generation, key)));
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
        s.bind(&"k".into(), 0, a.clone(), 0, Timestamp::from_millis(100));
        s.bind(&"j".into(), 1, a, 0, Timestamp::from_millis(100));
        s.get("k").unwrap().expires.set(Timestamp::from_millis(300));
        let gone = s.expire(Timestamp::from_millis(150));
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].slot, 1);
        assert!(s.get("k").is_some());
        assert_eq!(s.expire(Timestamp::from_millis(300)).len(), 1);
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn p2_hints_name_the_slots_keys_were_bound_to() {
        let a = ProxyAddress::parse("http://h:1").unwrap();
        let mut s = Sessions::default();
        assert_eq!(s.hint("account-0"), None);
        let keys: Vec<Arc<str>> = (0..5000).map(|i| format!("account-{i}").into()).collect();
        for (slot, key) in (0..).zip(&keys) {
            s.bind(key, slot, a.clone(), 0, Timestamp::from_millis(1));
            // The latest binding owns its place, across the hints' growth too.
            assert_eq!(s.hint(key), Some(slot));
        }
        assert!(s.hints.len() >= 2 * s.len());
        // A place keys share names one of them; most keep their own, none has none.
        let own = (0..)
            .zip(&keys)
            .filter(|(slot, k)| s.hint(k) == Some(*slot))
            .count();
        assert!(own * 10 >= keys.len() * 7, "{own} of {} keys", keys.len());
        assert!(keys.iter().all(|k| s.hint(k).is_some()));
    }

    #[test]
    fn p2_short_keys_are_stored_inline_and_long_ones_shared() {
        let a = ProxyAddress::parse("http://h:1").unwrap();
        let long: Arc<str> = "a-session-key-longer-than-twenty-two-bytes".into();
        let mut s = Sessions::default();
        s.bind(
            &"account-1".into(),
            0,
            a.clone(),
            0,
            Timestamp::from_millis(1),
        );
        s.bind(&long, 1, a.clone(), 0, Timestamp::from_millis(1));
        s.bind(&"".into(), 2, a, 0, Timestamp::from_millis(1));
        assert!(matches!(
            Key::new(&"account-1".into()),
            Key::Inline { len: 9, .. }
        ));
        assert!(matches!(Key::new(&long), Key::Shared(_)));
        assert_eq!(s.get("account-1").map(|b| b.slot), Some(0));
        assert_eq!(s.get(&long).map(|b| b.slot), Some(1));
        assert_eq!(s.get("").map(|b| b.slot), Some(2));
        assert!(s.get("account-2").is_none());
        assert_eq!(s.expire(Timestamp::from_millis(1)).len(), 3);
    }
}
