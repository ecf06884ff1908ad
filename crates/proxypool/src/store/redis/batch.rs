//! Group commit for the Redis store: concurrent acquires and releases of one process travel
//! together in one FCALL.
//!
//! On Redis 7.0 a function call's fixed cost (the call itself, its arguments, the socket
//! round) is most of what a small operation costs, so under load one call for many operations
//! is most of the throughput. When idle nothing waits: a lone call goes out at once; calls
//! arriving while as many batches are out as `RedisOptions::batches_in_flight` allows queue up
//! and leave together as the next batch, which first yields a few times ([`GATHER_YIELDS`]) so
//! that callers ready to run join it. Each caller still waits for exactly one round trip
//! carrying its operation.

use std::future::Future;
use std::num::NonZeroUsize;
use std::sync::{Arc, Weak};

use std::panic::AssertUnwindSafe;

use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use tokio::sync::{mpsc, oneshot};

/// How often a batch about to leave while another is out yields first. On the 50-task
/// benchmark (medians keyless / keyed, 2 in flight unless said): none left the server idle a
/// fifth of the time (0.36 / 0.37, 4 in flight), one 0.47 / 0.47 (4 in flight), two 0.44 /
/// 0.50, three 0.50 / 0.50, four 0.49 / 0.54, eight 0.49 / 0.53: past four the batches are as
/// large as the callers make them and the server is busy 96 % of the time.
const GATHER_YIELDS: usize = 4;

/// The most operations in one call: a batch runs atomically, so this bounds how long it holds
/// the server.
pub(super) const MAX_BATCH: usize = 64;

/// One operation waiting for its batch.
pub(super) struct Job<R, O> {
    pub(super) request: R,
    pub(super) reply: oneshot::Sender<O>,
}

/// The sending end of a batch queue.
pub(super) type Queue<R, O> = mpsc::UnboundedSender<Job<R, O>>;

