//! The engine's state as plain data: the snapshot and the prober's targets.

use crate::clock::Timestamp;
use crate::health::ramp;
use crate::snapshot::{AddressSnapshot, CellSnapshot, PoolCounts, Snapshot, SnapshotParts, Totals};
#[cfg(feature = "probe")]
use crate::store::ProbeTarget;
use crate::strategy::Slot;

use super::record::AddressRecord;
use super::sites::{self, NO_SITE};

use super::PoolState;

impl PoolState {
    #[cfg(feature = "probe")]
    /// What the prober needs of every address (P12): its full URL, state and load.
    pub(crate) fn probe_targets(&mut self, now: Timestamp) -> Vec<ProbeTarget> {
        self.sweep(now);
        self.records
            .iter()
            .zip(&self.hot)
            .filter_map(|(r, h)| r.map(|r| (r, h)))
            .map(|(r, h)| ProbeTarget {
                address: r.address.clone(),
                state: r.health.state,
                active_leases: h.active_leases,
            })
            .collect()
    }

    pub(crate) fn snapshot(&mut self, now: Timestamp) -> Snapshot {
        self.sweep(now);
        let cfg = &self.cfg.health;
        for rec in self.records.live_mut() {
            rec.health.refresh(now, cfg);
            rec.window.expire(now);
        }
        for c in self.sites.cells.values_mut() {
            c.window.expire(now);
        }
        for site in &mut self.sites.list {
            site.window
                .expire(now, cfg.window_max_age, self.cfg.judgement.site_recent);
        }
        let ctx = self.ctx(NO_SITE, now);
        let addresses = self
            .records
            .iter()
            .enumerate()
            .filter_map(|(slot, r)| r.map(|r| (slot as Slot, r)))
            .map(|(slot, r)| {
                let all = r.window.tallies(now).0;
                let quantiles = r.window.exact_quantiles(now);
                AddressSnapshot {
                    address: r.address.redacted().into(),
                    fingerprint: format!("{:016x}", r.fingerprint),
                    sub_pools: r.sub_pools[1..]
                        .iter()
                        .map(|sp| self.sub_pools[*sp as usize].name.to_string())
                        .collect(),
                    state: r.health.state,
                    state_since_ms: r.health.since.as_millis(),
                    reason: r.health.last_reason.clone(),
                    weight: if r.health.state.is_offered() {
                        ctx.weight(slot)
                    } else {
                        0.0
                    },
                    ramp_share: r
                        .health
                        .ramp_started
                        .and_then(|s| ramp::share(&cfg.ramp_steps, cfg.ramp_duration, s, now)),
                    active_leases: self.hot.get(slot as usize).map_or(0, |h| h.active_leases),
                    bound_keys: r.bound_keys,
                    window_samples: all.n as usize,
                    success_rate: all.rate(all.successes),
                    captcha_rate: all.rate(all.captchas),
                    latency_p50_ms: quantiles.map(|q| q.0),
                    latency_p95_ms: quantiles.map(|q| q.1),
                    quarantined_until_ms: r.health.quarantined_until.map(Timestamp::as_millis),
                    quarantine_entries: r.health.quarantine_entries,
                    backoff_level: r.health.backoff_level,
                    failed_cycles: r.health.failed_cycles,
                    totals: r.totals(),
                }
            })
            .collect();
        // Named sites from their cells; the site-less column derived from each address: its
        // window's untagged outcomes, its totals less those of its named cells.
        let mut unsited: Vec<Totals> = self
            .records
            .iter()
            .map(|r| r.map(AddressRecord::totals).unwrap_or_default())
            .collect();
        let mut matrix: Vec<CellSnapshot> = Vec::new();
        for ((slot, site), cell) in &self.sites.cells {
            let (Some(r), Some(s)) = (self.record(*slot), self.sites.list.get(*site as usize))
            else {
                continue;
            };
            if let Some(t) = unsited.get_mut(*slot as usize) {
                t.successes -= cell.totals.successes;
                t.failures -= cell.totals.failures;
                t.captchas -= cell.totals.captchas;
                t.rate_limited -= cell.totals.rate_limited;
            }
            let all = cell.window.tallies(now).0;
            matrix.push(CellSnapshot {
                address: r.address.redacted().into(),
                site: s.name.to_string(),
                window_samples: all.n as usize,
                success_rate: all.rate(all.successes),
                captcha_rate: all.rate(all.captchas),
                avoided: cell.verdict(cfg, now).is_some(),
                cooling_until_ms: cell
                    .cooling_until
                    .filter(|u| *u > now)
                    .map(Timestamp::as_millis),
                totals: cell.totals.clone(),
            });
        }
        for (r, totals) in self.records.iter().zip(unsited) {
            let Some(r) = r else { continue };
            let all = r.window.site_tally(NO_SITE, now);
            let cooling = (r.cooling_unsited > now).then_some(r.cooling_unsited);
            let outcomes = totals.successes + totals.failures + totals.captchas;
            if outcomes + totals.rate_limited == 0 && cooling.is_none() {
                continue;
            }
            matrix.push(CellSnapshot {
                address: r.address.redacted().into(),
                site: "-".into(),
                window_samples: all.n as usize,
                success_rate: all.rate(all.successes),
                captcha_rate: all.rate(all.captchas),
                avoided: false,
                cooling_until_ms: cooling.map(Timestamp::as_millis),
                totals: Totals {
                    successes: totals.successes,
                    failures: totals.failures,
                    captchas: totals.captchas,
                    rate_limited: totals.rate_limited,
                    ..Default::default()
                },
            });
        }
        let c = &self.counters;
        SnapshotParts {
            at_ms: now.as_millis(),
            addresses,
            matrix,
            sites: self.sites.list.iter().map(sites::Site::snapshot).collect(),
            counts: PoolCounts {
                quarantine_entries: c.quarantine_entries,
                frozen: self.frozen,
                active_leases: self.leases.len() as u64,
                bindings: self.sessions.len(),
                acquired: c.acquired,
                released: c.released,
                abandoned: c.abandoned,
                expired: c.expired,
                unavailable: c.unavailable,
                sessions_broken: c.sessions_broken,
            },
            decisions: self.log.recent(),
        }
        .build(self.cfg.quarantine_cap)
    }
}
