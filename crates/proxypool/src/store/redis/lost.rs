//! Grants whose reply never came. An `ops` call that failed — its connection lost (Redis
//! killed or cut off after it ran the call), or timed out and then lost — may have granted
//! leases no caller holds; unless given back they hold caps until their TTL. This process
//! numbers its acquires itself, from blocks of lease ids it reserves (`reserve` in
//! library.lua), so it knows the ids such a call would have granted: once Redis answers
//! again, `reclaim` finds which of them are open and they go back as abandons.

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use super::encoding::{Arg, parse_lease_member, text};
use super::stale::Open;
use super::{Epoch, RedisStore};
use crate::clock::Timestamp;

/// Lease ids reserved at a time: one reservation (a round trip before a batch) per this
/// many acquires. Ids stay far below the library's 10^14 at any rate a pool sees.
const BLOCK: u64 = 1 << 16;

/// How often a lost call's grants are looked for while Redis does not answer.
const RETRY: Duration = Duration::from_millis(100);

/// What is left of this process's block: ids `next..end` of the pool's epoch `epoch`.
#[derive(Debug, Default)]
pub(super) struct LeaseIds {
    epoch: Arc<str>,
    next: u64,
    end: u64,
}

impl LeaseIds {
    /// `count` consecutive ids of the block, unless it has fewer left or belongs to an
    /// epoch the pool no longer has.
    fn take(&mut self, count: u64, epoch: Option<&str>) -> Option<Ids> {
        let current = epoch.is_none_or(|e| *e == *self.epoch);
        if !current || self.end.saturating_sub(self.next) < count {
            return None;
        }
        let first = self.next;
        self.next += count;
        Some(Ids {
            epoch: Arc::clone(&self.epoch),
            first,
            count,
        })
    }
}

/// The lease ids of one batch's acquires: acquire k gets `first + k`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Ids {
    pub(super) epoch: Arc<str>,
    pub(super) first: u64,
    pub(super) count: u64,
}

/// A batch whose reply was lost: its ids and the deadline it gave its leases.
pub(super) struct Lost {
    pub(super) ids: Ids,
    pub(super) lease_deadline: u64,
}

impl RedisStore {
    /// Ids for a batch of `count` acquires, from the block or a new one; `None` when none
    /// can be reserved (the pool has no epoch yet, or Redis does not answer: the library
    /// then numbers the batch, and a lost reply leaves its grants to the TTL).
    pub(super) async fn lease_ids(&self, count: u64, now: Timestamp) -> Option<Ids> {
        let epoch = match &*self.epoch.lock().unwrap_or_else(PoisonError::into_inner) {
            Epoch::Seen(e) => Some(e.clone()),
            Epoch::Unknown | Epoch::Lost => None,
        };
        let from_block = self
            .lease_ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take(count, epoch.as_deref());
        if from_block.is_some() {
            return from_block;
        }
        let reply = self
            .call(&self.functions.reserve, now, false, &[Arg::Int(BLOCK)])
            .await
            .ok()?;
        let Value::Array(items) = reply else {
            return None;
        };
        let [Value::Int(first), epoch] = items.as_slice() else {
            return None;
        };
        let first = u64::try_from(*first).ok()?;
        let mut block = self
            .lease_ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // A batch reserving meanwhile replaced the block: this one's ids are as good.
        *block = LeaseIds {
            epoch: text(epoch)?.into(),
            next: first,
            end: first + BLOCK,
        };
        block.take(count, None)
    }

    /// Once Redis answers again, finds which acquires of `lost` were granted and gives them
    /// back; `open` (refusals are suspect meanwhile, see `stale`) ends when they are back,
    /// or after a lease TTL of trying (their TTL has freed them by then).
    pub(super) fn reclaim(self: &Arc<Self>, lost: Lost, now: Timestamp, open: Open) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let give_up = Instant::now() + me.cfg.lease_ttl;
            let args = [
                Arg::Int(lost.lease_deadline),
                Arg::Int(lost.ids.first),
                Arg::Int(lost.ids.count),
            ];
            loop {
                match me.call(&me.functions.reclaim, now, false, &args).await {
                    Ok(reply) => {
                        let grants = open_leases(&reply);
                        if !grants.is_empty() {
                            tracing::info!(target: "proxypool::redis", leases = grants.len(), "giving back grants whose reply was lost");
                        }
                        me.give_back(grants, now, open);
                        return;
                    }
                    Err(e) if Instant::now() + RETRY >= give_up => {
                        tracing::warn!(target: "proxypool::redis", error = %e, "grants whose reply was lost not found; their TTL frees them");
                        return;
                    }
                    Err(_) => tokio::time::sleep(RETRY).await,
                }
            }
        });
    }
}

/// `(lease, address id)` of each `l<lease>:<address id>` member `reclaim` replied.
fn open_leases(reply: &Value) -> Vec<(u64, u32)> {
    let Value::Array(items) = reply else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|m| parse_lease_member(&text(m)?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_hands_out_consecutive_ids_of_its_epoch_until_it_runs_short() {
        let mut block = LeaseIds {
            epoch: "e1".into(),
            next: 100,
            end: 110,
        };
        let ids = |first, count| Ids {
            epoch: "e1".into(),
            first,
            count,
        };
        assert_eq!(block.take(4, Some("e1")), Some(ids(100, 4)));
        assert_eq!(block.take(6, None), Some(ids(104, 6)));
        assert_eq!(block.take(1, Some("e1")), None);
        let mut block = LeaseIds {
            epoch: "e1".into(),
            next: 100,
            end: 110,
        };
        // Redis lost the pool: the ids may be the new epoch's.
        assert_eq!(block.take(1, Some("e2")), None);
        assert_eq!(LeaseIds::default().take(1, None), None);
    }

    #[test]
    fn reclaimed_members_name_their_lease_and_address() {
        let reply = Value::Array(vec![
            Value::BulkString(b"l1234:7".to_vec()),
            Value::BulkString(b"b-key".to_vec()),
            Value::BulkString(b"l99:x".to_vec()),
        ]);
        assert_eq!(open_leases(&reply), vec![(1234, 7)]);
        assert_eq!(open_leases(&Value::Nil), Vec::new());
    }
}
