//! The Redis L2 link cache, shared by every instance, between each instance's L1 and the
//! store.
//!
//! Every change of a link raises its version (unknown codes are version 0). Entries carry
//! the version and every write goes through one script that refuses to replace an entry by a
//! lower version. So a reader that fills the cache with what it read before a change can
//! never overwrite what the writer (or a process that noticed the change) put there after
//! the commit, whichever reaches Redis first — also when a link is enabled again.

use super::redis::{Redis, Unreachable};
use shortener_core::day::UnixSeconds;
use shortener_core::link::Link;
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
        match link {
            None => Self::Unknown,
            Some(link) => Self::Link {
                long_url: link.long_url.clone(),
                expires_at: link.expires_at,
                gone: if link.deleted_at.is_some() {
                    Some(Gone::Deleted)
                } else if link.disabled.is_some() {
                    Some(Gone::Disabled)
                } else {
                    None
                },
                version: link.version,
            },
        }
    }

    pub(crate) fn version(&self) -> u64 {
        match self {
            Self::Unknown => 0,
            Self::Link { version, .. } => *version,
        }
    }

    fn encode(&self) -> String {
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
                format!("v{version}|{state}|{expires_at}|{long_url}")
            }
        }
    }

    fn decode(value: &str) -> Option<Self> {
        let rest = value.strip_prefix('v')?;
        let (version, rest) = rest.split_once('|')?;
        let version: u64 = version.parse().ok()?;
        if rest == "u" {
            return (version == 0).then_some(Self::Unknown);
        }
        let (state, rest) = rest.split_once('|')?;
        let gone = match state {
            "l" => None,
            "d" => Some(Gone::Disabled),
            "x" => Some(Gone::Deleted),
            _ => return None,
        };
        let (expires_at, long_url) = rest.split_once('|')?;
        Some(Self::Link {
            long_url: long_url.to_owned(),
            expires_at: expires_at.parse().ok()?,
            gone,
            version,
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
            Entry::Link { gone: Some(_), .. } => self.ttl,
            Entry::Link { expires_at, .. } => match u64::try_from(expires_at - now) {
                Ok(left) if left > 0 => self.ttl.min(Duration::from_secs(left)),
                _ => self.negative_ttl,
            },
        };
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        self.redis
            .script::<i64>(
                FILL.key(key(code))
                    .arg(entry.encode())
                    .arg(ttl_ms)
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
            assert_eq!(Entry::decode(&entry.encode()), Some(entry));
        }
        for bad in [
            "",
            "9x",
            "v1|l|notanumber|https://x",
            "v3|u",
            "1|https://x",
            "v1|q|1|x",
        ] {
            assert_eq!(Entry::decode(bad), None, "{bad:?}");
        }
    }
}
