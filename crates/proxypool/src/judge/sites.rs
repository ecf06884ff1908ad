//! P9, the judgement of sites and of our side as pure functions over plain data: a site's
//! window of outcomes over all addresses ([`SiteWindow`]), whether it is degraded and since
//! when, the configuration and `now`. Both stores keep the window (memory in its `Site`, Redis
//! in the library's `w|SITE` field, read into a [`SiteWindow`]) and apply what is decided.
//!
//! Because a site's window sees all its traffic it turns well before any single address's
//! window does, so when a site goes bad for everyone it is judged degraded before the
//! addresses are judged, and their failures there are excused instead of quarantining them —
//! including the ones of the stretch that convicted the site (see [`SiteChange::Degrade`]).

use std::collections::VecDeque;
use std::time::Duration;

use crate::clock::{Timestamp, millis};
use crate::config::{HealthConfig, JudgementConfig};
use crate::health::window::Class;
use crate::strategy::Slot;

/// The longest newest stretch a site is judged on by itself (`JudgementConfig::site_recent`).
pub(crate) const MAX_RECENT: usize = 64;

/// One outcome at a site.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen {
    pub(crate) slot: Slot,
    pub(crate) class: Class,
    pub(crate) at: Timestamp,
}

/// Outcome counts over a stretch of a site's window.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Counts {
    pub(crate) n: usize,
    pub(crate) successes: usize,
    pub(crate) captchas: usize,
}

impl Counts {
    fn add(&mut self, class: Class) {
        self.n += 1;
        match class {
            Class::Success => self.successes += 1,
            Class::Captcha => self.captchas += 1,
            Class::Failure => {}
        }
    }

