//! The policies compared: naive random choice, round-robin, and the pool.

use proxypool::{AcquireError, Lease, Pool, Ticket};
use rand::Rng;
use rand::rngs::StdRng;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Random,
    RoundRobin,
    Pool,
}

impl Kind {
    pub(crate) const ALL: [Self; 3] = [Self::Random, Self::RoundRobin, Self::Pool];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Random => "random",
            Self::RoundRobin => "round_robin",
            Self::Pool => "pool",
        }
    }
}

/// What a policy answered for one request.
pub(crate) enum Pick {
    /// Use this address; release the lease afterwards if there is one.
    Address(usize, Option<Lease>),
    /// The pool ended the key's session.
    SessionBroken,
    Unavailable,
}

pub(crate) enum Policy {
    Random(Box<StdRng>),
    RoundRobin(usize),
    Pool(Pool),
}

impl Policy {
    pub(crate) async fn pick(
        &mut self,
        n: usize,
        key: Option<&str>,
        site: &str,
        index: impl Fn(&str) -> usize,
    ) -> Pick {
        match self {
            Self::Random(rng) => Pick::Address(rng.random_range(0..n), None),
            Self::RoundRobin(next) => {
                let a = *next % n;
                *next += 1;
                Pick::Address(a, None)
            }
            Self::Pool(pool) => {
                let mut t = Ticket::new().site(site);
                if let Some(k) = key {
                    t = t.key(k);
                }
                match pool.acquire(t).await {
                    Ok(lease) => Pick::Address(index(lease.address().as_str()), Some(lease)),
                    Err(AcquireError::SessionBroken { .. }) => Pick::SessionBroken,
                    Err(_) => Pick::Unavailable,
                }
            }
        }
    }
}
