//! P7 and P8: the guards that keep a pool from quarantining itself to a halt.

use std::fmt;

/// How many addresses of `total` may be quarantined at once: the fraction rounded up, at
/// least one.
pub(crate) fn cap(total: usize, fraction: f64) -> usize {
    ((total as f64 * fraction).ceil() as usize).max(1)
}

/// Why an address that earned a quarantine stays in service (degraded) instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// P7: the cap is full.
    Cap { cap: usize },
    /// P8: one fewer would leave fewer than the minimum offered.
    MinimumInService { min: usize },
    /// P9: failures everywhere point at our side; quarantining is frozen.
    Frozen,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cap { cap } => write!(f, "quarantine cap of {cap} reached"),
            Self::MinimumInService { min } => write!(f, "would leave fewer than {min} in service"),
            Self::Frozen => f.write_str("quarantining frozen: our side looks broken"),
        }
    }
}

/// What the pool looks like to the gate, for one candidate.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gate {
    pub(crate) frozen: bool,
    pub(crate) total: usize,
    pub(crate) fraction: f64,
    /// Addresses currently counted against the cap.
    pub(crate) quarantined: usize,
    /// Whether the candidate is already counted (a probing address going back).
    pub(crate) candidate_counted: bool,
    /// The fewest addresses offered in any sub-pool of the candidate, and that sub-pool's size.
    pub(crate) offered: usize,
    pub(crate) members: usize,
    /// Whether the candidate is counted in `offered`.
    pub(crate) candidate_offered: bool,
    pub(crate) min_in_service: usize,
}

impl Gate {
    pub(crate) fn check(&self) -> Result<(), Refusal> {
        if self.frozen {
            return Err(Refusal::Frozen);
        }
        let cap = cap(self.total, self.fraction);
        if !self.candidate_counted && self.quarantined >= cap {
            return Err(Refusal::Cap { cap });
        }
        let min = self.min_in_service.min(self.members);
        if self.candidate_offered && self.offered <= min {
            return Err(Refusal::MinimumInService { min });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p7_cap_rounds_up_and_allows_one() {
        assert_eq!(cap(10, 0.3), 3);
        assert_eq!(cap(11, 0.3), 4);
        assert_eq!(cap(2, 0.3), 1);
        assert_eq!(cap(1, 0.3), 1);
    }

    fn gate() -> Gate {
        Gate {
            frozen: false,
            total: 10,
            fraction: 0.3,
            quarantined: 0,
            candidate_counted: false,
            offered: 10,
            members: 10,
            candidate_offered: true,
            min_in_service: 2,
        }
    }

    #[test]
    fn p7_p8_refusals() {
        assert_eq!(gate().check(), Ok(()));
        assert_eq!(
            Gate {
                quarantined: 3,
                ..gate()
            }
            .check(),
            Err(Refusal::Cap { cap: 3 })
        );
        assert_eq!(
            Gate {
                quarantined: 3,
                candidate_counted: true,
                candidate_offered: false,
                ..gate()
            }
            .check(),
            Ok(())
        );
        assert_eq!(
            Gate {
                offered: 2,
                ..gate()
            }
            .check(),
            Err(Refusal::MinimumInService { min: 2 })
        );
        assert_eq!(
            Gate {
                frozen: true,
                ..gate()
            }
            .check(),
            Err(Refusal::Frozen)
        );
    }
}
