//! P9: the address × site matrix and the sites (their judgement: [`crate::judge::sites`]).
//!
//! Every site keeps one window of its last outcomes over all addresses ([`SiteWindow`]).
//! Each address × site pair (a [`Cell`]) with a named site keeps its own window: it weights the address for
//! tickets of that site, and when it alone looks bad the address is avoided there but kept
//! for other sites.

use std::collections::HashMap;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::clock::Timestamp;
use crate::config::HealthConfig;
use crate::health::signals::{self, Signal};
use crate::health::window::Window;
use crate::judge::sites::SiteWindow;
use crate::snapshot::{SiteSnapshot, Totals};
use crate::strategy::Slot;
use crate::telemetry::CellMetrics;

/// The column of tickets that name no site.
pub(crate) const NO_SITE: u32 = 0;

#[derive(Debug)]
pub(crate) struct Site {
    pub(crate) name: Arc<str>,
    pub(crate) degraded: bool,
    pub(crate) since: Timestamp,
    pub(crate) window: SiteWindow,
    /// Running latency of the successes here: the reference of the address × site weights.
    pub(crate) reference_ms: Option<f64>,
}

impl Site {
    fn new(name: Arc<str>) -> Self {
        Self {
            name,
            degraded: false,
            since: Timestamp::default(),
            window: SiteWindow::default(),
            reference_ms: None,
        }
    }

    pub(crate) fn snapshot(&self) -> SiteSnapshot {
        let n = self.window.len();
        let rate = |x: usize| (n > 0).then(|| x as f64 / n as f64);
        let spread = self.window.spread(n);
        let whole = self.window.whole;
        SiteSnapshot {
            site: self.name.to_string(),
            degraded: self.degraded,
            window_samples: n,
            failure_rate: rate(n - whole.successes - whole.captchas),
            captcha_rate: rate(whole.captchas),
            spread: (spread.distinct > 0).then(|| spread.with_bad as f64 / spread.distinct as f64),
        }
    }
}

/// One address × named site pair. Tickets without a site have no cells: nothing is judged or
/// weighted per pair there, the address window holds their outcomes (tagged), and the matrix
/// derives their column from the address (so a site-less release touches no cell).
#[derive(Debug)]
pub(crate) struct Cell {
    pub(crate) window: Window,
    pub(crate) cooling_until: Option<Timestamp>,
    /// The verdict last logged for the pair, so that only its changes are logged (P16).
    pub(crate) avoided: bool,
    pub(crate) totals: Totals,
    pub(crate) metrics: CellMetrics,
}

impl Cell {
    /// Why the address should be avoided for this site at `now`, if it should: the address
    /// fall signals over the pair's own counted outcomes.
    pub(crate) fn verdict(&self, cfg: &HealthConfig, now: Timestamp) -> Option<Signal> {
        signals::fall(&self.window, cfg, now, &[])
    }
}

/// Interned site names, their judgement and the matrix.
#[derive(Debug)]
pub(crate) struct Sites {
    index: HashMap<Arc<str>, u32>,
    pub(crate) list: Vec<Site>,
    /// Internal integer keys: a fast hash is safe here (no caller controls them).
    pub(crate) cells: FxHashMap<(Slot, u32), Cell>,
}

impl Sites {
    pub(crate) fn new() -> Self {
        Self {
            index: HashMap::new(),
            list: vec![Site::new("-".into())],
            cells: FxHashMap::default(),
        }
    }

    /// The id of a site, registered on first sight (by an acquire or a release).
    #[inline]
    pub(crate) fn intern(&mut self, name: Option<&Arc<str>>) -> u32 {
        let Some(name) = name else { return NO_SITE };
        if let Some(id) = self.index.get(&**name) {
            return *id;
        }
        let id = u32::try_from(self.list.len()).unwrap_or(u32::MAX);
        self.list.push(Site::new(Arc::clone(name)));
        self.index.insert(Arc::clone(name), id);
        id
    }

    pub(crate) fn is_degraded(&self, site: u32) -> bool {
        self.list.get(site as usize).is_some_and(|s| s.degraded)
    }

    pub(crate) fn get(&self, slot: Slot, site: u32) -> Option<&Cell> {
        self.cells.get(&(slot, site))
    }

    /// The cell of a pair with a named site, created (and its metrics registered) on first
    /// use.
    pub(crate) fn cell(
        &mut self,
        slot: Slot,
        site: u32,
        address: &str,
        cfg: &HealthConfig,
    ) -> &mut Cell {
        let name = self.list.get(site as usize).map_or("-", |s| &*s.name);
        self.cells.entry((slot, site)).or_insert_with(|| Cell {
            window: Window::new(cfg.window, cfg.window_max_age),
            cooling_until: None,
            avoided: false,
            totals: Totals::default(),
            metrics: CellMetrics::new(address, name),
        })
    }

    pub(crate) fn forget_address(&mut self, slot: Slot) {
        self.cells.retain(|(s, _), _| *s != slot);
    }
}
