//! The link model: its state, its version, and the one rule of how it may change.

use crate::day::UnixSeconds;

/// Default lifetime of a link: five years.
pub const DEFAULT_EXPIRES_IN_DAYS: u32 = 1825;
/// Accepted range of `expires_in_days`.
pub const EXPIRES_IN_DAYS: std::ops::RangeInclusive<u32> = 1..=3650;
/// Longest reason of a disable.
pub const MAX_REASON_CHARS: usize = 500;

/// A stored short link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The generated code or custom alias; the key.
    pub code: String,
    /// Where the redirect sends people (already validated and normalised).
    pub long_url: String,
    /// The user that created it; `None` for anonymous links.
    pub owner: Option<String>,
    /// Whether it was created with an admin token (never disabled automatically).
    pub owner_admin: bool,
    /// Whether `code` was chosen by the user.
    pub custom_alias: bool,
    /// Creation instant.
    pub created_at: UnixSeconds,
    /// From this instant on the link answers 404.
    pub expires_at: UnixSeconds,
    /// 1 at creation, one more at every change of what a redirect answers (disable, enable,
    /// delete, edit). Every cache layer keeps the highest version it has seen of a code.
    pub version: u64,
    /// Set while the link is disabled (410, reversible by an enable).
    pub disabled: Option<Disable>,
    /// When the link was deleted: 410 for good, its code never reused.
    pub deleted_at: Option<UnixSeconds>,
    /// Clicks by people, eventually consistent.
    pub clicks: u64,
    /// Clicks by known bots and link previews, eventually consistent.
    pub bot_clicks: u64,
    /// Address the creation request came from.
    pub created_ip: Option<String>,
}

/// What a redirect needs of a stored link, and all the caches keep of it: no owner, no
/// click counts, no details of a disable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedirectTarget {
    /// Where the redirect sends people.
    pub long_url: String,
    /// From this instant on the link answers 404.
    pub expires_at: UnixSeconds,
    /// The link's version ([`Link::version`]).
    pub version: u64,
    /// Whether the link is disabled (410 until enabled).
    pub disabled: bool,
    /// Whether the link is deleted (410 for good).
    pub deleted: bool,
}

/// Why and by whom a link is disabled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disable {
    /// When.
    pub at: UnixSeconds,
    /// Why, as given by whoever disabled it.
    pub reason: String,
    /// The actor's name (a user, or a system actor such as `auto-reports`).
    pub by: String,
    /// What kind of actor: an owner's disable is theirs to undo, an admin's or the system's
    /// only an admin's.
    pub by_kind: ActorKind,
}

/// Lifecycle state of a link at a given instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkStatus {
    /// Redirects.
    Active,
    /// Past its expiry: 404.
    Expired,
    /// Disabled by its owner, an admin or the system: 410 until enabled.
    Disabled,
    /// Deleted: 410 for good.
    Deleted,
}

impl LinkStatus {
    /// The name used in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Expired => "expired",
            Self::Disabled => "disabled",
            Self::Deleted => "deleted",
        }
    }
}

/// Who acts on a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActorKind {
    /// A request without a token.
    Anonymous,
    /// A user's token (owners of their links).
    User,
    /// An admin token or the operator's CLI.
    Admin,
    /// The service itself (`auto-reports`, `threat-feed`).
    System,
}

impl ActorKind {
    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Anonymous => "anonymous",
            Self::User => "user",
            Self::Admin => "admin",
            Self::System => "system",
        }
    }

    /// The inverse of [`Self::as_str`].
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "anonymous" => Self::Anonymous,
            "user" => Self::User,
            "admin" => Self::Admin,
            "system" => Self::System,
            _ => return None,
        })
    }
}

/// An actor: a name and what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    /// A user name, `anonymous`, or a system actor's name.
    pub name: String,
    /// What kind of actor it is.
    pub kind: ActorKind,
}

impl Actor {
    /// A request without a token.
    pub fn anonymous() -> Self {
        Self {
            name: "anonymous".to_owned(),
            kind: ActorKind::Anonymous,
        }
    }

    /// The service itself, under a name of its own (`auto-reports`, `threat-feed`).
    pub fn system(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            kind: ActorKind::System,
        }
    }

    /// The bearer of a token.
    pub fn of(principal: &crate::token::Principal) -> Self {
        Self {
            name: principal.user.clone(),
            kind: if principal.admin {
                ActorKind::Admin
            } else {
                ActorKind::User
            },
        }
    }

    fn sees_everything(&self) -> bool {
        matches!(self.kind, ActorKind::Admin | ActorKind::System)
    }
}

