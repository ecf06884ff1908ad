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

#[cfg(test)]
mod tests;
