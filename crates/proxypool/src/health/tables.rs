//! P1, P10: the weight arithmetic of [`weight`] and [`ramp`] as tables, so that the Redis
//! library only looks results up (`store/redis/encoding.rs` carries them to it) and the
//! arithmetic stays written once. The tests prove that looking up, the library's way, gives
//! what the functions give for every input.

use crate::config::HealthConfig;

use super::weight::{self, LEVELS};
use super::{HealthState, ramp};

/// The offered states, in the order of [`Tables::steps`].
pub(crate) const OFFERED: [HealthState; 3] = [
    HealthState::Healthy,
    HealthState::Degraded,
    HealthState::Probing,
];

/// The tables of one health configuration.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Tables {
    /// Per [`OFFERED`] state, the step of a pick by stage and level, at
    /// `stage × (2 LEVELS + 1) + level + LEVELS`: stage 0 is full weight, stage `k` ≥ 1 the ramp's
    /// share `ramp_steps[k - 1]`.
    pub(crate) steps: [Vec<u32>; 3],
    /// Per window length `n` (from 1 to the window), the success rate's level with no
    /// successes, then the success counts at which it rises by one (a count twice where it
    /// rises by two): the level of `s` successes is the first plus the number of counts ≤ `s`.
    pub(crate) rates: Vec<(i32, Vec<u16>)>,
    /// [`ramp::stage_ends`]: the stage of a ramp `e` ms old is the number of ends ≤ `e`,
    /// plus 1; it is over at the last.
    pub(crate) ramp_ends: Vec<u64>,
}

impl Tables {
    pub(crate) fn new(cfg: &HealthConfig) -> Self {
        let stages: Vec<f64> = std::iter::once(1.0)
            .chain(
                cfg.ramp_steps
                    .iter()
                    .take(cfg.ramp_steps.len().saturating_sub(1))
                    .copied(),
            )
            .collect();
        let steps = OFFERED.map(|state| {
            let by = weight::state_weight(state, cfg).unwrap_or(0.0);
            stages
                .iter()
                .flat_map(|share| {
                    (-LEVELS..=LEVELS)
                        .map(move |level| weight::step(weight::scaled(by * share, level as i8)))
                })
                .collect()
        });
        let window = u16::try_from(cfg.window).unwrap_or(u16::MAX);
        let rates = (1..=window)
            .map(|n| {
                let mut rises = Vec::new();
                for s in 1..=n {
                    let by = weight::rate_level_of(s, n) - weight::rate_level_of(s - 1, n);
                    // Never negative: the rate grows with the successes.
                    rises.extend(std::iter::repeat_n(s, by.max(0) as usize));
                }
                (weight::rate_level_of(0, n), rises)
            })
            .collect();
        Tables {
            steps,
            rates,
            ramp_ends: ramp::stage_ends(&cfg.ramp_steps, cfg.ramp_duration),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::clock::Timestamp;
    use crate::health::Health;

    const PER_STAGE: usize = 2 * LEVELS as usize + 1;

    /// The library's `ramp_stage`: 1 … while ramping, `None` once over.
    fn stage(t: &Tables, elapsed: u64) -> Option<usize> {
        let last = *t.ramp_ends.last()?;
        (elapsed < last).then(|| t.ramp_ends.iter().take_while(|e| **e <= elapsed).count() + 1)
    }

    fn configs() -> Vec<HealthConfig> {
        let odd = HealthConfig {
            ramp_steps: vec![0.3, 0.7, 0.9, 1.0],
            ramp_duration: Duration::from_millis(1_000_003),
            degraded_weight: 0.37,
            probing_weight: 0.013,
            window: 97,
            ..HealthConfig::default()
        };
        let flat = HealthConfig {
            ramp_steps: vec![1.0],
            ramp_duration: Duration::from_millis(7),
            window: 1,
            ..HealthConfig::default()
        };
        vec![HealthConfig::default(), odd, flat]
    }

    #[test]
    fn p1_looked_up_steps_are_the_weights_steps() {
        for cfg in configs() {
            let t = Tables::new(&cfg);
            let duration = ramp_ms(&cfg);
            // Every stage's first, a middle and its last millisecond, and past the end.
            let mut at: Vec<u64> = vec![0, duration, duration + 1];
            for e in &t.ramp_ends {
                at.extend([e.saturating_sub(1), *e, e + 1]);
            }
            for (i, state) in OFFERED.into_iter().enumerate() {
                for &elapsed in &at {
                    let mut h = Health::slow_start(Timestamp::from_millis(0));
                    h.state = state;
                    h.ramp_started = Some(Timestamp::from_millis(0));
                    let k = stage(&t, elapsed).unwrap_or(0);
                    for level in -LEVELS..=LEVELS {
                        let w =
                            weight::weight(level as i8, &h, &cfg, Timestamp::from_millis(elapsed));
                        let looked = t.steps[i][k * PER_STAGE + (level + LEVELS) as usize];
                        assert_eq!(
                            looked,
                            weight::step(w),
                            "{state:?} at {elapsed} ms, level {level}"
                        );
                    }
                }
            }
        }
    }

    fn ramp_ms(cfg: &HealthConfig) -> u64 {
        crate::clock::millis(cfg.ramp_duration)
    }

    #[test]
    fn p10_looked_up_stages_are_the_ramps_for_every_elapsed_time() {
        for cfg in configs() {
            let t = Tables::new(&cfg);
            let duration = ramp_ms(&cfg);
            let shares = |k: usize| {
                if k == 0 {
                    None
                } else {
                    Some(cfg.ramp_steps[k - 1])
                }
            };
            // Every millisecond of a short ramp; a long one's around each boundary.
            let every: Vec<u64> = if duration <= 100_000 {
                (0..=duration + 1).collect()
            } else {
                t.ramp_ends
                    .iter()
                    .flat_map(|e| e.saturating_sub(3)..=e + 3)
                    .chain(0..3)
                    .collect()
            };
            for elapsed in every {
                let share = ramp::share(
                    &cfg.ramp_steps,
                    cfg.ramp_duration,
                    Timestamp::from_millis(0),
                    Timestamp::from_millis(elapsed),
                );
                assert_eq!(
                    shares(stage(&t, elapsed).unwrap_or(0)),
                    share,
                    "{elapsed} ms"
                );
            }
        }
    }

    #[test]
    fn p1_looked_up_rate_levels_are_the_windows_for_every_count() {
        for cfg in configs() {
            let t = Tables::new(&cfg);
            assert_eq!(t.rates.len(), cfg.window);
            for (i, (first, rises)) in t.rates.iter().enumerate() {
                let n = i as u16 + 1;
                for s in 0..=n {
                    let looked = first + rises.iter().filter(|r| **r <= s).count() as i32;
                    assert_eq!(looked, weight::rate_level_of(s, n), "{s} of {n}");
                }
            }
        }
    }
}
