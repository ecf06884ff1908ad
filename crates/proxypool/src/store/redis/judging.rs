//! The Redis store's judgement of an address: the library hands over its facts after an
//! outcome that is news (`facts` in library.lua: with the release batch's reply, or the probe
//! report's), the judge decides — [`crate::judge`], the functions the memory store calls —
//! and `apply` writes the decided transition in a second call. That call refuses it when the
//! address's version, or the quarantine gate's facts it depended on, moved meanwhile (another
//! process decided first): the facts are then read again and judged again.

use std::sync::PoisonError;

use rand::Rng;
use redis::Value;

use super::RedisStore;
use super::encoding::{Arg, text};
use crate::clock::Timestamp;
use crate::config::{HealthConfig, PoolConfig};
use crate::health::quarantine::Gate;
use crate::health::signals::{self, Signal};
use crate::health::window::{Class, Entry, Window};
use crate::health::{Health, HealthState};
use crate::judge::{self, Evidence, Fall, PairChange, Standing, Thresholds, Verdict};

/// How often a refused decision is judged again before it is given up (logged): each refusal
/// means another process moved the address, so a few suffice.
const ATTEMPTS: usize = 8;

/// How many values the library's facts are, after their head (see `facts`).
const FACTS: usize = 13;

/// The length of one entry of the library's outcome windows (`WENTRY` in library.lua): the
/// class letter (upper case when excused), the site's number in 6 digits, a success's
/// latency (ms) in 5, the time in 13.
const ENTRY: usize = 25;

/// One of the library's outcome windows as the memory store's [`Window`]: the same entries,
/// latencies of every process included, so both stores' judgement reads the same data.
pub(super) fn window_of(text: &str, cfg: &HealthConfig) -> Option<Window> {
    let mut w = Window::new(cfg.window, cfg.window_max_age);
    for e in text.as_bytes().chunks(ENTRY) {
        let (class, excused) = match e.first()? {
            b's' => (Class::Success, false),
            b'f' => (Class::Failure, false),
            b'c' => (Class::Captcha, false),
            b'S' => (Class::Success, true),
            b'F' => (Class::Failure, true),
            b'C' => (Class::Captcha, true),
            _ => return None,
        };
        let field = |r: std::ops::Range<usize>| std::str::from_utf8(e.get(r)?).ok();
        w.push(Entry {
            at: Timestamp::from_millis(field(12..ENTRY)?.parse().ok()?),
            site: field(1..7)?.parse().ok()?,
            latency_ms: field(7..12)?.parse().ok()?,
            class,
            excused,
        });
    }
    Some(w)
}

/// What the judge reads of one address after one outcome.
#[derive(Debug, Clone)]
pub(super) struct Facts {
    id: u32,
    class: Class,
    /// The outcome's site is judged degraded (P9).
    excused: bool,
    /// A success that may have grown the tail, as its process judged it
    /// ([`crate::health::signals::may_grow_tail`]): the tail is read then.
    slower: bool,
    /// A probe report (judged as `PoolState::report_probe` does), not a release.
    probe: bool,
    /// The outcome's named site, and whether its pair was avoided.
    site: Option<String>,
    pair_avoided: bool,
    version: String,
    health: Health,
    /// The address's young outcome window (see [`window_of`]).
    window: String,
    /// Young windows of its pairs by site number: the outcome's first (for a named site),
    /// and when its fall is judged every named site counted in its window.
    pairs: Vec<(u32, String)>,
    /// The gate's facts as the library writes them, for a bad outcome.
    gate: Option<String>,
    /// The outcome's site changed its verdict after these were read: judged on fresh ones.
    stale: bool,
}

fn class_of(letter: &str) -> Option<Class> {
    match letter {
        "s" => Some(Class::Success),
        "f" => Some(Class::Failure),
        "c" => Some(Class::Captcha),
        _ => None,
    }
}

fn state_of(name: &str) -> Option<HealthState> {
    HealthState::ALL.into_iter().find(|s| s.as_str() == name)
}

