//! Abuse reports and the automatic disable they can trigger.

use crate::day::UnixSeconds;
use crate::link::{Disable, Link, LinkStatus};

/// Longest comment of a report, in characters.
pub const MAX_COMMENT_CHARS: usize = 1000;
/// Longest resolution of a report, in characters.
pub const MAX_RESOLUTION_CHARS: usize = 500;
/// Reports count towards an automatic disable for this long.
pub const AUTO_DISABLE_WINDOW_SECONDS: i64 = 24 * 3600;
/// The system actor of automatic disables.
pub const AUTO_REPORTS_ACTOR: &str = "auto-reports";

/// What a link is reported for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    /// Pretends to be someone else to take credentials.
    Phishing,
    /// Serves malicious software.
    Malware,
    /// Unsolicited advertising.
    Spam,
    /// Anything else (say what in the comment).
    Other,
}

impl Category {
    /// Every category.
    pub const ALL: [Self; 4] = [Self::Phishing, Self::Malware, Self::Spam, Self::Other];

    /// The name used in the API and the store.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Phishing => "phishing",
            Self::Malware => "malware",
            Self::Spam => "spam",
            Self::Other => "other",
        }
    }

    /// The inverse of [`Self::as_str`].
    ///
    /// ```
    /// use shortener_core::report::Category;
    /// assert_eq!(Category::parse("spam"), Some(Category::Spam));
    /// assert_eq!(Category::parse("Spam"), None);
    /// ```
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == name)
    }
}

/// A report as filed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewReport {
    /// The link reported.
    pub code: String,
    /// When.
    pub at: UnixSeconds,
    /// The reporter's address: reports count once per distinct address.
    pub ip: String,
    /// What for.
    pub category: Category,
    /// Optional free text, at most [`MAX_COMMENT_CHARS`].
    pub comment: Option<String>,
}

/// When filing a report disables its link: `threshold` reports from distinct addresses
/// within [`AUTO_DISABLE_WINDOW_SECONDS`], none of them made before the link's last enable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoDisable {
    /// `--auto-disable-reports`.
    pub threshold: u32,
}

impl AutoDisable {
    /// Whether `link`, with `distinct_reporters` counting, is disabled now. Links of admins
    /// are never disabled automatically, nor links that do not redirect anyway.
    ///
    /// ```
    /// use shortener_core::link::Link;
    /// use shortener_core::report::AutoDisable;
    /// let auto = AutoDisable { threshold: 5 };
    /// let mut link = Link::new("abcdefg", "https://example.com/", 0, 100);
    /// assert!(!auto.disables(&link, 4, 10));
    /// assert!(auto.disables(&link, 5, 10));
    /// link.owner_admin = true;
    /// assert!(!auto.disables(&link, 50, 10));
    /// ```
    pub fn disables(&self, link: &Link, distinct_reporters: u64, now: UnixSeconds) -> bool {
        !link.owner_admin
            && link.status(now) == LinkStatus::Active
            && distinct_reporters >= u64::from(self.threshold)
    }

    /// The reason recorded with an automatic disable.
    pub fn reason(&self, distinct_reporters: u64) -> String {
        format!("pending review: reported from {distinct_reporters} distinct addresses within 24 h")
    }
}

/// What filing a report did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReportOutcome {
    /// No such link; nothing was written.
    NotFound,
    /// Stored with its audit row; `disabled` is the link as the report's automatic disable
    /// left it, in the same transaction.
    Filed {
        /// The report's id.
        id: i64,
        /// Set when this report disabled the link.
        disabled: Option<Box<Link>>,
    },
}

/// A stored report, with the state of its link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Assigned by the store, increasing.
    pub id: i64,
    /// The report as filed.
    pub filed: NewReport,
    /// Set once an admin resolved it.
    pub resolution: Option<Resolution>,
    /// The link's disable, if it is disabled now.
    pub link_disabled: Option<Disable>,
    /// Whether the link is deleted now.
    pub link_deleted: bool,
}

/// How an admin closed a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    /// When.
    pub at: UnixSeconds,
    /// Who.
    pub by: String,
    /// What they decided, in their words.
    pub text: String,
}

/// A page of the report queue, newest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportQuery {
    /// Open (unresolved) reports, or resolved ones.
    pub open: bool,
    /// Only ids below this one (the cursor).
    pub before: Option<i64>,
    /// At most this many.
    pub limit: usize,
}

/// What resolving a report did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolveOutcome {
    /// No such report.
    NotFound,
    /// It was resolved before; nothing changed.
    AlreadyResolved(Report),
    /// Resolved now.
    Resolved(Report),
}
