//! The Redis L2 link cache, shared by every instance, between each instance's L1 and the
//! store.
//!
//! Every change of a link raises its version (unknown codes are version 0). Entries carry
//! the version and every write goes through one script that refuses to replace an entry by a
//! lower version. So a reader that fills the cache with what it read before a change can
//! never overwrite what the writer (or a process that noticed the change) put there after
//! the commit, whichever reaches Redis first — also when a link is enabled again.
//!
//! A link's key lives its TTL plus the stale age (`--stale-max-age`), never past the link's
//! expiry; the value carries its soft expiry (the TTL's end), after which it is only served
//! while the store is unavailable (stale if error).

use super::redis::{Redis, Unreachable};
use shortener_core::day::UnixSeconds;
use shortener_core::link::{Link, RedirectTarget};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

/// Sets `KEYS[1]` to `ARGV[1]` for `ARGV[2]` ms unless it holds a version above `ARGV[3]`.
static FILL: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local current = redis.call('GET', KEYS[1])
if current then
  local version = tonumber(string.match(current, '^v(%d+)|'))
  if version and version > tonumber(ARGV[3]) then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
",
    )
});

/// What a redirect answers for a link that no longer redirects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gone {
    /// 410 until enabled.
    Disabled,
    /// 410 for good.
    Deleted,
}

/// What the L2 knows of a code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Entry {
    /// No such link (version 0).
    Unknown,
    /// A link, live, disabled or deleted.
    Link {
        long_url: String,
        expires_at: UnixSeconds,
        gone: Option<Gone>,
        version: u64,
    },
}

impl Entry {
    pub(crate) fn of(link: Option<&Link>) -> Self {
        Self::of_target(link.map(Link::redirect_target))
    }

    /// What a store's [`RedirectTarget`] read says of a code.
    pub(crate) fn of_target(target: Option<RedirectTarget>) -> Self {
        match target {
            None => Self::Unknown,
            Some(target) => Self::Link {
                long_url: target.long_url,
                expires_at: target.expires_at,
                gone: if target.deleted {
                    Some(Gone::Deleted)
                } else if target.disabled {
                    Some(Gone::Disabled)
                } else {
                    None
                },
                version: target.version,
            },
        }
    }

    pub(crate) fn version(&self) -> u64 {
        match self {
            Self::Unknown => 0,
            Self::Link { version, .. } => *version,
        }
    }

    /// The value: version, then for a link its state, expiry, soft expiry and destination.
    fn encode(&self, fresh_until: UnixSeconds) -> String {
        match self {
            Self::Unknown => "v0|u".to_owned(),
            Self::Link {
                long_url,
                expires_at,
                gone,
                version,
            } => {
                let state = match gone {
                    None => 'l',
                    Some(Gone::Disabled) => 'd',
                    Some(Gone::Deleted) => 'x',
                };
                format!("v{version}|{state}|{expires_at}|{fresh_until}|{long_url}")
            }
        }
    }

    /// The entry and, for a link, its soft expiry.
    fn decode(value: &str) -> Option<(Self, UnixSeconds)> {
        let rest = value.strip_prefix('v')?;
        let (version, rest) = rest.split_once('|')?;
        let version: u64 = version.parse().ok()?;
        if rest == "u" {
            // Unknown codes are never served stale: their key lives the negative TTL only.
            return (version == 0).then_some((Self::Unknown, UnixSeconds::MAX));
        }
        let (state, rest) = rest.split_once('|')?;
        let gone = match state {
            "l" => None,
            "d" => Some(Gone::Disabled),
            "x" => Some(Gone::Deleted),
            _ => return None,
        };
        let (expires_at, rest) = rest.split_once('|')?;
        let (fresh_until, long_url) = rest.split_once('|')?;
        let link = Self::Link {
            long_url: long_url.to_owned(),
            expires_at: expires_at.parse().ok()?,
            gone,
            version,
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
            Entry::Link { gone: Some(_), .. } => (self.ttl, self.ttl + self.stale_max_age),
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
                    .arg(keep_ms)
                    .arg(entry.version()),
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
                gone: None,
                version: 1,
            },
            Entry::Link {
                long_url: "https://example.com/".to_owned(),
                expires_at: 5,
                gone: Some(Gone::Disabled),
                version: 7,
            },
            Entry::Link {
                long_url: "https://example.com/".to_owned(),
                expires_at: 5,
                gone: Some(Gone::Deleted),
                version: 8,
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
        for bad in [
            "",
            "9x",
            "v1|l|notanumber|1|https://x",
            // The format before soft expiries: refused, so the store is asked.
            "v1|l|5|https://x",
            "v3|u",
            "1|https://x",
            "v1|q|1|x",
        ] {
            assert_eq!(Entry::decode(bad), None, "{bad:?}");
        }
    }
}
