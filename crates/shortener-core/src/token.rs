//! API tokens: users and admins. Tokens are stored only as hashes.

use sha2::{Digest, Sha256};

/// Prefix of every token, so leaked tokens are easy to recognise and scan for.
pub const TOKEN_PREFIX: &str = "shk_";

/// Who a valid token belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// User name.
    pub user: String,
    /// Admins see and delete every link.
    pub admin: bool,
}

/// SHA-256 of a token. Tokens carry 192 random bits, so a fast hash is enough: there is
/// nothing to brute-force, unlike a password.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenHash(pub [u8; 32]);

impl TokenHash {
    /// Hashes a presented token.
    ///
    /// ```
    /// use shortener_core::token::TokenHash;
    /// assert_eq!(TokenHash::of("shk_a"), TokenHash::of("shk_a"));
    /// assert_ne!(TokenHash::of("shk_a"), TokenHash::of("shk_b"));
    /// ```
    pub fn of(token: &str) -> Self {
        Self(Sha256::digest(token.as_bytes()).into())
    }
}

/// Formats 24 random bytes as a token.
///
/// ```
/// use shortener_core::token::{format_token, TOKEN_PREFIX};
/// let t = format_token([0xab; 24]);
/// assert!(t.starts_with(TOKEN_PREFIX));
/// assert_eq!(t.len(), TOKEN_PREFIX.len() + 48);
/// ```
pub fn format_token(random: [u8; 24]) -> String {
    let mut out = String::with_capacity(TOKEN_PREFIX.len() + 48);
    out.push_str(TOKEN_PREFIX);
    for b in random {
        out.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        out.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
    }
    out
}

/// Why a user name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("user name must be 1 to 64 characters of A-Z, a-z, 0-9, '.', '_', '@' or '-'")]
pub struct UserNameError;

/// Checks a user name given to `token create`.
///
/// ```
/// use shortener_core::token::validate_user_name;
/// assert!(validate_user_name("alice@example.com").is_ok());
/// assert!(validate_user_name("").is_err());
/// assert!(validate_user_name("a b").is_err());
/// ```
pub fn validate_user_name(name: &str) -> Result<(), UserNameError> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'@' | b'-'));
    if ok { Ok(()) } else { Err(UserNameError) }
}
