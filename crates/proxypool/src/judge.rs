//! The judgement of one address as pure functions over plain data: where the address stands
//! (`Standing`, its `Health`), what its windows say (`Evidence`), the configuration and `now`,
//! passed in — no I/O, no clock reads, no store types. Each function decides a transition
//! with its reason; the store applies it (and logs it). Random draws (the backoff's jitter)
//! come from the caller's seeded generator. Sites and our side: [`sites`].

pub(crate) mod sites;

use rand::Rng;

use crate::clock::Timestamp;
use crate::config::{HealthConfig, PoolConfig};
use crate::health::quarantine::Refusal;
use crate::health::signals::{self, Signal};
use crate::health::window::{Class, Window};
use crate::health::{Health, HealthState, backoff};
use crate::state::sites::NO_SITE;

/// Where an address stands when an outcome arrives: the parts of its [`Health`] the
/// evaluation reads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Standing {
    pub(crate) state: HealthState,
    /// Ramping back after a quarantine (see [`Health::returning`]).
    pub(crate) returning: bool,
    /// Failures counted since a short fall signal made it suspect.
    pub(crate) suspect: Option<u32>,
    /// The minimum dwell in its state has passed.
    pub(crate) dwelt: bool,
}

impl Standing {
    pub(crate) fn of(h: &Health, now: Timestamp, cfg: &HealthConfig) -> Self {
        Self {
            state: h.state,
            returning: h.returning(),
            suspect: h.suspect,
            dwelt: h.dwelt(now, cfg),
        }
    }
}

/// The thresholds the evaluation itself compares against (the windows' evidence applies
/// the others).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Thresholds {
    pub(crate) min_success_rate: f64,
    pub(crate) recent_failures: usize,
}

impl Thresholds {
    pub(crate) fn of(cfg: &HealthConfig) -> Self {
        Self {
            min_success_rate: cfg.min_success_rate,
            recent_failures: cfg.recent_failures,
        }
    }
}

/// What an address's windows say, read only when the judgement needs it (reading costs).
pub(crate) trait Evidence {
    /// The fall signal over its counted outcomes (P4), judged per address × site (P9).
    fn fall(&mut self) -> Option<Signal>;
    /// Its latency tail (P4). `always` while degraded, to see the tail clear; otherwise the
    /// evidence reads it only when the outcome can have grown it.
    fn slow_tail(&mut self, always: bool) -> Option<Signal>;
}

/// What one evaluation of an address decided.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Verdict {
    /// A fall: to quarantine, through the gate ([`fall`]).
    Quarantine(String),
    /// A move that needs no gate.
    Become(HealthState, String),
    /// One more pass towards leaving probing ([`probe_pass`]).
    ProbeSuccess,
    /// A short fall signal: suspect until as many failures again confirm it. `Some` reason
    /// when the address is healthy and degrades meanwhile.
    Suspect(Option<String>),
    /// A failure while suspect and the signal still holds; the reason to quarantine once
    /// enough have come.
    Confirm(Option<String>),
    /// The signal no longer holds: not suspect any more.
    Clear,
}

/// Whether [`evaluate`] has nothing to decide, without asking it: a success of a healthy
/// address that is not suspect, when the outcome cannot have grown its latency tail
/// (`may_grow_tail`: the evidence then says no tail, so no fall, clear or slow verdict can
/// come). The common release; an engine skips building the evaluation's inputs for it.
pub(crate) fn nothing_to_decide(
    state: HealthState,
    suspect: Option<u32>,
    class: Class,
    may_grow_tail: bool,
) -> bool {
    class == Class::Success && !may_grow_tail && state == HealthState::Healthy && suspect.is_none()
}

