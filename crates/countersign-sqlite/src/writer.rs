//! The writer: one thread owns the only write connection and commits jobs in groups.
//!
//! With `synchronous = FULL` each commit costs an fsync, which caps a one-commit-per-write
//! design at the disk's fsync rate (often a few hundred a second). So the thread takes
//! one job, drains whatever else is queued (see `countersign_store::batch`), and runs
//! them all in one `BEGIN IMMEDIATE … COMMIT`. A job that fails must leave nothing and
//! get its own error while the others still commit, so when one fails the transaction is
//! rolled back and the batch runs again with each job inside its own savepoint, where a
//! failed job rolls back to its savepoint alone. Jobs are functions of the connection
//! alone, so running one twice (the first run rolled back) does what running it once
//! does. Savepoints are not the first try because they are not free: SQLite copies
//! every page a job touches into the savepoint's journal first, and jobs rarely fail.
//! Replies are sent only after the COMMIT, so an `Ok` always means durable; if the
//! COMMIT fails, every job in the batch gets an error.
//!
//! One writer per process also means jobs never contend for SQLite's write lock among
//! themselves; other processes on the same file wait on it through the busy timeout.
//!
//! With the `failpoints` feature (test builds only: the crash harness in
//! `crates/countersign-crash` turns it on), the commit path has named points at which the
//! process can be made to abort, chosen by `COUNTERSIGN_TEST_FAILPOINT`; see
//! the `failpoints` module. Without the feature they compile to nothing.

use std::path::Path;

use countersign_store::StoreError;
use countersign_store::batch::{self, BatchStats, Batches, MAX_BATCH, Reply, WriteQueue};
use rusqlite::Connection;

use crate::error::db_err;

/// Marks a fail point: with the `failpoints` feature, the process may abort here (see
/// the `failpoints` module); without it, nothing at all.
macro_rules! fail_point {
    ($name:literal) => {
        #[cfg(feature = "failpoints")]
        failpoints::hit($name);
    };
}

/// Fail points for crash testing: places in the commit path where the process aborts
/// (as abruptly as a `SIGKILL`: no destructor, no rollback, no reply) with a given
/// probability each time it passes.
///
/// `COUNTERSIGN_TEST_FAILPOINT=name:probability[,name:probability...]`, e.g.
/// `before_commit:0.01`. The points, in the order a batch passes them:
///
/// - `after_begin`: the write lock is held (`BEGIN IMMEDIATE`), nothing written yet;
/// - `after_job`: a job's savepoint was released (some of the batch written, uncommitted);
/// - `before_commit`: every job ran, the `COMMIT` is next;
/// - `after_commit`: the batch is durable, and no caller has been told yet.
///
/// The variable is read once, at the first write; a malformed value aborts the process
/// with a message rather than silently testing nothing. Each abort prints
/// `countersign: fail point NAME hit` to standard error first, so a harness can tell what
/// killed the process.
#[cfg(feature = "failpoints")]
pub mod failpoints {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// The environment variable that arms the fail points.
    pub const VAR: &str = "COUNTERSIGN_TEST_FAILPOINT";
    /// Every fail point, in the order a batch passes them.
    pub const POINTS: [&str; 4] = ["after_begin", "after_job", "before_commit", "after_commit"];

    struct Armed {
        points: Vec<(&'static str, f64)>,
        rng: AtomicU64,
    }

