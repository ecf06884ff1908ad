//! P9: the address × site matrix and the judgement of sites.
//!
//! Every site keeps one window of its last outcomes over all addresses. Because it sees all
//! the site's traffic it turns well before any single address's window does, so when a site
//! goes bad for everyone it is judged degraded before the addresses are judged, and their
//! failures there are excused instead of quarantining them — including the ones of the
//! stretch that convicted the site (see [`Verdict::from`]).
//!
//! Each address × site pair (a [`Cell`]) with a named site keeps its own window: it weights the address for
//! tickets of that site, and when it alone looks bad the address is avoided there but kept
//! for other sites.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use rustc_hash::FxHashMap;

use crate::clock::{Timestamp, millis};
use crate::config::{HealthConfig, JudgementConfig};
use crate::health::signals::{self, Signal};
use crate::health::window::{Class, Window};
use crate::snapshot::{SiteSnapshot, Totals};
use crate::strategy::Slot;
use crate::telemetry::CellMetrics;

/// The column of tickets that name no site.
pub(crate) const NO_SITE: u32 = 0;

/// The longest newest stretch a site is judged on by itself (`JudgementConfig::site_recent`).
pub(crate) const MAX_RECENT: usize = 64;

#[derive(Debug, Clone, Copy)]
struct Seen {
    slot: Slot,
    class: Class,
    at: Timestamp,
}

/// Outcome counts over a stretch of a site's window.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    n: usize,
    successes: usize,
    captchas: usize,
}

impl Counts {
    fn change(&mut self, class: Class, add: bool) {
        let step = |c: &mut usize| if add { *c += 1 } else { *c -= 1 };
        step(&mut self.n);
        match class {
            Class::Success => step(&mut self.successes),
            Class::Captcha => step(&mut self.captchas),
            Class::Failure => {}
        }
    }

    /// Rates that would condemn an address, over enough samples to judge.
    fn bad(&self, h: &HealthConfig, j: &JudgementConfig) -> bool {
        let n = self.n as f64;
        self.n >= j.site_min_samples.max(1)
            && ((self.successes as f64) < h.min_success_rate * n
                || (self.captchas as f64) > h.max_captcha_rate * n)
    }
}

/// Why a site is to blame, and since when.
#[derive(Debug, Clone)]
pub(crate) struct Verdict {
    pub(crate) reason: String,
    /// The first bad outcome of the stretch that convicted the site: outcomes there from this
    /// instant on are excused retroactively, so the failures that revealed a site-wide problem
    /// are not held against the addresses that happened to meet it first.
    pub(crate) from: Timestamp,
}

#[derive(Debug)]
pub(crate) struct Site {
    pub(crate) name: Arc<str>,
    pub(crate) degraded: bool,
    pub(crate) since: Timestamp,
    window: VecDeque<Seen>,
    whole: Counts,
    /// Counts over the newest `site_recent` outcomes, kept as the window slides.
    recent: Counts,
    /// Running latency of the successes here: the reference of the address × site weights.
    pub(crate) reference_ms: Option<f64>,
}

impl Site {
    fn new(name: Arc<str>) -> Self {
        Self {
            name,
            degraded: false,
            since: Timestamp::default(),
            window: VecDeque::new(),
            whole: Counts::default(),
            recent: Counts::default(),
            reference_ms: None,
        }
    }

    fn pop_front(&mut self, recent_len: usize) {
        let was = self.window.len();
        if let Some(old) = self.window.pop_front() {
            self.whole.change(old.class, false);
            // The front is in the newest stretch only when the window is no longer than it.
            if was <= recent_len {
                self.recent.change(old.class, false);
            }
        }
    }

    /// Drops the outcomes older than `max_age`.
    pub(crate) fn expire(&mut self, now: Timestamp, max_age: Duration, recent_len: usize) {
        let max_age = millis(max_age);
        while self
            .window
            .front()
            .is_some_and(|s| now.as_millis().saturating_sub(s.at.as_millis()) >= max_age)
        {
            self.pop_front(recent_len);
        }
    }

    pub(crate) fn push(
        &mut self,
        slot: Slot,
        class: Class,
        now: Timestamp,
        h: &HealthConfig,
        j: &JudgementConfig,
    ) {
        self.expire(now, h.window_max_age, j.site_recent);
        if self.window.len() >= j.site_window {
            self.pop_front(j.site_recent);
        }
        self.window.push_back(Seen {
            slot,
            class,
            at: now,
        });
        self.whole.change(class, true);
        self.recent.change(class, true);
        let len = self.window.len();
        if len > j.site_recent
            && let Some(leaving) = self.window.get(len - 1 - j.site_recent)
        {
            self.recent.change(leaving.class, false);
        }
    }