/// The address's evaluation after an outcome of `class` (P3–P5, P10). `excused`: the outcome's
/// site is judged degraded (P9), so it says nothing about the address. A fall is judged when
/// a bad outcome arrives: a success cannot start one.
pub(crate) fn evaluate(
    at: Standing,
    class: Class,
    excused: bool,
    cfg: Thresholds,
    evidence: &mut impl Evidence,
) -> Option<Verdict> {
    match at.state {
        HealthState::Quarantined | HealthState::Dead => None,
        HealthState::Probing if excused => None,
        HealthState::Probing if class == Class::Success => Some(Verdict::ProbeSuccess),
        // A captcha is reputation, judged by its rate, not a failed probe.
        HealthState::Probing if class == Class::Captcha => None,
        HealthState::Probing => Some(Verdict::Quarantine("failure while probing".into())),
        HealthState::Healthy | HealthState::Degraded => {
            let bad = class != Class::Success;
            // Judged on bad outcomes; on successes too while suspect, to clear it.
            let signal = (!excused && (bad || at.suspect.is_some()))
                .then(|| evidence.fall())
                .flatten();
            match signal {
                _ if bad && !excused && at.returning && class == Class::Failure => {
                    Some(Verdict::Quarantine("failure during the ramp".to_owned()))
                }
                // "3 of the last 5" quarantines at once when the window agrees (its success
                // rate is below the threshold too). Against a long good record it is met by
                // chance now and then — at 2 % background failures about once per 20 000
                // requests of a pool — so there it only makes the address suspect, and as
                // many failures again while it holds confirm it.
                Some(s @ Signal::RecentFailures { window_success, .. }) if bad => {
                    match at.suspect {
                        None if window_success < cfg.min_success_rate => {
                            Some(Verdict::Quarantine(s.to_string()))
                        }
                        None => Some(Verdict::Suspect(
                            (at.state == HealthState::Healthy)
                                .then(|| format!("{s}; suspect until as many more confirm it")),
                        )),
                        Some(n) if class == Class::Failure => {
                            let n = n + 1;
                            let enough = n as usize >= cfg.recent_failures;
                            Some(Verdict::Confirm(
                                enough.then(|| format!("{s}, confirmed by {n} more failures")),
                            ))
                        }
                        Some(_) => None,
                    }
                }
                // The rates are judged over at least `min_samples` outcomes: evidence
                // enough on its own.
                Some(s) if bad => Some(Verdict::Quarantine(s.to_string())),
                _ if bad => None,
                None if at.suspect.is_some() => Some(Verdict::Clear),
                _ => rise_or_slow(at, evidence),
            }
        }
    }
}

/// After a success, or a bad outcome that signals nothing: a latency tail degrades a healthy
/// address; a degraded one with nothing against it returns after the dwell.
fn rise_or_slow(at: Standing, evidence: &mut impl Evidence) -> Option<Verdict> {
    let slow = evidence.slow_tail(at.state == HealthState::Degraded);
    match (at.state, slow) {
        (HealthState::Healthy, Some(signal)) if at.dwelt => {
            Some(Verdict::Become(HealthState::Degraded, signal.to_string()))
        }
        (HealthState::Degraded, None) if at.dwelt => Some(Verdict::Become(
            HealthState::Healthy,
            "signals cleared".into(),
        )),
        _ => None,
    }
}

/// A passed probe (or a success while probing): the streak it makes, and the reason to return
/// to service when that is enough. Rise needs more evidence than fall (P5) and the dwell.
pub(crate) fn probe_pass(streak: u32, dwelt: bool, cfg: &HealthConfig) -> (u32, Option<String>) {
    let streak = streak + 1;
    let rise = (streak >= cfg.rise_successes && dwelt)
        .then(|| format!("{streak} successes in a row; ramping up"));
    (streak, rise)
}

/// An address's fall signal (P4), judged per address × site (P9): the sites where the pair
/// alone looks bad (`pair_bad`) are left out when the address has at least `recent` counted
/// outcomes elsewhere to be judged on; it is then avoided on those sites rather than
/// quarantined everywhere. Without such evidence (one site only, or bad everywhere) every
/// counted outcome counts. `bad`: scratch space for the sites left out.
pub(crate) fn address_fall(
    window: &Window,
    cfg: &HealthConfig,
    now: Timestamp,
    pair_bad: impl Fn(u32) -> bool,
    bad: &mut Vec<u32>,
) -> Option<Signal> {
    bad.clear();
    for e in window.newest_first(now) {
        if !e.excused && e.site != NO_SITE && !bad.contains(&e.site) {
            bad.push(e.site);
        }
    }
    bad.retain(|s| pair_bad(*s));
    let elsewhere = || {
        window
            .newest_first(now)
            .filter(|e| !e.excused && !bad.contains(&e.site))
            .count()
    };
    if !bad.is_empty() && elsewhere() >= cfg.recent {
        return signals::fall(window, cfg, now, bad);
    }
    signals::fall(window, cfg, now, &[])
}

/// A change of an address × site pair's verdict (P9).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PairChange {
    /// Its own window says the address is bad for this site: avoided there.
    Avoid(String),
    /// No longer avoided.
    Forgive(&'static str),
}

/// The pair's verdict over its own window at `now`, if it changed from `avoided`: the
/// address fall signals over the pair's counted outcomes.
pub(crate) fn judge_pair(
    window: &Window,
    avoided: bool,
    cfg: &HealthConfig,
    now: Timestamp,
) -> Option<PairChange> {
    let verdict = signals::fall(window, cfg, now, &[]);
    if verdict.is_some() == avoided {
        return None;
    }
    Some(match verdict {
        Some(signal) => PairChange::Avoid(format!("{signal} on this site")),
        None if window.newest_first(now).next().is_none() => {
            PairChange::Forgive("its outcomes there aged out")
        }
        None => PairChange::Forgive("signals cleared"),
    })
}