    /// Parses `name:probability[,...]`.
    pub fn parse(spec: &str) -> Result<Vec<(&'static str, f64)>, String> {
        let mut points = Vec::new();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, probability) = part
                .split_once(':')
                .ok_or_else(|| format!("{part:?} is not name:probability"))?;
            let name = POINTS
                .iter()
                .find(|p| **p == name.trim())
                .ok_or_else(|| format!("unknown fail point {name:?} (known: {POINTS:?})"))?;
            let probability: f64 = probability
                .trim()
                .parse()
                .map_err(|_| format!("{probability:?} is not a probability"))?;
            if !(0.0..=1.0).contains(&probability) {
                return Err(format!("{probability} is not between 0 and 1"));
            }
            points.push((*name, probability));
        }
        Ok(points)
    }

    fn armed() -> Option<&'static Armed> {
        static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
        ARMED
            .get_or_init(|| {
                let spec = std::env::var(VAR).ok()?;
                let points = match parse(&spec) {
                    Ok(points) => points,
                    Err(err) => {
                        eprintln!("countersign: {VAR}={spec:?}: {err}");
                        std::process::abort();
                    }
                };
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(0);
                let seed = (nanos ^ (u64::from(std::process::id()) << 32)) | 1;
                Some(Armed {
                    points,
                    rng: AtomicU64::new(seed),
                })
            })
            .as_ref()
    }

    /// A uniform draw in [0, 1) (xorshift64*: plenty for choosing when to crash).
    fn draw(rng: &AtomicU64) -> f64 {
        let mut x = rng.load(Ordering::Relaxed);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        rng.store(x, Ordering::Relaxed);
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Passes the fail point `name`: aborts the process with its probability.
    pub(super) fn hit(name: &'static str) {
        let Some(armed) = armed() else {
            return;
        };
        for (point, probability) in &armed.points {
            if *point == name && draw(&armed.rng) < *probability {
                eprintln!("countersign: fail point {name} hit");
                std::process::abort();
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn parses_points_and_refuses_typos() {
            assert_eq!(
                parse("before_commit:0.01, after_commit:1").unwrap(),
                vec![("before_commit", 0.01), ("after_commit", 1.0)]
            );
            assert_eq!(parse("").unwrap(), vec![]);
            assert!(parse("before_comit:0.1").is_err());
            assert!(parse("after_begin").is_err());
            assert!(parse("after_begin:2").is_err());
            assert!(parse("after_begin:x").is_err());
        }

        #[test]
        fn draws_are_uniform_enough() {
            let rng = AtomicU64::new(0x9E37_79B9_7F4A_7C15);
            let hits = (0..100_000).filter(|_| draw(&rng) < 0.25).count();
            assert!((23_000..27_000).contains(&hits), "{hits}");
        }
    }
}

/// Work for the writer thread, type-erased so that one queue carries every kind of write.
trait WriteJob: Send {
    /// Runs inside the batch's transaction; returns whether the job succeeded, i.e.
    /// whether its writes should stay. May be called again after the transaction of an
    /// earlier call was rolled back; the last call's result is the job's.
    fn run(&mut self, conn: &Connection) -> bool;

    /// Replies to the caller once the batch's fate is known: `Ok(())` if it committed.
    fn finish(self: Box<Self>, committed: Result<(), StoreError>);
}

struct Pending<T, F> {
    work: F,
    result: Option<Result<T, StoreError>>,
    reply: Reply<T>,
}

impl<T, F> WriteJob for Pending<T, F>
where
    T: Send,
    F: Fn(&Connection) -> Result<T, StoreError> + Send,
{
    fn run(&mut self, conn: &Connection) -> bool {
        let result = (self.work)(conn);
        let ok = result.is_ok();
        self.result = Some(result);
        ok
    }

    fn finish(self: Box<Self>, committed: Result<(), StoreError>) {
        let reply = match (self.result, committed) {
            // The job's own failure says more than the batch's, and it wrote nothing
            // either way.
            (Some(Err(own)), Ok(())) => Err(own),
            // But not when the batch did not commit: the job ran against the batch's
            // earlier writes, which are gone now, so a conflict it saw (and the winner it
            // names) may never have happened. The batch's error is the truth; a retry
            // sees the real state.
            (Some(_), Err(batch)) | (None, Err(batch)) => Err(batch),
            (Some(Ok(value)), Ok(())) => Ok(value),
            (None, Ok(())) => Err(StoreError::Backend(
                "internal error: a write job was committed without being run".into(),
            )),
        };
        // The caller may have stopped waiting; its write is durable all the same.
        let _ = self.reply.send(reply);
    }
}

/// Counters for tests, benchmarks and health output.
pub type WriterStats = BatchStats;

pub(crate) struct Writer {
    jobs: WriteQueue<Box<dyn WriteJob>>,
}

impl Writer {
    /// Starts the writer thread, which owns `conn` until the last `Writer` handle drops.
    /// `recent` gets the events of each batch once it has committed.
    pub(crate) fn start(
        conn: Connection,
        path: &Path,
        recent: std::sync::Arc<crate::recent::Recent>,
        token: crate::watch::Token,
    ) -> Result<Self, StoreError> {
        let (jobs, batches) =
            batch::queue(format!("the SQLite writer thread for {}", path.display()));
        // Other processes on this file learn of our commits by this file's changes
        // (watch.rs). Without it they still see them, at their feed's next poll.
        let poke = crate::watch::Poker::open(path, token)
            .inspect_err(|e| {
                tracing::warn!(error = %e, "other processes on this database will see its changes at their next poll");
            })
            .ok();
        // The checkpoints' copying runs beside the writer, on a connection of its own, so
        // that a commit never waits behind it (see `checkpoint_if_due`).
        let checkpointer = Connection::open_with_flags(
            path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .ok()
        .and_then(|conn| {
            let (wake, woken) = std::sync::mpsc::sync_channel::<()>(1);
            std::thread::Builder::new()
                .name("countersign-sqlite-checkpoint".into())
                .spawn(move || {
                    for () in woken {
                        if let Err(err) =
                            conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
                        {
                            tracing::debug!(%err, "a background checkpoint did not run");
                        }
                    }
                })
                .ok()
                .map(|_| wake)
        });
        std::thread::Builder::new()
            .name("countersign-sqlite-writer".into())
            .spawn(move || run(conn, batches, poke, &recent, checkpointer))
            .map_err(|e| {
                StoreError::Backend(format!("could not start the SQLite writer thread: {e}"))
            })?;
        Ok(Self { jobs })
    }

    /// Runs `work` in the next batch and returns its result once the batch committed.
    /// If the caller stops waiting, the write still happens. `work` may run more than
    /// once (the earlier runs rolled back), so it must touch nothing but the connection.
    pub(crate) async fn submit<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Fn(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        self.jobs
            .submit(|reply| -> Box<dyn WriteJob> {
                Box::new(Pending {
                    work,
                    result: None,
                    reply,
                })
            })
            .await
    }

    /// Whether the writer thread is still taking jobs.
    pub(crate) fn is_running(&self) -> bool {
        self.jobs.is_running()
    }

    pub(crate) fn stats(&self) -> WriterStats {
        self.jobs.stats()
    }

    pub(crate) fn stopped(&self) -> StoreError {
        self.jobs.stopped()
    }
}

fn run(
    conn: Connection,
    mut batches: Batches<Box<dyn WriteJob>>,
    poke: Option<crate::watch::Poker>,
    recent: &crate::recent::Recent,
    checkpointer: Option<std::sync::mpsc::SyncSender<()>>,
) {
    let mut batch: Vec<Box<dyn WriteJob>> = Vec::with_capacity(MAX_BATCH);
    // In place of SQLite's automatic checkpoint, which runs inside the COMMIT that takes
    // the WAL past its limit: that commit's callers would wait for it, and its events
    // would be visible before `recent` has them. The hook only counts.
    conn.wal_hook(Some(count_frames));
    // Ends when every sender is gone, i.e. the store was dropped; queued jobs finish first.
    while batches.blocking_next(&mut batch) {
        let committed = commit_batch(&conn, &mut batch, recent);
        // What the batch appended is in the database now, or not at all.
        let appended = crate::recent::take();
        recent.landed(if committed.is_ok() {
            appended
        } else {
            Vec::new()
        });
        match &committed {
            Err(err) => tracing::warn!(%err, jobs = batch.len(), "a write batch did not commit"),
            Ok(()) => {
                if let Some(poke) = &poke {
                    poke.poke();
                }
            }
        }
        for job in batch.drain(..) {
            job.finish(committed.clone());
        }
        checkpoint_if_due(&conn, checkpointer.as_ref());
    }
}

thread_local! {
    /// The WAL's length in frames after the last commit, as the WAL hook reported it.
    static WAL_FRAMES: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
}

/// As SQLite's default: a checkpoint once the WAL holds this many frames.
const CHECKPOINT_FRAMES: i32 = 1000;
/// Past this many frames the writer checkpoints itself, between batches: a passive
/// checkpoint beside a busy writer copies only what was committed when it began, so the
/// WAL is never wholly copied and never starts over; the writer's own catch-up is (and
/// is cheap: the checkpoint thread has copied all but the last frames).
const CATCH_UP_FRAMES: i32 = 8 * CHECKPOINT_FRAMES;

fn count_frames(_: &rusqlite::hooks::Wal, frames: std::os::raw::c_int) -> rusqlite::Result<()> {
    WAL_FRAMES.with(|f| f.set(frames));
    Ok(())
}

/// Copies the WAL into the database file once it is long enough, as SQLite's automatic
/// checkpoint does, but never inside a commit: the checkpoint thread does the copying
/// (passive: it takes what no reader still needs and never waits), and past
/// [`CATCH_UP_FRAMES`] the writer catches up itself after a batch's replies, so that the
/// WAL starts over. Without the thread, the writer does it all.
fn checkpoint_if_due(conn: &Connection, checkpointer: Option<&std::sync::mpsc::SyncSender<()>>) {
    let frames = WAL_FRAMES.with(std::cell::Cell::get);
    if frames < CHECKPOINT_FRAMES {
        return;
    }
    if let Some(wake) = checkpointer
        && frames < CATCH_UP_FRAMES
    {
        // Full: it is at work already, and will look again.
        let _ = wake.try_send(());
        return;
    }
    WAL_FRAMES.with(|f| f.set(0));
    if let Err(err) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
        tracing::debug!(%err, "a checkpoint did not run; the next commit tries again");
    }
}

fn commit_batch(
    conn: &Connection,
    batch: &mut [Box<dyn WriteJob>],
    recent: &crate::recent::Recent,
) -> Result<(), StoreError> {
    if in_one_transaction(conn, batch, recent, |conn, job| Ok(job.run(conn)))? {
        return Ok(());
    }
    // A job failed: nothing of that try stays. Again, each job in a savepoint of its own,
    // so that only the failing ones are undone.
    in_one_transaction(conn, batch, recent, |conn, job| {
        run_in_savepoint(conn, job).map(|()| true)
    })
    .map(|_| ())
}

/// Runs every job of `batch` with `run` in one transaction, then commits it; stops and
/// rolls back at the first job `run` says failed (`Ok(false)`) or at an error.
fn in_one_transaction(
    conn: &Connection,
    batch: &mut [Box<dyn WriteJob>],
    recent: &crate::recent::Recent,
    run: impl Fn(&Connection, &mut dyn WriteJob) -> Result<bool, StoreError>,
) -> Result<bool, StoreError> {
    // A try before this one was rolled back: its events never happened.
    crate::recent::take();
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(db_err("begin a write transaction"))?;
    fail_point!("after_begin");
    let result = (|| {
        for job in batch.iter_mut() {
            if !run(conn, job.as_mut())? {
                return Ok(false);
            }
            fail_point!("after_job");
        }
        fail_point!("before_commit");
        // Readers may see its events before they are in `recent`: they wait (recent.rs).
        recent.landing();
        conn.execute_batch("COMMIT").map_err(db_err("commit"))?;
        // Durable now; the replies go out when this returns.
        fail_point!("after_commit");
        Ok(true)
    })();
    if !matches!(result, Ok(true)) && !conn.is_autocommit() {
        // Nothing of a failed try, a failed commit or a broken savepoint may survive, and
        // the next transaction must start clean.
        let _ = conn.execute_batch("ROLLBACK");
    }
    result
}

fn run_in_savepoint(conn: &Connection, job: &mut dyn WriteJob) -> Result<(), StoreError> {
    conn.execute_batch("SAVEPOINT job")
        .map_err(db_err("open a savepoint"))?;
    let mark = crate::recent::mark();
    if job.run(conn) {
        conn.execute_batch("RELEASE job")
            .map_err(db_err("release a savepoint"))
    } else {
        crate::recent::roll_back_to(mark);
        conn.execute_batch("ROLLBACK TO job; RELEASE job")
            .map_err(db_err("roll back a failed write"))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::schema::{create_file, open_writer};

    fn writer() -> (Arc<Writer>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.db");
        create_file(&path).unwrap();
        let conn = open_writer(&path, Duration::from_secs(5)).unwrap();
        (
            Arc::new(Writer::start(conn, &path, Default::default(), [0; 8]).unwrap()),
            dir,
        )
    }

    /// Inserts an event row with the store's own numbering.
    fn append(conn: &Connection) -> Result<i64, StoreError> {
        conn.query_row(
            "INSERT INTO events (seq, at, kind, subject, bytes)
             SELECT coalesce(max(seq), 0) + 1, 0, 'test', NULL, x'' FROM events RETURNING seq",
            [],
            |r| r.get(0),
        )
        .map_err(db_err("append"))
    }

    /// Inserts a payload for event `seq`, which must exist unless foreign keys are
    /// deferred.
    fn payload_of(conn: &Connection, seq: i64) -> Result<usize, StoreError> {
        conn.execute(
            "INSERT INTO payloads (seq, salt, payload) VALUES (?1, '', 'null')",
            [seq],
        )
        .map_err(db_err("store a payload"))
    }

    fn count(conn: &Connection) -> Result<i64, StoreError> {
        conn.query_row("SELECT count(*) FROM events", [], |r| r.get(0))
            .map_err(db_err("count"))
    }

    type TestJob<T> = Box<dyn Fn(&Connection) -> Result<T, StoreError> + Send>;

    /// Holds the writer busy until the jobs, submitted in the order given, are all queued,
    /// so that they form one batch.
    async fn in_one_batch<T: Send + 'static>(
        writer: &Arc<Writer>,
        jobs: Vec<TestJob<T>>,
    ) -> Vec<Result<T, StoreError>> {
        let before = writer.stats();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let blocker = tokio::spawn({
            let writer = writer.clone();
            async move {
                writer
                    .submit(move |_| {
                        let _ = released.recv_timeout(Duration::from_secs(10));
                        Ok(())
                    })
                    .await
            }
        });
        // The writer has taken the blocker: from now on, jobs queue.
        wait_until(|| writer.stats().jobs == before.jobs + 1).await;
        let mut handles = Vec::new();
        for (n, job) in jobs.into_iter().enumerate() {
            let writer2 = writer.clone();
            handles.push(tokio::spawn(async move { writer2.submit(job).await }));
            wait_until(|| writer.stats().queued == n as u64 + 1).await;
        }
        release.send(()).unwrap();
        blocker.await.unwrap().unwrap();
        let mut results = Vec::new();
        for handle in handles {
            results.push(handle.await.unwrap());
        }
        assert_eq!(
            writer.stats().batches,
            before.batches + 2,
            "blocker, then one batch"
        );
        results
    }

    async fn wait_until(condition: impl Fn() -> bool) {
        for _ in 0..1000 {
            if condition() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("timed out waiting");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_job_is_rolled_back_alone_and_burns_no_number() {
        let (writer, _dir) = writer();
        let results = in_one_batch(
            &writer,
            vec![
                Box::new(|conn: &Connection| append(conn)),
                Box::new(|conn: &Connection| {
                    append(conn)?;
                    Err(StoreError::Backend("job two fails after writing".into()))
                }),
                Box::new(|conn: &Connection| append(conn)),
            ],
        )
        .await;
        assert_eq!(results[0].as_ref().unwrap(), &1);
        assert!(matches!(&results[1], Err(StoreError::Backend(m)) if m.contains("job two")));
        assert_eq!(
            results[2].as_ref().unwrap(),
            &2,
            "no hole where job two was"
        );
        assert_eq!(writer.submit(count).await.unwrap(), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_commit_fails_every_job_in_the_batch() {
        let (writer, _dir) = writer();
        // A deferred foreign key violation surfaces only at COMMIT.
        let results = in_one_batch(
            &writer,
            vec![
                Box::new(|conn: &Connection| append(conn)),
                Box::new(|conn: &Connection| {
                    conn.execute_batch("PRAGMA defer_foreign_keys = ON")
                        .map_err(db_err("defer"))?;
                    // A payload of an event that does not exist.
                    payload_of(conn, 999).map(|_| 0)
                }),
                Box::new(|conn: &Connection| append(conn)),
            ],
        )
        .await;
        for result in &results {
            let err = result.as_ref().unwrap_err();
            assert!(err.to_string().contains("commit"), "{err}");
        }
        assert_eq!(writer.submit(count).await.unwrap(), 0, "nothing committed");
        // A job that failed on its own in a batch that then did not commit is told the
        // batch's error, not its own: what it saw (say, another job's write it conflicted
        // with) is gone, and a conflict naming that write would be a lie.
        let results = in_one_batch(
            &writer,
            vec![
                Box::new(|conn: &Connection| append(conn)),
                Box::new(|_: &Connection| -> Result<i64, StoreError> {
                    Err(StoreError::Backend("this job's own failure".into()))
                }),
                Box::new(|conn: &Connection| {
                    conn.execute_batch("PRAGMA defer_foreign_keys = ON")
                        .map_err(db_err("defer"))?;
                    payload_of(conn, 999).map(|_| 0)
                }),
            ],
        )
        .await;
        let own = results[1].as_ref().unwrap_err().to_string();
        assert!(
            own.contains("commit") && !own.contains("own failure"),
            "{own}"
        );
        assert_eq!(writer.submit(count).await.unwrap(), 0, "nothing committed");
        // The next batch starts clean.
        assert_eq!(writer.submit(append).await.unwrap(), 1);
    }
}
