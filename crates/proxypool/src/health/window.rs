//! The sliding window of an address's last outcomes, with running sums for O(1) rates.

use std::collections::VecDeque;

/// What an outcome says about health. Rate limits are not health and never enter a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    Success,
    /// Connection error, timeout or block.
    Failure,
    Captcha,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry {
    pub(crate) class: Class,
    pub(crate) site: u32,
    /// Recorded while its site was judged degraded: never held against the address (P9).
    pub(crate) excused: bool,
    pub(crate) latency_ms: u32,
}

#[derive(Debug, Clone)]
pub(crate) struct Window {
    entries: VecDeque<Entry>,
    capacity: usize,
    successes: u32,
    captchas: u32,
    latency_sum_ms: u64,
}

impl Window {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            entries: VecDeque::with_capacity(capacity),
            capacity,
            successes: 0,
            captchas: 0,
            latency_sum_ms: 0,
        }
    }

    pub(crate) fn push(&mut self, entry: Entry) {
        if self.entries.len() == self.capacity
            && let Some(old) = self.entries.pop_front()
        {
            self.account(old, false);
        }
        self.account(entry, true);
        self.entries.push_back(entry);
    }

    fn account(&mut self, e: Entry, add: bool) {
        let (counter, latency) = match e.class {
            Class::Success => (&mut self.successes, u64::from(e.latency_ms)),
            Class::Captcha => (&mut self.captchas, 0),
            Class::Failure => return,
        };
        if add {
            *counter += 1;
            self.latency_sum_ms += latency;
        } else {
            *counter -= 1;
            self.latency_sum_ms -= latency;
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn successes(&self) -> u32 {
        self.successes
    }

    pub(crate) fn captchas(&self) -> u32 {
        self.captchas
    }

    /// Mean latency of the successes in the window.
    pub(crate) fn mean_latency_ms(&self) -> Option<f64> {
        (self.successes > 0).then(|| self.latency_sum_ms as f64 / f64::from(self.successes))
    }

    /// Newest first.
    pub(crate) fn newest_first(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter().rev()
    }

    /// (median, p95) of the successes' latencies, if there are at least `min` of them.
    /// `scratch` is reused between calls so the release path does not allocate.
    pub(crate) fn latency_quantiles(
        &self,
        min: usize,
        scratch: &mut Vec<u32>,
    ) -> Option<(u32, u32)> {
        if (self.successes as usize) < min.max(1) {
            return None;
        }
        scratch.clear();
        scratch.extend(
            self.entries
                .iter()
                .filter(|e| e.class == Class::Success)
                .map(|e| e.latency_ms),
        );
        let last = scratch.len() - 1;
        let mut at = |q: f64| {
            *scratch
                .select_nth_unstable(((last as f64) * q).round() as usize)
                .1
        };
        let p95 = at(0.95);
        Some((at(0.5), p95))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(class: Class, latency_ms: u32) -> Entry {
        Entry {
            class,
            site: 0,
            excused: false,
            latency_ms,
        }
    }

    #[test]
    fn sums_follow_the_window() {
        let mut w = Window::new(3);
        w.push(e(Class::Success, 100));
        w.push(e(Class::Captcha, 0));
        w.push(e(Class::Success, 300));
        assert_eq!((w.successes(), w.captchas()), (2, 1));
        assert_eq!(w.mean_latency_ms(), Some(200.0));
        w.push(e(Class::Failure, 0));
        w.push(e(Class::Failure, 0));
        assert_eq!((w.len(), w.successes(), w.captchas()), (3, 1, 0));
        assert_eq!(w.mean_latency_ms(), Some(300.0));
    }

    #[test]
    fn quantiles_need_enough_samples() {
        let mut w = Window::new(50);
        for ms in 1..=20 {
            w.push(e(Class::Success, ms * 10));
        }
        let mut scratch = Vec::new();
        assert_eq!(w.latency_quantiles(21, &mut scratch), None);
        assert_eq!(w.latency_quantiles(10, &mut scratch), Some((110, 190)));
    }
}