/// When an avoided pair is forgiven by time alone (no more outcomes there), and why: judged
/// again each time its oldest outcome ages out, as the memory store's sweep does.
#[cfg(feature = "redis")]
pub(crate) fn pair_cleared_at(
    window: &Window,
    cfg: &HealthConfig,
    now: Timestamp,
) -> (Timestamp, &'static str) {
    let mut at = now;
    while let Some(next) = window.horizon_at(at) {
        at = next;
        if let Some(PairChange::Forgive(why)) = judge_pair(window, true, cfg, at) {
            return (at, why);
        }
    }
    (at, "its outcomes there aged out")
}

/// What a fall does, once the gate has spoken.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Fall {
    /// Too many failed cycles in a row (P11).
    Dead {
        reason: String,
        backoff_level: u32,
        failed_cycles: u32,
    },
    /// Quarantined until `until` (P6); `backoff_level` is the next wait's level.
    Quarantine {
        reason: String,
        until: Timestamp,
        backoff_level: u32,
        failed_cycles: u32,
    },
    /// The gate refused a healthy address: kept in service at reduced weight (P7–P9).
    Degrade(String),
    /// The gate refused a probing address: its passes start over.
    RestartProbes,
    /// The gate refused; nothing changes.
    Stay,
}

/// A fall of an address whose state-machine data is `h` (P6, P11), given the quarantine
/// gate's answer (P7, P8, P9): the backoff level resets after a stable stretch, a fall while
/// probing or ramping back is a failed cycle, and enough of those in a row are death.
pub(crate) fn fall(
    h: &Health,
    gate: Result<(), Refusal>,
    reason: String,
    cfg: &PoolConfig,
    now: Timestamp,
    rng: &mut impl Rng,
) -> Fall {
    if let Err(refusal) = gate {
        return match h.state {
            HealthState::Healthy => Fall::Degrade(format!(
                "{reason}; kept in service at reduced weight: {refusal}"
            )),
            HealthState::Probing => Fall::RestartProbes,
            _ => Fall::Stay,
        };
    }
    let failed_cycle = h.state == HealthState::Probing || h.returning();
    let stable = h
        .stable_since
        .is_some_and(|s| now.since(s) >= cfg.backoff.reset_after);
    let level = if stable { 0 } else { h.backoff_level };
    let failed_cycles = h.failed_cycles + u32::from(failed_cycle);
    if failed_cycles >= cfg.health.dead_after_cycles {
        return Fall::Dead {
            reason: format!("{reason}; {failed_cycles} failed quarantine cycles in a row"),
            backoff_level: level,
            failed_cycles,
        };
    }
    let wait = backoff::wait(level, &cfg.backoff, rng);
    Fall::Quarantine {
        reason: format!("{reason}; quarantined for {} s", wait.as_secs()),
        until: now.after(wait),
        backoff_level: level + 1,
        failed_cycles,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;
    use std::time::Duration;

    /// Evidence that says what the test wants, and counts its reads.
    struct Said {
        fall: Option<Signal>,
        slow: Option<Signal>,
        reads: usize,
    }

    impl Evidence for Said {
        fn fall(&mut self) -> Option<Signal> {
            self.reads += 1;
            self.fall
        }
        fn slow_tail(&mut self, _always: bool) -> Option<Signal> {
            self.reads += 1;
            self.slow
        }
    }

    fn healthy() -> Standing {
        Standing {
            state: HealthState::Healthy,
            returning: false,
            suspect: None,
            dwelt: true,
        }
    }

    const THREE_OF_FIVE: Signal = Signal::RecentFailures {
        failures: 3,
        of: 5,
        window_success: 0.9,
    };

    #[test]
    fn nothing_to_decide_only_where_evaluate_decides_nothing() {
        let cfg = Thresholds::of(&HealthConfig::default());
        let states = [
            HealthState::Healthy,
            HealthState::Degraded,
            HealthState::Quarantined,
            HealthState::Probing,
            HealthState::Dead,
        ];
        let mut skipped = 0;
        for state in states {
            for suspect in [None, Some(1)] {
                for class in [Class::Success, Class::Failure, Class::Captcha] {
                    for dwelt in [false, true] {
                        let at = Standing {
                            state,
                            suspect,
                            dwelt,
                            ..healthy()
                        };
                        // The evidence a tail-less outcome gives: no tail, whatever the fall.
                        let mut said = Said {
                            fall: Some(THREE_OF_FIVE),
                            slow: None,
                            reads: 0,
                        };
                        if nothing_to_decide(state, suspect, class, false) {
                            skipped += 1;
                            assert_eq!(evaluate(at, class, false, cfg, &mut said), None);
                        }
                        // An outcome that may grow the tail is always judged.
                        assert!(!nothing_to_decide(state, suspect, class, true));
                    }
                }
            }
        }
        assert_eq!(skipped, 2, "a healthy, unsuspected success, dwelt or not");
    }

    #[test]
    fn three_of_five_against_a_good_record_makes_suspect_then_confirms() {
        let cfg = Thresholds::of(&HealthConfig::default());
        let mut said = Said {
            fall: Some(THREE_OF_FIVE),
            slow: None,
            reads: 0,
        };
        let v = evaluate(healthy(), Class::Failure, false, cfg, &mut said);
        assert!(matches!(v, Some(Verdict::Suspect(Some(_)))), "{v:?}");
        let suspect = Standing {
            state: HealthState::Degraded,
            suspect: Some(2),
            ..healthy()
        };
        let v = evaluate(suspect, Class::Failure, false, cfg, &mut said);
        assert!(matches!(v, Some(Verdict::Confirm(Some(ref r))) if r.contains("confirmed by 3")));
        // An excused failure reads nothing and decides nothing.
        said.reads = 0;
        assert_eq!(
            evaluate(healthy(), Class::Failure, true, cfg, &mut said),
            None
        );
        assert_eq!(said.reads, 0);
    }

    // `pair_cleared_at` serves the Redis store (memory sweeps instead).
    #[cfg(feature = "redis")]
    #[test]
    fn p9_an_avoided_pair_is_forgiven_when_its_window_clears_by_aging() {
        let cfg = HealthConfig::default();
        let at = |s: u64| Timestamp::from_millis(1_000_000 + s * 1000);
        let mut w = Window::new(cfg.window, cfg.window_max_age);
        let push = |w: &mut Window, s: u64, class: Class| {
            w.push(crate::health::window::Entry {
                at: at(s),
                site: 1,
                latency_ms: 0,
                class,
                excused: false,
            });
        };
        let mut same = w.clone();
        for s in 0..3 {
            push(&mut w, s, Class::Failure);
            push(&mut same, 0, Class::Failure);
        }
        assert!(matches!(
            judge_pair(&w, false, &cfg, at(2)),
            Some(PairChange::Avoid(ref r)) if r.ends_with("on this site")
        ));
        assert_eq!(judge_pair(&w, true, &cfg, at(2)), None);
        // Judged again as each ages out: two failures left signal nothing.
        assert_eq!(
            pair_cleared_at(&w, &cfg, at(2)),
            (at(600), "signals cleared")
        );
        // All at once: forgiven when they age out together.
        assert_eq!(
            pair_cleared_at(&same, &cfg, at(0)),
            (at(600), "its outcomes there aged out")
        );
        // A later success keeps 3 of the newest 5 failures: still avoided until then.
        push(&mut w, 300, Class::Success);
        assert_eq!(judge_pair(&w, true, &cfg, at(300)), None);
        assert_eq!(
            pair_cleared_at(&w, &cfg, at(300)),
            (at(600), "signals cleared")
        );
    }

    #[test]
    fn a_fall_passes_the_gate_or_degrades_and_dies_after_its_cycles() {
        let cfg = PoolConfig::default();
        let mut rng = StdRng::seed_from_u64(1);
        let now = Timestamp::from_millis(1_000_000);
        let mut h = Health::slow_start(Timestamp::from_millis(0));
        let refused = fall(&h, Err(Refusal::Frozen), "x".into(), &cfg, now, &mut rng);
        assert!(matches!(refused, Fall::Degrade(ref r) if r.contains("frozen")));
        // Stable for longer than the reset: the first wait is the base, ±20 %.
        match fall(&h, Ok(()), "x".into(), &cfg, now, &mut rng) {
            Fall::Quarantine {
                until,
                backoff_level: 1,
                failed_cycles: 0,
                ..
            } => {
                let wait = until.since(now);
                assert!(wait >= Duration::from_secs(48) && wait <= Duration::from_secs(72));
            }
            other => panic!("{other:?}"),
        }
        h.state = HealthState::Probing;
        h.failed_cycles = cfg.health.dead_after_cycles - 1;
        assert!(matches!(
            fall(&h, Ok(()), "x".into(), &cfg, now, &mut rng),
            Fall::Dead { .. }
        ));
    }
}
