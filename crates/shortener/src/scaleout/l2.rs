//! The Redis L2 link cache, shared by every instance, between each instance's L1 and the
//! store.
//!
//! A link only ever moves forward: unknown → live → disabled (expiry is computed at read
//! time, disabling is final). Entries carry that rank in their first byte and every write
//! goes through one script that refuses to replace an entry by a lower rank. So a reader that
//! fills the cache with what it read before a create or a delete can never overwrite what the
//! writer put there after its commit, whichever reaches Redis first.

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

    fn encode(&self) -> String {
        match self {
            Self::Unknown => "0".to_owned(),
            Self::Link {
                long_url,
                expires_at,
                disabled,
            } => format!("{}{expires_at}|{long_url}", if *disabled { 2 } else { 1 }),
        }
    }

    fn decode(value: &str) -> Option<Self> {
        let (rank, rest) = value.split_at_checked(1)?;
        if rank == "0" {
            return Some(Self::Unknown);
        }
        let disabled = match rank {
            "1" => false,
            "2" => true,
            _ => return None,
        };
        let (expires_at, long_url) = rest.split_once('|')?;
        Some(Self::Link {
            long_url: long_url.to_owned(),
            expires_at: expires_at.parse().ok()?,
            disabled,
        })
    }
}

/// The L2 cache.
#[derive(Debug)]
pub(crate) struct L2 {
    redis: Arc<Redis>,
    ttl: Duration,
    negative_ttl: Duration,
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
        }
    }

    /// The entry of `code`; `None` when Redis does not have it or does not answer (then the
    /// store is asked).
    pub(crate) async fn get(&self, code: &str) -> Option<Entry> {
        let value: Option<String> = match self.redis.query(redis::cmd("GET").arg(key(code))).await {
            Ok(value) => value,
            Err(e) => {
                tracing::debug!(error = %e, "L2 read failed; asking the store");
                return None;
            }
        };
        let entry = Entry::decode(&value?);
        if entry.is_none() {
            tracing::warn!(code, "unreadable L2 entry; asking the store");
        }
        entry
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
        let ttl = match entry {
            Entry::Unknown => self.negative_ttl,
            Entry::Link { disabled: true, .. } => self.ttl,
            Entry::Link { expires_at, .. } => match u64::try_from(expires_at - now) {
                Ok(left) if left > 0 => self.ttl.min(Duration::from_secs(left)),
                _ => self.negative_ttl,
            },
        };
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        self.redis
            .script::<i64>(FILL.key(key(code)).arg(entry.encode()).arg(ttl_ms))
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
            assert_eq!(Entry::decode(&entry.encode()), Some(entry));
        }
        assert_eq!(Entry::decode(""), None);
        assert_eq!(Entry::decode("9x"), None);
        assert_eq!(Entry::decode("1notanumber|https://x"), None);
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
            .map(|e| e.encode().as_bytes()[0])
            .collect();
        assert!(ranks.windows(2).all(|w| w[0] < w[1]));
    }
}
