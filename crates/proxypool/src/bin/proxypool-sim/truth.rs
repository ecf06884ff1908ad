//! Hidden ground truth: what each address really does towards each site, over time.

/// The true behaviour of one address towards one site at one instant.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Profile {
    pub(crate) success: f64,
    pub(crate) captcha: f64,
    pub(crate) latency_ms: f64,
}

impl Profile {
    pub(crate) const GOOD: Self = Self {
        success: 0.97,
        captcha: 0.01,
        latency_ms: 200.0,
    };
    pub(crate) const DEAD: Self = Self {
        success: 0.05,
        captcha: 0.0,
        latency_ms: 2000.0,
    };
}

/// A case's ground truth.
pub(crate) trait Truth {
    fn addresses(&self) -> usize;
    fn sites(&self) -> &[&'static str];
    fn profile(&self, address: usize, site: usize, t_ms: u64) -> Profile;
    /// Whether the address itself is fine at `t_ms`, site-wide trouble aside: quarantining it
    /// then is a false quarantine.
    fn address_fine(&self, address: usize, t_ms: u64) -> bool;
}
