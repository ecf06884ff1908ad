//! P9: the address × site matrix and the judgement of sites.
//!
//! Every site keeps one window of its last outcomes over all addresses. Because it sees all
//! the site's traffic it turns well before any single address's window does, so when a site
//! goes bad for everyone it is judged degraded before the addresses are judged, and their
//! failures there are excused instead of quarantining them.

use std::collections::{HashMap, VecDeque};

use rustc_hash::FxHashMap;
use std::sync::Arc;

use crate::clock::Timestamp;
use crate::config::{HealthConfig, JudgementConfig};
use crate::health::window::Class;
use crate::snapshot::{SiteSnapshot, Totals};
use crate::strategy::Slot;
use crate::telemetry::CellMetrics;

/// The column of tickets that name no site.
pub(crate) const NO_SITE: u32 = 0;

#[derive(Debug)]
pub(crate) struct Site {
    pub(crate) name: Arc<str>,
    pub(crate) degraded: bool,
    pub(crate) since: Timestamp,
    window: VecDeque<(Slot, Class)>,
    successes: usize,
    captchas: usize,
    /// Per address in the window: (outcomes, bad outcomes).
    per_address: FxHashMap<Slot, (u32, u32)>,
    with_bad: usize,
}

impl Site {
    fn new(name: Arc<str>) -> Self {
        Self {
            name,
            degraded: false,
            since: Timestamp::default(),
            window: VecDeque::new(),
            successes: 0,
            captchas: 0,
            per_address: FxHashMap::default(),
            with_bad: 0,
        }
    }

    fn count(&mut self, slot: Slot, class: Class, add: bool) {
        let bad = u32::from(class != Class::Success);
        let (n, b) = self.per_address.entry(slot).or_insert((0, 0));
        let had_bad = *b > 0;
        if add {
            *n += 1;
            *b += bad;
        } else {
            *n -= 1;
            *b -= bad;
        }
        let (n, has_bad) = (*n, *b > 0);
        if n == 0 {
            self.per_address.remove(&slot);
        }
        match (had_bad, has_bad) {
            (false, true) => self.with_bad += 1,
            (true, false) => self.with_bad -= 1,
            _ => {}
        }
        let sign = |c: &mut usize| if add { *c += 1 } else { *c -= 1 };
        match class {
            Class::Success => sign(&mut self.successes),
            Class::Captcha => sign(&mut self.captchas),
            Class::Failure => {}
        }
    }

    pub(crate) fn push(&mut self, slot: Slot, class: Class, keep: usize) {
        if self.window.len() >= keep
            && let Some((s, c)) = self.window.pop_front()
        {
            self.count(s, c, false);
        }
        self.window.push_back((slot, class));
        self.count(slot, class, true);
    }

    /// Why the site should be judged degraded now, if it should: its success or captcha rate
    /// crosses the thresholds an address would be judged by, and the bad outcomes are spread
    /// over most of the addresses that worked on it (a few bad addresses do not make a bad
    /// site). Judged over the whole site window and over its newest outcomes, so that a sudden
    /// site-wide spike is recognised within a few requests, before any one address has
    /// gathered enough failures to be condemned for it.
    pub(crate) fn verdict(&self, h: &HealthConfig, j: &JudgementConfig) -> Option<String> {
        let whole = Tally {
            n: self.window.len(),
            successes: self.successes,
            captchas: self.captchas,
            distinct: self.per_address.len(),
            with_bad: self.with_bad,
        };
        let recent = Tally::of(self.window.iter().rev().take(j.site_recent));
        [whole, recent].into_iter().find_map(|t| t.verdict(h, j))
    }

    /// Whether the site has seen enough traffic to be judged at all.
    pub(crate) fn has_evidence(&self, j: &JudgementConfig) -> bool {
        self.window.len() >= j.site_min_samples
    }

    pub(crate) fn snapshot(&self) -> SiteSnapshot {
        let n = self.window.len();
        let rate = |x: usize| (n > 0).then(|| x as f64 / n as f64);
        SiteSnapshot {
            site: self.name.to_string(),
            degraded: self.degraded,
            window_samples: n,
            failure_rate: rate(n - self.successes - self.captchas),
            captcha_rate: rate(self.captchas),
            spread: (!self.per_address.is_empty())
                .then(|| self.with_bad as f64 / self.per_address.len() as f64),
        }
    }
}

/// The longest newest stretch a site is judged on by itself (`JudgementConfig::site_recent`).
pub(crate) const MAX_RECENT: usize = 64;

/// Counts over a stretch of a site's window.
#[derive(Debug, Clone, Copy)]
struct Tally {
    n: usize,
    successes: usize,
    captchas: usize,
    distinct: usize,
    with_bad: usize,
}

