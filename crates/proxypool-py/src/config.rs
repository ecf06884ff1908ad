//! The recipe that builds the pool (again, in a forked child).

use proxypool::{PoolBuilder, PoolConfig, RedisOptions, Strategy};

/// Everything needed to build the pool, kept so that a forked child can connect anew.
#[derive(Debug, Clone)]
pub(crate) struct Recipe {
    pub(crate) config: PoolConfig,
    pub(crate) addresses: Vec<(String, Vec<String>)>,
    pub(crate) sub_pools: Vec<(String, Strategy)>,
    pub(crate) seed: Option<u64>,
    pub(crate) redis: Option<RedisOptions>,
}

impl Recipe {
    pub(crate) fn builder(&self) -> PoolBuilder {
        let mut b = proxypool::Pool::builder().config(self.config.clone());
        for (address, pools) in &self.addresses {
            let pools: Vec<&str> = pools.iter().map(String::as_str).collect();
            b = b.address_in(address.clone(), &pools);
        }
        for (name, strategy) in &self.sub_pools {
            b = b.sub_pool(name.clone(), *strategy);
        }
        if let Some(seed) = self.seed {
            b = b.seed(seed);
        }
        if let Some(redis) = &self.redis {
            b = b.redis(redis.clone());
        }
        b
    }
}
