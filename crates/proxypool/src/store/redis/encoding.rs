//! What crosses to the function library besides the keys: the pool's configuration in a typed,
//! versioned encoding the library checks (a process whose encoding it cannot read, or whose
//! values differ from the pool's, is refused at connect), a call's arguments, how an acquire
//! names its pool, and the replies read back.

use std::fmt::Write as _;
use std::sync::Arc;

use crate::clock::millis;
use crate::config::{PoolConfig, Strategy};
use crate::decision::{Decision, Subject};
use crate::health::tables::Tables;
use crate::health::weight::LEVELS;
use crate::lease::Choice;

use super::judging::Facts;
use super::verdicts::SiteFacts;

/// The version of the configuration encoding: `CONFIG_VERSION` in library.lua must match.
/// Bump both when a field is added, removed or changes meaning.
const CONFIG_VERSION: u32 = 1;

/// The version of the tables' encoding: `TABLES_VERSION` in library.lua must match.
const TABLES_VERSION: u32 = 1;

/// One value of the encoding, with the type the library checks it against.
enum Field {
    /// A whole number (counts, milliseconds).
    Whole(u64),
    /// A number (rates, shares, weights).
    Number(f64),
    /// A comma-separated list of numbers (the ramp's shares).
    Numbers(Vec<f64>),
    /// A comma-separated list of whole numbers.
    Wholes(Vec<u64>),
    /// Lists of whole numbers but for the first of each, which may be negative, separated
    /// by ';'.
    Groups(Vec<(i64, Vec<u64>)>),
}

/// `<tag>=<version>`, then ` name=<type letter><value>` per field.
fn encode(tag: &str, version: u32, fields: Vec<(&str, Field)>) -> String {
    let mut text = format!("{tag}={version}");
    let list = |xs: &mut dyn Iterator<Item = String>| xs.collect::<Vec<_>>().join(",");
    for (name, value) in fields {
        let _ = match value {
            Field::Whole(n) => write!(text, " {name}=i{n}"),
            Field::Number(x) => write!(text, " {name}=f{x}"),
            Field::Numbers(xs) => write!(
                text,
                " {name}=l{}",
                list(&mut xs.iter().map(f64::to_string))
            ),
            Field::Wholes(xs) => write!(
                text,
                " {name}=w{}",
                list(&mut xs.iter().map(u64::to_string))
            ),
            Field::Groups(gs) => {
                let groups: Vec<String> = gs
                    .iter()
                    .map(|(first, rest)| {
                        let rest = rest.iter().map(u64::to_string);
                        list(&mut std::iter::once(first.to_string()).chain(rest))
                    })
                    .collect();
                write!(text, " {name}=g{}", groups.join(";"))
            }
        };
    }
    text
}

/// The weight arithmetic's tables (`health::tables`) as the library looks them up:
/// `tables=<version> levels=i… healthy=w… degraded=w… probing=w… rates=g… ramp=w…`. Checked
/// at connect like the configuration; the pool keeps them for the library to load.
pub(super) fn tables(cfg: &PoolConfig) -> String {
    let t = Tables::new(&cfg.health);
    let wholes = |xs: &[u32]| Field::Wholes(xs.iter().map(|x| u64::from(*x)).collect());
    let [healthy, degraded, probing] = &t.steps;
    let rates = t
        .rates
        .iter()
        .map(|(first, rises)| {
            (
                i64::from(*first),
                rises.iter().map(|r| u64::from(*r)).collect(),
            )
        })
        .collect();
    encode(
        "tables",
        TABLES_VERSION,
        vec![
            ("levels", Field::Whole(LEVELS as u64)),
            ("healthy", wholes(healthy)),
            ("degraded", wholes(degraded)),
            ("probing", wholes(probing)),
            ("rates", Field::Groups(rates)),
            ("ramp", Field::Wholes(t.ramp_ends)),
        ],
    )
}

