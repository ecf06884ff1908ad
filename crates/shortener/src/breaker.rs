//! A circuit breaker: after repeated failures a dependency is left alone for a while, callers
//! getting a refusal at once instead of waiting for their deadline; then one caller probes
//! (half-open) and its outcome closes or reopens the breaker.
//!
//! Time is passed in (`now`), so the state machine runs under a test's clock. The state is
//! behind a mutex held for a few instructions and never across an await.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What the breaker is doing, for the metrics (`0` closed, `1` open, `2` half-open).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Closed,
    Open,
    HalfOpen,
}

impl Phase {
    pub(crate) fn gauge(self) -> i64 {
        match self {
            Self::Closed => 0,
            Self::Open => 1,
            Self::HalfOpen => 2,
        }
    }
}

#[derive(Debug)]
enum State {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
    },
    /// One probe is out; if it never reports (its caller was cancelled), another caller
    /// probes after `until`.
    HalfOpen {
        until: Instant,
    },
}

/// Permission to call the dependency; report its outcome with [`Breaker::record`].
#[derive(Debug)]
#[must_use]
pub(crate) struct Pass {
    probe: bool,
}

/// The breaker refused this call: the dependency is considered down.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("circuit breaker open")]
pub(crate) struct Refused;

/// How the breaker changed with an outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    None,
    Opened,
    Closed,
}

/// A breaker that opens after `threshold` failures in a row and stays open for `open_for`.
#[derive(Debug)]
pub(crate) struct Breaker {
    state: Mutex<State>,
    threshold: u32,
    open_for: Duration,
}

impl Breaker {
    pub(crate) fn new(threshold: u32, open_for: Duration) -> Self {
        Self {
            state: Mutex::new(State::Closed { failures: 0 }),
            threshold: threshold.max(1),
            open_for,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a call may go through now.
    pub(crate) fn admit(&self, now: Instant) -> Result<Pass, Refused> {
        let mut state = self.state();
        match *state {
            State::Closed { .. } => Ok(Pass { probe: false }),
            State::Open { until } | State::HalfOpen { until } if now >= until => {
                *state = State::HalfOpen {
                    until: now + self.open_for,
                };
                Ok(Pass { probe: true })
            }
            State::Open { .. } | State::HalfOpen { .. } => Err(Refused),
        }
    }

    /// Reports the outcome of an admitted call: `healthy` unless the dependency failed or
    /// timed out (an error it answered with is healthy).
    pub(crate) fn record(&self, pass: Pass, healthy: bool, now: Instant) -> Change {
        let mut state = self.state();
        match (&mut *state, healthy) {
            (State::Closed { failures }, true) => {
                *failures = 0;
                Change::None
            }
            (State::Closed { failures }, false) => {
                *failures += 1;
                if *failures >= self.threshold {
                    *state = State::Open {
                        until: now + self.open_for,
                    };
                    Change::Opened
                } else {
                    Change::None
                }
            }
            // Only the probe decides; late answers of calls admitted before the opening
            // say nothing new.
            (State::HalfOpen { .. }, true) if pass.probe => {
                *state = State::Closed { failures: 0 };
                Change::Closed
            }
            (State::HalfOpen { .. }, false) if pass.probe => {
                *state = State::Open {
                    until: now + self.open_for,
                };
                Change::None
            }
            _ => Change::None,
        }
    }

    pub(crate) fn phase(&self) -> Phase {
        match *self.state() {
            State::Closed { .. } => Phase::Closed,
            State::Open { .. } => Phase::Open,
            State::HalfOpen { .. } => Phase::HalfOpen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPEN_FOR: Duration = Duration::from_secs(1);

    #[test]
    fn opens_after_the_threshold_of_failures_in_a_row_only() {
        let t0 = Instant::now();
        let b = Breaker::new(3, OPEN_FOR);
        for _ in 0..2 {
            let pass = b.admit(t0).unwrap();
            assert_eq!(b.record(pass, false, t0), Change::None);
        }
        // A success in between starts the count again.
        let pass = b.admit(t0).unwrap();
        b.record(pass, true, t0);
        for _ in 0..2 {
            let pass = b.admit(t0).unwrap();
            b.record(pass, false, t0);
        }
        assert_eq!(b.phase(), Phase::Closed);
        let pass = b.admit(t0).unwrap();
        assert_eq!(b.record(pass, false, t0), Change::Opened);
        assert_eq!(b.phase(), Phase::Open);
        assert!(b.admit(t0 + OPEN_FOR / 2).is_err());
    }

    #[test]
    fn one_probe_at_a_time_and_its_outcome_decides() {
        let t0 = Instant::now();
        let b = Breaker::new(1, OPEN_FOR);
        let pass = b.admit(t0).unwrap();
        b.record(pass, false, t0);
        let t1 = t0 + OPEN_FOR;
        let probe = b.admit(t1).unwrap();
        assert_eq!(b.phase(), Phase::HalfOpen);
        assert!(
            b.admit(t1).is_err(),
            "a second caller while the probe is out"
        );
        b.record(probe, false, t1);
        assert_eq!(b.phase(), Phase::Open);
        assert!(b.admit(t1 + OPEN_FOR / 2).is_err());
        let t2 = t1 + OPEN_FOR;
        let probe = b.admit(t2).unwrap();
        assert_eq!(b.record(probe, true, t2), Change::Closed);
        assert_eq!(b.phase(), Phase::Closed);
        assert!(b.admit(t2).is_ok());
    }

    #[test]
    fn a_lost_probe_is_replaced_and_stale_answers_change_nothing() {
        let t0 = Instant::now();
        let b = Breaker::new(1, OPEN_FOR);
        let early = b.admit(t0).unwrap();
        let failing = b.admit(t0).unwrap();
        b.record(failing, false, t0);
        let t1 = t0 + OPEN_FOR;
        // The probe's caller was cancelled: it never reports.
        drop(b.admit(t1).unwrap());
        assert!(b.admit(t1 + OPEN_FOR / 2).is_err());
        let probe = b.admit(t1 + OPEN_FOR).unwrap();
        // A call admitted before the opening answers late: not the probe, no change.
        assert_eq!(b.record(early, true, t1 + OPEN_FOR), Change::None);
        assert_eq!(b.phase(), Phase::HalfOpen);
        assert_eq!(b.record(probe, true, t1 + OPEN_FOR), Change::Closed);
    }
}
