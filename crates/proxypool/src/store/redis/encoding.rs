//! What crosses to the function library besides the keys: the pool's configuration in a typed,
//! versioned encoding the library checks (a process whose encoding it cannot read, or whose
//! values differ from the pool's, is refused at connect), a call's arguments, and how an
//! acquire names its pool.

use std::fmt::Write as _;
use std::sync::Arc;

use crate::clock::millis;
use crate::config::{PoolConfig, Strategy};

/// The version of the configuration encoding: `CONFIG_VERSION` in library.lua must match.
/// Bump both when a field is added, removed or changes meaning.
const CONFIG_VERSION: u32 = 1;

/// One value of the encoding, with the type the library checks it against.
enum Value {
    /// A whole number (counts, milliseconds).
    Whole(u64),
    /// A number (rates, shares, weights).
    Number(f64),
    /// A comma-separated list of numbers (the ramp's shares).
    Numbers(Vec<f64>),
}

/// The settings the library judges with, as `config=<version> name=<type><value> …`, the type
/// a letter (`i` whole, `f` number, `l` list): named, so a field the library does not know,
/// one it misses or one of another type is an error rather than a misreading.
pub(super) fn config(cfg: &PoolConfig) -> String {
    let (h, b, j) = (&cfg.health, &cfg.backoff, &cfg.judgement);
    let whole = |n: usize| Value::Whole(n as u64);
    let fields = [
        ("recent", whole(h.recent)),
        ("recent_failures", whole(h.recent_failures)),
        ("qcap", Value::Number(cfg.quarantine_cap)),
        (
            "min_in_service",
            Value::Whole(u64::from(cfg.min_in_service)),
        ),
        ("base", Value::Whole(millis(b.base))),
        ("max", Value::Whole(millis(b.cap))),
        ("dead_after", Value::Whole(u64::from(h.dead_after_cycles))),
        ("rise", Value::Whole(u64::from(h.rise_successes))),
        ("dwell", Value::Whole(millis(h.min_dwell))),
        ("window", whole(h.window)),
        ("max_age", Value::Whole(millis(h.window_max_age))),
        ("min_success", Value::Number(h.min_success_rate)),
        ("min_samples", whole(h.min_samples)),
        ("max_captcha", Value::Number(h.max_captcha_rate)),
        ("degraded_weight", Value::Number(h.degraded_weight)),
        ("probing_weight", Value::Number(h.probing_weight)),
        ("ramp_ms", Value::Whole(millis(h.ramp_duration))),
        ("reset_ms", Value::Whole(millis(b.reset_after))),
        ("site_window", whole(j.site_window)),
        ("site_recent", whole(j.site_recent)),
        ("site_min_samples", whole(j.site_min_samples)),
        ("site_min_addresses", whole(j.site_min_addresses)),
        ("site_spread", Value::Number(j.site_spread)),
        ("latency_factor", Value::Number(h.latency_factor)),
        ("steps", Value::Numbers(h.ramp_steps.clone())),
    ];
    let mut text = format!("config={CONFIG_VERSION}");
    for (name, value) in fields {
        let _ = match value {
            Value::Whole(n) => write!(text, " {name}=i{n}"),
            Value::Number(x) => write!(text, " {name}=f{x}"),
            Value::Numbers(xs) => {
                let list: Vec<String> = xs.iter().map(f64::to_string).collect();
                write!(text, " {name}=l{}", list.join(","))
            }
        };
    }
    text
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_names_and_types_every_field() {
        let text = config(&PoolConfig::default());
        assert!(text.starts_with("config=1 recent=i5 recent_failures=i3 qcap=f0.3 "));
        assert!(text.ends_with(" steps=l0.1,0.25,0.5,1"), "{text}");
        assert_eq!(text.split(' ').count(), 26);
    }
}