/// The settings the library judges with, as `config=<version> name=<type><value> …`, the type
/// a letter (`i` whole, `f` number, `l` list): named, so a field the library does not know,
/// one it misses or one of another type is an error rather than a misreading.
pub(super) fn config(cfg: &PoolConfig) -> String {
    let (h, b, j) = (&cfg.health, &cfg.backoff, &cfg.judgement);
    let whole = |n: usize| Field::Whole(n as u64);
    let fields = vec![
        ("recent", whole(h.recent)),
        ("recent_failures", whole(h.recent_failures)),
        ("qcap", Field::Number(cfg.quarantine_cap)),
        (
            "min_in_service",
            Field::Whole(u64::from(cfg.min_in_service)),
        ),
        ("base", Field::Whole(millis(b.base))),
        ("max", Field::Whole(millis(b.cap))),
        ("dead_after", Field::Whole(u64::from(h.dead_after_cycles))),
        ("rise", Field::Whole(u64::from(h.rise_successes))),
        ("dwell", Field::Whole(millis(h.min_dwell))),
        ("window", whole(h.window)),
        ("max_age", Field::Whole(millis(h.window_max_age))),
        ("min_success", Field::Number(h.min_success_rate)),
        ("min_samples", whole(h.min_samples)),
        ("max_captcha", Field::Number(h.max_captcha_rate)),
        ("degraded_weight", Field::Number(h.degraded_weight)),
        ("probing_weight", Field::Number(h.probing_weight)),
        ("ramp_ms", Field::Whole(millis(h.ramp_duration))),
        ("reset_ms", Field::Whole(millis(b.reset_after))),
        ("site_window", whole(j.site_window)),
        ("site_recent", whole(j.site_recent)),
        ("site_min_samples", whole(j.site_min_samples)),
        ("site_min_addresses", whole(j.site_min_addresses)),
        ("site_spread", Field::Number(j.site_spread)),
        ("latency_factor", Field::Number(h.latency_factor)),
        ("steps", Field::Numbers(h.ramp_steps.clone())),
    ];
    encode("config", CONFIG_VERSION, fields)
}

/// The configuration field each encoded name stands for, as `PoolConfig` spells it.
const PATHS: [(&str, &str); 25] = [
    ("recent", "health.recent"),
    ("recent_failures", "health.recent_failures"),
    ("qcap", "quarantine_cap"),
    ("min_in_service", "min_in_service"),
    ("base", "backoff.base"),
    ("max", "backoff.cap"),
    ("dead_after", "health.dead_after_cycles"),
    ("rise", "health.rise_successes"),
    ("dwell", "health.min_dwell"),
    ("window", "health.window"),
    ("max_age", "health.window_max_age"),
    ("min_success", "health.min_success_rate"),
    ("min_samples", "health.min_samples"),
    ("max_captcha", "health.max_captcha_rate"),
    ("degraded_weight", "health.degraded_weight"),
    ("probing_weight", "health.probing_weight"),
    ("ramp_ms", "health.ramp_duration"),
    ("reset_ms", "backoff.reset_after"),
    ("site_window", "judgement.site_window"),
    ("site_recent", "judgement.site_recent"),
    ("site_min_samples", "judgement.site_min_samples"),
    ("site_min_addresses", "judgement.site_min_addresses"),
    ("site_spread", "judgement.site_spread"),
    ("latency_factor", "health.latency_factor"),
    ("steps", "health.ramp_steps"),
];

/// The library's refusal of a configuration, made readable: a field whose value differs from
/// the pool's (`differs NAME THEIRS OURS`) is named as `PoolConfig` spells it; anything else
/// (another encoding version, a malformed field) is passed on.
pub(super) fn refusal(message: &str) -> String {
    let why = message.split(" script: ").next().unwrap_or(message).trim();
    let mut words = why.split_whitespace();
    let (Some("differs"), Some(name), Some(theirs), Some(ours)) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return why.to_owned();
    };
    let path = PATHS
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(name, |(_, p)| *p);
    // The values without their type letter (durations are milliseconds).
    let value = |v: &str| v.get(1..).unwrap_or(v).to_owned();
    format!(
        "the pool is configured with {path} = {} and this process with {}: every process of a \
         pool must be configured alike",
        value(theirs),
        value(ours)
    )
}

