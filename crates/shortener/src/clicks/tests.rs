//! The aggregator against sinks the tests hold: folds, bounds, writes held at a gate or
//! refused, producers racing the fold.

use super::*;
use shortener_core::store::ClickDelta;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use tokio::sync::Semaphore;

fn aggregator(store: Arc<dyn ClickSink>) -> Aggregator {
    let metrics = Arc::new(Metrics::new());
    Aggregator::new(store, None, VisitFold::new([7; 16], None), metrics, 65_536)
}

fn click(code: &Arc<str>, at: UnixSeconds, bot: bool, person: bool) -> ClickEvent {
    ClickEvent {
        code: SmolStr::from(&**code),
        at,
        bot,
        visit: person.then(|| Visit::new([192, 0, 2, 1].into(), "Firefox", None)),
    }
}

#[test]
fn runs_of_one_code_count_as_many_clicks_as_were_queued() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(crate::store::sqlite::SqliteStore::open(dir.path()).unwrap());
    let mut fold = aggregator(store);
    let day = 1_700_000_000;
    let hot: Arc<str> = Arc::from("hotlink");
    // The same code from another cache entry: counted under the same key all the same.
    let hot_again: Arc<str> = Arc::from("hotlink");
    let other: Arc<str> = Arc::from("another");
    let queue = ClickQueue::new(16, 1);
    for event in [
        click(&hot, day, true, false),
        click(&hot, day + 1, true, false),
        click(&hot, day + 2, false, true),
        click(&hot, day + 3, true, false),
        click(&hot_again, day + 4, true, false),
        click(&other, day + 5, false, false),
        click(&hot, day + 6, false, false),
        click(&hot, day + 7, true, false),
        // The next UTC day: a key of its own.
        click(&hot, day + 86_400, true, false),
    ] {
        queue.push(event).unwrap();
    }
    fold.fold_all(&queue);
    let counts = |code: &str, at: UnixSeconds| {
        let pending = &fold.pending.counts[&(SmolStr::from(code), Day::from_unix(at))];
        (pending.human, pending.bot, pending.people.is_some())
    };
    assert_eq!(counts("hotlink", day), (2, 5, true));
    assert_eq!(counts("another", day), (1, 0, false));
    assert_eq!(counts("hotlink", day + 86_400), (0, 1, false));
    assert_eq!(fold.pending.counts.len(), 3);
    assert_eq!(fold.pending.events, 9);
    assert_eq!(
        fold.pending.cost(),
        3 + 1,
        "three entries and one person's click"
    );
    assert_eq!(fold.pending.oldest, Some(day));
    assert!(queue.is_empty());
}

#[tokio::test]
async fn the_lag_counts_from_the_oldest_click_not_yet_written() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(crate::store::sqlite::SqliteStore::open(dir.path()).unwrap());
    let mut fold = aggregator(store);
    let code: Arc<str> = Arc::from("someone");
    let queue = ClickQueue::new(16, 1);
    let at = crate::now() - 100;
    queue.push(click(&code, at, true, false)).unwrap();
    fold.fold_all(&queue);
    assert!(fold.lag() >= 100);
    fold.flush().await;
    assert!(fold.is_done());
    assert_eq!(fold.lag(), 0);
    // A busy process folds again right after a write: its lag is that of the new clicks.
    queue.push(click(&code, at + 7, true, false)).unwrap();
    fold.fold_all(&queue);
    assert_eq!(fold.pending.oldest, Some(at + 7));
    // And while they are being written, from them still.
    fold.start_write();
    assert!(fold.pending.oldest.is_none());
    assert_eq!(fold.writing.as_ref().map(|w| w.oldest), Some(Some(at + 7)));
    assert!(fold.lag() >= 93);
}

#[test]
fn the_bound_counts_entries_and_people_not_a_runs_clicks() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(crate::store::sqlite::SqliteStore::open(dir.path()).unwrap());
    let mut fold = aggregator(store);
    fold.max_backlog = 3;
    fold.write_at = u64::MAX;
    let codes: Vec<Arc<str>> = ["hotlink", "another", "third", "fourth", "fifth"]
        .into_iter()
        .map(Arc::from)
        .collect();
    let queue = ClickQueue::new(16, 1);
    for i in [0, 0, 0, 0, 0, 1, 2, 3, 4, 4] {
        queue
            .push(click(&codes[i], 1_700_000_000, true, false))
            .unwrap();
    }
    fold.drain(&queue);
    // The run of five costs one entry; the third entry fills the bound, and the event
    // taken after it (to end its run) is folded too.
    assert_eq!(fold.pending.counts.len(), 4);
    assert_eq!(fold.pending.events, 8);
    let hot = (SmolStr::from(&*codes[0]), Day::from_unix(1_700_000_000));
    assert_eq!(fold.pending.counts[&hot].bot, 5);
    assert_eq!(queue.len(), 2);
}

