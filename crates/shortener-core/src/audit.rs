//! The audit trail: one append-only row per change, written by the store in the transaction
//! of the change itself. Rows are built here, once, for every store.

use crate::day::UnixSeconds;
use crate::link::{Actor, Link, LinkChange};

/// Default of `--audit-retention-days`.
pub const DEFAULT_RETENTION_DAYS: u32 = 400;
/// Most rows one page of the audit holds.
pub const MAX_PAGE: usize = 500;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditAction {
    /// A link was created.
    Created,
    /// Its destination or expiry changed.
    Edited,
    /// It was disabled (reason in the row).
    Disabled,
    /// It was enabled again.
    Enabled,
    /// It was deleted.
    Deleted,
    /// Someone reported it.
    Reported,
    /// A token was issued.
    TokenIssued,
    /// A token was revoked.
    TokenRevoked,
}

impl AuditAction {
    /// Every action, for documents and validation.
    pub const ALL: [Self; 8] = [
        Self::Created,
        Self::Edited,
        Self::Disabled,
        Self::Enabled,
        Self::Deleted,
        Self::Reported,
        Self::TokenIssued,
        Self::TokenRevoked,
    ];

    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Edited => "edited",
            Self::Disabled => "disabled",
            Self::Enabled => "enabled",
            Self::Deleted => "deleted",
            Self::Reported => "reported",
            Self::TokenIssued => "token_issued",
            Self::TokenRevoked => "token_revoked",
        }
    }

    /// The inverse of [`Self::as_str`].
    ///
    /// ```
    /// use shortener_core::audit::AuditAction;
    /// for a in AuditAction::ALL {
    ///     assert_eq!(AuditAction::parse(a.as_str()), Some(a));
    /// }
    /// assert_eq!(AuditAction::parse("created "), None);
    /// ```
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.as_str() == name)
    }
}

/// Who asked for a change, and from where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// The actor.
    pub actor: Actor,
    /// The client's address; `None` for the CLI and the service itself.
    pub ip: Option<String>,
    /// The client's User-Agent, if it sent one.
    pub user_agent: Option<String>,
}

impl Origin {
    /// The service itself (`auto-reports`, `threat-feed`).
    pub fn system(name: &str) -> Self {
        Self {
            actor: Actor::system(name),
            ip: None,
            user_agent: None,
        }
    }
}

/// A row of the audit trail, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRecord {
    /// When.
    pub at: UnixSeconds,
    /// Who: a user name, `anonymous`, or a system actor.
    pub actor: String,
    /// The client's address.
    pub ip: Option<String>,
    /// The client's User-Agent.
    pub user_agent: Option<String>,
    /// What.
    pub action: AuditAction,
    /// The link concerned, if any.
    pub code: Option<String>,
    /// The destination before (edits) or at the time (other link actions).
    pub old_url: Option<String>,
    /// The destination after a create or an edit.
    pub new_url: Option<String>,
    /// The reason of a disable, the category of a report, the user of a token.
    pub detail: Option<String>,
}

impl AuditRecord {
    fn new(origin: &Origin, at: UnixSeconds, action: AuditAction) -> Self {
        Self {
            at,
            actor: origin.actor.name.clone(),
            ip: origin.ip.clone(),
            user_agent: origin.user_agent.clone(),
            action,
            code: None,
            old_url: None,
            new_url: None,
            detail: None,
        }
    }

    /// The row of a create.
    pub fn created(link: &Link, origin: &Origin) -> Self {
        Self {
            code: Some(link.code.clone()),
            new_url: Some(link.long_url.clone()),
            ..Self::new(origin, link.created_at, AuditAction::Created)
        }
    }

    /// The row of `change` taking `before` to `after` at `at`.
    pub fn changed(
        before: &Link,
        after: &Link,
        change: &LinkChange,
        origin: &Origin,
        at: UnixSeconds,
    ) -> Self {
        let (action, detail) = match change {
            LinkChange::Disable { reason } => (AuditAction::Disabled, Some(reason.clone())),
            LinkChange::Enable => (AuditAction::Enabled, None),
            LinkChange::Delete => (AuditAction::Deleted, None),
            LinkChange::Edit { .. } => (
                AuditAction::Edited,
                (before.expires_at != after.expires_at).then(|| {
                    format!(
                        "expires_at {} -> {}",
                        crate::day::rfc3339(before.expires_at),
                        crate::day::rfc3339(after.expires_at)
                    )
                }),
            ),
        };
        Self {
            code: Some(after.code.clone()),
            old_url: Some(before.long_url.clone()),
            new_url: (before.long_url != after.long_url).then(|| after.long_url.clone()),
            detail,
            ..Self::new(origin, at, action)
        }
    }

    /// The row of a report on `link`.
    pub fn reported(link: &Link, report: &crate::report::NewReport, origin: &Origin) -> Self {
        Self {
            code: Some(link.code.clone()),
            old_url: Some(link.long_url.clone()),
            detail: Some(report.category.as_str().to_owned()),
            ..Self::new(origin, report.at, AuditAction::Reported)
        }
    }

    /// The row of a token issued.
    pub fn token_issued(token: &crate::store::TokenRecord, origin: &Origin) -> Self {
        let info = crate::store::TokenInfo {
            id: token.hash.public_id(),
            principal: token.principal.clone(),
            name: token.name.clone(),
            created_at: token.created_at,
            last_used_at: None,
        };
        Self {
            detail: Some(info.describe()),
            ..Self::new(origin, token.created_at, AuditAction::TokenIssued)
        }
    }

    /// The row of a token revoked.
    pub fn token_revoked(
        token: &crate::store::TokenInfo,
        origin: &Origin,
        at: UnixSeconds,
    ) -> Self {
        Self {
            detail: Some(token.describe()),
            ..Self::new(origin, at, AuditAction::TokenRevoked)
        }
    }
}

/// A stored row: its id orders the trail (higher is newer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRow {
    /// Assigned by the store, increasing.
    pub id: i64,
    /// The row.
    pub record: AuditRecord,
}

/// A page of the trail: rows matching every set filter, newest first, with ids below
/// `before` (the cursor of the previous page).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditQuery {
    /// Only this link.
    pub code: Option<String>,
    /// Only this actor.
    pub actor: Option<String>,
    /// Only this action.
    pub action: Option<AuditAction>,
    /// From this instant on (inclusive).
    pub since: Option<UnixSeconds>,
    /// Before this instant (exclusive).
    pub until: Option<UnixSeconds>,
    /// Only ids below this one.
    pub before: Option<i64>,
    /// At most this many rows (1 to [`MAX_PAGE`]).
    pub limit: usize,
}
