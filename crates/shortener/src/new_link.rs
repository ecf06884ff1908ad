//! The rules a new link's fields pass, whoever sends them: the API's create and edit and
//! `shortener import` call these and nothing else.

use shortener_core::alias::validate_alias;
use shortener_core::day::{UnixSeconds, parse_rfc3339};
use shortener_core::link::EXPIRES_IN_DAYS;
use shortener_core::long_url::{UrlPolicy, validate_long_url};
use shortener_core::threat::{Feeds, ThreatMatcher};

/// Why a field was refused; `code` is the API's error code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    #[error("{0}")]
    InvalidUrl(String),
    /// Names the feed, never the entry.
    #[error("the destination is on the threat feed {0}")]
    UrlBlocked(String),
    #[error("{0}")]
    InvalidAlias(String),
    #[error("{0}")]
    InvalidExpiry(String),
    /// A well-formed instant the clock rules out (past, or too far away): the same code, but
    /// not a malformed request (the API answers 422, which its document can state where no
    /// schema can say "in the future").
    #[error("{0}")]
    ExpiryOutOfWindow(String),
}

impl Refused {
    pub(crate) fn code(&self) -> &'static str {
        match self {
            Self::InvalidUrl(_) => "invalid_url",
            Self::UrlBlocked(_) => "url_blocked",
            Self::InvalidAlias(_) => "invalid_alias",
            Self::InvalidExpiry(_) | Self::ExpiryOutOfWindow(_) => "invalid_expiry",
        }
    }
}

/// The destination as stored (normalised), unless its syntax, the policy or a threat feed
/// refuses it.
pub(crate) fn destination(
    policy: &UrlPolicy,
    threats: &Feeds,
    raw: &str,
) -> Result<String, Refused> {
    let long_url =
        validate_long_url(raw, policy).map_err(|e| Refused::InvalidUrl(e.to_string()))?;
    // Without feeds, no second parse (an import of millions of lines notices).
    if !threats.is_empty()
        && let Ok(url) = url::Url::parse(&long_url)
        && let Some(feed) = threats.find(&url)
    {
        return Err(Refused::UrlBlocked(feed.to_owned()));
    }
    Ok(long_url)
}

/// A custom alias's rules (length, characters, reserved and offensive words).
pub(crate) fn alias(alias: &str) -> Result<(), Refused> {
    validate_alias(alias).map_err(|e| Refused::InvalidAlias(e.to_string()))
}

/// The expiry `days` days after `now`, within the accepted range of days.
pub(crate) fn expiry_in_days(now: UnixSeconds, days: i64) -> Result<UnixSeconds, Refused> {
    let range = i64::from(*EXPIRES_IN_DAYS.start())..=i64::from(*EXPIRES_IN_DAYS.end());
    if !range.contains(&days) {
        return Err(Refused::InvalidExpiry(format!(
            "expires_in_days must be between {} and {}",
            EXPIRES_IN_DAYS.start(),
            EXPIRES_IN_DAYS.end()
        )));
    }
    Ok(now + days * 86_400)
}

/// An absolute expiry: an RFC 3339 instant after `now`, at most the longest lifetime away.
pub(crate) fn expiry_at(now: UnixSeconds, text: &str) -> Result<UnixSeconds, Refused> {
    let latest = now + i64::from(*EXPIRES_IN_DAYS.end()) * 86_400;
    let window = || {
        format!(
            "expires_at must be an RFC 3339 instant in the future, at most {} days away",
            EXPIRES_IN_DAYS.end()
        )
    };
    match parse_rfc3339(text) {
        Some(at) if at > now && at <= latest => Ok(at),
        Some(_) => Err(Refused::ExpiryOutOfWindow(window())),
        None => Err(Refused::InvalidExpiry(window())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shortener_core::threat::Feed;

    #[test]
    fn a_destination_on_a_feed_is_refused_by_the_feeds_name() {
        let (feed, _) = Feed::parse("phish.txt", "bad.example\n");
        let feeds = Feeds(vec![feed]);
        let policy = UrlPolicy::default();
        assert_eq!(
            destination(&policy, &feeds, "https://www.bad.example/x"),
            Err(Refused::UrlBlocked("phish.txt".into()))
        );
        assert_eq!(
            destination(&policy, &feeds, "https://good.example/x").as_deref(),
            Ok("https://good.example/x")
        );
        assert_eq!(
            destination(&policy, &feeds, "ftp://good.example/")
                .unwrap_err()
                .code(),
            "invalid_url"
        );
    }

    #[test]
    fn expiries_are_bounded_both_ways() {
        assert!(expiry_in_days(0, 0).is_err());
        assert_eq!(expiry_in_days(0, 1), Ok(86_400));
        assert!(expiry_at(100, "1970-01-01T00:00:00Z").is_err());
        assert_eq!(expiry_at(0, "1970-01-02T00:00:00Z"), Ok(86_400));
        assert!(expiry_at(0, "2999-01-01T00:00:00Z").is_err());
        assert!(expiry_at(0, "tomorrow").is_err());
    }
}