/// A whole number the library wrote ('' or absent: 0).
fn number(v: &str) -> Option<u64> {
    if v.is_empty() {
        return Some(0);
    }
    v.parse().ok()
}

fn at(v: &str) -> Option<Option<Timestamp>> {
    if v.is_empty() {
        return Some(None);
    }
    v.parse().ok().map(|ms| Some(Timestamp::from_millis(ms)))
}

impl Facts {
    /// One record of facts with its head: the release's number in its batch ('' for a probe
    /// report), then the facts.
    pub(super) fn parse(record: &Value) -> Option<(Option<usize>, Self)> {
        let Value::Array(items) = record else {
            return None;
        };
        let (head, rest) = items.split_at_checked(7)?;
        let t: Vec<String> = head.iter().map(text).collect::<Option<_>>()?;
        let [n, id, class, excused, latency, site, avoided] = t.as_slice() else {
            return None;
        };
        let release = if n.is_empty() {
            None
        } else {
            Some(n.parse().ok()?)
        };
        // A success's latency in ms ('' for other outcomes), followed by '!' when it may have
        // grown the tail.
        let (ms, slower) = match latency.strip_suffix('!') {
            Some(ms) => (ms, true),
            None => (latency.as_str(), false),
        };
        if !ms.is_empty() {
            ms.parse::<u16>().ok()?;
        }
        let mut facts = Self {
            id: id.parse().ok()?,
            class: class_of(class)?,
            excused: excused == "1",
            slower,
            probe: release.is_none(),
            site: (site != super::NO_SITE).then(|| site.clone()),
            pair_avoided: avoided == "1",
            version: String::new(),
            health: Health::slow_start(Timestamp::default()),
            window: String::new(),
            pairs: Vec::new(),
            gate: None,
            stale: false,
        };
        facts.read(rest)?;
        Some((release, facts))
    }

    /// The facts proper (see `facts` in library.lua), over these.
    fn read(&mut self, items: &[Value]) -> Option<()> {
        let [fields @ .., Value::Array(pairs)] = items else {
            return None;
        };
        let f: Vec<String> = fields.iter().map(text).collect::<Option<_>>()?;
        let [s, ver, su, t, rs, qe, lv, cy, ss, st, w, gate] = f.as_slice() else {
            return None;
        };
        self.pairs = pairs
            .chunks(2)
            .map(|p| match p {
                [sid, w] => Some((text(sid)?.parse().ok()?, text(w)?)),
                _ => None,
            })
            .collect::<Option<_>>()?;
        let small = |v: &str| number(v).and_then(|n| u32::try_from(n).ok());
        self.health = Health {
            state: state_of(s)?,
            quarantine_entries: small(qe)?,
            suspect: if su.is_empty() {
                None
            } else {
                Some(small(su)?)
            },
            ramp_started: at(rs)?,
            since: at(t)?.unwrap_or_default(),
            quarantined_until: None,
            probe_streak: small(st)?,
            backoff_level: small(lv)?,
            failed_cycles: small(cy)?,
            stable_since: at(ss)?,
            last_reason: String::new(),
        };
        self.version = if ver.is_empty() {
            "0".into()
        } else {
            ver.clone()
        };
        self.window = w.clone();
        self.gate = (!gate.is_empty()).then(|| gate.clone());
        Some(())
    }

    /// The address of a probe report that failed in service, which entered its window (as a
    /// siteless failure does in memory's `report_probe`).
    pub(super) fn failed_probe_in_service(&self) -> Option<u32> {
        let in_service = matches!(
            self.health.state,
            HealthState::Healthy | HealthState::Degraded
        );
        (self.probe && self.class == Class::Failure && in_service).then_some(self.id)
    }

    /// The outcome's site changed its verdict (P9) after these facts were read: it is now
    /// degraded (`excused`) or not, and the address is judged on its windows read again (a
    /// conviction excused the stretch in them).
    pub(super) fn site_changed(&mut self, excused: bool) {
        (self.excused, self.stale) = (excused, true);
    }

