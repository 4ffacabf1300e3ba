//! The queue in front of a backend's one writer, and the batches the writer takes from
//! it, with their counters.
//!
//! Every backend serializes appends to the log (SQLite's write lock, PostgreSQL's log
//! head lock), so a commit is what a write costs. Each writer therefore takes one job,
//! drains whatever else is queued (up to [`MAX_BATCH`]) and commits them together. How
//! a batch is committed is the backend's own; queueing, draining and counting are the
//! same everywhere and live here.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{mpsc, oneshot};

use crate::StoreError;

/// The most jobs one transaction carries: enough to amortize a commit (an fsync, a WAL
/// flush) over many writes, few enough that one batch never holds the write lock for
/// long.
pub const MAX_BATCH: usize = 256;

/// Jobs waiting for the writer; callers beyond this wait to enqueue (backpressure).
const QUEUE: usize = 4096;

/// Where a job's result goes once its batch's fate is known.
pub type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// A queue of jobs of type `J` for one writer, named by `writer` (e.g. "the SQLite
/// writer thread for /var/lib/countersign.db") in the error callers get once it stops.
pub fn queue<J>(writer: impl Into<String>) -> (WriteQueue<J>, Batches<J>) {
    let (jobs, queue) = mpsc::channel(QUEUE);
    let counters = Arc::new(Counters::default());
    let sender = WriteQueue {
        jobs,
        counters: counters.clone(),
        writer: writer.into(),
    };
    (sender, Batches { queue, counters })
}

/// Counters for tests, benchmarks and health output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Transactions attempted (one per batch).
    pub batches: u64,
    /// Jobs run, successful or not.
    pub jobs: u64,
    /// The most jobs one transaction carried.
    pub largest_batch: u64,
    /// Jobs waiting for the writer right now.
    pub queued: u64,
}

#[derive(Default)]
struct Counters {
    batches: AtomicU64,
    jobs: AtomicU64,
    largest_batch: AtomicU64,
}

/// The callers' end: what a store holds. Once it is dropped, the writer finishes the
/// queued jobs and ends.
pub struct WriteQueue<J> {
    jobs: mpsc::Sender<J>,
    counters: Arc<Counters>,
    writer: String,
}

impl<J> WriteQueue<J> {
    /// Queues the job that `job` builds around its reply, and waits for the reply. If
    /// the caller stops waiting, the job still runs.
    pub async fn submit<T>(&self, job: impl FnOnce(Reply<T>) -> J) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(job(reply))
            .await
            .map_err(|_| self.stopped())?;
        answer.await.map_err(|_| self.stopped())?
    }

    /// Whether the writer is still taking jobs.
    pub fn is_running(&self) -> bool {
        !self.jobs.is_closed()
    }

    /// The error for a job that the writer can no longer take or answer.
    pub fn stopped(&self) -> StoreError {
        StoreError::Unavailable(format!("{} has stopped", self.writer))
    }

    pub fn stats(&self) -> BatchStats {
        BatchStats {
            batches: self.counters.batches.load(Ordering::Relaxed),
            jobs: self.counters.jobs.load(Ordering::Relaxed),
            largest_batch: self.counters.largest_batch.load(Ordering::Relaxed),
            queued: (self.jobs.max_capacity() - self.jobs.capacity()) as u64,
        }
    }
}

/// The writer's end.
pub struct Batches<J> {
    queue: mpsc::Receiver<J>,
    counters: Arc<Counters>,
}

impl<J> Batches<J> {
    /// Waits for a job, then fills `batch` with it and whatever else is queued, up to
    /// [`MAX_BATCH`]. False once every [`WriteQueue`] is gone and nothing is queued.
    pub async fn next(&mut self, batch: &mut Vec<J>) -> bool {
        match self.queue.recv().await {
            Some(first) => self.fill(first, batch),
            None => false,
        }
    }

    /// [`next`](Self::next) for a writer on a thread of its own.
    pub fn blocking_next(&mut self, batch: &mut Vec<J>) -> bool {
        match self.queue.blocking_recv() {
            Some(first) => self.fill(first, batch),
            None => false,
        }
    }

    fn fill(&mut self, first: J, batch: &mut Vec<J>) -> bool {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match self.queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let size = batch.len() as u64;
        self.counters.batches.fetch_add(1, Ordering::Relaxed);
        self.counters.jobs.fetch_add(size, Ordering::Relaxed);
        self.counters
            .largest_batch
            .fetch_max(size, Ordering::Relaxed);
        true
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[tokio::test]
    async fn a_batch_takes_what_is_queued_up_to_the_limit() {
        let (jobs, mut batches) = queue::<usize>("the test writer");
        let senders: Vec<_> = (0..MAX_BATCH + 3)
            .map(|n| {
                let sender = jobs.jobs.clone();
                async move { sender.send(n).await.unwrap() }
            })
            .collect();
        for send in senders {
            send.await;
        }
        assert_eq!(jobs.stats().queued, MAX_BATCH as u64 + 3);

        let mut batch = Vec::new();
        assert!(batches.next(&mut batch).await);
        assert_eq!(batch, (0..MAX_BATCH).collect::<Vec<_>>());
        batch.clear();
        assert!(batches.next(&mut batch).await);
        assert_eq!(batch, vec![MAX_BATCH, MAX_BATCH + 1, MAX_BATCH + 2]);
        assert_eq!(
            jobs.stats(),
            BatchStats {
                batches: 2,
                jobs: MAX_BATCH as u64 + 3,
                largest_batch: MAX_BATCH as u64,
                queued: 0,
            }
        );

        drop(jobs);
        batch.clear();
        assert!(!batches.next(&mut batch).await, "no writer left to feed");
    }

    #[tokio::test]
    async fn a_job_gets_its_reply_or_learns_that_the_writer_stopped() {
        let (jobs, mut batches) = queue::<Reply<u32>>("the test writer");
        let writer = tokio::spawn(async move {
            let mut batch = Vec::new();
            batches.next(&mut batch).await;
            for reply in batch.drain(..) {
                let _ = reply.send(Ok(7));
            }
            // Stops with the next job unanswered.
            batches.next(&mut batch).await;
        });
        assert_eq!(jobs.submit(|reply| reply).await.unwrap(), 7);
        let err = jobs.submit::<u32>(|reply| reply).await.unwrap_err();
        assert!(
            matches!(&err, StoreError::Unavailable(m) if m == "the test writer has stopped"),
            "{err}"
        );
        writer.await.unwrap();
        assert!(!jobs.is_running());
    }
}