/// A change of a link's state. Part of one store transaction with its audit row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkChange {
    /// Reversible: 410 until enabled.
    Disable {
        /// Why; shown in the link's metadata and the audit trail.
        reason: String,
    },
    /// Redirects again.
    Enable,
    /// For good: 410, never enabled again, the code never reused.
    Delete,
    /// A new destination and/or expiry (already validated); a disabled link stays disabled.
    Edit {
        /// The new destination.
        long_url: Option<String>,
        /// The new expiry instant.
        expires_at: Option<UnixSeconds>,
    },
}

/// Why a change was refused; nothing was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No such link, or not the actor's to see (a non-owner learns nothing more).
    #[error("no such link")]
    NotFound,
    /// The owner may not enable a link an admin or the system disabled.
    #[error("only an admin may enable a link an admin or the system disabled")]
    Forbidden,
    /// A deleted link stays deleted.
    #[error("the link is deleted")]
    Deleted,
}

impl Link {
    /// The state at `now`; deleted wins over disabled, which wins over expired.
    ///
    /// ```
    /// use shortener_core::link::{Link, LinkStatus};
    /// let mut link = Link::new("abcdefg", "https://example.com/", 0, 100);
    /// assert_eq!(link.status(99), LinkStatus::Active);
    /// assert_eq!(link.status(100), LinkStatus::Expired);
    /// link.deleted_at = Some(50);
    /// assert_eq!(link.status(60), LinkStatus::Deleted);
    /// ```
    pub fn status(&self, now: UnixSeconds) -> LinkStatus {
        if self.deleted_at.is_some() {
            LinkStatus::Deleted
        } else if self.disabled.is_some() {
            LinkStatus::Disabled
        } else if now >= self.expires_at {
            LinkStatus::Expired
        } else {
            LinkStatus::Active
        }
    }

    /// What a redirect needs of this link.
    pub fn redirect_target(&self) -> RedirectTarget {
        RedirectTarget {
            long_url: self.long_url.clone(),
            expires_at: self.expires_at,
            version: self.version,
            disabled: self.disabled.is_some(),
            deleted: self.deleted_at.is_some(),
        }
    }

    /// A fresh, anonymous, active link at version 1.
    pub fn new(
        code: &str,
        long_url: &str,
        created_at: UnixSeconds,
        expires_at: UnixSeconds,
    ) -> Self {
        Self {
            code: code.to_owned(),
            long_url: long_url.to_owned(),
            owner: None,
            owner_admin: false,
            custom_alias: false,
            created_at,
            expires_at,
            version: 1,
            disabled: None,
            deleted_at: None,
            clicks: 0,
            bot_clicks: 0,
            created_ip: None,
        }
    }

    /// Whether `principal` may read or change this link: its owner or any admin.
    pub fn visible_to(&self, principal: &crate::token::Principal) -> bool {
        principal.admin || self.owner.as_deref() == Some(principal.user.as_str())
    }