    /// Why the site should be judged degraded now, if it should: its success or captcha rate
    /// crosses the thresholds an address would be judged by, and the bad outcomes are spread
    /// over most of the addresses that worked on it (a few bad addresses do not make a bad
    /// site). Judged over the whole site window and over its newest outcomes, so that a sudden
    /// site-wide spike is recognised within a few requests, before any one address has
    /// gathered enough failures to be condemned for it. The rates are running counts; the
    /// spread is only looked at when they are bad.
    pub(crate) fn verdict(&self, h: &HealthConfig, j: &JudgementConfig) -> Option<Verdict> {
        if !self.whole.bad(h, j) && !self.recent.bad(h, j) {
            return None;
        }
        let len = self.window.len();
        [(self.whole, len), (self.recent, len.min(j.site_recent))]
            .into_iter()
            .filter(|(counts, _)| counts.bad(h, j))
            .find_map(|(counts, stretch)| {
                let spread = self.spread(stretch);
                if spread.distinct < j.site_min_addresses
                    || spread.with_bad as f64 / spread.distinct as f64 <= j.site_spread
                {
                    return None;
                }
                let reason = format!(
                    "success {:.0}%, captcha {:.0}% over the last {} outcomes; {} of {} addresses affected",
                    counts.successes as f64 * 100.0 / counts.n as f64,
                    counts.captchas as f64 * 100.0 / counts.n as f64,
                    counts.n,
                    spread.with_bad,
                    spread.distinct
                );
                Some(Verdict {
                    reason,
                    from: spread.first_bad.unwrap_or_default(),
                })
            })
    }

    /// Distinct addresses in the newest `stretch` outcomes, how many of them had a bad one,
    /// and when the first bad one was.
    fn spread(&self, stretch: usize) -> Spread {
        let start = self.window.len() - stretch;
        let mut seen: Vec<(Slot, bool)> = self
            .window
            .range(start..)
            .map(|s| (s.slot, s.class != Class::Success))
            .collect();
        let first_bad = self
            .window
            .range(start..)
            .find(|s| s.class != Class::Success)
            .map(|s| s.at);
        seen.sort_unstable();
        let (mut distinct, mut with_bad) = (0, 0);
        for group in seen.chunk_by(|a, b| a.0 == b.0) {
            distinct += 1;
            if group.iter().any(|(_, bad)| *bad) {
                with_bad += 1;
            }
        }
        Spread {
            distinct,
            with_bad,
            first_bad,
        }
    }

    /// The distinct addresses with an outcome here at or after `from`.
    pub(crate) fn slots_since(&self, from: Timestamp) -> Vec<Slot> {
        let mut slots: Vec<Slot> = self
            .window
            .iter()
            .filter(|s| s.at >= from)
            .map(|s| s.slot)
            .collect();
        slots.sort_unstable();
        slots.dedup();
        slots
    }

    /// Whether the site has seen enough traffic to be judged at all.
    pub(crate) fn has_evidence(&self, j: &JudgementConfig) -> bool {
        self.window.len() >= j.site_min_samples
    }

    pub(crate) fn snapshot(&self) -> SiteSnapshot {
        let n = self.window.len();
        let rate = |x: usize| (n > 0).then(|| x as f64 / n as f64);
        let spread = self.spread(n);
        SiteSnapshot {
            site: self.name.to_string(),
            degraded: self.degraded,
            window_samples: n,
            failure_rate: rate(n - self.whole.successes - self.whole.captchas),
            captcha_rate: rate(self.whole.captchas),
            spread: (spread.distinct > 0).then(|| spread.with_bad as f64 / spread.distinct as f64),
        }
    }
}

struct Spread {
    distinct: usize,
    with_bad: usize,
    first_bad: Option<Timestamp>,
}

/// One address × named site pair. Tickets without a site have no cells: nothing is judged or
/// weighted per pair there, the address window holds their outcomes (tagged), and the matrix
/// derives their column from the address (so a site-less release touches no cell).
#[derive(Debug)]
pub(crate) struct Cell {
    pub(crate) window: Window,
    pub(crate) cooling_until: Option<Timestamp>,
    /// The verdict last logged for the pair, so that only its changes are logged (P16).
    pub(crate) avoided: bool,
    pub(crate) totals: Totals,
    pub(crate) metrics: CellMetrics,
}

impl Cell {
    /// Why the address should be avoided for this site at `now`, if it should: the address
    /// fall signals over the pair's own counted outcomes.
    pub(crate) fn verdict(&self, cfg: &HealthConfig, now: Timestamp) -> Option<Signal> {
        signals::fall(&self.window, cfg, now, &[])
    }
}