/// A click sink that counts in memory; its writes wait at a gate the test opens, and
/// the ones `fails` names are refused.
struct Sink {
    /// Each write takes a permit and gives it back: one permit opens the gate for good.
    gate: Semaphore,
    fails: fn(usize) -> bool,
    started: AtomicUsize,
    inside: AtomicUsize,
    most_inside: AtomicUsize,
    /// Each successful write: (code, human, bot) per delta, in code order.
    writes: Mutex<Vec<Vec<(String, u64, u64)>>>,
}

impl Sink {
    fn new(open: bool, fails: fn(usize) -> bool) -> Arc<Sink> {
        Arc::new(Sink {
            gate: Semaphore::new(usize::from(open)),
            fails,
            started: AtomicUsize::new(0),
            inside: AtomicUsize::new(0),
            most_inside: AtomicUsize::new(0),
            writes: Mutex::new(Vec::new()),
        })
    }

    fn writes(&self) -> Vec<Vec<(String, u64, u64)>> {
        self.writes.lock().unwrap().clone()
    }

    fn clicks(&self) -> u64 {
        self.writes().iter().flatten().map(|(_, h, b)| h + b).sum()
    }
}

#[async_trait::async_trait]
impl ClickSink for Sink {
    async fn apply_clicks(&self, deltas: Vec<ClickDelta>) -> Result<(), StoreError> {
        let n = self.started.fetch_add(1, Ordering::SeqCst);
        let inside = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_inside.fetch_max(inside, Ordering::SeqCst);
        let pass = self.gate.acquire().await;
        let result = if pass.is_err() || (self.fails)(n) {
            Err(StoreError::Unavailable("refused by the test".into()))
        } else {
            let mut write: Vec<_> = deltas
                .into_iter()
                .map(|d| (d.code.to_string(), d.human, d.bot))
                .collect();
            write.sort();
            self.writes.lock().unwrap().push(write);
            Ok(())
        };
        self.inside.fetch_sub(1, Ordering::SeqCst);
        result
    }

    async fn apply_click_batches(&self, _: &[ClickBatch]) -> Result<usize, StoreError> {
        Err(StoreError::Backend("no stream in these tests".into()))
    }

    async fn prune_clicks_before(&self, _: Day) -> Result<u64, StoreError> {
        Ok(0)
    }
}

struct Running {
    recorder: ClickRecorder,
    metrics: Arc<Metrics>,
    stop: watch::Sender<bool>,
    handle: tokio::task::JoinHandle<()>,
}

fn run(sink: &Arc<Sink>, capacity: usize, lanes: usize, interval: Duration) -> Running {
    let metrics = Arc::new(Metrics::new());
    let (stop, stopped) = watch::channel(false);
    let (recorder, handle) = start(
        sink.clone(),
        None,
        VisitFold::new([7; 16], None),
        metrics.clone(),
        ClickQueue::new(capacity, lanes),
        interval,
        stopped,
    );
    Running {
        recorder,
        metrics,
        stop,
        handle,
    }
}

impl Running {
    /// Records a click on each of the codes a, b, c and d (the size of a write with the
    /// bound of 8): returns them and the clicks' time.
    fn one_click_on_each_of_four(&self, bot: bool) -> ([Arc<str>; 4], UnixSeconds) {
        let four = <[Arc<str>; 4]>::try_from(codes(&["a", "b", "c", "d"])).unwrap();
        let at = crate::now();
        for code in &four {
            self.recorder.record(click(code, at, bot, false));
        }
        (four, at)
    }

    async fn stop(self) -> Arc<Metrics> {
        self.stop.send(true).unwrap();
        self.handle.await.unwrap();
        self.metrics
    }
}

/// Lets the aggregator run (it drains on its own timer) until `cond` holds; the limit
/// only keeps a broken build from hanging.
async fn until(what: &str, cond: impl Fn() -> bool) {
    let waited = tokio::time::timeout(Duration::from_secs(30), async {
        while !cond() {
            tokio::task::yield_now().await;
        }
    });
    assert!(waited.await.is_ok(), "never came: {what}");
}