/// One argument of a call, after the common ones.
pub(super) enum Arg<'a> {
    Int(u64),
    Signed(i64),
    Str(&'a str),
    Float(f64),
}

impl Arg<'_> {
    pub(super) fn push(&self, cmd: &mut redis::Cmd) {
        match self {
            Arg::Int(n) => cmd.arg(*n),
            Arg::Signed(n) => cmd.arg(*n),
            Arg::Str(s) => cmd.arg(*s),
            Arg::Float(x) => cmd.arg(*x),
        };
    }
}

/// A pool as the library's acquire names it: the keyless strategy's letter, then the
/// sub-pool's name (none for the whole pool).
pub(super) fn pool_spec(strategy: Strategy, name: &str) -> Arc<str> {
    let letter = match strategy {
        Strategy::Weighted => 'w',
        Strategy::RoundRobin => 'r',
        Strategy::LeastConnections => 'l',
    };
    format!("{letter}{name}").into()
}

/// One entry of the library's decision log: its number and the decision.
pub(super) fn log_entry(e: &str) -> Option<(u64, Decision)> {
    let mut f = e.splitn(6, '\t');
    let (Some(n), Some(at), Some(subject), Some(from), Some(to), Some(reason)) =
        (f.next(), f.next(), f.next(), f.next(), f.next(), f.next())
    else {
        return None;
    };
    // Addresses are URLs; the library names sites, pairs ('@pair ADDRESS SITE': a redacted
    // URL has no space) and the pool with an '@'.
    let subject = if let Some(site) = subject.strip_prefix("@site ") {
        Subject::Site {
            site: site.to_owned(),
        }
    } else if let Some((address, site)) = subject
        .strip_prefix("@pair ")
        .and_then(|p| p.split_once(' '))
    {
        Subject::Cell {
            address: address.to_owned(),
            site: site.to_owned(),
        }
    } else if subject == "@pool" {
        Subject::Pool
    } else {
        Subject::Address {
            address: subject.to_owned(),
        }
    };
    let decision = Decision {
        at_ms: at.parse().ok()?,
        subject,
        from: from.to_owned(),
        to: to.to_owned(),
        reason: reason.to_owned(),
    };
    Some((n.parse().ok()?, decision))
}

/// A lease's member in the `due` sorted set: `l<lease>:<address id>` (the library grants
/// and closes leases by it).
pub(super) fn lease_member(lease: u64, id: u32) -> String {
    format!("l{lease}:{id}")
}

/// A success's latency as its window entry holds it (`WENTRY` in library.lua: 5 digits),
/// followed by `!` when it may have grown the address's tail (the script then asks the judge).
pub(super) fn success_latency((ms, slow): (u16, bool)) -> String {
    format!("{ms:05}{}", if slow { "!" } else { "" })
}

/// The `(lease, address id)` a [`lease_member`] names; `None` for any other member.
pub(super) fn parse_lease_member(member: &str) -> Option<(u64, u32)> {
    let (lease, id) = member.strip_prefix('l')?.split_once(':')?;
    Some((lease.parse().ok()?, id.parse().ok()?))
}

