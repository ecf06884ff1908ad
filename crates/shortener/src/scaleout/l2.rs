//! The Redis L2 link cache, shared by every instance, between each instance's L1 and the
//! store.
//!
//! A link only ever moves forward: unknown → live → disabled (expiry is computed at read
//! time, disabling is final). Entries carry that rank in their first byte and every write
//! goes through one script that refuses to replace an entry by a lower rank. So a reader that
//! fills the cache with what it read before a create or a delete can never overwrite what the
//! writer put there after its commit, whichever reaches Redis first.
//!
//! A link's key lives its TTL plus the stale age (`--stale-max-age`), never past the link's
//! expiry; the value carries its soft expiry (the TTL's end), after which it is only served
//! while the store is unavailable (stale if error).

use super::redis::{Redis, Unreachable};
use shortener_core::day::UnixSeconds;
use shortener_core::link::Link;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

/// Sets `KEYS[1]` to `ARGV[1]` for `ARGV[2]` ms unless it holds a higher-ranked value.
static FILL: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local current = redis.call('GET', KEYS[1])
if current and string.byte(current, 1) > string.byte(ARGV[1], 1) then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
",
    )
});

/// What the L2 knows of a code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Entry {
    /// No such link.
    Unknown,
    /// A link, live or disabled.
    Link {
        long_url: String,
        expires_at: UnixSeconds,
        disabled: bool,
    },
}

impl Entry {
    pub(crate) fn of(link: Option<&Link>) -> Self {
        match link {
            None => Self::Unknown,
            Some(link) => Self::Link {
                long_url: link.long_url.clone(),
                expires_at: link.expires_at,
                disabled: link.disabled_at.is_some(),
            },
        }
    }

    /// The value: rank, then for a link its expiry, its soft expiry and its destination.
    fn encode(&self, fresh_until: UnixSeconds) -> String {
        match self {
            Self::Unknown => "0".to_owned(),
            Self::Link {
                long_url,
                expires_at,
                disabled,
            } => format!(
                "{}{expires_at}|{fresh_until}|{long_url}",
                if *disabled { 2 } else { 1 }
            ),
        }
    }

    /// The entry and, for a link, its soft expiry.
    fn decode(value: &str) -> Option<(Self, UnixSeconds)> {
        let (rank, rest) = value.split_at_checked(1)?;
        if rank == "0" {
            // Unknown codes are never served stale: their key lives the negative TTL only.
            return Some((Self::Unknown, UnixSeconds::MAX));
        }
        let disabled = match rank {
            "1" => false,
            "2" => true,
            _ => return None,
        };
        let (expires_at, rest) = rest.split_once('|')?;
        let (fresh_until, long_url) = rest.split_once('|')?;
        let link = Self::Link {
            long_url: long_url.to_owned(),
            expires_at: expires_at.parse().ok()?,
            disabled,
        };
        Some((link, fresh_until.parse().ok()?))
    }
}

/// The L2 cache.
#[derive(Debug)]
pub(crate) struct L2 {
    redis: Arc<Redis>,
    ttl: Duration,
    negative_ttl: Duration,
    stale_max_age: Duration,
}

/// An L2 entry as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    pub(crate) entry: Entry,
    /// Past its soft expiry: to be served only while the store is unavailable.
    pub(crate) stale: bool,
}

fn key(code: &str) -> String {
    format!("shortener:link:{code}")
}

impl L2 {
    pub(crate) fn new(redis: Arc<Redis>, ttl: Duration, negative_ttl: Duration) -> Self {
        Self {
            redis,
            ttl,
            negative_ttl,
            stale_max_age: Duration::ZERO,
        }
    }

    /// Keeps links this long past their TTL, for stale serving.
    pub(crate) fn serving_stale_for(self, stale_max_age: Duration) -> Self {
        Self {
            stale_max_age,
            ..self
        }
    }

    /// The entry of `code` as of `now`; `None` when Redis does not have it or does not answer
    /// (then the store is asked).
    pub(crate) async fn get(&self, code: &str, now: UnixSeconds) -> Option<Found> {
        let value: Option<String> = match self.redis.query(redis::cmd("GET").arg(key(code))).await {
            Ok(value) => value,
            Err(e) => {
                tracing::debug!(error = %e, "L2 read failed; asking the store");
                return None;
            }
        };
        let Some((entry, fresh_until)) = Entry::decode(&value?) else {
            tracing::warn!(code, "unreadable L2 entry; asking the store");
            return None;
        };
        Some(Found {
            entry,
            stale: now >= fresh_until,
        })
    }

    /// Drops the entry of `code`.
    pub(crate) async fn forget(&self, code: &str) -> Result<(), Unreachable> {
        self.redis
            .query::<i64>(redis::cmd("DEL").arg(key(code)))
            .await
            .map(drop)
    }

    /// Stores `entry` for `code` unless Redis already holds a later state of the link.
    pub(crate) async fn fill(
        &self,
        code: &str,
        entry: &Entry,
        now: UnixSeconds,
    ) -> Result<(), Unreachable> {
        // The soft TTL, and how long the key lives (the stale age on top, never past expiry).
        let (ttl, keep) = match entry {
            Entry::Unknown => (self.negative_ttl, self.negative_ttl),
            Entry::Link { disabled: true, .. } => (self.ttl, self.ttl + self.stale_max_age),
            Entry::Link { expires_at, .. } => match u64::try_from(expires_at - now) {
                Ok(left) if left > 0 => {
                    let left = Duration::from_secs(left);
                    (
                        self.ttl.min(left),
                        (self.ttl + self.stale_max_age).min(left),
                    )
                }
                _ => (self.negative_ttl, self.negative_ttl),
            },
        };
        let fresh_until = now.saturating_add(i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX));
        let keep_ms = u64::try_from(keep.as_millis()).unwrap_or(u64::MAX).max(1);
        self.redis
            .script::<i64>(
                FILL.key(key(code))
                    .arg(entry.encode(fresh_until))
                    .arg(keep_ms),
            )
            .await
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_survive_their_encoding() {
        for entry in [
            Entry::Unknown,
            Entry::Link {
                long_url: "https://example.com/a|b?c=1".to_owned(),
                expires_at: 1_900_000_000,
                disabled: false,
            },
            Entry::Link {
                long_url: "https://example.com/".to_owned(),
                expires_at: 5,
                disabled: true,
            },
        ] {
            let fresh_until = match entry {
                Entry::Unknown => UnixSeconds::MAX,
                Entry::Link { .. } => 1_800_000_000,
            };
            assert_eq!(
                Entry::decode(&entry.encode(fresh_until)),
                Some((entry, fresh_until))
            );
        }
        assert_eq!(Entry::decode(""), None);
        assert_eq!(Entry::decode("9x"), None);
        assert_eq!(Entry::decode("1notanumber|1|https://x"), None);
        // The format before soft expiries: refused, so the store is asked.
        assert_eq!(Entry::decode("15|https://x"), None);
    }

    #[test]
    fn ranks_order_unknown_before_live_before_disabled() {
        let live = Entry::Link {
            long_url: "https://example.com/".to_owned(),
            expires_at: 1,
            disabled: false,
        };
        let disabled = Entry::Link {
            long_url: "https://example.com/".to_owned(),
            expires_at: 1,
            disabled: true,
        };
        let ranks: Vec<u8> = [Entry::Unknown, live, disabled]
            .iter()
            .map(|e| e.encode(0).as_bytes()[0])
            .collect();
        assert!(ranks.windows(2).all(|w| w[0] < w[1]));
    }
}