    /// The gate as the memory store's `PoolState::gate` builds it, from the library's text.
    fn gate(&self, cfg: &PoolConfig) -> Option<Gate> {
        let mut f = self.gate.as_deref()?.split(' ');
        let mut next = || f.next().and_then(|v| v.parse::<usize>().ok());
        let (frozen, total, quarantined, offered, members) =
            (next()?, next()?, next()?, next()?, next()?);
        Some(Gate {
            frozen: frozen == 1,
            total,
            fraction: cfg.quarantine_cap,
            quarantined,
            candidate_counted: self.health.state.counts_against_cap(),
            offered,
            members,
            candidate_offered: self.health.state.is_offered(),
            min_in_service: cfg.min_in_service as usize,
        })
    }
}

/// What the library's facts say of an address's windows, read when the judge asks.
struct Recorded<'a> {
    facts: &'a Facts,
    window: Window,
    pairs: Vec<(u32, Window)>,
    cfg: &'a HealthConfig,
    now: Timestamp,
}

impl Evidence for Recorded<'_> {
    fn fall(&mut self) -> Option<Signal> {
        let (pairs, cfg, now) = (&self.pairs, self.cfg, self.now);
        let pair_bad = |site: u32| {
            pairs
                .iter()
                .any(|(s, w)| *s == site && signals::fall(w, cfg, now, &[]).is_some())
        };
        judge::address_fall(&self.window, cfg, now, pair_bad, &mut Vec::new())
    }

    fn slow_tail(&mut self, always: bool) -> Option<Signal> {
        // As the memory store reads it (`state::judgement`), from a window that holds every
        // process's latencies.
        (self.facts.slower || always)
            .then(|| signals::slow_tail(&self.window, self.cfg))
            .flatten()
    }
}

/// A decided transition, as `apply` takes it.
#[derive(Debug, Default, PartialEq)]
struct Plan {
    enter: Option<(HealthState, String)>,
    /// The end of a quarantine wait.
    until: Option<Timestamp>,
    fields: Vec<(&'static str, String)>,
    /// Decided through the quarantine gate: refused if its facts moved.
    gated: bool,
}

impl Plan {
    fn enter(to: HealthState, reason: String) -> Self {
        Self {
            enter: Some((to, reason)),
            ..Self::default()
        }
    }

