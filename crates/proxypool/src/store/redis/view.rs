//! The snapshot function's reply read into a [`Snapshot`].

use std::collections::{BTreeMap, HashMap};

use redis::Value;

use super::encoding::{log_entry, text};
use super::judging::window_of;

use crate::address::ProxyAddress;
use crate::clock::Timestamp;
use crate::config::{HealthConfig, PoolConfig};
use crate::decision::{Decision, Subject};
use crate::health::signals;
use crate::health::window::{Tally, Window};
use crate::health::{HealthState, ramp, weight};
use crate::snapshot::{
    AddressSnapshot, CellSnapshot, PoolCounts, SiteSnapshot, Snapshot, SnapshotParts, Totals,
};
use crate::state::sites::NO_SITE;
use crate::strategy::consistent_hash::fingerprint;

/// The shared state as the snapshot function returns it.
pub(crate) struct SharedView {
    pub(crate) snapshot: Snapshot,
    /// The address id of each of `snapshot.addresses`.
    pub(super) ids: Vec<u32>,
    /// Expired leases no process's metrics counted yet: this read's to count.
    pub(super) expired_untold: u64,
}

pub(super) fn map(v: &Value) -> HashMap<String, String> {
    let mut out = HashMap::new();
    if let Value::Array(items) = v {
        for pair in items.chunks(2) {
            if let [k, v] = pair
                && let (Some(k), Some(v)) = (text(k), text(v))
            {
                out.insert(k, v);
            }
        }
    }
    out
}

/// Lifetime outcome counts of one address × site pair (the library's `c:ID` hash).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Counts {
    s: u64,
    f: u64,
    b: u64,
    c: u64,
    r: u64,
    /// Leases dropped unreleased: no outcome, only the address's totals.
    a: u64,
    /// Failed probes of an address in service: failures without a lease.
    p: u64,
}

impl Counts {
    fn add(&mut self, o: Self) {
        self.s += o.s;
        self.f += o.f;
        self.b += o.b;
        self.c += o.c;
        self.r += o.r;
        self.a += o.a;
        self.p += o.p;
    }

    /// Outcomes that speak of the address (rate limits do not).
    fn judged(&self) -> u64 {
        self.s + self.f + self.b + self.c + self.p
    }

    /// Failures of the address: failed outcomes, blocks and failed probes.
    fn failures(&self) -> u64 {
        self.f + self.b + self.p
    }

    fn rate(&self, n: u64) -> Option<f64> {
        let all = self.judged();
        (all > 0).then(|| n as f64 / all as f64)
    }

    fn totals(&self) -> Totals {
        Totals {
            leases: self.s + self.f + self.b + self.c + self.r,
            successes: self.s,
            failures: self.failures(),
            captchas: self.c,
            rate_limited: self.r,
            abandoned: self.a,
            expired: 0,
        }
    }
}

/// `site|class → n` fields → counts per site.
fn counts_by_site(v: &Value) -> BTreeMap<String, Counts> {
    let mut out: BTreeMap<String, Counts> = BTreeMap::new();
    for (field, n) in map(v) {
        let (Some((site, class)), Ok(n)) = (field.rsplit_once('|'), n.parse::<u64>()) else {
            continue;
        };
        let c = out.entry(site.to_owned()).or_default();
        match class {
            "s" => c.s += n,
            "f" => c.f += n,
            "b" => c.b += n,
            "c" => c.c += n,
            "r" => c.r += n,
            "a" => c.a += n,
            "p" => c.p += n,
            _ => {}
        }
    }
    out
}

/// An address's windows as the snapshot function returns them: its own, then site name and
/// window per pair.
fn windows_of(v: &Value, cfg: &HealthConfig) -> Option<(Window, Vec<(String, Window)>)> {
    let Value::Array(items) = v else { return None };
    let (own, pairs) = items.split_first()?;
    let pairs = pairs
        .chunks(2)
        .map(|p| match p {
            [name, w] => Some((text(name)?, window_of(&text(w)?, cfg)?)),
            _ => None,
        })
        .collect::<Option<_>>()?;
    Some((window_of(&text(own)?, cfg)?, pairs))
}

pub(super) fn state_of(s: &str) -> Option<HealthState> {
    HealthState::ALL.into_iter().find(|h| h.as_str() == s)
}

