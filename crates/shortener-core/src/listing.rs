//! A page of links as `GET /api/v1/links` asks every store for it: newest first, keyed by
//! (creation instant, code) so that links created while someone pages never shift a page.

use crate::day::UnixSeconds;
use crate::link::LinkStatus;

/// Most links one page holds.
pub const MAX_PAGE: usize = 100;

/// The position after the last link of a page: the next page holds only links ordered after
/// it, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkCursor {
    /// `created_at` of the last link shown.
    pub created_at: UnixSeconds,
    /// Its code (ties on `created_at` are ordered by code, descending).
    pub code: String,
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
