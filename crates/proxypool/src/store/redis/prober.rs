//! The prober's side (feature `probe`): the prober role, the addresses to probe, and the
//! shared decision log passed to `tracing` once per pool.

use std::sync::atomic::Ordering;

use redis::Value;

use super::encoding::{Arg, log_entry, text};
use super::view::state_of;
use super::{PROBER_HOLD, RedisStore, unavailable};
use crate::address::ProxyAddress;
use crate::clock::{Timestamp, millis};
use crate::decision::Decision;
use crate::store::ProbeTarget;

impl RedisStore {
    /// The addresses the prober considers, one round trip — none unless this process's prober
    /// holds the pool's prober role (taken when free, kept by asking within [`PROBER_HOLD`]):
    /// several processes with probers do not multiply the probes. The holder also passes the
    /// pool's new decisions to `tracing`, as the memory store does as it makes them: once per
    /// pool, not once per process.
    pub(crate) async fn probe_targets(&self, now: Timestamp) -> Result<Vec<ProbeTarget>, String> {
        let logged = self.logged.load(Ordering::Relaxed);
        let args = [
            Arg::Str(&self.prober_token),
            Arg::Int(millis(PROBER_HOLD)),
            Arg::Int(logged),
        ];
        let reply = self
            .call(&self.functions.targets, now, true, &args)
            .await
            .map_err(|e| unavailable(&e))?;
        let Value::Array(parts) = reply else {
            return Err("malformed targets reply".into());
        };
        let [Value::Array(items), decided, Value::Array(new)] = parts.as_slice() else {
            return Err("malformed targets reply".into());
        };
        // Oldest first; a count below ours means Redis lost the pool: start again from there.
        let mut entries: Vec<(u64, Decision)> =
            new.iter().filter_map(|e| log_entry(&text(e)?)).collect();
        entries.sort_by_key(|(n, _)| *n);
        for (_, d) in entries.iter().filter(|(n, _)| *n > logged) {
            crate::decision::trace(d);
        }
        if let Value::Int(decided) = decided {
            self.logged
                .store(u64::try_from(*decided).unwrap_or(0), Ordering::Relaxed);
        }
        Ok(items
            .chunks(3)
            .filter_map(|t| {
                let [state, url, open] = t else { return None };
                Some(ProbeTarget {
                    state: state_of(&text(state)?)?,
                    address: ProxyAddress::parse(&text(url)?).ok()?,
                    active_leases: text(open)?.parse().ok()?,
                })
            })
            .collect())
    }
}