    /// The link after `actor` applies `change` at `now`: `Ok(None)` when it changes nothing
    /// (disabling a disabled link, enabling an active one, deleting a deleted one). Every
    /// store runs this one rule inside the transaction that writes its outcome.
    ///
    /// ```
    /// use shortener_core::link::{Actor, ActorKind, Link, LinkChange, Refusal};
    /// let mut link = Link::new("abcdefg", "https://example.com/", 0, 100);
    /// link.owner = Some("alice".into());
    /// let alice = Actor { name: "alice".into(), kind: ActorKind::User };
    /// let admin = Actor { name: "root".into(), kind: ActorKind::Admin };
    /// let disable = LinkChange::Disable { reason: "phishing".into() };
    /// let disabled = link.apply(&disable, &admin, 5).unwrap().unwrap();
    /// assert_eq!(disabled.version, 2);
    /// assert_eq!(disabled.apply(&LinkChange::Enable, &alice, 6), Err(Refusal::Forbidden));
    /// let enabled = disabled.apply(&LinkChange::Enable, &admin, 6).unwrap().unwrap();
    /// assert_eq!((enabled.version, enabled.disabled), (3, None));
    /// ```
    pub fn apply(
        &self,
        change: &LinkChange,
        actor: &Actor,
        now: UnixSeconds,
    ) -> Result<Option<Link>, Refusal> {
        let owns =
            self.owner.as_deref() == Some(actor.name.as_str()) && actor.kind == ActorKind::User;
        if !(owns || actor.sees_everything()) {
            return Err(Refusal::NotFound);
        }
        if self.deleted_at.is_some() {
            return match change {
                LinkChange::Delete => Ok(None),
                _ => Err(Refusal::Deleted),
            };
        }
        let mut next = self.clone();
        match change {
            LinkChange::Disable { .. } if self.disabled.is_some() => return Ok(None),
            LinkChange::Disable { reason } => {
                next.disabled = Some(Disable {
                    at: now,
                    reason: reason.clone(),
                    by: actor.name.clone(),
                    by_kind: actor.kind,
                });
            }
            LinkChange::Enable => match &self.disabled {
                None => return Ok(None),
                Some(d) if actor.kind == ActorKind::User && d.by_kind != ActorKind::User => {
                    return Err(Refusal::Forbidden);
                }
                Some(_) => next.disabled = None,
            },
            LinkChange::Delete => next.deleted_at = Some(now),
            LinkChange::Edit {
                long_url,
                expires_at,
            } => {
                if let Some(url) = long_url {
                    next.long_url.clone_from(url);
                }
                if let Some(at) = expires_at {
                    next.expires_at = *at;
                }
                if next == *self {
                    return Ok(None);
                }
            }
        }
        next.version = self.version + 1;
        Ok(Some(next))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned() -> Link {
        Link {
            owner: Some("alice".into()),
            ..Link::new("abcdefg", "https://example.com/", 0, 1_000)
        }
    }

    fn user(name: &str) -> Actor {
        Actor {
            name: name.into(),
            kind: ActorKind::User,
        }
    }

    fn disable() -> LinkChange {
        LinkChange::Disable {
            reason: "spam".into(),
        }
    }

    #[test]
    fn others_and_anonymous_learn_nothing() {
        for actor in [user("bob"), Actor::anonymous()] {
            assert_eq!(owned().apply(&disable(), &actor, 1), Err(Refusal::NotFound));
        }
    }

    #[test]
    fn an_owner_undoes_their_own_disable_only() {
        let by_owner = owned()
            .apply(&disable(), &user("alice"), 1)
            .unwrap()
            .unwrap();
        assert_eq!(
            by_owner.disabled.as_ref().map(|d| d.by_kind),
            Some(ActorKind::User)
        );
        assert!(
            by_owner
                .apply(&LinkChange::Enable, &user("alice"), 2)
                .unwrap()
                .is_some()
        );
        let by_system = owned()
            .apply(&disable(), &Actor::system("auto-reports"), 1)
            .unwrap()
            .unwrap();
        assert_eq!(
            by_system.apply(&LinkChange::Enable, &user("alice"), 2),
            Err(Refusal::Forbidden)
        );
    }

    #[test]
    fn no_op_changes_keep_the_version_and_deleted_is_final() {
        let admin = Actor {
            name: "root".into(),
            kind: ActorKind::Admin,
        };
        assert_eq!(owned().apply(&LinkChange::Enable, &admin, 1), Ok(None));
        let deleted = owned()
            .apply(&LinkChange::Delete, &admin, 1)
            .unwrap()
            .unwrap();
        assert_eq!(deleted.version, 2);
        assert_eq!(deleted.status(2), LinkStatus::Deleted);
        assert_eq!(deleted.apply(&LinkChange::Delete, &admin, 2), Ok(None));
        assert_eq!(
            deleted.apply(&LinkChange::Enable, &admin, 2),
            Err(Refusal::Deleted)
        );
        assert_eq!(deleted.apply(&disable(), &admin, 2), Err(Refusal::Deleted));
    }

    #[test]
    fn an_edit_raises_the_version_unless_it_changes_nothing() {
        let edit = |url: &str| LinkChange::Edit {
            long_url: Some(url.into()),
            expires_at: None,
        };
        let alice = user("alice");
        assert_eq!(
            owned().apply(&edit("https://example.com/"), &alice, 1),
            Ok(None)
        );
        let edited = owned()
            .apply(&edit("https://example.org/"), &alice, 1)
            .unwrap()
            .unwrap();
        assert_eq!(
            (edited.version, edited.long_url.as_str()),
            (2, "https://example.org/")
        );
        assert_eq!(
            owned().apply(&edit("https://example.org/"), &user("bob"), 1),
            Err(Refusal::NotFound)
        );
        let disabled = owned().apply(&disable(), &alice, 1).unwrap().unwrap();
        let still = disabled
            .apply(&edit("https://example.org/"), &alice, 2)
            .unwrap()
            .unwrap();
        assert!(still.disabled.is_some());
        let deleted = owned()
            .apply(&LinkChange::Delete, &alice, 1)
            .unwrap()
            .unwrap();
        assert_eq!(
            deleted.apply(&edit("https://example.org/"), &alice, 2),
            Err(Refusal::Deleted)
        );
    }
}