/// Interned site names, their judgement and the matrix.
#[derive(Debug)]
pub(crate) struct Sites {
    index: HashMap<Arc<str>, u32>,
    pub(crate) list: Vec<Site>,
    /// Internal integer keys: a fast hash is safe here (no caller controls them).
    pub(crate) cells: FxHashMap<(Slot, u32), Cell>,
}

impl Sites {
    pub(crate) fn new() -> Self {
        Self {
            index: HashMap::new(),
            list: vec![Site::new("-".into())],
            cells: FxHashMap::default(),
        }
    }

    /// The id of a site, registered on first sight (by an acquire or a release).
    pub(crate) fn intern(&mut self, name: Option<&Arc<str>>) -> u32 {
        let Some(name) = name else { return NO_SITE };
        if let Some(id) = self.index.get(&**name) {
            return *id;
        }
        let id = u32::try_from(self.list.len()).unwrap_or(u32::MAX);
        self.list.push(Site::new(Arc::clone(name)));
        self.index.insert(Arc::clone(name), id);
        id
    }

    pub(crate) fn is_degraded(&self, site: u32) -> bool {
        self.list.get(site as usize).is_some_and(|s| s.degraded)
    }

    pub(crate) fn get(&self, slot: Slot, site: u32) -> Option<&Cell> {
        self.cells.get(&(slot, site))
    }

    /// The cell of a pair with a named site, created (and its metrics registered) on first
    /// use.
    pub(crate) fn cell(
        &mut self,
        slot: Slot,
        site: u32,
        address: &str,
        cfg: &HealthConfig,
    ) -> &mut Cell {
        let name = self.list.get(site as usize).map_or("-", |s| &*s.name);
        self.cells.entry((slot, site)).or_insert_with(|| Cell {
            window: Window::new(cfg.window, cfg.window_max_age, false),
            cooling_until: None,
            avoided: false,
            totals: Totals::default(),
            metrics: CellMetrics::new(address, name),
        })
    }

    pub(crate) fn forget_address(&mut self, slot: Slot) {
        self.cells.retain(|(s, _), _| *s != slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every one of 10 addresses once per round, a second per round, 1 ms apart.
    fn push_all(site: &mut Site, rounds: std::ops::Range<u64>, class: impl Fn(u64, u32) -> Class) {
        let (h, j) = (HealthConfig::default(), JudgementConfig::default());
        for round in rounds {
            for slot in 0..10u32 {
                let at = Timestamp::from_millis(round * 1000 + u64::from(slot));
                site.push(slot, class(round, slot), at, &h, &j);
            }
        }
    }

    #[test]
    fn p9_a_few_bad_addresses_do_not_make_a_bad_site() {
        let (h, j) = (HealthConfig::default(), JudgementConfig::default());
        let mut site = Site::new("s".into());
        // 10 addresses, 3 always failing: success 70 %, but only 3 of 10 affected.
        push_all(&mut site, 0..10, |_, slot| {
            if slot < 3 {
                Class::Failure
            } else {
                Class::Success
            }
        });
        assert!(site.verdict(&h, &j).is_none());
        // Now every address fails half the time: the site is to blame.
        push_all(&mut site, 10..20, |round, slot| {
            if (u64::from(slot) + round) % 2 == 0 {
                Class::Failure
            } else {
                Class::Success
            }
        });
        assert!(site.verdict(&h, &j).is_some());
    }

    #[test]
    fn p9_a_verdict_dates_back_to_the_first_bad_outcome_of_its_stretch() {
        let (h, j) = (HealthConfig::default(), JudgementConfig::default());
        let mut site = Site::new("s".into());
        push_all(&mut site, 0..5, |_, _| Class::Success);
        push_all(&mut site, 5..7, |_, slot| {
            if slot % 4 == 3 {
                Class::Success
            } else {
                Class::Failure
            }
        });
        // The newest 16 outcomes convict; they start in round 5 at slot 4 (a failure).
        let v = site.verdict(&h, &j).unwrap();
        assert_eq!(v.from, Timestamp::from_millis(5004), "{}", v.reason);
        assert_eq!(site.slots_since(v.from).len(), 10);
    }

    #[test]
    fn p9_site_windows_age_and_recent_counts_follow() {
        let (h, j) = (HealthConfig::default(), JudgementConfig::default());
        let mut site = Site::new("s".into());
        push_all(&mut site, 0..3, |_, _| Class::Failure);
        assert!(site.verdict(&h, &j).is_some());
        site.expire(
            Timestamp::from_millis(10 * 60 * 1000 + 2009),
            h.window_max_age,
            j.site_recent,
        );
        assert_eq!(site.window.len(), 0);
        assert_eq!((site.whole.n, site.recent.n), (0, 0));
        assert!(site.verdict(&h, &j).is_none());
    }
}