impl SharedView {
    pub(super) fn empty(now: Timestamp) -> Self {
        let snapshot = SnapshotParts {
            at_ms: now.as_millis(),
            addresses: Vec::new(),
            matrix: Vec::new(),
            sites: Vec::new(),
            counts: PoolCounts::default(),
            decisions: Vec::new(),
        }
        .build(0.0);
        Self {
            snapshot,
            ids: Vec::new(),
            expired_untold: 0,
        }
    }

    pub(super) fn parse(reply: Value, now: Timestamp, cfg: &PoolConfig) -> Option<Self> {
        let Value::Array(parts) = reply else {
            return None;
        };
        let [
            state,
            url,
            name,
            rows_in,
            cells_in,
            qexp,
            meta,
            bindings,
            log,
            windows_in,
        ] = parts.as_slice()
        else {
            return None;
        };
        let (Value::Array(cells_in), Value::Array(windows_in)) = (cells_in, windows_in) else {
            return None;
        };
        let (url, name, qexp, meta) = (map(url), map(name), map(qexp), map(meta));
        let n = |m: &HashMap<String, String>, k: &str| {
            m.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        };
        let Value::Array(rows_in) = rows_in else {
            return None;
        };
        let Value::Array(state) = state else {
            return None;
        };
        let mut rows = Vec::new();
        // `rows_in` holds each address's hash in the order of the state index's pairs.
        let mut matrix = Vec::new();
        let mut sites: BTreeMap<String, (Counts, usize, usize)> = BTreeMap::new();
        let hc = &cfg.health;
        for (((pair, a), cells), windows) in
            state.chunks(2).zip(rows_in).zip(cells_in).zip(windows_in)
        {
            let (Some(id), Some(st)) = (text(&pair[0]), pair.get(1).and_then(text)) else {
                continue;
            };
            let Some(st) = state_of(&st) else { continue };
            let Some((window, pairs)) = windows_of(windows, hc) else {
                continue;
            };
            let all_window = window.tallies(now).0;
            let quantiles = window.exact_quantiles(now);
            let Some(full) = url.get(&id).and_then(|u| ProxyAddress::parse(u).ok()) else {
                continue;
            };
            let a = map(a);
            let redacted = name
                .get(&id)
                .cloned()
                .unwrap_or_else(|| full.redacted().to_owned());
            let ramp_share = a
                .get("rs")
                .and_then(|v| v.parse::<u64>().ok())
                .and_then(|started| {
                    let (h, started) = (&cfg.health, Timestamp::from_millis(started));
                    ramp::share(&h.ramp_steps, h.ramp_duration, started, now)
                });
            let mut all = Counts::default();
            for (site, c) in counts_by_site(cells) {
                all.add(c);
                // Abandons alone make no cell (as in memory: no outcome there).
                if c.judged() + c.r == 0 {
                    continue;
                }
                let cooling_until_ms = a
                    .get(&format!("cool|{site}"))
                    .and_then(|v| v.parse::<u64>().ok())
                    .filter(|&until| until > now.as_millis());
                let seen = sites.entry(site.clone()).or_default();
                seen.0.add(c);
                seen.1 += 1;
                seen.2 += usize::from(c.failures() + c.c > 0);
                // The pair's window, as memory's `Cell`; the site-less column is the address
                // window's untagged part.
                let pair = pairs.iter().find(|(name, _)| *name == site).map(|p| &p.1);
                let t = match pair {
                    Some(w) => w.tallies(now).0,
                    None if site == super::NO_SITE => window.site_tally(NO_SITE, now),
                    None => Tally::default(),
                };
                let avoided = pair.is_some_and(|w| signals::fall(w, hc, now, &[]).is_some());
                matrix.push(CellSnapshot {
                    address: redacted.clone(),
                    site,
                    window_samples: t.n as usize,
                    success_rate: t.rate(t.successes),
                    captcha_rate: t.rate(t.captchas),
                    avoided,
                    cooling_until_ms,
                    // Abandons are the address's, not a pair's.
                    totals: Totals {
                        abandoned: 0,
                        ..c.totals()
                    },
                });
            }
            let row = AddressSnapshot {
                address: redacted,
                fingerprint: format!("{:016x}", fingerprint(full.as_str())),
                sub_pools: a
                    .get("sp")
                    .map(|sp| sp.split_whitespace().map(str::to_owned).collect())
                    .unwrap_or_default(),
                state: st,
                state_since_ms: n(&a, "t"),
                reason: String::new(),
                // The library's keyless step is the inverse of this weight: state × ramp share
                // × quality (its level in half octaves), as `health::weight` has it.
                weight: if st.is_offered() {
                    let by_state = match st {
                        HealthState::Degraded => cfg.health.degraded_weight,
                        HealthState::Probing => cfg.health.probing_weight,
                        _ => 1.0,
                    };
                    let level = a.get("ql").and_then(|l| l.parse::<i8>().ok());
                    weight::scaled(by_state * ramp_share.unwrap_or(1.0), level.unwrap_or(0))
                } else {
                    0.0
                },
                ramp_share,
                active_leases: u32::try_from(n(&a, "n")).unwrap_or(u32::MAX),
                bound_keys: n(&a, "k"),
                window_samples: all_window.n as usize,
                success_rate: all_window.rate(all_window.successes),
                captcha_rate: all_window.rate(all_window.captchas),
                latency_p50_ms: quantiles.map(|q| q.0),
                latency_p95_ms: quantiles.map(|q| q.1),
                quarantined_until_ms: qexp
                    .get(&id)
                    .and_then(|v| v.parse::<f64>().ok())
                    .map(|v| v as u64),
                quarantine_entries: u32::try_from(n(&a, "qe")).unwrap_or(u32::MAX),
                backoff_level: u32::try_from(n(&a, "lv")).unwrap_or(u32::MAX),
                failed_cycles: u32::try_from(n(&a, "cy")).unwrap_or(u32::MAX),
                totals: all.totals(),
            };
            rows.push((id.parse::<u64>().unwrap_or(u64::MAX), row));
        }
        // In the order they were added, as memory lists its slots (ids are never reused).
        rows.sort_by_key(|(id, _)| *id);
        let (ids, mut rows): (Vec<u32>, Vec<_>) = rows
            .into_iter()
            .map(|(id, row)| (u32::try_from(id).unwrap_or(u32::MAX), row))
            .unzip();
        let sites = sites
            .into_iter()
            .map(|(site, (c, addresses, bad))| SiteSnapshot {
                degraded: meta.contains_key(&format!("d|{site}")),
                site,
                window_samples: c.judged() as usize,
                failure_rate: c.rate(c.failures()),
                captcha_rate: c.rate(c.c),
                spread: (addresses > 0).then(|| bad as f64 / addresses as f64),
            })
            .collect();
        let decisions: Vec<Decision> = match log {
            // Newest first in Redis; oldest first in a snapshot.
            Value::Array(entries) => entries
                .iter()
                .rev()
                .filter_map(|e| Some(log_entry(&text(e)?)?.1))
                .collect(),
            _ => Vec::new(),
        };
        // An address's reason is that of its latest transition still in the log.
        let mut latest: HashMap<&str, &str> = HashMap::new();
        for d in &decisions {
            if let Subject::Address { address } = &d.subject {
                latest.insert(address, &d.reason);
            }
        }
        for row in &mut rows {
            if let Some(reason) = latest.get(row.address.as_str()) {
                row.reason = (*reason).to_owned();
            }
        }
        // Open leases of removed addresses count too, as in memory.
        let active_leases =
            rows.iter().map(|a| u64::from(a.active_leases)).sum::<u64>() + n(&meta, "orphans");
        // Lease ids of an epoch start at a random `seq0`; those reserved by processes count
        // as they are granted (see `reserve` in library.lua).
        let acquired = (n(&meta, "seq") + n(&meta, "granted"))
            .saturating_sub(n(&meta, "seq0") + n(&meta, "reserved"));
        let (abandoned, expired) = (n(&meta, "abandoned"), n(&meta, "expired"));
        let expired_untold = expired.saturating_sub(n(&meta, "told"));
        let counts = PoolCounts {
            quarantine_entries: n(&meta, "q_entries"),
            frozen: meta.get("frozen").is_some_and(|f| f == "1"),
            active_leases,
            bindings: match bindings {
                Value::Int(b) => usize::try_from(*b).unwrap_or(0),
                _ => 0,
            },
            acquired,
            released: n(&meta, "released"),
            abandoned,
            expired,
            unavailable: n(&meta, "none"),
            sessions_broken: n(&meta, "broken"),
        };
        let snapshot = SnapshotParts {
            at_ms: now.as_millis(),
            addresses: rows,
            matrix,
            sites,
            counts,
            decisions,
        }
        .build(cfg.quarantine_cap);
        Some(Self {
            snapshot,
            ids,
            expired_untold,
        })
    }
}