    fn field(name: &'static str, value: impl ToString) -> Self {
        Self {
            fields: vec![(name, value.to_string())],
            ..Self::default()
        }
    }
}

/// What the judge decides on `facts` at `now` (the memory store's `evaluate`,
/// `try_quarantine`, `probe_success` and `report_probe`, applied as a plan).
fn decide(facts: &Facts, cfg: &PoolConfig, now: Timestamp, rng: &mut impl Rng) -> Option<Plan> {
    let hc = &cfg.health;
    let mut h = facts.health.clone();
    h.refresh(now, hc);
    let passed = facts.class == Class::Success;
    if facts.probe {
        match (h.state, passed) {
            (HealthState::Probing | HealthState::Dead, true) => {
                return Some(probe_pass(&h, now, hc));
            }
            (HealthState::Probing, false) => {
                return fall(facts, &h, "probe failed".into(), None, cfg, now, rng);
            }
            (HealthState::Dead, false) => {
                return (h.probe_streak != 0).then(|| Plan::field("st", 0));
            }
            (HealthState::Healthy | HealthState::Degraded, false) => {}
            _ => return None,
        }
    }
    let pairs = facts
        .pairs
        .iter()
        .map(|(sid, w)| Some((*sid, window_of(w, hc)?)))
        .collect::<Option<_>>();
    let (Some(window), Some(pairs)) = (window_of(&facts.window, hc), pairs) else {
        tracing::warn!(target: "proxypool::redis", id = facts.id, "malformed outcome windows");
        return None;
    };
    let mut evidence = Recorded {
        facts,
        window,
        pairs,
        cfg: hc,
        now,
    };
    let standing = Standing::of(&h, now, hc);
    let verdict = judge::evaluate(
        standing,
        facts.class,
        facts.excused,
        Thresholds::of(hc),
        &mut evidence,
    )?;
    match verdict {
        Verdict::Quarantine(reason) => fall(facts, &h, reason, None, cfg, now, rng),
        Verdict::Become(to, reason) => Some(Plan::enter(to, reason)),
        Verdict::ProbeSuccess => Some(probe_pass(&h, now, hc)),
        Verdict::Suspect(degrade) => {
            let mut plan = Plan::field("su", 0);
            plan.enter = degrade.map(|r| (HealthState::Degraded, r));
            Some(plan)
        }
        Verdict::Confirm(reason) => {
            let n = h.suspect.map_or(1, |n| n + 1);
            match reason {
                None => Some(Plan::field("su", n)),
                Some(reason) => fall(facts, &h, reason, Some(n), cfg, now, rng),
            }
        }
        Verdict::Clear => Some(Plan::field("su", "")),
    }
}

fn probe_pass(h: &Health, now: Timestamp, cfg: &HealthConfig) -> Plan {
    let (streak, rise) = judge::probe_pass(h.probe_streak, h.dwelt(now, cfg), cfg);
    match rise {
        Some(reason) => Plan::enter(HealthState::Healthy, reason),
        None => Plan::field("st", streak),
    }
}

/// A fall through the gate ([`judge::fall`]). `suspect`: the count a confirmation left, kept
/// if the address stays where it is (a transition clears it).
fn fall(
    facts: &Facts,
    h: &Health,
    reason: String,
    suspect: Option<u32>,
    cfg: &PoolConfig,
    now: Timestamp,
    rng: &mut impl Rng,
) -> Option<Plan> {
    let Some(gate) = facts.gate(cfg) else {
        tracing::warn!(target: "proxypool::redis", id = facts.id, "a fall without the gate's facts");
        return None;
    };
    let mut plan = match judge::fall(h, gate.check(), reason, cfg, now, rng) {
        Fall::Dead {
            reason,
            backoff_level,
            failed_cycles,
        } => {
            let mut plan = Plan::enter(HealthState::Dead, reason);
            plan.fields = vec![
                ("lv", backoff_level.to_string()),
                ("cy", failed_cycles.to_string()),
            ];
            plan
        }
        Fall::Quarantine {
            reason,
            until,
            backoff_level,
            failed_cycles,
        } => {
            let mut plan = Plan::enter(HealthState::Quarantined, reason);
            plan.until = Some(until);
            plan.fields = vec![
                ("lv", backoff_level.to_string()),
                ("cy", failed_cycles.to_string()),
            ];
            plan
        }
        Fall::Degrade(reason) => Plan::enter(HealthState::Degraded, reason),
        Fall::RestartProbes => Plan::field("st", 0),
        Fall::Stay => Plan::default(),
    };
    if plan.enter.is_none()
        && let Some(n) = suspect
    {
        plan.fields.push(("su", n.to_string()));
    }
    plan.gated = true;
    (plan
        != Plan {
            gated: true,
            ..Plan::default()
        })
    .then_some(plan)
}

impl RedisStore {
    /// Judges `facts` and applies what the judge decides; judged again on fresh facts while
    /// `apply` refuses (another process moved the address first).
    pub(super) async fn judge(&self, mut facts: Facts, now: Timestamp) -> Result<(), String> {
        if facts.stale && !self.refresh(&mut facts, now).await? {
            return Ok(());
        }
        self.judge_pair(&facts, now).await?;
        for _ in 0..ATTEMPTS {
            let plan = {
                let mut rng = self.rng.lock().unwrap_or_else(PoisonError::into_inner);
                decide(&facts, &self.cfg, now, &mut *rng)
            };
            let Some(plan) = plan else { return Ok(()) };
            let id = facts.id.to_string();
            let until = plan.until.map(|t| t.as_millis().to_string());
            let (state, reason) = match &plan.enter {
                Some((to, reason)) => (to.as_str(), reason.as_str()),
                None => ("", ""),
            };
            let gate = if plan.gated {
                facts.gate.as_deref().unwrap_or("")
            } else {
                ""
            };
            let mut args = vec![
                Arg::Str(&id),
                Arg::Str(&facts.version),
                Arg::Str(gate),
                Arg::Str(state),
                Arg::Str(reason),
                Arg::Str(until.as_deref().unwrap_or("")),
            ];
            for (name, value) in &plan.fields {
                args.extend([Arg::Str(name), Arg::Str(value)]);
            }
            let reply = self
                .call(&self.functions.apply, now, false, &args)
                .await
                .map_err(|e| e.to_string())?;
            if matches!(reply, Value::Int(1))
                && matches!(plan.enter, Some((HealthState::Quarantined, _)))
            {
                self.telemetry.quarantined(facts.id);
            }
            if !matches!(reply, Value::Int(0)) || !self.refresh(&mut facts, now).await? {
                return Ok(());
            }
        }
        tracing::warn!(target: "proxypool::redis", id = facts.id, "a decision refused {ATTEMPTS} times; given up");
        Ok(())
    }