    fn sub(&mut self, class: Class) {
        self.n -= 1;
        match class {
            Class::Success => self.successes -= 1,
            Class::Captcha => self.captchas -= 1,
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
    /// The first bad outcome of the stretch that convicted the site.
    pub(crate) from: Timestamp,
}

/// Distinct addresses in a stretch of a site's window, how many of them had a bad outcome
/// there, and when the first bad one was.
pub(crate) struct Spread {
    pub(crate) distinct: usize,
    pub(crate) with_bad: usize,
    pub(crate) first_bad: Option<Timestamp>,
}

/// A site's last outcomes over all addresses, oldest first, with running counts over the
/// whole window and over its newest `site_recent` outcomes.
#[derive(Debug, Clone, Default)]
pub(crate) struct SiteWindow {
    window: VecDeque<Seen>,
    pub(crate) whole: Counts,
    recent: Counts,
}

impl SiteWindow {
    fn pop_front(&mut self, recent_len: usize) {
        let was = self.window.len();
        if let Some(old) = self.window.pop_front() {
            self.whole.sub(old.class);
            // The front is in the newest stretch only when the window is no longer than it.
            if was <= recent_len {
                self.recent.sub(old.class);
            }
        }
    }

    /// Drops the outcomes older than `max_age`.
    pub(crate) fn expire(&mut self, now: Timestamp, max_age: Duration, recent_len: usize) {
        let max_age = millis(max_age);
        while self.window.front().is_some_and(|s| old(s, now, max_age)) {
            self.pop_front(recent_len);
        }
    }

    pub(crate) fn push(&mut self, seen: Seen, h: &HealthConfig, j: &JudgementConfig) {
        self.expire(seen.at, h.window_max_age, j.site_recent);
        if self.window.len() >= j.site_window {
            self.pop_front(j.site_recent);
        }
        self.window.push_back(seen);
        self.whole.add(seen.class);
        self.recent.add(seen.class);
        let len = self.window.len();
        if len > j.site_recent
            && let Some(leaving) = self.window.get(len - 1 - j.site_recent)
        {
            self.recent.sub(leaving.class);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.window.len()
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

    /// The spread over the newest `stretch` outcomes.
    pub(crate) fn spread(&self, stretch: usize) -> Spread {
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

    /// Whether the site has seen enough traffic to be judged at all: outcomes younger than
    /// the maximum age at `now` (a window ages whether or not outcomes arrive).
    pub(crate) fn has_evidence(
        &self,
        now: Timestamp,
        h: &HealthConfig,
        j: &JudgementConfig,
    ) -> bool {
        let max_age = millis(h.window_max_age);
        let young = self
            .window
            .iter()
            .rev()
            .take_while(|s| !old(s, now, max_age));
        young.count() >= j.site_min_samples
    }
}

fn old(s: &Seen, now: Timestamp, max_age: u64) -> bool {
    now.as_millis().saturating_sub(s.at.as_millis()) >= max_age
}

/// A change of a site's verdict (P9).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SiteChange {
    /// Degraded. Its outcomes from `from` (the first bad outcome of the stretch that convicted
    /// it) on are excused retroactively, so the failures that revealed a site-wide problem are
    /// not held against the addresses that happened to meet it first.
    Degrade { reason: String, from: Timestamp },
    /// Ok again.
    Recover(&'static str),
}

impl SiteChange {
    pub(crate) fn states(&self) -> (&'static str, &'static str) {
        match self {
            Self::Degrade { .. } => ("ok", "degraded"),
            Self::Recover(_) => ("degraded", "ok"),
        }
    }
}

/// The site's verdict after an outcome of `class` was pushed into its window, if it changed
/// from `degraded` (since `since`). A success cannot make a site look worse: it is judged on
/// bad outcomes, and on every outcome while degraded (to see it recover after the dwell).
#[inline]
pub(crate) fn judge_site(
    window: &SiteWindow,
    degraded: bool,
    since: Timestamp,
    class: Class,
    now: Timestamp,
    h: &HealthConfig,
    j: &JudgementConfig,
) -> Option<SiteChange> {
    if class == Class::Success && !degraded {
        return None;
    }
    match (degraded, window.verdict(h, j)) {
        (false, Some(v)) => Some(SiteChange::Degrade {
            reason: format!(
                "{}: failures there are not held against addresses",
                v.reason
            ),
            from: v.from,
        }),
        (true, None) if now.since(since) >= h.min_dwell => Some(SiteChange::Recover(
            "failures no longer spread over most addresses",
        )),
        _ => None,
    }
}

/// P9, our side: when every site with evidence is degraded (at least two of them), the common
/// factor is our side (network, probes): quarantining is frozen until one recovers. `sites`:
/// per site, whether it has evidence and whether it is degraded. The change from `frozen`, if
/// any, with its reason.
pub(crate) fn judge_our_side(
    sites: impl IntoIterator<Item = (bool, bool)>,
    frozen: bool,
) -> Option<(bool, String)> {
    let (mut judged, mut degraded) = (0, 0);
    for (evidence, d) in sites {
        if evidence {
            judged += 1;
            degraded += usize::from(d);
        }
    }
    let now_frozen = judged >= 2 && degraded == judged;
    (now_frozen != frozen).then(|| {
        (
            now_frozen,
            format!("{degraded} of {judged} sites with traffic degraded"),
        )
    })
}

/// The states of our side's decision: from, to.
pub(crate) fn our_side_states(frozen: bool) -> (&'static str, &'static str) {
    if frozen {
        ("quarantining", "frozen")
    } else {
        ("frozen", "quarantining")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every one of 10 addresses once per round, a second per round, 1 ms apart.
    fn push_all(
        site: &mut SiteWindow,
        rounds: std::ops::Range<u64>,
        class: impl Fn(u64, u32) -> Class,
    ) {
        let (h, j) = (HealthConfig::default(), JudgementConfig::default());
        for round in rounds {
            for slot in 0..10u32 {
                let at = Timestamp::from_millis(round * 1000 + u64::from(slot));
                let class = class(round, slot);
                site.push(Seen { slot, class, at }, &h, &j);
            }
        }
    }

    #[test]
    fn p9_a_few_bad_addresses_do_not_make_a_bad_site() {
        let (h, j) = (HealthConfig::default(), JudgementConfig::default());
        let mut site = SiteWindow::default();
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
        let mut site = SiteWindow::default();
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
        let mut site = SiteWindow::default();
        push_all(&mut site, 0..3, |_, _| Class::Failure);
        assert!(site.verdict(&h, &j).is_some());
        let later = Timestamp::from_millis(10 * 60 * 1000 + 2009);
        assert!(site.has_evidence(Timestamp::from_millis(2009), &h, &j));
        // Evidence ages with the window, whether or not it is expired yet.
        assert!(!site.has_evidence(later, &h, &j));
        site.expire(later, h.window_max_age, j.site_recent);
        assert_eq!(site.len(), 0);
        assert_eq!((site.whole.n, site.recent.n), (0, 0));
        assert!(site.verdict(&h, &j).is_none());
    }

    #[test]
    fn p9_our_side_is_frozen_when_every_site_with_evidence_is_degraded() {
        // One site with evidence is not enough to blame our side.
        assert_eq!(judge_our_side([(true, true), (false, false)], false), None);
        let (frozen, reason) = judge_our_side([(true, true), (true, true)], false).unwrap();
        assert!(frozen && reason == "2 of 2 sites with traffic degraded");
        assert_eq!(judge_our_side([(true, true), (true, true)], true), None);
        assert!(matches!(
            judge_our_side([(true, true), (true, false)], true),
            Some((false, _))
        ));
    }
}
