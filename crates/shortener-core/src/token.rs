//! API tokens: users and admins. Tokens are stored only as hashes.

use crate::day::UnixSeconds;
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

    /// The token's public id: the first bytes of its hash in hex. It names the token in
    /// `token list` and `token revoke` and says nothing about the secret; every stored
    /// token has one without a migration writing it.
    ///
    /// ```
    /// use shortener_core::token::{TokenHash, TokenId};
    /// let id = TokenHash::of("shk_a").public_id();
    /// assert_eq!(id.to_string().len(), 12);
    /// assert_eq!(id.to_string().parse::<TokenId>(), Ok(id));
    /// ```
    pub fn public_id(&self) -> TokenId {
        let mut id = [0; TOKEN_ID_BYTES];
        id.copy_from_slice(&self.0[..TOKEN_ID_BYTES]);
        TokenId(id)
    }
}

/// Bytes of the hash that make a token's public id: 48 bits, so ids of a store's tokens
/// do not collide in practice.
pub const TOKEN_ID_BYTES: usize = 6;

/// A token's public id (see [`TokenHash::public_id`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenId(pub [u8; TOKEN_ID_BYTES]);

impl std::fmt::Display for TokenId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// Why a token id was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a token id is 12 hex digits, as `token list` prints it")]
pub struct TokenIdError;

impl std::str::FromStr for TokenId {
    type Err = TokenIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() != TOKEN_ID_BYTES * 2 || !s.is_ascii() {
            return Err(TokenIdError);
        }
        let mut id = [0; TOKEN_ID_BYTES];
        for (i, byte) in id.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[i * 2..i * 2 + 2], 16).map_err(|_| TokenIdError)?;
        }
        Ok(Self(id))
    }
}

/// How stale a token's "last used" may get: a request writes it only when the stored
/// value is older than this, so a busy token costs one write a minute, not one per request.
pub const LAST_USED_GRANULARITY: UnixSeconds = 60;

/// Whether a request at `now` should record itself as the token's last use.
///
/// ```
/// use shortener_core::token::last_use_is_stale;
/// assert!(last_use_is_stale(None, 100));
/// assert!(!last_use_is_stale(Some(100), 159));
/// assert!(last_use_is_stale(Some(100), 160));
/// ```
pub fn last_use_is_stale(last_used_at: Option<UnixSeconds>, now: UnixSeconds) -> bool {
    last_used_at.is_none_or(|at| now >= at.saturating_add(LAST_USED_GRANULARITY))
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

/// Why a token name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("token name must be 1 to 64 characters, none of them control characters")]
pub struct TokenNameError;

/// Checks the `--name` given to `token create` (a label for the operator, e.g. "ci").
///
/// ```
/// use shortener_core::token::validate_token_name;
/// assert!(validate_token_name("deploy bot").is_ok());
/// assert!(validate_token_name("").is_err());
/// assert!(validate_token_name("a\nb").is_err());
/// ```
pub fn validate_token_name(name: &str) -> Result<(), TokenNameError> {
    let ok = (1..=64).contains(&name.chars().count())
        && !name.chars().any(char::is_control)
        && name.trim() == name;
    if ok { Ok(()) } else { Err(TokenNameError) }
}

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