    /// Reads `facts` again (the outcome's pair first); false if the address is gone.
    async fn refresh(&self, facts: &mut Facts, now: Timestamp) -> Result<bool, String> {
        let id = facts.id.to_string();
        // The gate's facts for a bad outcome that is not excused, as `facts` in library.lua.
        let need_gate = facts.class != Class::Success && !facts.excused;
        let site = facts.site.as_deref().unwrap_or("");
        let args = [
            Arg::Str(&id),
            Arg::Str(if need_gate { "1" } else { "0" }),
            Arg::Str(site),
        ];
        let reply = self
            .call(&self.functions.facts, now, false, &args)
            .await
            .map_err(|e| e.to_string())?;
        let Value::Array(items) = reply else {
            // Gone meanwhile: nothing left to judge.
            return Ok(false);
        };
        (items.len() == FACTS)
            .then(|| facts.read(&items))
            .flatten()
            .ok_or("malformed facts reply")?;
        Ok(true)
    }

    /// Judges the outcome's address × site pair (P9: [`judge::judge_pair`], as the memory
    /// store's `judge_cell`) and applies a change. An avoidance lasts until the pair's window
    /// clears by aging alone ([`judge::pair_cleared_at`]), when the library forgives it; an
    /// outcome there meanwhile is judged again. Refused when another process changed the
    /// pair first: its decision stands.
    async fn judge_pair(&self, facts: &Facts, now: Timestamp) -> Result<(), String> {
        let (Some(site), Some((_, text))) = (&facts.site, facts.pairs.first()) else {
            return Ok(());
        };
        let hc = &self.cfg.health;
        let window = window_of(text, hc).ok_or("malformed pair window")?;
        let Some(change) = judge::judge_pair(&window, facts.pair_avoided, hc, now) else {
            return Ok(());
        };
        let (id, was) = (
            facts.id.to_string(),
            if facts.pair_avoided { "1" } else { "0" },
        );
        let mut args = vec![Arg::Str(&id), Arg::Str(site), Arg::Str(was)];
        let until;
        match &change {
            PairChange::Avoid(reason) => {
                let (at, why) = judge::pair_cleared_at(&window, hc, now);
                until = at.as_millis().to_string();
                args.extend([
                    Arg::Str("1"),
                    Arg::Str(reason),
                    Arg::Str(&until),
                    Arg::Str(why),
                ]);
            }
            PairChange::Forgive(why) => args.extend([Arg::Str("0"), Arg::Str(why)]),
        }
        self.call(&self.functions.pair, now, false, &args)
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    /// A facts record: `fields` as text, then the pairs' windows (none).
    fn record(fields: &[&str]) -> Value {
        let mut items: Vec<Value> = fields
            .iter()
            .map(|f| Value::BulkString(f.as_bytes().to_vec()))
            .collect();
        items.push(Value::Array(Vec::new()));
        Value::Array(items)
    }

    /// Facts of a healthy address (version 3) after a failure, its window `window`, with the
    /// gate's facts `gate`.
    fn failed(window: &str, gate: &str) -> Value {
        record(&[
            "1", "7", "f", "0", "", "-", "0", "healthy", "3", "", "0", "", "0", "0", "0", "", "0",
            window, gate,
        ])
    }

    #[test]
    fn three_failures_of_a_fresh_address_quarantine_it_through_the_gate() {
        let cfg = PoolConfig::default();
        let now = Timestamp::from_millis(10_000_000);
        let mut rng = StdRng::seed_from_u64(1);
        // Released failure of a healthy address whose window is three failures; 10
        // addresses, none quarantined, 10 offered.
        let fff = "f000000000000000010000000".repeat(3);
        let (n, facts) = Facts::parse(&failed(&fff, "0 10 0 10 10")).unwrap();
        assert_eq!(n, Some(1));
        let plan = decide(&facts, &cfg, now, &mut rng).unwrap();
        assert_eq!(
            plan.enter.as_ref().map(|e| e.0),
            Some(HealthState::Quarantined)
        );
        assert!(plan.gated && plan.until.is_some());
        // Frozen: kept in service at reduced weight instead.
        let (_, mut frozen) = Facts::parse(&failed(&fff, "1 10 0 10 10")).unwrap();
        let plan = decide(&frozen, &cfg, now, &mut rng).unwrap();
        assert!(matches!(plan.enter, Some((HealthState::Degraded, ref r)) if r.contains("frozen")));
        // An excused failure decides nothing.
        frozen.excused = true;
        assert_eq!(decide(&frozen, &cfg, now, &mut rng), None);
    }

    #[test]
    fn a_passed_probe_counts_towards_the_rise() {
        let cfg = PoolConfig::default();
        let now = Timestamp::from_millis(10_000_000);
        let mut rng = StdRng::seed_from_u64(1);
        let (n, facts) = Facts::parse(&record(&[
            "", "3", "s", "0", "", "-", "0", "probing", "5", "", "0", "", "1", "0", "0", "", "0",
            "", "",
        ]))
        .unwrap();
        assert_eq!(n, None);
        assert_eq!(
            decide(&facts, &cfg, now, &mut rng),
            Some(Plan::field("st", 1))
        );
    }

    #[test]
    fn p4_a_slow_success_reads_the_tail_of_every_processes_latencies() {
        let cfg = PoolConfig::default();
        let now = Timestamp::from_millis(10_000_000);
        let mut rng = StdRng::seed_from_u64(1);
        // 40 successes in 100 ms and 4 in 2 s, whoever released them: p95 > 3 × median.
        let window = format!(
            "{}{}",
            "s000000001000000009999000".repeat(40),
            "s000000020000000009999000".repeat(4)
        );
        let slow = |latency: &str| {
            record(&[
                "1", "7", "s", "0", latency, "-", "0", "healthy", "3", "", "0", "", "0", "0", "0",
                "", "0", &window, "",
            ])
        };
        let (_, facts) = Facts::parse(&slow("02000!")).unwrap();
        let plan = decide(&facts, &cfg, now, &mut rng).unwrap();
        assert!(
            matches!(plan.enter, Some((HealthState::Degraded, ref r)) if r.starts_with("latency p95")),
            "{plan:?}"
        );
        // A success its process found no slower than the tail's trigger: not read, as memory.
        let (_, facts) = Facts::parse(&slow("02000")).unwrap();
        assert_eq!(decide(&facts, &cfg, now, &mut rng), None);
        // Latencies are whole milliseconds.
        assert!(Facts::parse(&slow("2.5!")).is_none());
    }
}