pub(super) fn text(v: &redis::Value) -> Option<String> {
    match v {
        redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        redis::Value::SimpleString(s) => Some(s.clone()),
        redis::Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

/// One acquire's answer in a batch reply.
pub(super) struct AcquireReply {
    pub(super) lease: u64,
    pub(super) id: u32,
    pub(super) choice: Option<Choice>,
    pub(super) refusal: Option<&'static str>,
}

/// The `ops` function's reply: three elements per acquire (lease id, address id, tag), then
/// the facts of the releases that are news for the judge, those of the sites to judge, `more`
/// and the epoch.
pub(super) struct OpsReply {
    pub(super) acquires: Vec<AcquireReply>,
    /// By the release's number in the batch (from 1).
    pub(super) facts: Vec<(usize, Facts)>,
    /// The sites whose outcomes in the batch are to be judged.
    pub(super) sites: Vec<SiteFacts>,
    pub(super) more: bool,
    pub(super) epoch: String,
}

pub(super) fn parse_ops(reply: redis::Value, n: usize) -> Option<OpsReply> {
    let redis::Value::Array(items) = reply else {
        return None;
    };
    let (epoch, rest) = items.split_last()?;
    let epoch = text(epoch)?;
    let (redis::Value::Int(more), rest) = rest.split_last()? else {
        return None;
    };
    let (sites, rest) = rest.split_last()?;
    let sites = SiteFacts::parse_all(sites)?;
    let (judged, rest) = rest.split_last()?;
    let facts = match judged {
        redis::Value::Array(records) => records
            .iter()
            .map(|r| match Facts::parse(r)? {
                (Some(j), f) => Some((j, f)),
                (None, _) => None,
            })
            .collect::<Option<Vec<_>>>()?,
        // Lua's empty table.
        _ => Vec::new(),
    };
    if rest.len() != 3 * n {
        return None;
    }
    let mut out = Vec::with_capacity(n);
    for r in rest.chunks(3) {
        // The address id comes as text (the library does not turn it into a number).
        let [redis::Value::Int(lease), id, tag] = r else {
            return None;
        };
        let id: u32 = text(id)?.parse().ok()?;
        let (choice, refusal) = match text(tag).as_deref() {
            Some("bound") => (Some(Choice::Bound), None),
            Some("hashed") => (Some(Choice::Hashed), None),
            Some("weighted") => (Some(Choice::Weighted), None),
            Some("round_robin") => (Some(Choice::RoundRobin), None),
            Some("least") => (Some(Choice::LeastConnections), None),
            Some("broken") => (None, Some("broken")),
            Some("busy") => (None, Some("busy")),
            Some("cooling") => (None, Some("cooling")),
            Some("none") => (None, Some("none")),
            _ => return None,
        };
        out.push(AcquireReply {
            lease: u64::try_from(*lease).ok()?,
            id,
            choice,
            refusal,
        });
    }
    Some(OpsReply {
        acquires: out,
        facts,
        sites,
        more: *more == 1,
        epoch,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_success_latency_is_five_digits_and_marked_when_slow() {
        assert_eq!(success_latency((100, false)), "00100");
        assert_eq!(success_latency((u16::MAX, true)), "65535!");
    }

    #[test]
    fn the_config_names_and_types_every_field() {
        let text = config(&PoolConfig::default());
        assert!(text.starts_with("config=1 recent=i5 recent_failures=i3 qcap=f0.3 "));
        assert!(text.ends_with(" steps=l0.1,0.25,0.5,1"), "{text}");
        assert_eq!(text.split(' ').count(), 26);
        // Every encoded name has its configuration path.
        for token in text.split(' ').skip(1) {
            let name = token.split('=').next().unwrap();
            assert!(PATHS.iter().any(|(n, _)| *n == name), "{name}");
        }
    }

    #[test]
    fn the_tables_name_and_type_every_table() {
        let text = tables(&PoolConfig::default());
        let names: Vec<&str> = text
            .split(' ')
            .map(|t| t.split('=').next().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "tables", "levels", "healthy", "degraded", "probing", "rates", "ramp"
            ]
        );
        assert!(text.starts_with("tables=1 levels=i13 healthy=w"), "{text}");
        // Of 1 outcome: -1 without a success, 0 with it; of 3, one success rises by two.
        assert!(text.contains(" rates=g-1,1;-2,1,2;-3,1,1,3;"), "{text}");
        assert!(text.ends_with(" ramp=w20000,40000,60000"), "{text}");
    }

    #[test]
    fn a_differing_field_is_named_as_the_configuration_spells_it() {
        assert_eq!(
            refusal("differs max_captcha f0.2 f0.3 script: x_config, on @user_function:1."),
            "the pool is configured with health.max_captcha_rate = 0.2 and this process with \
             0.3: every process of a pool must be configured alike"
        );
        assert_eq!(
            refusal("encoding config=2, this library reads 1"),
            "encoding config=2, this library reads 1"
        );
    }
}
