//! The scale-out mode's shared parts on Redis: an L2 link cache, invalidation fan-out, create
//! limits shared by every instance, and the click stream with its aggregators.
//!
//! Redis only ever helps: every use has a local fallback (the store for links, the local
//! limiter for creates, the local queue and then a counted drop for clicks), so a Redis
//! outage degrades an instance, never stops it.

pub(crate) mod clickstream;
pub(crate) mod invalidation;
pub(crate) mod l2;
pub(crate) mod ratelimit;
pub(crate) mod redis;

use anyhow::Context;
use clickstream::ClickShipper;
use invalidation::Invalidations;
use l2::L2;
use redis::{Redis, RedisTarget};
use std::sync::Arc;
use std::time::Duration;

/// How long the L2 keeps a link (never past its expiry).
const L2_TTL: Duration = Duration::from_secs(24 * 3600);

/// The shared parts of one instance.
#[derive(Debug, Clone)]
pub(crate) struct Scaleout {
    pub(crate) target: RedisTarget,
    pub(crate) redis: Arc<Redis>,
    pub(crate) l2: Arc<L2>,
    pub(crate) invalidations: Arc<Invalidations>,
    pub(crate) shipper: Arc<ClickShipper>,
}

impl Scaleout {
    /// Connects to Redis; fails (at start) when it does not answer.
    pub(crate) async fn connect(
        target: &RedisTarget,
        negative_ttl: Duration,
        stale_max_age: Duration,
    ) -> anyhow::Result<Self> {
        let redis = Arc::new(
            Redis::connect(target, redis::TIMEOUT)
                .await
                .with_context(|| format!("cannot reach Redis at {target}"))?,
        );
        let l2 =
            Arc::new(L2::new(redis.clone(), L2_TTL, negative_ttl).serving_stale_for(stale_max_age));
        Ok(Self {
            target: target.clone(),
            invalidations: Arc::new(Invalidations::new(redis.clone(), l2.clone())),
            shipper: Arc::new(ClickShipper::new(redis.clone())),
            l2,
            redis,
        })
    }
}

#[cfg(test)]
mod tests;
