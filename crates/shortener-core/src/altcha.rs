//! Proof-of-work CAPTCHA in the classic ALTCHA challenge format (what the `altcha` widget
//! before 3.0 speaks): the server picks a secret number, publishes `SHA-256(salt + number)`
//! with an HMAC signature, and the client finds the number by trying them in turn.
//!
//! ```
//! use shortener_core::altcha::{Solution, create, solve, verify};
//! let key = [7u8; 32];
//! let challenge = create(&key, [1; 12], 4242, 10_000, 1_000);
//! assert!(challenge.salt.ends_with("?expires=1000"));
//! let number = solve(&challenge).unwrap();
//! let solution = Solution {
//!     algorithm: challenge.algorithm.to_owned(),
//!     challenge: challenge.challenge.clone(),
//!     number,
//!     salt: challenge.salt.clone(),
//!     signature: challenge.signature.clone(),
//! };
//! assert_eq!(verify(&key, &solution, 999), Ok(1_000));
//! assert!(verify(&key, &solution, 1_000).is_err()); // expired
//! assert!(verify(&[8u8; 32], &solution, 999).is_err()); // another server's key
//! ```

use crate::day::UnixSeconds;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// The only algorithm offered and accepted.
pub const ALGORITHM: &str = "SHA-256";

/// A challenge as sent to the client (`GET /api/v1/challenge`, and in 428 answers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    /// Always [`ALGORITHM`].
    pub algorithm: &'static str,
    /// Hex SHA-256 of `salt` followed by the secret number in decimal.
    pub challenge: String,
    /// The number is at most this.
    pub maxnumber: u64,
    /// Random hex, then `?expires=UNIX`.
    pub salt: String,
    /// Hex HMAC-SHA-256 of `challenge` under the server's key.
    pub signature: String,
}

/// What a client sends back: the challenge's fields and the number it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Solution {
    /// Must be [`ALGORITHM`].
    pub algorithm: String,
    /// As received.
    pub challenge: String,
    /// The number found.
    pub number: u64,
    /// As received.
    pub salt: String,
    /// As received.
    pub signature: String,
}

/// Why a solution was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    /// Not SHA-256.
    #[error("the algorithm must be SHA-256")]
    Algorithm,
    /// The salt carries no expiry, or it has passed.
    #[error("the challenge has expired")]
    Expired,
    /// The signature is not this server's.
    #[error("the challenge was not issued by this server")]
    Forged,
    /// The number does not produce the challenge.
    #[error("the number does not solve the challenge")]
    Wrong,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn digest(salt: &str, number: u64) -> String {
    hex(&Sha256::digest(format!("{salt}{number}").as_bytes()))
}

fn mac(key: &[u8]) -> Hmac<Sha256> {
    // HMAC takes keys of any length, so this never fails.
    <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!())
}

/// A challenge for `number` (at most `max_number`) that expires at `expires`.
pub fn create(
    key: &[u8],
    random: [u8; 12],
    number: u64,
    max_number: u64,
    expires: UnixSeconds,
) -> Challenge {
    let salt = format!("{}?expires={expires}", hex(&random));
    let challenge = digest(&salt, number);
    let mut signer = mac(key);
    signer.update(challenge.as_bytes());
    Challenge {
        algorithm: ALGORITHM,
        signature: hex(&signer.finalize().into_bytes()),
        challenge,
        maxnumber: max_number,
        salt,
    }
}

fn expires_of(salt: &str) -> Option<UnixSeconds> {
    let (_, query) = salt.split_once('?')?;
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix("expires="))
        .and_then(|v| v.parse().ok())
}

/// Checks a solution at `now`; returns when its challenge expires (how long a replay must
/// be remembered). Replays are the caller's to refuse.
pub fn verify(key: &[u8], solution: &Solution, now: UnixSeconds) -> Result<UnixSeconds, Invalid> {
    if solution.algorithm != ALGORITHM {
        return Err(Invalid::Algorithm);
    }
    let expires = expires_of(&solution.salt).ok_or(Invalid::Expired)?;
    if now >= expires {
        return Err(Invalid::Expired);
    }
    let signature = (0..solution.signature.len())
        .step_by(2)
        .map(|i| {
            solution
                .signature
                .get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        })
        .collect::<Option<Vec<u8>>>()
        .ok_or(Invalid::Forged)?;
    let mut checker = mac(key);
    checker.update(solution.challenge.as_bytes());
    // Constant time: the comparison does not tell how much of a forgery was right.
    checker
        .verify_slice(&signature)
        .map_err(|_| Invalid::Forged)?;
    if digest(&solution.salt, solution.number) != solution.challenge {
        return Err(Invalid::Wrong);
    }
    Ok(expires)
}

/// Finds the number of a challenge as a client does (tests and tools).
pub fn solve(challenge: &Challenge) -> Option<u64> {
    (0..=challenge.maxnumber).find(|&n| digest(&challenge.salt, n) == challenge.challenge)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vector_and_tampering() {
        // SHA-256("abc" "123"), as any ALTCHA client computes it.
        assert_eq!(
            digest("abc", 123),
            "6ca13d52ca70c883e0f0bb101e425a89e8624de51db2d2392593af6a84118090"
        );
        let key = [1u8; 32];
        let c = create(&key, [0; 12], 5, 10, 100);
        let good = Solution {
            algorithm: c.algorithm.into(),
            challenge: c.challenge.clone(),
            number: 5,
            salt: c.salt.clone(),
            signature: c.signature.clone(),
        };
        assert_eq!(verify(&key, &good, 50), Ok(100));
        let wrong = Solution {
            number: 6,
            ..good.clone()
        };
        assert_eq!(verify(&key, &wrong, 50), Err(Invalid::Wrong));
        let longer = Solution {
            salt: c.salt.replace("expires=100", "expires=999999"),
            ..good.clone()
        };
        assert_eq!(verify(&key, &longer, 50), Err(Invalid::Wrong));
        let resigned = Solution {
            signature: "zz".into(),
            ..good.clone()
        };
        assert_eq!(verify(&key, &resigned, 50), Err(Invalid::Forged));
        let other = Solution {
            algorithm: "SHA-1".into(),
            ..good
        };
        assert_eq!(verify(&key, &other, 50), Err(Invalid::Algorithm));
    }
}
