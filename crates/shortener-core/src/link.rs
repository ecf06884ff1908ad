//! The link model.

use crate::day::UnixSeconds;

/// Default lifetime of a link: five years.
pub const DEFAULT_EXPIRES_IN_DAYS: u32 = 1825;
/// Accepted range of `expires_in_days`.
pub const EXPIRES_IN_DAYS: std::ops::RangeInclusive<u32> = 1..=3650;

/// A stored short link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The generated code or custom alias; the key.
    pub code: String,
    /// Where the redirect sends people (already validated and normalised).
    pub long_url: String,
    /// The user that created it; `None` for anonymous links.
    pub owner: Option<String>,
    /// Whether `code` was chosen by the user.
    pub custom_alias: bool,
    /// Creation instant.
    pub created_at: UnixSeconds,
    /// From this instant on the link answers 404.
    pub expires_at: UnixSeconds,
    /// When the link was disabled (deleted); it then answers 410.
    pub disabled_at: Option<UnixSeconds>,
    /// Clicks by people, eventually consistent.
    pub clicks: u64,
    /// Clicks by known bots and link previews, eventually consistent.
    pub bot_clicks: u64,
    /// Address the creation request came from (the audit trail).
    pub created_ip: Option<String>,
}

/// Lifecycle state of a link at a given instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkStatus {
    /// Redirects.
    Active,
    /// Past its expiry: 404.
    Expired,
    /// Deleted or disabled by its owner or an admin: 410.
    Disabled,
}

impl LinkStatus {
    /// The name used in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Expired => "expired",
            Self::Disabled => "disabled",
        }
    }
}

impl Link {
    /// The state at `now`; disabling wins over expiry.
    ///
    /// ```
    /// use shortener_core::link::{Link, LinkStatus};
    /// let mut link = Link {
    ///     code: "abcdefg".into(), long_url: "https://example.com/".into(), owner: None,
    ///     custom_alias: false, created_at: 0, expires_at: 100, disabled_at: None,
    ///     clicks: 0, bot_clicks: 0, created_ip: None,
    /// };
    /// assert_eq!(link.status(99), LinkStatus::Active);
    /// assert_eq!(link.status(100), LinkStatus::Expired);
    /// link.disabled_at = Some(50);
    /// assert_eq!(link.status(60), LinkStatus::Disabled);
    /// ```
    pub fn status(&self, now: UnixSeconds) -> LinkStatus {
        if self.disabled_at.is_some() {
            LinkStatus::Disabled
        } else if now >= self.expires_at {
            LinkStatus::Expired
        } else {
            LinkStatus::Active
        }
    }

    /// Whether `principal` may read or delete this link: its owner or any admin.
    pub fn visible_to(&self, principal: &crate::token::Principal) -> bool {
        principal.admin || self.owner.as_deref() == Some(principal.user.as_str())
    }
}
