//! What every store of links (embedded, PostgreSQL) and every sink of clicks implements.

use crate::audit::{AuditQuery, AuditRow, Origin};
use crate::day::{Day, UnixSeconds};
use crate::link::{Link, LinkChange, RedirectTarget, Refusal};
use crate::listing::{LinkQuery, PageOfLinks};
use crate::people::People;
use crate::report::{AutoDisable, NewReport, Report, ReportOutcome, ReportQuery, ResolveOutcome};
use crate::token::{Principal, TokenHash, TokenId};
use async_trait::async_trait;
use smol_str::SmolStr;
use std::ops::Range;
use std::sync::Arc;

/// A boxed error from a store's driver.
pub type DriverError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A store failure, saying whether it is worth retrying elsewhere or later.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store cannot be reached or is shutting down; callers answer 503.
    #[error("store unavailable: {0}")]
    Unavailable(#[source] DriverError),
    /// The store answered with an error.
    #[error("store error: {0}")]
    Backend(#[source] DriverError),
    /// Every generated id has been handed out.
    #[error("the space of generated codes is exhausted")]
    IdSpaceExhausted,
}

/// Result of a put-if-absent of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertOutcome {
    /// The link is stored durably.
    Inserted,
    /// A link with this code already exists; nothing was written.
    CodeTaken,
}

/// Links `shortener import` writes in one transaction, and where the import stands once
/// they are written.
#[derive(Debug, Clone)]
pub struct ImportBatch {
    /// New links (version 1, no clicks, neither disabled nor deleted), codes distinct within
    /// the batch.
    pub links: Vec<Link>,
    /// Who imports; every stored link gets its `created` audit row from it.
    pub origin: Origin,
    /// The meta key of this import's progress, set to `progress` in the same transaction.
    pub progress_key: String,
    /// Where the import stands after this batch (the importer's encoding).
    pub progress: Vec<u8>,
}

/// What [`LinkStore::import_links`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImportOutcome {
    /// Committed, progress included: per link of the batch, in order, whether it is stored
    /// (a custom alias already taken is `CodeTaken`, and nothing of it was written).
    Committed(Vec<InsertOutcome>),
    /// These links (indices) carry generated codes already taken: nothing at all was
    /// written. The importer gives them new codes and sends the batch again.
    GeneratedTaken(Vec<usize>),
}

/// What [`LinkStore::change_link`] did.
// A short-lived return value: boxing the links would cost more than the size difference.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeOutcome {
    /// Written, with its audit row and change note, in one transaction.
    Changed {
        /// The link before.
        before: Link,
        /// The link as now stored (version one higher).
        after: Link,
    },
    /// The change would change nothing; nothing was written.
    Unchanged(Link),
    /// Refused by the rule ([`Link::apply`]); nothing was written.
    Refused(Refusal),
}

/// One entry of the store's change sequence: `code` reached `version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeNote {
    /// Position in the sequence; consecutive, in commit order (notes written together may
    /// share one).
    pub seq: u64,
    /// The link.
    pub code: String,
    /// Its version after the change.
    pub version: u64,
}

/// A new API token, as stored.
#[derive(Debug, Clone)]
pub struct TokenRecord {
    /// Hash of the token; the token itself is never stored.
    pub hash: TokenHash,
    /// Who it belongs to.
    pub principal: Principal,
    /// When it was issued.
    pub created_at: UnixSeconds,
    /// The operator's label for it, if any.
    pub name: Option<String>,
}

/// A stored token as `token list` shows it: never its hash or secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    /// Its public id.
    pub id: TokenId,
    /// Who it belongs to.
    pub principal: Principal,
    /// The operator's label for it, if any.
    pub name: Option<String>,
    /// When it was issued.
    pub created_at: UnixSeconds,
    /// Roughly when it was last presented (see [`crate::token::LAST_USED_GRANULARITY`]).
    pub last_used_at: Option<UnixSeconds>,
}

