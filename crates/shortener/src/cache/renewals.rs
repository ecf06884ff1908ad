//! Unknown codes read again before they expire, off the request path (refresh ahead).
//!
//! A code the store did not know is answered from its room until its lifetime ends
//! ([`CacheSettings::unknown_until`]); then the next request for it reads the store on the
//! request path. Under a crawler's steady sweep that is every code of the sweep, within the
//! quarter of the TTL their lifetimes spread over, each a store read behind a request (the
//! bench's unknown-code round that crossed the TTL read 0.55–0.89 of bare, BENCHMARKS.md).
//! A lookup that finds an unknown code in the last quarter of its lifetime claims it here
//! (one bit of a small table: later lookups of a claimed code read that bit and go on) and
//! queues it; every [`RENEWAL_TICK`], [`LinkCache::renew_unknown`] reads the queue in batches
//! (not a wake-up and a thread hop per handful of codes) and stores the codes still unknown
//! again with a lifetime counted from the read, under the generation loaded
//! before it, as a miss does: a write racing the renewal leaves the renewed entry stale.
//! Codes nobody asks for in that quarter expire as before.

use super::{CacheSettings, LinkCache, l2};
use shortener_core::day::UnixSeconds;
use shortener_core::store::StoreError;
use smol_str::SmolStr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Claim bits: codes in flight at once at most (a code whose bit another holds waits for
/// its next lookup), so the queue needs no bound of its own (at most 64 Ki codes, ~5 MiB for
/// the longest aliases, outside `--cache-mb`; the bits are 8 KiB).
const CLAIMS: usize = 1 << 16;
/// Codes read in one store call.
const RENEWED_AT_ONCE: usize = 1000;
/// How often [`LinkCache::renew_unknown`] should run: at most half of the last quarter of a
/// negative lifetime (at least a second) in which a queued code waits for it.
pub(crate) const RENEWAL_TICK: Duration = Duration::from_millis(500);

/// A claimed code waiting to be read again.
#[derive(Debug)]
struct Due {
    code: SmolStr,
    hash: u64,
}

/// Claimed codes and the queue they wait in.
#[derive(Debug)]
pub(super) struct Renewals {
    claimed: Box<[AtomicU64]>,
    queue: Mutex<Vec<Due>>,
}

impl Default for Renewals {
    fn default() -> Self {
        Self {
            claimed: (0..CLAIMS / 64).map(|_| AtomicU64::new(0)).collect(),
            queue: Mutex::default(),
        }
    }
}

/// The word and bit that claim a code of `hash`: from all of its bits mixed, so that codes
/// sharing a bucket of negatives or a lifetime (both from slices of the hash) claim apart.
fn claim_bit(hash: u64) -> (usize, u64) {
    let bit = (hash.wrapping_mul(0xD1B5_4A32_D192_ED03) >> 48) as usize % CLAIMS;
    (bit / 64, 1 << (bit % 64))
}

impl CacheSettings {
    /// Whether an unknown code served until `fresh_until` is due to be read again at `now`:
    /// in the last quarter of the negative TTL before it expires.
    pub(super) fn renewal_due(&self, fresh_until: UnixSeconds, now: UnixSeconds) -> bool {
        let quarter = i64::try_from(self.negative_quarter()).unwrap_or(i64::MAX);
        quarter > 0 && now >= fresh_until.saturating_sub(quarter)
    }
}

impl Renewals {
    /// Queues `code` unless it (or a code sharing its bit) is already claimed.
    pub(super) fn claim(&self, code: &str, hash: u64) {
        let (word, bit) = claim_bit(hash);
        let word = &self.claimed[word];
        // A load first: the lookups of a claimed code write nothing.
        if word.load(Ordering::Relaxed) & bit != 0
            || word.fetch_or(bit, Ordering::AcqRel) & bit != 0
        {
            return;
        }
        let due = Due {
            code: SmolStr::new(code),
            hash,
        };
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(due);
    }

    fn take(&self) -> Vec<Due> {
        // Drained, not swapped out: the queue keeps its room, and a claim seldom grows it.
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        queue.drain(..).collect()
    }

    fn release(&self, done: &[Due]) {
        for due in done {
            let (word, bit) = claim_bit(due.hash);
            self.claimed[word].fetch_and(!bit, Ordering::AcqRel);
        }
    }
}

impl LinkCache {
    /// Reads the queued unknown codes again, `now` being when the reads start: those still
    /// unknown are remembered anew, those the store now knows (created by another process,
    /// whose note is not polled yet) are forgotten. Returns how many were read; on a store
    /// error the rest stay unread and their entries expire as they would have.
    pub(crate) async fn renew_unknown(&self, now: UnixSeconds) -> Result<usize, StoreError> {
        let due = self.renewals.take();
        let mut read = 0;
        for batch in due.chunks(RENEWED_AT_ONCE) {
            let result = self.renew_batch(batch, now).await;
            self.renewals.release(batch);
            if let Err(e) = result {
                self.renewals.release(&due[read + batch.len()..]);
                return Err(e);
            }
            read += batch.len();
        }
        Ok(read)
    }

    async fn renew_batch(&self, batch: &[Due], now: UnixSeconds) -> Result<(), StoreError> {
        // Loaded before the read: a write landing after it bumps the generation, and the
        // entry stored below is then stale, as a miss's would be.
        let seen: Vec<u32> = batch
            .iter()
            .map(|due| self.generation(due.hash).load(Ordering::Acquire))
            .collect();
        for ((due, generation), unknown) in
            batch.iter().zip(seen).zip(self.unknown(batch, now).await?)
        {
            if !unknown {
                // Created since by another process, whose note is not polled yet.
                self.invalidate(&due.code);
                continue;
            }
            let negative = self.settings.unknown(due.hash, generation, now);
            self.remember_unknown(&due.code, due.hash, negative, now);
        }
        Ok(())
    }

    /// Whether each code of `batch` is still unknown, read as a miss reads ([`Self::load`]):
    /// in the scale-out mode from L2 where it holds a fresh entry, else from the store, whose
    /// answers then fill L2 (so that N instances do not each read the store for one sweep).
    async fn unknown(&self, batch: &[Due], now: UnixSeconds) -> Result<Vec<bool>, StoreError> {
        let mut unknown = vec![true; batch.len()];
        let mut unread: Vec<usize> = (0..batch.len()).collect();
        if let Some(shared) = &self.shared {
            let codes: Vec<&str> = batch.iter().map(|due| &*due.code).collect();
            let found = shared.get_all(&codes, now).await;
            unread.retain(|&i| match &found[i] {
                Some(found) if !found.stale => {
                    unknown[i] = matches!(found.entry, l2::Entry::Unknown);
                    false
                }
                _ => true,
            });
        }
        let codes: Vec<String> = unread.iter().map(|&i| batch[i].code.to_string()).collect();
        let targets = self.store.redirect_targets(&codes).await?;
        self.metrics.cache_renewals.inc_by(codes.len() as u64);
        for (&i, target) in unread.iter().zip(&targets) {
            unknown[i] = target.is_none();
        }
        if let Some(shared) = &self.shared {
            let read = codes.iter().map(String::as_str).zip(targets);
            let failed = shared.fill_all(read, now).await;
            if failed > 0 {
                tracing::debug!(failed, "cannot fill L2 with renewed unknown codes");
            }
        }
        Ok(unknown)
    }
}
