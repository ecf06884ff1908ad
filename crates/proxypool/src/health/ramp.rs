//! P10: after quarantine an address earns its weight back in steps.

use std::time::Duration;

use crate::clock::{Timestamp, millis};

/// The share of its weight an address ramping since `started` gets at `now`: the steps are
/// spread evenly over `duration` (10 %, 25 %, 50 %, then 100 % at the end by default);
/// `None` once the ramp is over.
pub(crate) fn share(
    steps: &[f64],
    duration: Duration,
    started: Timestamp,
    now: Timestamp,
) -> Option<f64> {
    // In integer milliseconds: this runs on every weight read of a ramping address.
    let (elapsed, duration) = (
        now.as_millis().saturating_sub(started.as_millis()),
        millis(duration),
    );
    if elapsed >= duration || steps.len() < 2 {
        return None;
    }
    // The last step is full weight, reached when the ramp ends.
    let ramping = steps.len() - 1;
    // In 64 bits when it fits (always, for durations below millions of years): a 128-bit
    // division is a library call.
    let step = match elapsed.checked_mul(ramping as u64) {
        Some(x) => (x / duration) as usize,
        None => (u128::from(elapsed) * ramping as u128 / u128::from(duration)) as usize,
    };
    steps.get(step.min(ramping - 1)).copied()
}

/// When each stage of [`share`] ends, in ms after the ramp's start: stage `k` (from 0, the
/// share `steps[k]`) lasts until `ends[k]`, the last one until the ramp's end. Empty when
/// there is nothing to ramp. The Redis library looks stages up here (`super::tables`).
#[cfg(feature = "redis")]
pub(crate) fn stage_ends(steps: &[f64], duration: Duration) -> Vec<u64> {
    let (ramping, duration) = (
        steps.len().saturating_sub(1) as u128,
        u128::from(millis(duration)),
    );
    // The first elapsed time whose stage in `share` is `k + 1`: ⌈(k + 1) × duration ÷ ramping⌉.
    (1..=ramping)
        .map(|k| u64::try_from((k * duration).div_ceil(ramping)).unwrap_or(u64::MAX))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p10_ramp_steps_over_sixty_seconds() {
        let steps = [0.10, 0.25, 0.50, 1.0];
        let d = Duration::from_secs(60);
        let at = |s: u64| {
            share(
                &steps,
                d,
                Timestamp::from_millis(0),
                Timestamp::from_millis(s * 1000),
            )
        };
        assert_eq!(at(0), Some(0.10));
        assert_eq!(at(19), Some(0.10));
        assert_eq!(at(20), Some(0.25));
        assert_eq!(at(45), Some(0.50));
        assert_eq!(at(60), None);
        #[cfg(feature = "redis")]
        {
            assert_eq!(stage_ends(&steps, d), [20_000, 40_000, 60_000]);
            assert_eq!(stage_ends(&[1.0], d), [] as [u64; 0]);
        }
    }
}