impl TokenInfo {
    /// One line naming the token for people: kind, user, id and name.
    pub fn describe(&self) -> String {
        let kind = if self.principal.admin {
            "admin"
        } else {
            "user"
        };
        let mut line = format!("{kind} token {} for {}", self.id, self.principal.user);
        if let Some(name) = &self.name {
            line.push_str(&format!(" ({name})"));
        }
        line
    }
}

/// A presented token that the store knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundToken {
    /// Who it belongs to.
    pub principal: Principal,
    /// Roughly when it was last presented.
    pub last_used_at: Option<UnixSeconds>,
}

/// Clicks on one code on one UTC day, already summed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClickDelta {
    /// The link. Inline up to 23 bytes (a longer alias shares one allocation): a batch of
    /// tens of thousands of codes allocates none.
    pub code: SmolStr,
    /// The UTC day of the clicks.
    pub day: Day,
    /// Clicks by people.
    pub human: u64,
    /// Clicks by bots and link previews.
    pub bot: u64,
    /// Who the people were: visitors and breakdowns (none for bots). Boxed: most deltas
    /// have none, and a batch holds one delta per code clicked since the last.
    pub people: Option<Box<People>>,
}

impl ClickDelta {
    /// The people of these clicks, if any were counted.
    pub fn people(&self) -> Option<&People> {
        self.people.as_deref().filter(|people| !people.is_empty())
    }
}

/// Deltas shipped together under one id: applying a batch twice counts it once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClickBatch {
    /// Unique per batch, chosen by whoever assembled it.
    pub id: String,
    /// Its clicks.
    pub deltas: Vec<ClickDelta>,
}

/// One day of analytics as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DailyCount {
    /// The UTC day.
    pub day: Day,
    /// Clicks by people.
    pub human: u64,
    /// Clicks by bots.
    pub bot: u64,
    /// Visitors and breakdowns of the people.
    pub people: People,
}