fn codes(names: &[&str]) -> Vec<Arc<str>> {
    names.iter().map(|&name| Arc::from(name)).collect()
}

/// Issue 18: a write that takes its time no longer leaves the queue to fill.
#[tokio::test]
async fn a_write_under_way_does_not_stop_the_fold() {
    let sink = Sink::new(false, |_| false);
    // Bound 8, a write at 4; no write on the timer.
    let running = run(&sink, 8, 1, Duration::from_secs(3600));
    let ([a, b, ..], at) = running.one_click_on_each_of_four(true);
    until("the first write to start", || {
        sink.started.load(Ordering::SeqCst) == 1
    })
    .await;
    // Ten queues' worth of clicks while that write waits at the gate.
    for _ in 0..10 {
        for code in [&a, &a, &a, &a, &b, &b, &b, &b] {
            running.recorder.record(click(code, at, true, false));
        }
        until("the queue to be drained", || running.recorder.depth() == 0).await;
    }
    assert_eq!(running.metrics.clicks_dropped.get(), 0);
    assert_eq!(
        sink.started.load(Ordering::SeqCst),
        1,
        "one write at a time"
    );
    assert!(sink.writes().is_empty());
    sink.gate.add_permits(1);
    until("the first write to end", || sink.writes().len() == 1).await;
    let metrics = running.stop().await;
    let one = |code: &str, n| (code.to_owned(), 0, n);
    assert_eq!(
        sink.writes(),
        [
            vec![one("a", 1), one("b", 1), one("c", 1), one("d", 1)],
            vec![one("a", 40), one("b", 40)],
        ],
        "written in order, each click once"
    );
    assert_eq!(metrics.clicks_flushed.get(), 84);
    assert_eq!(metrics.clicks_dropped.get(), 0);
    assert_eq!(sink.most_inside.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_failed_write_is_merged_back_and_written_once() {
    let sink = Sink::new(true, |n| n == 0);
    let running = run(&sink, 8, 1, Duration::from_secs(3600));
    let ([a, ..], at) = running.one_click_on_each_of_four(false);
    until("the write to fail", || {
        running.metrics.click_flush_failures.get() == 1
    })
    .await;
    for _ in 0..3 {
        running.recorder.record(click(&a, at, true, false));
    }
    until("the queue to be drained", || running.recorder.depth() == 0).await;
    // The failed write's clicks are pending again (cost 4, the size of a write), but
    // the retry waits for the timer: a failing target is not hammered.
    assert_eq!(sink.started.load(Ordering::SeqCst), 1);
    let metrics = running.stop().await;
    assert_eq!(
        sink.writes(),
        [vec![
            ("a".to_owned(), 1, 3),
            ("b".to_owned(), 1, 0),
            ("c".to_owned(), 1, 0),
            ("d".to_owned(), 1, 0),
        ]]
    );
    assert_eq!(metrics.clicks_flushed.get(), 7);
    assert_eq!(metrics.click_flush_failures.get(), 1);
}

/// Producers on threads of their own, a sink refusing every third write (the first too), writes on a
/// short timer: whatever interleaving happens, every click is written once or counted
/// as dropped, and no two writes overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_click_is_written_once_or_counted_dropped() {
    let sink = Sink::new(true, |n| n % 3 == 0);
    let running = run(&sink, 256, 2, Duration::from_millis(5));
    let codes = codes(&["a", "b", "c", "d", "e", "f", "g", "h"]);
    let sent = Arc::new(AtomicU64::new(0));
    let producers: Vec<_> = (0..4u64)
        .map(|p| {
            let (recorder, codes, sent) = (running.recorder.clone(), codes.clone(), sent.clone());
            tokio::task::spawn_blocking(move || {
                let at = crate::now();
                for i in 0..40_000u64 {
                    // Runs of one code, spread codes, people now and then.
                    let code = &codes[((i / 16 + p * i) % 8) as usize];
                    recorder.record(click(code, at, i % 3 == 0, i % 1000 == 0));
                    sent.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for producer in producers {
        producer.await.unwrap();
    }
    let metrics = running.stop().await;
    let dropped = metrics.clicks_dropped.get();
    assert_eq!(sink.clicks() + dropped, sent.load(Ordering::Relaxed));
    assert_eq!(metrics.clicks_flushed.get(), sink.clicks());
    assert_eq!(sink.most_inside.load(Ordering::SeqCst), 1);
    assert!(metrics.click_flush_failures.get() > 0);
}
