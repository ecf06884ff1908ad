//! P6: exponential quarantine waits with jitter.

use std::time::Duration;

use rand::Rng;

use crate::config::BackoffConfig;

/// The wait for the `level`-th quarantine in a row (0-based): `base × 2^level`, capped, then
/// jittered by a uniform factor in `1 ± jitter` so addresses quarantined together do not return
/// together.
pub(crate) fn wait(level: u32, cfg: &BackoffConfig, rng: &mut impl Rng) -> Duration {
    let factor = 2f64.powi(i32::try_from(level.min(62)).unwrap_or(62));
    let raw = cfg.base.as_secs_f64() * factor;
    let capped = raw.min(cfg.cap.as_secs_f64());
    let jitter = if cfg.jitter > 0.0 {
        rng.random_range(-cfg.jitter..=cfg.jitter)
    } else {
        0.0
    };
    Duration::from_secs_f64(capped * (1.0 + jitter))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn doubles_then_caps_within_jitter() {
        let cfg = BackoffConfig::default();
        let mut rng = StdRng::seed_from_u64(7);
        for (level, nominal) in [
            (0, 60.0),
            (1, 120.0),
            (2, 240.0),
            (5, 1920.0),
            (6, 3600.0),
            (40, 3600.0),
        ] {
            for _ in 0..50 {
                let w = wait(level, &cfg, &mut rng).as_secs_f64();
                assert!(
                    w >= nominal * 0.8 - 1e-9 && w <= nominal * 1.2 + 1e-9,
                    "{level}: {w}"
                );
            }
        }
    }

    #[test]
    fn jitter_spreads_waits() {
        let cfg = BackoffConfig::default();
        let mut rng = StdRng::seed_from_u64(1);
        let waits: Vec<_> = (0..20).map(|_| wait(0, &cfg, &mut rng)).collect();
        assert!(waits.iter().any(|w| *w != waits[0]));
    }
}
