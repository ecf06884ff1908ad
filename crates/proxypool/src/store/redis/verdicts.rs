//! The Redis store's judgement of sites and of our side (P9): the library keeps each site's
//! window (key `sw:SITE`) and returns it, with the batch's outcomes there, when they must
//! be judged (a bad outcome at a site that is ok; any outcome at a degraded one). The judge
//! replays them into the memory store's [`SiteWindow`] and decides with the functions the
//! memory store calls ([`crate::judge::sites`]); `site` applies a change unless the site's
//! state moved meanwhile (another process decided first: its decision stands), excusing the
//! stretch that convicted it, and `our_side` the freeze that follows, unless another site
//! changed since. The batch's addresses at that site are judged afterwards, on their windows
//! read again ([`super::judging`]), as the memory store judges them after the site.

use redis::Value;

use super::RedisStore;
use super::encoding::{Arg, text};
use crate::clock::Timestamp;
use crate::config::PoolConfig;
use crate::health::window::Class;
use crate::judge::sites::{self, Seen, SiteChange, SiteWindow};

/// The length of one entry of a site's window (`ENTRY` in library.lua): the class letter, the
/// address id in 9 digits, the time in 13.
const ENTRY: usize = 23;

/// A site window's text, oldest first, as entries.
fn entries(text: &str) -> Option<Vec<Seen>> {
    text.as_bytes()
        .chunks(ENTRY)
        .map(|e| {
            let class = match e.first()? {
                b's' => Class::Success,
                b'f' => Class::Failure,
                b'c' => Class::Captcha,
                _ => return None,
            };
            let field = |r: std::ops::Range<usize>| std::str::from_utf8(e.get(r)?).ok();
            Some(Seen {
                slot: field(1..10)?.parse().ok()?,
                class,
                at: Timestamp::from_millis(field(10..ENTRY)?.parse().ok()?),
            })
        })
        .collect()
}

/// The window the library's text holds, as the memory store's: replayed, so that entries the
/// library kept past the maximum age or the window's length drop out as memory's do.
fn window_of(text: &str, cfg: &PoolConfig) -> Option<SiteWindow> {
    let mut w = SiteWindow::default();
    for seen in entries(text)? {
        w.push(seen, &cfg.health, &cfg.judgement);
    }
    Some(w)
}

/// What the library returns of a site whose outcomes in a batch must be judged.
#[derive(Debug)]
pub(super) struct SiteFacts {
    name: String,
    /// When it was degraded (`d|SITE`, empty while ok): the guard of `site`.
    degraded: String,
    /// Its window before the batch, oldest first.
    window: String,
    /// The batch's outcomes there, in order, each with the number of its release in the batch
    /// (0: a probe report).
    outcomes: Vec<(usize, Seen)>,
}

impl SiteFacts {
    /// One record: name, degraded since, window, the batch's entries (oldest first), their
    /// releases' numbers.
    pub(super) fn parse(record: &Value) -> Option<Self> {
        let Value::Array(items) = record else {
            return None;
        };
        let [name, degraded, window, batch, releases] = items.as_slice() else {
            return None;
        };
        let Value::Array(releases) = releases else {
            return None;
        };
        let batch = entries(&text(batch)?)?;
        let releases = releases.iter().map(|r| text(r)?.parse().ok());
        let releases = releases.collect::<Option<Vec<usize>>>()?;
        (releases.len() == batch.len()).then_some(())?;
        Some(Self {
            name: text(name)?,
            degraded: text(degraded)?,
            window: text(window)?,
            outcomes: releases.into_iter().zip(batch).collect(),
        })
    }

    /// A list of records, or Lua's empty table.
    pub(super) fn parse_all(v: &Value) -> Option<Vec<Self>> {
        match v {
            Value::Array(records) => records.iter().map(Self::parse).collect(),
            _ => Some(Vec::new()),
        }
    }
}

/// The site's changes over the batch's outcomes, each with the position of the outcome that
/// decided it: pushed one by one and judged after each, as the memory store does.
fn replay(facts: &SiteFacts, cfg: &PoolConfig) -> Option<Vec<(usize, SiteChange)>> {
    let (h, j) = (&cfg.health, &cfg.judgement);
    let mut window = window_of(&facts.window, cfg)?;
    let mut degraded = !facts.degraded.is_empty();
    let mut since = match degraded {
        true => Timestamp::from_millis(facts.degraded.parse().ok()?),
        false => Timestamp::default(),
    };
    let mut changes = Vec::new();
    for (i, (_, seen)) in facts.outcomes.iter().enumerate() {
        window.push(*seen, h, j);
        let now = seen.at;
        if let Some(change) = sites::judge_site(&window, degraded, since, seen.class, now, h, j) {
            (degraded, since) = (matches!(change, SiteChange::Degrade { .. }), now);
            changes.push((i, change));
        }
    }
    Some(changes)
}

