//! Generated short codes: 7 base62 characters drawn from a keyed permutation of the id space.
//!
//! Ids come from blocks leased out of one counter, so they are dense and consecutive. A keyed
//! bijection over `[0, 62^7)` scrambles them before encoding: neighbours get unrelated codes,
//! yet two ids can never share a code, so no collision check is needed.

use siphasher::sip::SipHasher13;
use std::hash::Hasher;
use std::num::NonZeroU64;

/// Length of every generated code.
pub const CODE_LEN: usize = 7;

/// Number of distinct generated codes, `62^7`.
pub const ID_SPACE: u64 = 62u64.pow(CODE_LEN as u32);

const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// Rounds of the Feistel network; 8 is well past what mixing 21-bit halves needs.
const ROUNDS: u64 = 8;

/// Encodes an id below [`ID_SPACE`] as exactly [`CODE_LEN`] base62 characters.
///
/// Returns `None` for ids outside the space.
///
/// ```
/// use shortener_core::code::encode_id;
/// assert_eq!(encode_id(0).as_deref(), Some("0000000"));
/// assert_eq!(encode_id(61).as_deref(), Some("000000z"));
/// assert_eq!(encode_id(62u64.pow(7)), None);
/// ```
pub fn encode_id(mut id: u64) -> Option<String> {
    if id >= ID_SPACE {
        return None;
    }
    let mut out = [b'0'; CODE_LEN];
    for slot in out.iter_mut().rev() {
        // `id % 62` is below 62, so the index is in range.
        *slot = ALPHABET[(id % 62) as usize];
        id /= 62;
    }
    Some(out.iter().map(|&b| char::from(b)).collect())
}

/// Decodes a 7-character base62 code back to its id; `None` if it is not one.
///
/// ```
/// use shortener_core::code::{decode_code, encode_id};
/// assert_eq!(decode_code(&encode_id(123_456).unwrap()), Some(123_456));
/// assert_eq!(decode_code("abc"), None);
/// ```
pub fn decode_code(code: &str) -> Option<u64> {
    if code.len() != CODE_LEN {
        return None;
    }
    code.bytes().try_fold(0u64, |acc, b| {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'A'..=b'Z' => b - b'A' + 10,
            b'a'..=b'z' => b - b'a' + 36,
            _ => return None,
        };
        Some(acc * 62 + u64::from(digit))
    })
}

/// A keyed bijection over `[0, domain)`: a balanced Feistel network on the smallest even
/// number of bits that covers the domain, with cycle walking to stay inside it; or over
/// every `u64` ([`full_width`](Self::full_width)).
///
/// ```
/// use shortener_core::code::CodePermutation;
/// let p = CodePermutation::new([1; 16]);
/// let x = p.permute(5);
/// assert_eq!(p.invert(x), 5);
/// ```
#[derive(Clone)]
pub struct CodePermutation {
    key: [u8; 16],
    /// Its numbers are below this one; `None`: every `u64` (no cycle walking).
    domain: Option<NonZeroU64>,
    half_bits: u32,
}

impl std::fmt::Debug for CodePermutation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays secret: knowing it makes codes predictable again.
        f.debug_struct("CodePermutation")
            .field("domain", &self.domain)
            .finish_non_exhaustive()
    }
}

impl CodePermutation {
    /// The permutation of the generated-code space, [`ID_SPACE`].
    pub fn new(key: [u8; 16]) -> Self {
        Self::with_domain(key, ID_SPACE)
    }

    /// A permutation of `[0, domain)`; small domains make exhaustive tests possible.
    ///
    /// # Panics
    /// If `domain` is below 2 or above `2^62`.
    pub fn with_domain(key: [u8; 16], domain: u64) -> Self {
        assert!((2..=1 << 62).contains(&domain), "domain out of range");
        let bits = u64::BITS - (domain - 1).leading_zeros();
        Self {
            key,
            domain: NonZeroU64::new(domain),
            half_bits: bits.div_ceil(2),
        }
    }

    /// A permutation of every `u64`: no number is outside its domain, so neither
    /// [`permute`](Self::permute) nor [`invert`](Self::invert) panics.
    ///
    /// ```
    /// use shortener_core::code::CodePermutation;
    /// let p = CodePermutation::full_width([1; 16]);
    /// assert_eq!(p.invert(p.permute(u64::MAX)), u64::MAX);
    /// ```
    pub fn full_width(key: [u8; 16]) -> Self {
        Self {
            key,
            domain: None,
            half_bits: u64::BITS / 2,
        }
    }