/// Starts the worker of one queue on the current tokio runtime. It runs `run` for each batch,
/// at most `in_flight` at once, a batch holding a job that `settles` names only once every
/// earlier batch is done,
/// holding `owner` only while a batch runs, and stops when the queue's sender is dropped and
/// its last batches are done. The batches run inside the worker's own task: a finished batch
/// makes room for the next without another task's wake-up in between.
pub(super) fn spawn<T, R, O, F, Fut>(
    owner: Weak<T>,
    in_flight: NonZeroUsize,
    settles: fn(&R) -> bool,
    run: F,
) -> Queue<R, O>
where
    T: Send + Sync + 'static,
    R: Send + 'static,
    O: Send + 'static,
    F: Fn(Arc<T>, Vec<Job<R, O>>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, mut rx) = mpsc::unbounded_channel::<Job<R, O>>();
    tokio::spawn(async move {
        let mut running = FuturesUnordered::new();
        let mut open = true;
        loop {
            tokio::select! {
                Some(()) = running.next(), if !running.is_empty() => {}
                job = rx.recv(), if open && running.len() < in_flight.get() => {
                    let Some(first) = job else {
                        open = false;
                        continue;
                    };
                    let mut jobs = vec![first];
                    // Under load (a batch is out), let the callers that are ready to run queue
                    // theirs first: larger batches, and the server kept busy.
                    if !running.is_empty() {
                        for _ in 0..GATHER_YIELDS {
                            tokio::task::yield_now().await;
                        }
                    }
                    while jobs.len() < MAX_BATCH {
                        match rx.try_recv() {
                            Ok(job) => jobs.push(job),
                            Err(_) => break,
                        }
                    }
                    // Batches in flight finish in any order: one that must follow them waits.
                    if jobs.iter().any(|j| settles(&j.request)) {
                        while running.next().await.is_some() {}
                    }
                    let Some(owner) = owner.upgrade() else { break };
                    // A batch that panics loses its own callers' answers (their channels
                    // close), not the worker.
                    running.push(AssertUnwindSafe(run(owner, jobs)).catch_unwind().map(drop));
                }
                else => break,
            }
        }
    });
    tx
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: NonZeroUsize = NonZeroUsize::MIN.saturating_add(1);

    /// Queues `request`; its answer.
    fn ask(queue: &Queue<u32, u32>, request: u32) -> oneshot::Receiver<u32> {
        let (reply, answer) = oneshot::channel();
        queue.send(Job { request, reply }).unwrap();
        answer
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_calls_share_batches_and_every_caller_gets_its_own_answer() {
        let owner = Arc::new(std::sync::Mutex::new(Vec::<usize>::new()));
        let queue = spawn(
            Arc::downgrade(&owner),
            TWO,
            |_| false,
            |sizes, jobs: Vec<Job<u32, u32>>| async move {
                // A slow "server": later callers pile up behind the batches in flight.
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                sizes.lock().unwrap().push(jobs.len());
                for job in jobs {
                    let _ = job.reply.send(job.request * 2);
                }
            },
        );
        let mut waiting = Vec::new();
        for i in 0..200u32 {
            let (tx, rx) = oneshot::channel();
            queue
                .send(Job {
                    request: i,
                    reply: tx,
                })
                .unwrap();
            waiting.push((i, rx));
        }
        for (i, rx) in waiting {
            assert_eq!(rx.await.unwrap(), i * 2);
        }
        let sizes = owner.lock().unwrap().clone();
        assert_eq!(sizes.iter().sum::<usize>(), 200);
        assert!(sizes.iter().all(|&n| n <= MAX_BATCH), "{sizes:?}");
        assert!(sizes.len() < 200, "no call was shared: {sizes:?}");
    }

    #[tokio::test]
    async fn no_more_batches_are_out_at_once_than_allowed() {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        // Every batch holds until the gate opens; `started` counts the batches that began.
        let (open, gate) = tokio::sync::watch::channel(false);
        let started = Arc::new(AtomicUsize::new(0));
        let three = NonZeroUsize::new(3).unwrap();
        let queue = spawn(
            Arc::downgrade(&started),
            three,
            |_| false,
            move |started, jobs: Vec<Job<u32, u32>>| {
                let mut gate = gate.clone();
                async move {
                    started.fetch_add(1, SeqCst);
                    let _ = gate.wait_for(|open| *open).await;
                    for job in jobs {
                        let _ = job.reply.send(job.request);
                    }
                }
            },
        );
        let mut answers = Vec::new();
        // One runtime thread: the worker runs whenever this task yields.
        for i in 1..=3 {
            answers.push(ask(&queue, i));
            while started.load(SeqCst) < i as usize {
                tokio::task::yield_now().await;
            }
        }
        answers.push(ask(&queue, 4));
        answers.push(ask(&queue, 5));
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(started.load(SeqCst), 3, "a fourth batch went out");
        open.send(true).unwrap();
        for (i, answer) in (1..).zip(answers) {
            assert_eq!(answer.await.unwrap(), i);
        }
        assert!(started.load(SeqCst) >= 4);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_that_panics_loses_its_answers_not_the_worker() {
        let owner = Arc::new(());
        let queue = spawn(
            Arc::downgrade(&owner),
            TWO,
            |_| false,
            |_, jobs: Vec<Job<u32, u32>>| async move {
                assert!(jobs.iter().all(|j| j.request != 0), "a poisoned batch");
                for job in jobs {
                    let _ = job.reply.send(job.request);
                }
            },
        );
        assert!(ask(&queue, 0).await.is_err());
        for i in 1..=20 {
            assert_eq!(ask(&queue, i).await.unwrap(), i);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_settling_job_waits_for_every_batch_out_before_it() {
        // The first batch holds until the test opens its gate; job 0 settles.
        let (started_tx, started) = oneshot::channel::<()>();
        let (gate_tx, gate) = oneshot::channel::<()>();
        let hooks = Arc::new(std::sync::Mutex::new((Some(started_tx), Some(gate))));
        let queue = spawn(
            Arc::downgrade(&hooks),
            TWO,
            |r: &u32| *r == 0,
            |hooks, jobs: Vec<Job<u32, u32>>| async move {
                let (started, gate) = {
                    let mut h = hooks.lock().unwrap();
                    (h.0.take(), h.1.take())
                };
                if let (Some(started), Some(gate)) = (started, gate) {
                    let _ = started.send(());
                    let _ = gate.await;
                }
                for job in jobs {
                    let _ = job.reply.send(job.request);
                }
            },
        );
        let first = ask(&queue, 1);
        started.await.unwrap();
        let mut settled = ask(&queue, 0);
        // A slot is free (2 in flight), yet the settling job stays behind the held batch.
        let early = tokio::time::timeout(std::time::Duration::from_millis(200), &mut settled).await;
        assert!(
            early.is_err(),
            "settled before the batch out before it ended"
        );
        gate_tx.send(()).unwrap();
        assert_eq!(first.await.unwrap(), 1);
        assert_eq!(settled.await.unwrap(), 0);
    }

    #[tokio::test]
    async fn without_an_owner_callers_are_answered_by_a_closed_channel_not_left_hanging() {
        let owner = Arc::new(());
        let queue = spawn(
            Arc::downgrade(&owner),
            TWO,
            |_| false,
            |_, _: Vec<Job<(), ()>>| async {},
        );
        drop(owner);
        let (tx, rx) = oneshot::channel();
        queue
            .send(Job {
                request: (),
                reply: tx,
            })
            .unwrap();
        assert!(rx.await.is_err());
    }
}
