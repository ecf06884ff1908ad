//! The seed's four cases as ground truth plus workload.

use crate::truth::{Profile, Truth};

const MIN: u64 = 60_000;

/// Which phase of a periodic pattern `t` is in: true during the first `on` of every `period`.
fn during(t: u64, period: u64, on: u64, offset: u64) -> bool {
    (t + period - offset % period) % period < on
}

/// Case 1: keyless scraping of one site; a quarter of the list is dead, a few addresses are
/// intermittent. Random choice lands near 70 %.
pub(crate) struct Scraping;

impl Scraping {
    const N: usize = 40;
    const DEAD: usize = 10;
    const FLAKY: usize = 4;

    fn bad(address: usize, t: u64) -> bool {
        if address < Self::DEAD {
            return true;
        }
        // Intermittent: bad for 5 minutes out of every 12, each with its own offset.
        address < Self::DEAD + Self::FLAKY && during(t, 12 * MIN, 5 * MIN, address as u64 * 3 * MIN)
    }
}

impl Truth for Scraping {
    fn addresses(&self) -> usize {
        Self::N
    }
    fn sites(&self) -> &[&'static str] {
        &["catalog.example"]
    }
    fn profile(&self, address: usize, _site: usize, t: u64) -> Profile {
        if Self::bad(address, t) {
            Profile::DEAD
        } else {
            Profile {
                latency_ms: 150.0 + (address % 7) as f64 * 40.0,
                ..Profile::GOOD
            }
        }
    }
    fn address_fine(&self, address: usize, t: u64) -> bool {
        !Self::bad(address, t)
    }
}

/// Case 2: accounts with sessions; three addresses die mid-run. Switching an account's address
/// mid-session triggers verification (the simulator adds the penalty).
pub(crate) struct Accounts;

impl Accounts {
    pub(crate) const KEYS: usize = 300;

    fn dead(address: usize, t: u64) -> bool {
        address < 3 && t >= 10 * MIN
    }
}

impl Truth for Accounts {
    fn addresses(&self) -> usize {
        30
    }
    fn sites(&self) -> &[&'static str] {
        &["platform.example"]
    }
    fn profile(&self, address: usize, _site: usize, t: u64) -> Profile {
        if Self::dead(address, t) {
            Profile::DEAD
        } else {
            Profile::GOOD
        }
    }
    fn address_fine(&self, address: usize, t: u64) -> bool {
        !Self::dead(address, t)
    }
}

/// Case 3: the target tightens its checks: captchas on every address for the middle third.
pub(crate) struct Tightening {
    pub(crate) from: u64,
    pub(crate) to: u64,
}

impl Truth for Tightening {
    fn addresses(&self) -> usize {
        30
    }
    fn sites(&self) -> &[&'static str] {
        &["target.example"]
    }
    fn profile(&self, _address: usize, _site: usize, t: u64) -> Profile {
        if (self.from..self.to).contains(&t) {
            Profile {
                success: 0.55,
                captcha: 0.44,
                latency_ms: 250.0,
            }
        } else {
            Profile::GOOD
        }
    }
    fn address_fine(&self, _address: usize, _t: u64) -> bool {
        true
    }
}

/// Case 4: one flaky site gives error spikes for every address at once; all addresses are fine.
pub(crate) struct FlakySite;

impl Truth for FlakySite {
    fn addresses(&self) -> usize {
        20
    }
    fn sites(&self) -> &[&'static str] {
        &["steady.example", "flaky.example"]
    }
    fn profile(&self, _address: usize, site: usize, t: u64) -> Profile {
        // Two minutes of 80 % timeouts every ten minutes.
        if site == 1 && during(t, 10 * MIN, 2 * MIN, 4 * MIN) {
            Profile {
                success: 0.2,
                captcha: 0.0,
                latency_ms: 3000.0,
            }
        } else {
            Profile::GOOD
        }
    }
    fn address_fine(&self, _address: usize, _t: u64) -> bool {
        true
    }
}