    fn contains(&self, x: u64) -> bool {
        self.domain.is_none_or(|d| x < d.get())
    }

    /// Maps `id` (below the domain) to its image, also below the domain.
    ///
    /// # Panics
    /// If `id` is outside the domain.
    pub fn permute(&self, id: u64) -> u64 {
        assert!(self.contains(id), "id outside the permutation's domain");
        let mut x = id;
        // Cycle walking: the Feistel network permutes a power-of-two superset of the domain;
        // following the cycle until it re-enters the domain keeps the map a bijection on it.
        loop {
            x = self.feistel(x, false);
            if self.contains(x) {
                return x;
            }
        }
    }

    /// The inverse of [`permute`](Self::permute).
    ///
    /// # Panics
    /// If `code_id` is outside the domain.
    pub fn invert(&self, code_id: u64) -> u64 {
        assert!(
            self.contains(code_id),
            "id outside the permutation's domain"
        );
        let mut x = code_id;
        loop {
            x = self.feistel(x, true);
            if self.contains(x) {
                return x;
            }
        }
    }

    fn feistel(&self, x: u64, inverse: bool) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut left, mut right) = (x >> self.half_bits, x & mask);
        for i in 0..ROUNDS {
            let round = if inverse { ROUNDS - 1 - i } else { i };
            if inverse {
                (left, right) = (right ^ self.round(round, left), left);
            } else {
                (left, right) = (right, left ^ self.round(round, right));
            }
        }
        (left << self.half_bits) | right
    }

    fn round(&self, round: u64, half: u64) -> u64 {
        let mut h = SipHasher13::new_with_key(&self.key);
        h.write_u64(round);
        h.write_u64(half);
        h.finish() & ((1u64 << self.half_bits) - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn encode_decode_round_trip_at_the_edges() {
        for id in [0, 1, 61, 62, 3843, ID_SPACE / 2, ID_SPACE - 1] {
            let code = encode_id(id).unwrap();
            assert_eq!(code.len(), CODE_LEN);
            assert_eq!(decode_code(&code), Some(id));
        }
        assert_eq!(encode_id(ID_SPACE - 1).as_deref(), Some("zzzzzzz"));
        assert_eq!(decode_code("zzzzzz-"), None);
        assert_eq!(decode_code("zzzzzzzz"), None);
    }

    #[test]
    fn permutation_is_a_bijection_on_small_domains() {
        for domain in [2u64, 3, 1000, 4096, 5000] {
            let p = CodePermutation::with_domain([9; 16], domain);
            let images: HashSet<u64> = (0..domain).map(|x| p.permute(x)).collect();
            assert_eq!(images.len() as u64, domain, "domain {domain}");
            assert!(images.iter().all(|&y| y < domain));
            for x in 0..domain {
                assert_eq!(p.invert(p.permute(x)), x);
            }
        }
    }

    #[test]
    fn consecutive_ids_get_unrelated_codes() {
        let p = CodePermutation::new([3; 16]);
        let codes: Vec<u64> = (0..1000).map(|x| p.permute(x)).collect();
        let unique: HashSet<_> = codes.iter().collect();
        assert_eq!(unique.len(), codes.len());
        // Neighbours land far apart: fewer than 1 % of adjacent pairs within 62^4 of each other.
        let close = codes
            .windows(2)
            .filter(|w| w[0].abs_diff(w[1]) < 62u64.pow(4))
            .count();
        assert!(close < 10, "{close} adjacent pairs are close");
    }

    #[test]
    fn the_full_width_permutation_round_trips_and_scatters_neighbours() {
        let p = CodePermutation::full_width([5; 16]);
        for x in [0, 1, 2, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
            assert_eq!(p.invert(p.permute(x)), x);
            assert_eq!(p.permute(p.invert(x)), x);
        }
        let images: Vec<u64> = (0..1000).map(|x| p.permute(x)).collect();
        assert_eq!(images.iter().collect::<HashSet<_>>().len(), images.len());
        // Both halves mixed: fewer than 1 % of adjacent pairs within 2^48 of each other.
        let close = images
            .windows(2)
            .filter(|w| w[0].abs_diff(w[1]) < 1 << 48)
            .count();
        assert!(close < 10, "{close} adjacent pairs are close");
    }

    #[test]
    fn different_keys_give_different_permutations() {
        let a = CodePermutation::new([1; 16]);
        let b = CodePermutation::new([2; 16]);
        let same = (0..100).filter(|&x| a.permute(x) == b.permute(x)).count();
        assert!(same < 2);
    }
}