impl Tally {
    /// Tallies at most [`MAX_RECENT`] entries, on the stack: this runs on every release.
    fn of<'a>(entries: impl Iterator<Item = &'a (Slot, Class)>) -> Self {
        let mut t = Self {
            n: 0,
            successes: 0,
            captchas: 0,
            distinct: 0,
            with_bad: 0,
        };
        let mut seen = [(0 as Slot, false); MAX_RECENT];
        for &(slot, class) in entries.take(MAX_RECENT) {
            t.n += 1;
            match class {
                Class::Success => t.successes += 1,
                Class::Captcha => t.captchas += 1,
                Class::Failure => {}
            }
            let bad = class != Class::Success;
            match seen[..t.distinct].iter_mut().find(|(s, _)| *s == slot) {
                Some((_, b)) => *b |= bad,
                None => {
                    seen[t.distinct] = (slot, bad);
                    t.distinct += 1;
                }
            }
        }
        t.with_bad = seen[..t.distinct].iter().filter(|(_, b)| *b).count();
        t
    }

    fn verdict(&self, h: &HealthConfig, j: &JudgementConfig) -> Option<String> {
        if self.n < j.site_min_samples || self.distinct < j.site_min_addresses {
            return None;
        }
        let success = self.successes as f64 / self.n as f64;
        let captcha = self.captchas as f64 / self.n as f64;
        let spread = self.with_bad as f64 / self.distinct as f64;
        let bad = success < h.min_success_rate || captcha > h.max_captcha_rate;
        (bad && spread > j.site_spread).then(|| {
            format!(
                "success {:.0}%, captcha {:.0}% over the last {} outcomes; {} of {} addresses affected",
                success * 100.0,
                captcha * 100.0,
                self.n,
                self.with_bad,
                self.distinct
            )
        })
    }
}

/// One address × site pair.
#[derive(Debug)]
pub(crate) struct Cell {
    window: VecDeque<Class>,
    successes: usize,
    captchas: usize,
    pub(crate) cooling_until: Option<Timestamp>,
    pub(crate) totals: Totals,
    pub(crate) metrics: CellMetrics,
}

impl Cell {
    pub(crate) fn new(metrics: CellMetrics) -> Self {
        Self {
            window: VecDeque::new(),
            successes: 0,
            captchas: 0,
            cooling_until: None,
            totals: Totals::default(),
            metrics,
        }
    }

    pub(crate) fn push(&mut self, class: Class, keep: usize) {
        if self.window.len() >= keep
            && let Some(old) = self.window.pop_front()
        {
            match old {
                Class::Success => self.successes -= 1,
                Class::Captcha => self.captchas -= 1,
                Class::Failure => {}
            }
        }
        match class {
            Class::Success => self.successes += 1,
            Class::Captcha => self.captchas += 1,
            Class::Failure => {}
        }
        self.window.push_back(class);
    }

    /// (samples, success rate, captcha rate).
    pub(crate) fn rates(&self) -> (usize, Option<f64>, Option<f64>) {
        let n = self.window.len();
        let rate = |x: usize| (n > 0).then(|| x as f64 / n as f64);
        (n, rate(self.successes), rate(self.captchas))
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

    /// The id of a site already seen; `None` never saw traffic, so nothing can be cooling there.
    pub(crate) fn find(&self, name: Option<&str>) -> Option<u32> {
        match name {
            None => Some(NO_SITE),
            Some(n) => self.index.get(n).copied(),
        }
    }

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

    pub(crate) fn cooling(&self, slot: Slot, site: u32, now: Timestamp) -> Option<Timestamp> {
        self.cells
            .get(&(slot, site))
            .and_then(|c| c.cooling_until)
            .filter(|until| *until > now)
    }

    /// The cell of a pair, created (and its metrics registered) on first use.
    pub(crate) fn cell(&mut self, slot: Slot, site: u32, address: &str) -> &mut Cell {
        let name = self.list.get(site as usize).map_or("-", |s| &*s.name);
        self.cells
            .entry((slot, site))
            .or_insert_with(|| Cell::new(CellMetrics::new(address, name)))
    }

    pub(crate) fn forget_address(&mut self, slot: Slot) {
        self.cells.retain(|(s, _), _| *s != slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p9_a_few_bad_addresses_do_not_make_a_bad_site() {
        let (h, j) = (HealthConfig::default(), JudgementConfig::default());
        let mut site = Site::new("s".into());
        // 10 addresses, 3 always failing: success 70 %, but only 3 of 10 affected.
        for _ in 0..10 {
            for slot in 0..10u32 {
                let class = if slot < 3 {
                    Class::Failure
                } else {
                    Class::Success
                };
                site.push(slot, class, j.site_window);
            }
        }
        assert_eq!(site.verdict(&h, &j), None);
        // Now every address fails half the time: the site is to blame.
        for round in 0..10 {
            for slot in 0..10u32 {
                let class = if (slot + round) % 2 == 0 {
                    Class::Failure
                } else {
                    Class::Success
                };
                site.push(slot, class, j.site_window);
            }
        }
        assert!(site.verdict(&h, &j).is_some());
    }
}
