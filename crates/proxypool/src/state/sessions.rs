//! P2: sticky bindings key → address with a TTL renewed on every use.

use std::borrow::Borrow;
use std::cell::Cell;
use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashSet};
use std::hash::{Hash, Hasher};

use thin_vec::ThinVec;

use crate::clock::Timestamp;
use crate::strategy::Slot;

/// Keys up to this long are stored inside the map's entry.
const INLINE: usize = 14;

/// A session key as the map stores it, in 16 bytes: inline when short (most account ids), so
/// that a lookup compares it in the entry it already read instead of following a pointer to a
/// string elsewhere in memory; behind one thin pointer otherwise. Hashes and compares as its
/// bytes (no UTF-8 check on the lookup path).
#[derive(Debug, Clone)]
enum Key {
    Inline { len: u8, bytes: [u8; INLINE] },
    Long(ThinVec<u8>),
}

impl Key {
    fn new(key: &str) -> Self {
        match u8::try_from(key.len()) {
            Ok(len) if key.len() <= INLINE => {
                let mut bytes = [0; INLINE];
                bytes[..key.len()].copy_from_slice(key.as_bytes());
                Self::Inline { len, bytes }
            }
            _ => Self::Long(ThinVec::from(key.as_bytes())),
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Self::Long(b) => b,
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

/// Bits of [`Due`] that hold the deadline's milliseconds.
const MS_BITS: u32 = 48;
/// The latest deadline a binding holds: 2^48 − 1 ms after the epoch, in the year 10 889;
/// later ones are read as this.
const MS_MAX: u64 = (1 << MS_BITS) - 1;

/// A binding's deadline and the generation of the bind that made it, in one word (so that an
/// entry is 32 bytes): the deadline's milliseconds in the low 48 bits, the generation in the
/// high 16. Generations wrap: an expiry entry left by an earlier bind of the same key whose
/// generation the new bind happens to reuse acts as the new bind's own, which costs a second
/// expiry entry until the binding runs out and nothing else (a binding is only ever
/// removed once its deadline has passed).
#[derive(Debug, Clone, Copy)]
struct Due(u64);

impl Due {
    fn new(at: Timestamp, generation: u16) -> Self {
        Self(at.as_millis().min(MS_MAX) | u64::from(generation) << MS_BITS)
    }

    fn at(self) -> Timestamp {
        Timestamp::from_millis(self.0 & MS_MAX)
    }

    fn generation(self) -> u16 {
        (self.0 >> MS_BITS) as u16
    }
}

/// Where a key is bound. The address is its record's (records stay in place once removed,
/// so a broken session is still reported by name).
#[derive(Debug)]
pub(crate) struct Binding {
    pub(crate) slot: Slot,
    pub(crate) sub_pool: u32,
    /// Moved on renewal, in place (see [`Sessions::get`]).
    due: Cell<Due>,
}

impl Binding {
    /// When it runs out unless renewed.
    pub(crate) fn expires(&self) -> Timestamp {
        self.due.get().at()
    }

    /// Moves its deadline to `until`.
    pub(crate) fn renew(&self, until: Timestamp) {
        self.due.set(Due::new(until, self.due.get().generation()));
    }

    fn generation(&self) -> u16 {
        self.due.get().generation()
    }
}

/// A binding with its key, as the map holds it: 32 bytes, two to a cache line, so that a
/// lookup reads one line of bindings (and one of the map's control bytes) and 100 000
/// sessions take 4 MiB of them instead of 8 (at that size, which half of the last-level
/// cache a pool's bindings need is what a renewal's time depends on). Hashes and compares as
/// its key.
#[derive(Debug)]
#[repr(C, align(32))]
struct Entry {
    key: Key,
    binding: Binding,
}

const _: () = assert!(size_of::<Entry>() == 32 && size_of::<Key>() == 16);

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

/// Bindings and their expiry. Renewal only moves a binding's deadline (one lookup); the heap
/// entry is checked when it comes due and pushed again if the binding was renewed meanwhile,
/// so a renewal costs O(1).
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    /// Hashed with foldhash, seeded per map: SipHash was a third of a renewal's acquire.
    /// Keys come from callers, so the seed (not a fixed function like Fx) keeps collisions
    /// from being precomputed. A set of key-and-binding entries rather than a map of keys to
    /// bindings: a map's buckets would not be aligned to share lines evenly.
    map: HashSet<Entry, foldhash::fast::RandomState>,
    expiry: BinaryHeap<Reverse<(Timestamp, u16, Key)>>,
    next_generation: u16,
}

impl Sessions {
    /// The key's binding; renew it with [`Binding::renew`].
    pub(crate) fn get(&self, key: &str) -> Option<&Binding> {
        self.map.get(key.as_bytes()).map(|e| &e.binding)
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn bind(&mut self, key: &str, slot: Slot, sub_pool: u32, expires: Timestamp) {
        self.next_generation = self.next_generation.wrapping_add(1);
        let generation = self.next_generation;
        let key = Key::new(key);
        let due = Due::new(expires, generation);
        self.expiry
            .push(Reverse((due.at(), generation, key.clone())));
        self.map.replace(Entry {
            key,
            binding: Binding {
                slot,
                sub_pool,
                due: Cell::new(due),
            },
        });
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
                Some(b) if b.generation() == generation && b.expires() <= now => {
                    if let Some(e) = self.map.take(key.as_bytes()) {
                        gone.push(e.binding);
                    }
                }
                Some(b) if b.generation() == generation => {
                    self.expiry.push(Reverse((b.expires(), generation, key)));
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

    fn at(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    #[test]
    fn p2_renewed_bindings_outlive_their_first_deadline() {
        let mut s = Sessions::default();
        s.bind("k", 0, 0, at(100));
        s.bind("j", 1, 0, at(100));
        s.get("k").unwrap().renew(at(300));
        let gone = s.expire(at(150));
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].slot, 1);
        assert_eq!(s.get("k").map(Binding::expires), Some(at(300)));
        assert_eq!(s.expire(at(300)).len(), 1);
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn p2_short_keys_are_stored_inline_and_long_ones_behind_a_pointer() {
        let (fits, long) = ("account-123456", "account-1234567");
        let mut s = Sessions::default();
        s.bind(fits, 0, 0, at(1));
        s.bind(long, 1, 0, at(1));
        s.bind("", 2, 0, at(1));
        assert!(matches!(Key::new(fits), Key::Inline { len: 14, .. }));
        assert!(matches!(Key::new(long), Key::Long(_)));
        assert_eq!(s.get(fits).map(|b| b.slot), Some(0));
        assert_eq!(s.get(long).map(|b| b.slot), Some(1));
        assert_eq!(s.get("").map(|b| b.slot), Some(2));
        assert!(s.get("account-12345").is_none());
        assert!(s.get("account-12345678").is_none());
        assert_eq!(s.expire(at(1)).len(), 3);
    }

    #[test]
    fn p2_a_key_bound_again_is_not_expired_by_its_first_binds_deadline() {
        let mut s = Sessions::default();
        s.bind("k", 0, 0, at(100));
        assert!(s.unbind("k").is_some());
        s.bind("k", 1, 0, at(300));
        assert!(s.expire(at(150)).is_empty());
        // The first bind's entry is dropped, not pushed again for the second's deadline.
        assert_eq!(s.expiry.len(), 1);
        assert_eq!(s.get("k").map(|b| b.slot), Some(1));
        assert_eq!(s.expire(at(300)).len(), 1);
        assert_eq!((s.len(), s.next_due()), (0, None));
    }

    #[test]
    fn p2_a_reused_generation_costs_an_expiry_entry_and_no_early_expiry() {
        let mut s = Sessions {
            next_generation: u16::MAX - 1,
            ..Sessions::default()
        };
        s.bind("k", 0, 0, at(100));
        assert!(s.unbind("k").is_some());
        // As if 65 536 binds had happened since: the second bind reuses the first's generation.
        s.next_generation = u16::MAX - 1;
        s.bind("k", 1, 0, at(300));
        assert_eq!(s.get("k").map(Binding::generation), Some(u16::MAX));
        assert!(s.expire(at(150)).is_empty());
        assert_eq!(s.expiry.len(), 2);
        assert_eq!(s.get("k").map(|b| b.slot), Some(1));
        assert_eq!(s.expire(at(300)).len(), 1);
        assert_eq!((s.len(), s.next_due()), (0, None));
        // Generations wrap.
        s.bind("j", 2, 0, at(400));
        assert_eq!(s.get("j").map(Binding::generation), Some(0));
    }

    #[test]
    fn p2_deadlines_past_the_year_10889_are_read_as_then() {
        let mut s = Sessions::default();
        s.bind("k", 0, 0, at(u64::MAX));
        let b = s.get("k").unwrap();
        assert_eq!(b.expires(), at(MS_MAX));
        b.renew(at(MS_MAX + 1));
        assert_eq!(b.expires(), at(MS_MAX));
        assert_eq!(b.generation(), 1);
    }
}
