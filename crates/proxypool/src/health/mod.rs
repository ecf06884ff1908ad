//! The health of one address: its states (P3), the signals that move it (P4, P5) and the
//! quarantine machinery (P6, P7, P8, P10, P11). Pure data and functions, no I/O.

pub(crate) mod backoff;
pub(crate) mod quarantine;
pub(crate) mod ramp;
pub(crate) mod signals;
#[cfg(feature = "redis")]
pub(crate) mod tables;
pub(crate) mod weight;
pub(crate) mod window;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::config::HealthConfig;

/// Where an address stands (P3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    /// Offered at full weight (or ramping up to it).
    Healthy,
    /// Offered at reduced weight.
    Degraded,
    /// Not offered until its wait ends.
    Quarantined,
    /// Half-open: offered a small share; enough successes in a row bring it back.
    Probing,
    /// Failed too many quarantine cycles in a row; not offered. Probe reports revive it, and a
    /// removal that would leave too few in service brings it back to probing.
    Dead,
}

impl HealthState {
    /// All states, for per-state counts.
    pub const ALL: [Self; 5] = [
        Self::Healthy,
        Self::Degraded,
        Self::Quarantined,
        Self::Probing,
        Self::Dead,
    ];

    /// Whether selection may pick the address.
    pub fn is_offered(self) -> bool {
        matches!(self, Self::Healthy | Self::Degraded | Self::Probing)
    }

    /// Whether the address counts against the quarantine cap: its quarantine episode is open.
    pub(crate) fn counts_against_cap(self) -> bool {
        matches!(self, Self::Quarantined | Self::Probing)
    }

    /// Lower-case name, as in metrics labels and the decision log.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Degraded => "degraded",
            Self::Quarantined => "quarantined",
            Self::Probing => "probing",
            Self::Dead => "dead",
        }
    }
}

/// The state-machine data of one address. C order, 112 bytes: what every outcome reads
/// (state to `since`) is the last 40 of them, so that a record can put it on one cache line
/// beside other fields of every pair (see `AddressRecord`), the rest on the line before.
#[derive(Debug, Clone)]
#[repr(C)]
pub(crate) struct Health {
    pub(crate) last_reason: String,
    pub(crate) quarantined_until: Option<Timestamp>,
    /// Since when the address has been healthy without a fall (P6 reset).
    pub(crate) stable_since: Option<Timestamp>,
    pub(crate) probe_streak: u32,
    /// `n` of the next wait `base × 2^n` (P6).
    pub(crate) backoff_level: u32,
    pub(crate) state: HealthState,
    pub(crate) quarantine_entries: u32,
    /// Suspect since a short fall signal ("3 of the last 5"), with the failures counted since;
    /// that many again while the signal holds confirm it (see `PoolState::evaluate`).
    pub(crate) suspect: Option<u32>,
    /// Set while the address earns its weight back (P10); new addresses ramp too (slow start).
    pub(crate) ramp_started: Option<Timestamp>,
    pub(crate) since: Timestamp,
    /// Quarantine cycles that ended in failure, in a row (P11). Read only at a fall; it fills
    /// the end of the line the fields above share.
    pub(crate) failed_cycles: u32,
}

impl Health {
    /// A new address starts healthy on a slow-start ramp (see ARCHITECTURE.md, proxypool decisions).
    pub(crate) fn slow_start(now: Timestamp) -> Self {
        Self {
            state: HealthState::Healthy,
            since: now,
            quarantined_until: None,
            ramp_started: Some(now),
            probe_streak: 0,
            suspect: None,
            backoff_level: 0,
            failed_cycles: 0,
            stable_since: Some(now),
            quarantine_entries: 0,
            last_reason: "added (slow start)".into(),
        }
    }

    /// Whether the minimum dwell in the current state has passed.
    pub(crate) fn dwelt(&self, now: Timestamp, cfg: &HealthConfig) -> bool {
        now.since(self.since) >= cfg.min_dwell
    }

    /// Ramping back after a quarantine (P10), as opposed to a new address's slow start: only
    /// then does a single failure send it back, and only then is a failure a failed cycle.
    pub(crate) fn returning(&self) -> bool {
        self.ramp_started.is_some() && self.quarantine_entries > 0
    }

    /// Ends a finished ramp: the quarantine cycle that preceded it succeeded.
    pub(crate) fn refresh(&mut self, now: Timestamp, cfg: &HealthConfig) {
        if let Some(started) = self.ramp_started
            && ramp::share(&cfg.ramp_steps, cfg.ramp_duration, started, now).is_none()
        {
            self.ramp_started = None;
            self.failed_cycles = 0;
        }
    }

    /// Moves to `to`, keeping the bookkeeping that depends on the edge; returns the old state.
    pub(crate) fn enter(&mut self, to: HealthState, now: Timestamp, reason: String) -> HealthState {
        let from = self.state;
        self.state = to;
        self.since = now;
        self.last_reason = reason;
        self.probe_streak = 0;
        self.suspect = None;
        match to {
            HealthState::Healthy => {
                self.quarantined_until = None;
                self.stable_since = Some(now);
                if !from.is_offered() || from == HealthState::Probing {
                    self.ramp_started = Some(now);
                }
            }
            HealthState::Degraded => self.stable_since = None,
            HealthState::Quarantined => {
                self.quarantine_entries += 1;
                self.stable_since = None;
                self.ramp_started = None;
            }
            HealthState::Probing => self.quarantined_until = None,
            HealthState::Dead => {
                self.quarantined_until = None;
                self.ramp_started = None;
                self.stable_since = None;
            }
        }
        from
    }
}