impl RedisStore {
    /// Judges the sites of a batch and applies their changes. Returns the releases to judge
    /// again on fresh facts (those at a site from its change on) with whether their site is
    /// degraded now.
    pub(super) async fn judge_sites(
        &self,
        sites: &[SiteFacts],
        now: Timestamp,
    ) -> Result<Vec<(usize, bool)>, String> {
        let mut again = Vec::new();
        for facts in sites {
            let changes = replay(facts, &self.cfg).ok_or("malformed site facts")?;
            let Some((first, _)) = changes.first() else {
                continue;
            };
            let mut guard = facts.degraded.clone();
            for (_, change) in &changes {
                let (degraded, applied) = self.apply_site(&facts.name, &guard, change, now).await?;
                guard = degraded;
                if !applied {
                    break;
                }
            }
            let excused = !guard.is_empty();
            again.extend(facts.outcomes[*first..].iter().map(|(n, _)| (*n, excused)));
        }
        Ok(again)
    }

    /// Applies one change of site `name` decided while its `d|SITE` was `guard`, then judges
    /// our side. Returns the site's `d|SITE` after, and whether the change was applied.
    async fn apply_site(
        &self,
        name: &str,
        guard: &str,
        change: &SiteChange,
        now: Timestamp,
    ) -> Result<(String, bool), String> {
        let (to, reason, from) = match change {
            SiteChange::Degrade { reason, from } => ("1", reason.as_str(), from.as_millis()),
            SiteChange::Recover(reason) => ("0", *reason, 0),
        };
        let args = [
            Arg::Str(name),
            Arg::Str(guard),
            Arg::Str(to),
            Arg::Str(reason),
            Arg::Int(from),
        ];
        let reply = self
            .call(&self.functions.site, now, false, &args)
            .await
            .map_err(|e| e.to_string())?;
        let malformed = || "malformed site reply".to_owned();
        let Value::Array(items) = reply else {
            return Err(malformed());
        };
        let [applied, degraded, version, frozen, Value::Array(all)] = items.as_slice() else {
            return Err(malformed());
        };
        let (applied, degraded) = (text(applied).ok_or_else(malformed)?, text(degraded));
        let degraded = degraded.ok_or_else(malformed)?;
        if applied != "1" {
            return Ok((degraded, false));
        }
        // Our side, over every site's window and state (`sw:SITE`, '1' if degraded).
        let (h, j) = (&self.cfg.health, &self.cfg.judgement);
        let mut judged = Vec::with_capacity(all.len() / 2);
        for site in all.chunks(2) {
            let [window, d] = site else {
                return Err(malformed());
            };
            let window = text(window).and_then(|w| window_of(&w, &self.cfg));
            let window = window.ok_or_else(malformed)?;
            judged.push((
                window.has_evidence(now, h, j),
                text(d).as_deref() == Some("1"),
            ));
        }
        let was = text(frozen).as_deref() == Some("1");
        if let Some((frozen, reason)) = sites::judge_our_side(judged, was) {
            let version = text(version).ok_or_else(malformed)?;
            let to = if frozen { "1" } else { "0" };
            let args = [Arg::Str(&version), Arg::Str(to), Arg::Str(&reason)];
            // Refused when another site changed meanwhile: its process judges our side after.
            self.call(&self.functions.our_side, now, false, &args)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok((degraded, true))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(class: char, id: u32, at: u64) -> String {
        format!("{class}{id:09}{at:013}")
    }

    #[test]
    fn a_batch_is_replayed_into_the_window_and_convicts_at_its_outcome() {
        let cfg = PoolConfig::default();
        // Nine addresses failed once each, then a tenth fails in the batch.
        let window: String = (0..9)
            .map(|i| entry('f', i, 1_000 + u64::from(i)))
            .collect();
        let batch = Value::BulkString(entry('f', 9, 2_000).into_bytes());
        let record = Value::Array(vec![
            Value::BulkString(b"shop".to_vec()),
            Value::BulkString(Vec::new()),
            Value::BulkString(window.into_bytes()),
            batch,
            Value::Array(vec![Value::BulkString(b"1".to_vec())]),
        ]);
        let facts = SiteFacts::parse(&record).unwrap();
        let changes = replay(&facts, &cfg).unwrap();
        assert!(
            matches!(changes.as_slice(), [(0, SiteChange::Degrade { from, .. })] if from.as_millis() == 1_000),
            "{changes:?}"
        );
    }
}
