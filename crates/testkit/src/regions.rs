//! The stores of two regions on loopback, as the shortener's region tests and
//! `scripts/two-regions` run them: region A holds the primary and its Redis, region B a
//! streaming standby of the primary and a Redis of its own. The regions share no Redis.

use crate::{Postgres, RedisServer};
use std::path::Path;

/// Everything both regions store in, started under one directory.
#[derive(Debug)]
pub struct Regions {
    /// Region A's PostgreSQL: every region writes here.
    pub primary: Postgres,
    /// Region B's read replica of the primary.
    pub standby: Postgres,
    pub redis_a: RedisServer,
    pub redis_b: RedisServer,
}

impl Regions {
    /// Starts the primary with an empty database `database`, its standby and both Redis
    /// servers; everything stops when the value is dropped.
    pub fn start(dir: &Path, database: &str) -> std::io::Result<Self> {
        let primary = Postgres::primary(&dir.join("primary"))?;
        primary.create_database(database)?;
        let standby = primary.standby(&dir.join("standby"))?;
        Ok(Self {
            redis_a: RedisServer::start(&dir.join("redis-a"))?,
            redis_b: RedisServer::start(&dir.join("redis-b"))?,
            primary,
            standby,
        })
    }
}