/// Durable storage of links, id blocks and tokens.
///
/// Every write that returns `Ok` is durable: a crash right after it loses nothing.
#[async_trait]
pub trait LinkStore: Send + Sync + 'static {
    /// Atomically takes the next `count` ids from the store's one counter. Concurrent callers,
    /// in this process or any other, always get disjoint ranges.
    async fn lease_ids(&self, count: u64) -> Result<Range<u64>, StoreError>;

    /// Returns the key of the code permutation, storing `candidate` first if there is none.
    /// Every caller gets the same key, whoever came first.
    async fn code_key(&self, candidate: [u8; 16]) -> Result<[u8; 16], StoreError> {
        self.secret("code_key", candidate.to_vec())
            .await?
            .try_into()
            .map_err(|_| StoreError::Backend("the stored code key is not 16 bytes".into()))
    }

    /// The secret stored under `name`, storing `candidate` first if there is none (the
    /// code key, the CAPTCHA key). Every caller, in any process, gets the same bytes.
    async fn secret(&self, name: &'static str, candidate: Vec<u8>) -> Result<Vec<u8>, StoreError>;

    /// Spends the one-time `token` (a solved CAPTCHA challenge) until `until`: `false` when
    /// it was spent before, by any process on this store. Forgets a few tokens whose time
    /// passed on the way, so the table stays as small as the tokens still valid.
    async fn spend_once(
        &self,
        token: &str,
        until: UnixSeconds,
        now: UnixSeconds,
    ) -> Result<bool, StoreError>;

    /// Takes the lease `name` for `holder` until `until` to do `work` (a job's fingerprint):
    /// `false` while another holder's lease runs, or when `work` is what the last holder
    /// finished, so that of several processes on this store one does each piece of work.
    async fn take_lease(
        &self,
        name: &str,
        holder: &str,
        work: &str,
        until: UnixSeconds,
        now: UnixSeconds,
    ) -> Result<bool, StoreError>;

    /// Ends `holder`'s lease `name`, recording `done` as finished work when it is given (a
    /// failed job leaves it for the next holder).
    async fn end_lease(
        &self,
        name: &str,
        holder: &str,
        done: Option<&str>,
    ) -> Result<(), StoreError>;

    /// Stores `link` unless its code exists (put-if-absent, never read-then-write), with its
    /// `created` audit row in the same transaction.
    async fn insert_link(&self, link: &Link, origin: &Origin) -> Result<InsertOutcome, StoreError>;

    /// Stores the batch's links whose codes are free, each with its `created` audit row, and
    /// its progress, all in one transaction (see [`ImportOutcome`]). Shared, so that a store
    /// writing on a thread of its own need not copy hundreds of thousands of links.
    async fn import_links(&self, batch: Arc<ImportBatch>) -> Result<ImportOutcome, StoreError>;

    /// An import has stored its last batch: brings what the store knows about the tables an
    /// import fills (statistics, which pages are all-visible) up to date, where the store
    /// keeps such knowledge, instead of leaving it to a background job that may run later or
    /// never. Whole tables: its cost grows with what was written since they were last
    /// brought up to date. What it ran, if anything, for the import to report.
    async fn after_import(&self) -> Result<Option<&'static str>, StoreError>;

    /// The value stored under `key` in the store's meta table, if any.
    async fn meta(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError>;

    /// The link with this code, whatever its status.
    async fn get_link(&self, code: &str) -> Result<Option<Link>, StoreError>;

    /// What a redirect needs of the link with this code ([`Link::redirect_target`] of what
    /// [`Self::get_link`] would return), read without its click counts: the caches' loads.
    async fn redirect_target(&self, code: &str) -> Result<Option<RedirectTarget>, StoreError>;

    /// [`Self::redirect_target`] of each of `codes`, in their order: one read where the store
    /// can (a poller refreshing the shared cache after an import reads thousands at a time).
    async fn redirect_targets(
        &self,
        codes: &[String],
    ) -> Result<Vec<Option<RedirectTarget>>, StoreError> {
        let mut targets = Vec::with_capacity(codes.len());
        for code in codes {
            targets.push(self.redirect_target(code).await?);
        }
        Ok(targets)
    }

    /// A page of links matching `query`, newest first (`created_at`, then creation order,
    /// both descending); never a deleted one.
    async fn list_links(&self, query: &LinkQuery) -> Result<PageOfLinks, StoreError>;

    /// Applies `change` by `origin` at `now` under the one rule ([`Link::apply`]) in one
    /// transaction that also appends its audit row and its note to the change sequence.
    async fn change_link(
        &self,
        code: &str,
        change: &LinkChange,
        origin: &Origin,
        now: UnixSeconds,
    ) -> Result<ChangeOutcome, StoreError>;

    /// The last position of the change sequence (0 when nothing ever changed).
    async fn last_change(&self) -> Result<u64, StoreError>;

    /// The notes after position `seq`, in order, of whole positions (one may hold several
    /// notes: a PostgreSQL group of creates), until `limit` notes are reached: fewer than
    /// `limit` means there are no more.
    async fn changes_after(&self, seq: u64, limit: usize) -> Result<Vec<ChangeNote>, StoreError>;

    /// Gives the next positions of the sequence to the notes written without one (creates and
    /// imports on PostgreSQL, whose groups would otherwise queue on the sequence's row through
    /// their commits), in one transaction holding that row; returns how many positions. Until
    /// then [`Self::changes_after`] does not return them. The embedded store numbers every note
    /// as it writes it (0).
    async fn number_pending_changes(&self) -> Result<u64, StoreError>;

    /// Forgets up to `batch` positions of change notes written before `at` (embedded creates
    /// write one each, so an hour's can be many); returns how many went.
    async fn prune_changes_before(&self, at: UnixSeconds, batch: usize) -> Result<u64, StoreError>;

    /// Up to `limit` (code, destination) pairs of links neither disabled nor deleted, with
    /// codes after `after`, in code order (a sweep's batches).
    async fn live_destinations_after(
        &self,
        after: &str,
        limit: usize,
    ) -> Result<Vec<(String, String)>, StoreError>;

    /// One page of the audit trail.
    async fn audit(&self, query: &AuditQuery) -> Result<Vec<AuditRow>, StoreError>;

    /// Deletes up to `batch` audit rows older than `at` (retention, the only deletion of
    /// audit rows); returns how many went.
    async fn prune_audit_before(&self, at: UnixSeconds, batch: usize) -> Result<u64, StoreError>;

    /// Daily counts of one code from `since` on, in any order; days with no clicks may be
    /// missing.
    async fn daily_clicks(&self, code: &str, since: Day) -> Result<Vec<DailyCount>, StoreError>;

    /// Files a report on an existing link with its audit row and, when `auto` is set and
    /// [`AutoDisable::disables`] says so, disables the link as `auto-reports` (audit row,
    /// change note), all in one transaction. Reports made before the link's last enable do
    /// not count.
    async fn insert_report(
        &self,
        report: &NewReport,
        origin: &Origin,
        auto: Option<AutoDisable>,
    ) -> Result<ReportOutcome, StoreError>;

    /// One page of the report queue.
    async fn reports(&self, query: &ReportQuery) -> Result<Vec<Report>, StoreError>;

    /// Resolves an open report.
    async fn resolve_report(
        &self,
        id: i64,
        resolution: &crate::report::Resolution,
    ) -> Result<ResolveOutcome, StoreError>;

    /// Stores a new token, with its audit row in the same transaction.
    async fn insert_token(&self, token: &TokenRecord, origin: &Origin) -> Result<(), StoreError>;

    /// Who owns the token with this hash, if anyone. This is the only way a request's token
    /// is checked (nothing caches it), so a revoked token fails on every instance at once.
    async fn find_token(&self, hash: &TokenHash) -> Result<Option<FoundToken>, StoreError>;

    /// Records a use of the token at `at` (callers write only when
    /// [`crate::token::last_use_is_stale`]).
    async fn touch_token(&self, hash: &TokenHash, at: UnixSeconds) -> Result<(), StoreError>;

    /// Every token, oldest first.
    async fn list_tokens(&self) -> Result<Vec<TokenInfo>, StoreError>;

    /// Deletes the token with this id, with its `token_revoked` audit row in the same
    /// transaction; `None` when no token has the id.
    async fn revoke_token(
        &self,
        id: TokenId,
        origin: &Origin,
        at: UnixSeconds,
    ) -> Result<Option<TokenInfo>, StoreError>;

    /// Checks that the store answers.
    async fn ping(&self) -> Result<(), StoreError>;
}

/// Where aggregated clicks go.
#[async_trait]
pub trait ClickSink: Send + Sync + 'static {
    /// Adds every delta to its day and to its link's running totals, and merges its people
    /// into the day's (trimmed to the top values), all in one atomic write: either every
    /// delta counts or none does. Deltas for unknown codes are ignored. The batch is given,
    /// not lent: a store that writes on a thread of its own takes it there without copying
    /// (tens of thousands of deltas a second under a spread-out load).
    async fn apply_clicks(&self, deltas: Vec<ClickDelta>) -> Result<(), StoreError>;

    /// Applies every batch whose id was never applied before, and records the ids, all in
    /// one atomic write; returns how many batches were new. Replaying a batch (a retried
    /// send, a redelivered stream entry) changes nothing.
    async fn apply_click_batches(&self, batches: &[ClickBatch]) -> Result<usize, StoreError>;

    /// Forgets daily counts older than `day` (totals stay), and the ids of batches applied
    /// before it; returns how many rows of counts went.
    async fn prune_clicks_before(&self, day: Day) -> Result<u64, StoreError>;
}
