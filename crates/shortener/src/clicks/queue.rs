//! The click queue: bounded and lock-free, one lane per worker thread. With one queue for
//! all, every redirect's push moved the queue's tail (a cache line) between the cores; a
//! lane is written by its own thread and read by the aggregator every few milliseconds.

use super::ClickEvent;
use crossbeam_queue::ArrayQueue;

/// Lanes of events, each a bounded lock-free queue (its head and tail on lines of their
/// own). Any thread may push to any lane: a lane is where a thread pushes, not a rule.
#[derive(Debug)]
pub(crate) struct ClickQueue {
    lanes: Box<[ArrayQueue<ClickEvent>]>,
}

impl ClickQueue {
    /// `capacity` events in all, split evenly between `lanes` lanes (at least one, at most
    /// one per event; a lane holds at least one event).
    pub(crate) fn new(capacity: usize, lanes: usize) -> Self {
        let lanes = lanes.clamp(1, capacity.max(1));
        let each = capacity.div_ceil(lanes).max(1);
        ClickQueue {
            lanes: (0..lanes).map(|_| ArrayQueue::new(each)).collect(),
        }
    }

    /// Queues the event on the calling thread's lane; gives it back when that lane is full.
    pub(crate) fn push(&self, event: ClickEvent) -> Result<(), ClickEvent> {
        self.lanes[crate::metrics::stripe() % self.lanes.len()].push(event)
    }

    /// Events it can hold, in all.
    pub(crate) fn capacity(&self) -> usize {
        self.lanes.iter().map(ArrayQueue::capacity).sum()
    }

    /// Events waiting, in every lane.
    pub(crate) fn len(&self) -> usize {
        self.lanes.iter().map(ArrayQueue::len).sum()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.lanes.iter().all(ArrayQueue::is_empty)
    }

    /// The consumer's side: takes the events lane after lane.
    pub(crate) fn taker(&self) -> Taker<'_> {
        Taker {
            queue: self,
            lane: 0,
        }
    }
}

/// Reads a [`ClickQueue`] one lane at a time: a lane's events stay in the order its thread
/// queued them (runs of one link's clicks stay together), and a lane found empty is not
/// read again until the others were.
pub(crate) struct Taker<'a> {
    queue: &'a ClickQueue,
    lane: usize,
}

impl Taker<'_> {
    /// The next event: the current lane's, else the next lane's that has one; `None` once
    /// every lane was found empty in turn.
    pub(crate) fn pop(&mut self) -> Option<ClickEvent> {
        let lanes = &self.queue.lanes;
        for _ in 0..lanes.len() {
            if let Some(event) = lanes[self.lane].pop() {
                return Some(event);
            }
            self.lane = (self.lane + 1) % lanes.len();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn event(at: i64) -> ClickEvent {
        ClickEvent {
            code: "code".into(),
            at,
            bot: true,
            visit: None,
        }
    }

    #[test]
    fn the_capacity_is_split_between_lanes_and_never_below_one_event() {
        assert_eq!(ClickQueue::new(8, 2).lanes.len(), 2);
        assert_eq!(ClickQueue::new(8, 2).lanes[0].capacity(), 4);
        assert_eq!(ClickQueue::new(9, 2).lanes[1].capacity(), 5);
        assert_eq!(ClickQueue::new(9, 2).capacity(), 10);
        assert_eq!(ClickQueue::new(1, 4).lanes.len(), 1);
        assert_eq!(ClickQueue::new(5, 0).lanes.len(), 1);
        assert_eq!(ClickQueue::new(0, 2).lanes[0].capacity(), 1);
    }

    #[test]
    fn a_thread_fills_its_own_lane_and_the_taker_reads_every_lane_in_order() {
        let queue = Arc::new(ClickQueue::new(6, 3));
        // Three threads, each with a lane of its own when the stripes fall that way, or
        // sharing one: either way nothing is lost and a lane keeps its order.
        let pushed: Vec<usize> = (0..3)
            .map(|t| {
                let queue = queue.clone();
                std::thread::spawn(move || {
                    (0..4)
                        .filter(|i| queue.push(event(t * 10 + i)).is_ok())
                        .count()
                })
            })
            .map(|thread| thread.join().unwrap())
            .collect();
        let pushed: usize = pushed.iter().sum();
        assert!((2..=6).contains(&pushed), "{pushed}");
        assert_eq!(queue.len(), pushed);
        let mut taker = queue.taker();
        let taken: Vec<i64> = std::iter::from_fn(|| taker.pop()).map(|e| e.at).collect();
        assert_eq!(taken.len(), pushed);
        for thread in 0..3 {
            let own: Vec<i64> = taken
                .iter()
                .copied()
                .filter(|at| at / 10 == thread)
                .collect();
            assert!(own.is_sorted(), "{taken:?}");
        }
        assert!(queue.is_empty());
        assert!(queue.taker().pop().is_none());
    }
}
