//! Rules for custom aliases chosen by users.

use std::sync::OnceLock;

/// Shortest custom alias.
pub const MIN_LEN: usize = 4;
/// Longest custom alias.
pub const MAX_LEN: usize = 30;

/// Words that name paths the service serves itself, or may serve; compared case-insensitively.
pub const RESERVED: &[&str] = &[
    "about",
    "admin",
    "api",
    "app",
    "assets",
    "auth",
    "dashboard",
    "docs",
    "favicon",
    "health",
    "healthz",
    "help",
    "login",
    "logout",
    "metrics",
    "openapi",
    "ready",
    "readyz",
    "robots",
    "signup",
    "static",
    "status",
    "swagger",
    "www",
];

const OFFENSIVE_WORDS: &str = include_str!("../data/offensive-words.txt");

/// Why an alias was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AliasError {
    /// Fewer than [`MIN_LEN`] or more than [`MAX_LEN`] characters.
    #[error("custom_alias must be {MIN_LEN} to {MAX_LEN} characters long, got {0}")]
    Length(usize),
    /// A character outside `[A-Za-z0-9-]`.
    #[error("custom_alias may only contain A-Z, a-z, 0-9 and '-', found {0:?}")]
    Character(char),
    /// A word the service keeps for its own paths.
    #[error("custom_alias {0:?} is a reserved word")]
    Reserved(String),
    /// On the offensive-word list.
    #[error("custom_alias is not allowed")]
    Offensive,
}

/// Checks a custom alias against every rule.
///
/// ```
/// use shortener_core::alias::{validate_alias, AliasError};
/// assert!(validate_alias("spring-sale-2025").is_ok());
/// assert_eq!(validate_alias("abc"), Err(AliasError::Length(3)));
/// assert_eq!(validate_alias("Metrics"), Err(AliasError::Reserved("Metrics".into())));
/// assert_eq!(validate_alias("a_b_c"), Err(AliasError::Character('_')));
/// ```
pub fn validate_alias(alias: &str) -> Result<(), AliasError> {
    let len = alias.chars().count();
    if !(MIN_LEN..=MAX_LEN).contains(&len) {
        return Err(AliasError::Length(len));
    }
    if let Some(bad) = alias
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-'))
    {
        return Err(AliasError::Character(bad));
    }
    let lower = alias.to_ascii_lowercase();
    if RESERVED.contains(&lower.as_str()) {
        return Err(AliasError::Reserved(alias.to_owned()));
    }
    if is_offensive(&lower) {
        return Err(AliasError::Offensive);
    }
    Ok(())
}

/// Whether `path_segment` could name a link at all (a generated code or a custom alias).
///
/// The redirect path uses it to answer 404 for garbage without touching any store.
///
/// ```
/// use shortener_core::alias::could_be_code;
/// assert!(could_be_code("aZ3x9Qp"));
/// assert!(!could_be_code("x"));
/// assert!(!could_be_code("no/slash"));
/// ```
pub fn could_be_code(path_segment: &str) -> bool {
    (MIN_LEN..=MAX_LEN).contains(&path_segment.len())
        && path_segment.bytes().all(|b| CODE_BYTES[usize::from(b)])
}

/// The bytes a code or alias may hold (ASCII letters, digits, `-`), as a table: every
/// redirect asks, and one load per byte is cheaper than the range comparisons.
static CODE_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let byte = b as u8;
        table[b] = byte.is_ascii_alphanumeric() || byte == b'-';
        b += 1;
    }
    table
};

fn offensive_words() -> &'static [&'static str] {
    static WORDS: OnceLock<Vec<&'static str>> = OnceLock::new();
    WORDS.get_or_init(|| {
        OFFENSIVE_WORDS
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect()
    })
}

fn is_offensive(lower: &str) -> bool {
    let folded: String = lower
        .chars()
        .map(|c| match c {
            '0' => 'o',
            '1' => 'i',
            '3' => 'e',
            '4' => 'a',
            '5' => 's',
            '7' => 't',
            other => other,
        })
        .collect();
    let joined: String = folded.chars().filter(|&c| c != '-').collect();
    offensive_words().iter().any(|word| {
        folded.split('-').any(|part| part == *word)
            // Short words only match whole parts: "classic" must not fail on "ass".
            || (word.len() >= 6 && joined.contains(word))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_code_holds_letters_digits_and_dashes_only() {
        for b in 0..=u8::MAX {
            let segment = String::from_utf8(vec![b'a', b'b', b'c', b]);
            let expected = b.is_ascii_alphanumeric() || b == b'-';
            // Bytes past ASCII are not a string alone: a code of them is refused anyway.
            if let Ok(segment) = segment {
                assert_eq!(could_be_code(&segment), expected, "byte {b:#04x}");
            }
            assert_eq!(CODE_BYTES[usize::from(b)], expected, "byte {b:#04x}");
        }
        assert!(!could_be_code("abcé"));
    }

    #[test]
    fn length_limits_are_inclusive() {
        assert!(validate_alias("abcd").is_ok());
        assert!(validate_alias(&"a".repeat(30)).is_ok());
        assert_eq!(validate_alias(&"a".repeat(31)), Err(AliasError::Length(31)));
        assert_eq!(validate_alias(""), Err(AliasError::Length(0)));
    }

    #[test]
    fn non_ascii_and_symbols_are_refused() {
        assert_eq!(validate_alias("café-x"), Err(AliasError::Character('é')));
        assert_eq!(validate_alias("ab cd"), Err(AliasError::Character(' ')));
        assert_eq!(validate_alias("ab/cd"), Err(AliasError::Character('/')));
    }

    #[test]
    fn reserved_words_in_any_case() {
        for word in ["api", "API", "healthz", "ReadyZ", "static", "admin"] {
            if word.len() >= MIN_LEN {
                assert!(
                    matches!(validate_alias(word), Err(AliasError::Reserved(_))),
                    "{word}"
                );
            }
        }
    }

    #[test]
    fn offensive_words_whole_parts_and_long_substrings() {
        assert_eq!(validate_alias("shit-happens"), Err(AliasError::Offensive));
        assert_eq!(validate_alias("Sh1t"), Err(AliasError::Offensive));
        assert_eq!(
            validate_alias("bigmotherfuckerdeal"),
            Err(AliasError::Offensive)
        );
        assert!(validate_alias("classic-cars").is_ok());
        assert!(validate_alias("scunthorpe").is_ok());
        assert!(validate_alias("shitake").is_ok());
    }

    #[test]
    fn word_list_loads() {
        assert!(offensive_words().len() > 20);
        assert!(
            offensive_words()
                .iter()
                .all(|w| w.chars().all(|c| c.is_ascii_lowercase()))
        );
    }
}
