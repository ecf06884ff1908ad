//! A page of links as `GET /api/v1/links` asks every store for it: newest first, keyed by
//! (creation instant, creation order) so that links created while someone pages never shift
//! a page.

use crate::code::CodePermutation;
use crate::day::UnixSeconds;
use crate::link::{Link, LinkStatus};

/// Most links one page holds.
pub const MAX_PAGE: usize = 100;

/// The position after the last link of a page: the next page holds only links ordered after
/// it, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkCursor {
    /// `created_at` of the last link shown.
    pub created_at: UnixSeconds,
    /// Its place in the store's creation order (ties on `created_at` list the link created
    /// later first). A store's own number, meaningful to that store only: on the embedded
    /// store the id of the link's creation audit row (`links.created_audit`), on PostgreSQL
    /// `links.seq`. In creation order so that a create appends to the list's indexes: by
    /// code, each create wrote a page at a random place among its second's links
    /// (BENCHMARKS.md, the thirty-second session). Below [`SEQ_BOUND`] in magnitude: a
    /// cursor says nothing of a place past it.
    pub seq: i64,
}

/// The magnitude every [`LinkCursor::seq`] stays below: 2^40, a trillion creations (or, on
/// the embedded store, audited changes) — no store comes near it.
pub const SEQ_BOUND: i64 = 1 << 40;

/// Hides a cursor's `seq` from the people it is given to: a store's creation order counts
/// everyone's links (and, on the embedded store, every audited change), so two cursors a user
/// gets would tell how busy the service was between their links, which generated codes keep
/// to themselves ([`CodePermutation`]). Hidden, `seq` is a keyed permutation of its bits, so
/// any other number (an altered cursor, one made under another key: another deployment's, or
/// a store restored without its key) reveals a number spread over all 64 bits, which falls
/// below [`SEQ_BOUND`] about once in eight million: such a cursor is refused instead of
/// starting a page somewhere else.
///
/// ```
/// use shortener_core::listing::CursorCipher;
/// let cipher = CursorCipher::new([7; 16]);
/// let hidden = cipher.hide(-42);
/// assert_eq!(cipher.reveal(hidden), Some(-42));
/// assert_eq!(CursorCipher::new([8; 16]).reveal(hidden), None);
/// ```
#[derive(Debug, Clone)]
pub struct CursorCipher(CodePermutation);

impl CursorCipher {
    /// The cipher under `key` (random, kept by the store and shared by its instances; not
    /// the key of generated codes, so that no key drives two permutations).
    pub fn new(key: [u8; 16]) -> Self {
        Self(CodePermutation::full_width(key))
    }

    /// `seq` as a cursor shows it.
    pub fn hide(&self, seq: i64) -> u64 {
        // The bits of the i64: negative numbers (see `LinkCursor::seq`) round-trip too.
        self.0.permute(seq as u64)
    }

    /// The `seq` a hidden number stands for, unless it is not one [`hide`](Self::hide) gives
    /// for a `seq` below [`SEQ_BOUND`] under this key.
    pub fn reveal(&self, hidden: u64) -> Option<i64> {
        Some(self.0.invert(hidden) as i64).filter(|seq| seq.unsigned_abs() < SEQ_BOUND as u64)
    }
}

/// The links of one page and where the next one starts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PageOfLinks {
    /// Newest first.
    pub links: Vec<Link>,
    /// After the last link, when the page is full (there may be more); `None` otherwise.
    pub next: Option<LinkCursor>,
}

impl PageOfLinks {
    /// The page of `rows` (each a link and its `seq`, in the page's order) for `query`.
    pub fn new(query: &LinkQuery, rows: Vec<(Link, i64)>) -> Self {
        let next = (rows.len() == query.limit)
            .then(|| rows.last())
            .flatten()
            .map(|(l, seq)| LinkCursor {
                created_at: l.created_at,
                seq: *seq,
            });
        Self {
            links: rows.into_iter().map(|(l, _)| l).collect(),
            next,
        }
    }
}

/// Which links a page holds. Deleted links are never listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkQuery {
    /// Only this owner's links; `None` lists everyone's (admins).
    pub owner: Option<String>,
    /// Only links whose code or destination contains this text (case-sensitive).
    pub contains: Option<String>,
    /// Only links in this state at `now`: active, disabled or expired.
    pub status: Option<LinkStatus>,
    /// Created at or after this instant.
    pub created_after: Option<UnixSeconds>,
    /// Created before this instant.
    pub created_before: Option<UnixSeconds>,
    /// Only links after this position.
    pub after: Option<LinkCursor>,
    /// The instant `status` is judged at.
    pub now: UnixSeconds,
    /// At most this many links (1 to [`MAX_PAGE`]).
    pub limit: usize,
}

impl LinkQuery {
    /// Every link of `owner` (or everyone's), newest first, `limit` at a time.
    pub fn new(owner: Option<String>, now: UnixSeconds, limit: usize) -> Self {
        Self {
            owner,
            contains: None,
            status: None,
            created_after: None,
            created_before: None,
            after: None,
            now,
            limit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_seqs_round_trip_and_depend_on_the_key() {
        let (a, b) = (CursorCipher::new([1; 16]), CursorCipher::new([2; 16]));
        for seq in [1 - SEQ_BOUND, -7, -1, 0, 1, 42, SEQ_BOUND - 1] {
            assert_eq!(a.reveal(a.hide(seq)), Some(seq));
            assert_ne!(a.hide(seq), b.hide(seq), "{seq}");
        }
    }

    #[test]
    fn numbers_hide_does_not_give_are_refused() {
        let (a, b) = (CursorCipher::new([1; 16]), CursorCipher::new([2; 16]));
        for seq in [i64::MIN, -SEQ_BOUND, SEQ_BOUND, i64::MAX] {
            assert_eq!(a.reveal(a.hide(seq)), None, "{seq}");
        }
        // Another key's cursors, and this key's altered in any one bit: refused.
        for seq in 0..1000 {
            let hidden = a.hide(seq);
            assert_eq!(b.reveal(hidden), None, "{seq}");
            for bit in 0..64 {
                assert_eq!(a.reveal(hidden ^ 1 << bit), None, "{seq} {bit}");
            }
        }
    }
}
