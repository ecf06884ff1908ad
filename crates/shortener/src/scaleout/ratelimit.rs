//! Create limits shared by every instance: the same GCRA as the local limiter (burst = the
//! hourly quota, refilling evenly), its state in one Redis key per client, updated by one
//! script so that concurrent checks from many instances never both take the last cell. The
//! script reads the clock from Redis, so instances with skewed clocks agree.

use super::redis::{Redis, Unreachable};
use crate::ratelimit::{Budget, Refused};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

/// KEYS[1]: the client's bucket. ARGV[1]: cells per period; ARGV[2]: period in ms.
/// Returns {allowed, remaining, retry_after_ms}.
static GCRA: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local limit = tonumber(ARGV[1])
local interval = tonumber(ARGV[2]) / limit
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local new_tat = tat + interval
local allow_at = new_tat - limit * interval
if allow_at > now then
  return {0, 0, math.ceil(allow_at - now)}
end
redis.call('SET', KEYS[1], string.format('%.3f', new_tat), 'PX', math.ceil(new_tat - now))
-- The epsilon absorbs the division's rounding (6 × (3600000 / 7) / (3600000 / 7) < 6).
return {1, math.floor((now - allow_at) / interval + 1e-6), 0}
",
    )
});

const HOUR_MS: u64 = 3_600_000;

/// The shared limiter.
#[derive(Debug)]
pub(crate) struct SharedLimits {
    redis: Arc<Redis>,
}

impl SharedLimits {
    pub(crate) fn new(redis: Arc<Redis>) -> Self {
        Self { redis }
    }

    /// Takes one cell of `bucket`'s hourly budget of `per_hour`.
    pub(crate) async fn check(
        &self,
        bucket: &str,
        per_hour: u32,
    ) -> Result<Result<Budget, Refused>, Unreachable> {
        let (allowed, remaining, retry_ms): (i64, i64, i64) = self
            .redis
            .script(
                GCRA.key(format!("shortener:ratelimit:{bucket}"))
                    .arg(per_hour)
                    .arg(HOUR_MS),
            )
            .await?;
        Ok(if allowed == 1 {
            Ok(Budget {
                limit: per_hour,
                remaining: u32::try_from(remaining).unwrap_or(0),
            })
        } else {
            Err(Refused {
                limit: per_hour,
                retry_after: Duration::from_millis(u64::try_from(retry_ms).unwrap_or(0)),
            })
        })
    }
}
