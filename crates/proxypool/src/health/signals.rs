//! Reading a window: the accumulated signals that make an address fall or degrade (P4).

use std::fmt;

use super::window::{Class, Entry, Window};
use crate::clock::Timestamp;
use crate::config::HealthConfig;

/// A reason to think an address is unwell; its `Display` is the decision log's reason.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Signal {
    /// `window_success`: the success rate over every counted outcome of the window, which
    /// tells a sudden break from a chance cluster on a long good record.
    RecentFailures {
        failures: usize,
        of: usize,
        window_success: f64,
    },
    LowSuccess {
        rate: f64,
        samples: usize,
    },
    Captchas {
        rate: f64,
        samples: usize,
    },
    SlowTail {
        p95_ms: u32,
        median_ms: u32,
    },
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::RecentFailures {
                failures,
                of,
                window_success,
            } => write!(
                f,
                "{failures} failures in the last {of} outcomes (window success {:.0}%)",
                window_success * 100.0
            ),
            Self::LowSuccess { rate, samples } => {
                write!(
                    f,
                    "success rate {:.0}% over {samples} outcomes",
                    rate * 100.0
                )
            }
            Self::Captchas { rate, samples } => {
                write!(
                    f,
                    "captcha rate {:.0}% over {samples} outcomes",
                    rate * 100.0
                )
            }
            Self::SlowTail { p95_ms, median_ms } => {
                write!(f, "latency p95 {p95_ms} ms > 3x median {median_ms} ms")
            }
        }
    }
}

/// A fall signal (failures or captchas) over the window's counted outcomes at `now`, leaving
/// out the sites in `excluded`. Without exclusions it reads the running sums, and walks the
/// newest outcomes only when the window holds enough failures for "3 of the last 5" to be
/// possible: a healthy window costs a few comparisons.
pub(crate) fn fall(
    w: &Window,
    cfg: &HealthConfig,
    now: Timestamp,
    excluded: &[u32],
) -> Option<Signal> {
    let counted = |e: &&Entry| !e.excused && !excluded.contains(&e.site);
    let (n, successes, captchas) = if excluded.is_empty() {
        let t = w.counted(now);
        (t.n as usize, t.successes, t.captchas)
    } else {
        let (mut n, mut successes, mut captchas) = (0, 0, 0);
        for e in w.newest_first(now).filter(counted) {
            n += 1;
            match e.class {
                Class::Success => successes += 1,
                Class::Captcha => captchas += 1,
                Class::Failure => {}
            }
        }
        (n, successes, captchas)
    };
    let failures = n - successes as usize - captchas as usize;
    if cfg.recent_failures > 0 && failures >= cfg.recent_failures {
        let recent_failures = w
            .newest_first(now)
            .filter(counted)
            .take(cfg.recent)
            .filter(|e| e.class == Class::Failure)
            .count();
        if recent_failures >= cfg.recent_failures {
            return Some(Signal::RecentFailures {
                failures: recent_failures,
                of: cfg.recent.min(n),
                window_success: f64::from(successes) / n.max(1) as f64,
            });
        }
    }
    if n >= cfg.min_samples && n > 0 {
        let rate = f64::from(successes) / n as f64;
        if rate < cfg.min_success_rate {
            return Some(Signal::LowSuccess { rate, samples: n });
        }
        let rate = f64::from(captchas) / n as f64;
        if rate > cfg.max_captcha_rate {
            return Some(Signal::Captchas { rate, samples: n });
        }
    }
    None
}

/// Whether a success of `latency_ms` may have grown its address's latency tail: slower than
/// `latency_factor` × the mean of the successes in the window before it (every one, excused
/// too; the noise floor under it). Only then, and at every outcome while degraded, is the tail
/// read: the Redis store decides it in the releasing process from a window of that process's
/// own outcomes (`store/redis/latency.rs`), which in one process is memory's window, so both
/// stores ask the judge at the same releases.
pub(crate) fn may_grow_tail(latency_ms: u16, mean_before: Option<f64>, cfg: &HealthConfig) -> bool {
    mean_before.is_some_and(|mean| {
        f64::from(latency_ms) > cfg.latency_factor * mean.max(super::weight::LATENCY_NOISE_MS)
    })
}

/// A latency tail far above the address's own median (from the window's latency histogram:
/// no sorting on the release path). A median below the latency noise counts as the noise: a
/// tail of a few milliseconds is no jump.
pub(crate) fn slow_tail(w: &Window, cfg: &HealthConfig) -> Option<Signal> {
    let (median_ms, p95_ms) = w.tail_quantiles(cfg.min_samples)?;
    let norm = f64::from(median_ms).max(super::weight::LATENCY_NOISE_MS);
    (f64::from(p95_ms) > cfg.latency_factor * norm)
        .then_some(Signal::SlowTail { p95_ms, median_ms })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Timestamp = Timestamp::from_millis(0);

    fn window(classes: &[Class]) -> Window {
        let mut w = Window::new(50, std::time::Duration::from_secs(600));
        for (i, c) in classes.iter().enumerate() {
            w.push(Entry {
                at: NOW,
                class: *c,
                site: (i % 2) as u32,
                excused: false,
                latency_ms: 100,
            });
        }
        w
    }

    use Class::{Captcha as C, Failure as F, Success as S};

    #[test]
    fn one_error_is_noise_three_of_five_is_a_signal() {
        let cfg = HealthConfig::default();
        assert_eq!(fall(&window(&[S, S, S, S, F]), &cfg, NOW, &[]), None);
        assert_eq!(fall(&window(&[S, F, S, F, S]), &cfg, NOW, &[]), None);
        assert!(matches!(
            fall(&window(&[S, F, S, F, F]), &cfg, NOW, &[]),
            Some(Signal::RecentFailures {
                failures: 3,
                of: 5,
                ..
            })
        ));
    }

    #[test]
    fn low_success_needs_ten_samples() {
        let cfg = HealthConfig::default();
        // 6 of 9 successes is below 70 % but too few samples; spaced so 3-of-5 never fires.
        let nine = [S, F, S, S, F, S, S, F, S];
        assert_eq!(fall(&window(&nine), &cfg, NOW, &[]), None);
        let ten = [S, F, S, S, F, S, S, F, S, S, F, S];
        assert!(matches!(
            fall(&window(&ten), &cfg, NOW, &[]),
            Some(Signal::LowSuccess { samples: 12, .. })
        ));
    }

    #[test]
    fn captchas_have_their_own_threshold() {
        let cfg = HealthConfig::default();
        let w = window(&[S, S, C, S, S, C, S, S, S, C]);
        assert!(matches!(
            fall(&w, &cfg, NOW, &[]),
            Some(Signal::Captchas { .. })
        ));
    }

    #[test]
    fn excused_sites_do_not_count() {
        let cfg = HealthConfig::default();
        // failures all on site 1 (odd positions)
        let w = window(&[S, F, S, F, S, F]);
        assert!(fall(&w, &cfg, NOW, &[]).is_some());
        assert_eq!(fall(&w, &cfg, NOW, &[1]), None);
    }
}
