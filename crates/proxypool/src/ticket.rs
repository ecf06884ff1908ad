//! What a caller asks for: an optional business key, target site and sub-pool.

use std::sync::Arc;

/// A request for an address.
///
/// ```
/// use proxypool::Ticket;
/// let t = Ticket::new().key("account-42").site("shop.example");
/// assert_eq!(t.key_str(), Some("account-42"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ticket {
    pub(crate) key: Option<Arc<str>>,
    pub(crate) site: Option<Arc<str>>,
    pub(crate) sub_pool: Option<Arc<str>>,
}

impl Ticket {
    /// A keyless ticket for no particular site.
    pub fn new() -> Self {
        Self::default()
    }

    /// The business-session key (e.g. an account id): keyed work is sticky (P2).
    pub fn key(mut self, key: impl Into<Arc<str>>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// The target site the work is for: reputation is judged per address × site (P9).
    pub fn site(mut self, site: impl Into<Arc<str>>) -> Self {
        self.site = Some(site.into());
        self
    }

    /// Draw from a declared sub-pool (per site or task type) instead of the whole pool.
    pub fn sub_pool(mut self, name: impl Into<Arc<str>>) -> Self {
        self.sub_pool = Some(name.into());
        self
    }

    /// The key, if any.
    pub fn key_str(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The site, if any.
    pub fn site_str(&self) -> Option<&str> {
        self.site.as_deref()
    }
}
