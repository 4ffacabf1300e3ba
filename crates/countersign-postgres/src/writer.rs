//! The writer: one task per store owns the connection that appends events, and commits
//! the writes queued meanwhile together.
//!
//! Every transaction that appends events, in every instance, first locks the one row
//! of `log_head` (`SELECT ... FOR UPDATE`), so appends are serialized across instances:
//! a statement numbers its event `max(seq) + 1`, which is gap-free, and commit order is
//! sequence order. That lock makes one commit (a WAL flush, with the default
//! `synchronous_commit = on`) per transaction the ceiling on throughput, so the task
//! takes one write, drains whatever else is queued (see `countersign_store::batch`) and
//! runs them all in one transaction:
//!
//! 1. `BEGIN` and lock the head: one round trip.
//! 2. Every write is a single statement (its change and its event, in data-modifying
//!    CTEs), and all of them are sent at once (pipelined): one round trip for the batch.
//!    The one composite write, a request created already decided, sends its second
//!    statement (the decision) once its first has answered, and only if it inserted.
//! 3. Update the head, `NOTIFY` the other instances, `COMMIT`: one round trip.
//!
//! Replies go out only after the COMMIT, so an `Ok` always means durable.
//!
//! No savepoints: each write is one statement that reports, rather than raises, the
//! expected refusals (a version conflict, a duplicate, a reused idempotency key), so an
//! expected refusal never aborts the batch. A statement that does raise an error
//! aborts the transaction; then the batch is rolled back and its writes are run again
//! one per transaction, so that each gets its own result. (Savepoints would cost a
//! round trip each and, past 64 in a transaction, overflow PostgreSQL's subtransaction
//! cache and slow every other session's snapshots.)

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use countersign_core::TokenRecord;
use countersign_store::StoreError;
use countersign_store::batch::{self, Batches, MAX_BATCH, Reply, WriteQueue};
use countersign_store::rows::{EventRow, TransitionRow};
use futures_util::future::join_all;
use tokio_postgres::{Client, Row, SimpleQueryMessage, Statement};

use crate::config::Target;
use crate::connection::connect;
use crate::docs::{self, DocOp, DocWrite};
use crate::error::{Failure, classify, connect_err, map};
use crate::events;
use crate::listener::CHANNEL;
use crate::params::{Param, Params};
use crate::requests::{self, Inserted};
use crate::tokens::{self, NewToken, Revocation};

/// A write that appends an event (or, for `Check`, proves that one could).
pub(crate) enum Write {
    CreateRequest(TransitionRow),
    /// A new request and what follows it at once (a policy's decision; a gateway's
    /// claim), in one transaction: the request's insert, then, only if it inserted,
    /// each following update in order.
    CreateDecided(TransitionRow, Vec<TransitionRow>),
    Apply(TransitionRow),
    AppendEvent(EventRow),
    CreateToken(NewToken),
    RevokeToken(Revocation),
    /// A document insert or update and its event (always with one: a document write
    /// without an event does not need the writer).
    Doc(DocWrite),
    /// Takes the log head lock and commits, writing nothing: the health check.
    Check,
}

/// What a write did, when it succeeded.
pub(crate) enum Outcome {
    Created(Inserted),
    /// `CreateDecided` wrote both.
    CreatedDecided,
    Applied,
    Appended(u64),
    TokenCreated,
    Revoked(TokenRecord),
    DocWritten,
    Checked,
}

/// A write's statement result, read before the batch commits.
pub(crate) struct Decoded {
    /// The event it wrote.
    seq: Option<u64>,
    result: Result<Outcome, StoreError>,
    /// The result cannot be trusted to match what the statement wrote: the batch must
    /// not commit.
    poisoned: bool,
}

impl Decoded {
    /// Wrote event `seq`; succeeded.
    pub(crate) fn wrote(seq: u64, outcome: Outcome) -> Self {
        Self {
            seq: Some(seq),
            result: Ok(outcome),
            poisoned: false,
        }
    }

    /// Wrote nothing: a refusal, or a success that needs no event.
    pub(crate) fn unwritten(result: Result<Outcome, StoreError>) -> Self {
        Self {
            seq: None,
            result,
            poisoned: false,
        }
    }

    /// The result could not be read, so what was written is unknown.
    pub(crate) fn failed(err: StoreError) -> Self {
        Self {
            seq: None,
            result: Err(err),
            poisoned: true,
        }
    }
}

impl Write {
    fn op(&self) -> &'static str {
        match self {
            Write::CreateRequest(_) => "insert a request",
            Write::CreateDecided(..) => "insert a request and its decision",
            Write::Apply(_) => "update a request",
            Write::AppendEvent(_) => "append an event",
            Write::CreateToken(_) => "insert a token",
            Write::RevokeToken(_) => "revoke a token",
            Write::Doc(doc) => doc.what(),
            Write::Check => "check that the log can be written",
        }
    }

    fn statement<'a>(&self, statements: &'a Statements) -> &'a Statement {
        match self {
            // A composite write's first statement (`transaction` runs the second).
            Write::CreateRequest(_) | Write::CreateDecided(..) => &statements.insert_request,
            Write::Apply(_) => &statements.apply,
            Write::AppendEvent(_) => &statements.append,
            Write::CreateToken(_) => &statements.insert_token,
            Write::RevokeToken(_) => &statements.revoke_token,
            Write::Doc(doc) => match doc.op() {
                DocOp::Insert => &statements.insert_doc,
                DocOp::Update => &statements.update_doc,
            },
            Write::Check => &statements.check,
        }
    }

    fn params(&self) -> Vec<Param<'_>> {
        match self {
            Write::CreateRequest(row) | Write::Apply(row) | Write::CreateDecided(row, _) => {
                row.params()
            }
            Write::AppendEvent(event) => event.params(),
            Write::CreateToken(token) => token.params(),
            Write::RevokeToken(revocation) => revocation.params(),
            Write::Doc(doc) => doc.params(),
            Write::Check => Vec::new(),
        }
    }

    fn decode(&self, row: &Row) -> Decoded {
        match self {
            Write::CreateRequest(r) | Write::CreateDecided(r, _) => {
                requests::decode_insert(&r.request.id, row)
            }
            Write::Apply(r) => requests::decode_apply(&r.request.id, row),
            Write::AppendEvent(_) => match events::written_seq(row) {
                Ok(Some(seq)) => Decoded::wrote(seq, Outcome::Appended(seq)),
                Ok(None) => Decoded::failed(StoreError::Backend(
                    "append an event: the statement wrote no event".into(),
                )),
                Err(err) => Decoded::failed(err),
            },
            Write::CreateToken(token) => token.decode(row),
            Write::RevokeToken(revocation) => revocation.decode(row),
            Write::Doc(doc) => doc.decode(row),
            Write::Check => Decoded::unwritten(Ok(Outcome::Checked)),
        }
    }

    /// The error for a statement that raised `err`.
    fn error(&self, err: &tokio_postgres::Error) -> StoreError {
        match self {
            Write::Doc(doc) => doc.error(err),
            _ => map(self.op(), err),
        }
    }
}

/// The writes' statements, prepared once per connection.
struct Statements {
    insert_request: Statement,
    apply: Statement,
    append: Statement,
    insert_token: Statement,
    revoke_token: Statement,
    insert_doc: Statement,
    update_doc: Statement,
    check: Statement,
}

const LOCK_HEAD: &str = "BEGIN; SELECT last_seq FROM log_head FOR UPDATE";

/// Ends a batch that wrote events: the head records the newest, and the other instances
/// are told at commit (PostgreSQL delivers a NOTIFY only when its transaction commits).
/// The payload names the schema, so that listeners of other schemas can ignore it.
fn commit_written() -> String {
    format!(
        "UPDATE log_head SET last_seq = (SELECT max(seq) FROM events);
         SELECT pg_notify('{CHANNEL}', coalesce(current_schema(), '') || ':' || last_seq)
         FROM log_head;
         COMMIT"
    )
}

/// The writer's connection and its prepared statements.
struct Session {
    client: Client,
    statements: Statements,
}

impl Session {
    async fn open(target: &Target) -> Result<Self, StoreError> {
        let op = "open the write connection";
        let client = connect(&target.config)
            .await
            .map_err(|e| connect_err(op, &target.name, &e))?;
        let sql = [
            requests::insert_sql(),
            requests::apply_sql(),
            events::append_sql(),
            tokens::insert_sql(),
            tokens::revoke_sql(),
            docs::write_sql(DocOp::Insert, true),
            docs::write_sql(DocOp::Update, true),
            "SELECT NULL::bigint".to_string(),
        ];
        let prepared = join_all(sql.iter().map(|s| client.prepare(s))).await;
        let mut prepared = prepared
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| map("prepare the write statements", &e))?
            .into_iter();
        let mut next = || {
            prepared.next().ok_or_else(|| {
                StoreError::Backend("prepare the write statements: one is missing".into())
            })
        };
        let statements = Statements {
            insert_request: next()?,
            apply: next()?,
            append: next()?,
            insert_token: next()?,
            revoke_token: next()?,
            insert_doc: next()?,
            update_doc: next()?,
            check: next()?,
        };
        Ok(Self { client, statements })
    }
}

/// Why a transaction did not commit.
enum Failed {
    /// Nothing was written, for a reason that concerns the whole batch (the lock, the
    /// connection, the commit): every write gets this error.
    Batch(StoreError),
    /// Nothing was written because one write's statement failed: the writes are worth
    /// trying again one by one.
    Job(StoreError),
    /// The connection broke during COMMIT: the batch may or may not have committed.
    Unknown(StoreError),
}

/// Counters for tests, benchmarks and health output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Transactions attempted.
    pub batches: u64,
    /// Writes run, successful or not.
    pub jobs: u64,
    /// The most writes one transaction carried.
    pub largest_batch: u64,
    /// Batches rolled back and run again one write per transaction.
    pub split_batches: u64,
    /// Writes waiting for the writer right now.
    pub queued: u64,
}

struct Job {
    write: Write,
    reply: Reply<Outcome>,
}

pub(crate) struct Writer {
    jobs: WriteQueue<Job>,
    split_batches: Arc<AtomicU64>,
}

impl Writer {
    /// Starts the writer task. It connects on its first write (and again whenever its
    /// connection is lost), and ends once the last handle is dropped and the queued
    /// writes are done.
    pub(crate) fn start(target: Target) -> Self {
        let (jobs, batches) = batch::queue(format!("the PostgreSQL writer for {}", target.name));
        let split_batches = Arc::new(AtomicU64::new(0));
        tokio::spawn(run(target, batches, split_batches.clone()));
        Self {
            jobs,
            split_batches,
        }
    }

    /// Runs `write` in the next batch; returns its outcome once the batch committed.
    /// If the caller stops waiting, the write still happens.
    pub(crate) async fn submit(&self, write: Write) -> Result<Outcome, StoreError> {
        self.jobs.submit(|reply| Job { write, reply }).await
    }

    pub(crate) fn stats(&self) -> WriterStats {
        let batches = self.jobs.stats();
        WriterStats {
            batches: batches.batches,
            jobs: batches.jobs,
            largest_batch: batches.largest_batch,
            split_batches: self.split_batches.load(Ordering::Relaxed),
            queued: batches.queued,
        }
    }
}

async fn run(target: Target, mut batches: Batches<Job>, split_batches: Arc<AtomicU64>) {
    let mut session: Option<Session> = None;
    let mut batch: Vec<Job> = Vec::with_capacity(MAX_BATCH);
    while batches.next(&mut batch).await {
        let writes: Vec<&Write> = batch.iter().map(|job| &job.write).collect();
        let results = match attempt(&target, &mut session, &writes).await {
            Ok(results) => results,
            Err(Failed::Job(err)) if writes.len() > 1 => {
                tracing::debug!(%err, writes = writes.len(), "a batch failed; writing one by one");
                split_batches.fetch_add(1, Ordering::Relaxed);
                let mut results = Vec::with_capacity(writes.len());
                // A failure that is not the write's own (the lock, the connection) would
                // recur for every write left: they all get it rather than wait for it.
                let mut shared: Option<StoreError> = None;
                for write in &writes {
                    if let Some(err) = &shared {
                        results.push(Err(err.clone()));
                        continue;
                    }
                    results.push(match attempt(&target, &mut session, &[write]).await {
                        Ok(mut one) => one.pop().unwrap_or_else(|| Err(missing())),
                        // The next write reconnects; this one's fate is its own.
                        Err(Failed::Job(err) | Failed::Unknown(err)) => Err(err),
                        Err(Failed::Batch(err)) => {
                            shared = Some(err.clone());
                            Err(err)
                        }
                    });
                }
                results
            }
            Err(Failed::Batch(err) | Failed::Job(err) | Failed::Unknown(err)) => {
                tracing::warn!(%err, writes = writes.len(), "a write batch did not commit");
                writes.iter().map(|_| Err(err.clone())).collect()
            }
        };
        for (job, result) in batch.drain(..).zip(results) {
            // The caller may have stopped waiting; its write stands all the same.
            let _ = job.reply.send(result);
        }
    }
}

/// One write's statements in the open transaction, and what they did.
async fn run_write(session: &Session, write: &Write) -> Result<Decoded, Failed> {
    let first = query_one(
        session,
        write,
        write.statement(&session.statements),
        write.params(),
    )
    .await?;
    let decoded = write.decode(&first);
    let Write::CreateDecided(_, then) = write else {
        return Ok(decoded);
    };
    // The rest only if the request was inserted: an idempotent repeat returns the
    // request that was there, and a taken id is refused, both with nothing written.
    if decoded.poisoned || !matches!(decoded.result, Ok(Outcome::Created(Inserted::New))) {
        return Ok(decoded);
    }
    let mut seq = decoded.seq;
    for next in then {
        let row = query_one(session, write, &session.statements.apply, next.params()).await?;
        let applied = requests::decode_apply(&next.request.id, &row);
        match applied.result {
            Ok(_) if !applied.poisoned => seq = applied.seq,
            // Nothing else can have touched a request this transaction just inserted;
            // if a transition was not written all the same, the request must not be
            // either: the batch does not commit.
            Ok(_) => return Ok(Decoded::failed(missing())),
            Err(err) => return Ok(Decoded::failed(err)),
        }
    }
    Ok(Decoded {
        seq,
        result: Ok(Outcome::CreatedDecided),
        poisoned: false,
    })
}

/// Runs one statement of `write`, which must return one row.
async fn query_one(
    session: &Session,
    write: &Write,
    statement: &Statement,
    params: Vec<Param<'_>>,
) -> Result<Row, Failed> {
    let rows = session
        .client
        .query(statement, &params)
        .await
        .map_err(|e| {
            let err = write.error(&e);
            // A lost connection concerns every write; anything else is this one's.
            if classify(&e) == Failure::Unreachable {
                Failed::Batch(err)
            } else {
                Failed::Job(err)
            }
        })?;
    match <[Row; 1]>::try_from(rows) {
        Ok([row]) => Ok(row),
        Err(rows) => Err(Failed::Job(StoreError::Backend(format!(
            "{}: the statement returned {} rows instead of 1",
            write.op(),
            rows.len()
        )))),
    }
}

fn missing() -> StoreError {
    StoreError::Backend("internal error: a write got no result".into())
}

/// Runs `writes` in one transaction on the writer's connection, (re)connecting first if
/// needed; returns each write's result once committed.
async fn attempt(
    target: &Target,
    session: &mut Option<Session>,
    writes: &[&Write],
) -> Result<Vec<Result<Outcome, StoreError>>, Failed> {
    if session.as_ref().is_none_or(|s| s.client.is_closed()) {
        *session = None;
        *session = Some(Session::open(target).await.map_err(Failed::Batch)?);
    }
    let Some(live) = session.as_ref() else {
        return Err(Failed::Batch(missing()));
    };
    let result = transaction(live, writes).await;
    match &result {
        Ok(_) => {}
        Err(Failed::Unknown(_)) => *session = None,
        Err(Failed::Batch(_) | Failed::Job(_)) => {
            // The transaction is aborted or never began; make sure it is over before
            // the connection is used again, and drop a connection that cannot say so.
            if live.client.batch_execute("ROLLBACK").await.is_err() {
                *session = None;
            }
        }
    }
    result
}

async fn transaction(
    session: &Session,
    writes: &[&Write],
) -> Result<Vec<Result<Outcome, StoreError>>, Failed> {
    let batch_err = |op: &str, e: &tokio_postgres::Error| Failed::Batch(map(op, e));

    // 1. Take the log head lock. Everything after runs while this transaction is the
    //    only appender in the database.
    let locked = session
        .client
        .simple_query(LOCK_HEAD)
        .await
        .map_err(|e| batch_err("lock the log head", &e))?;
    let heads = locked
        .iter()
        .filter(|m| matches!(m, SimpleQueryMessage::Row(_)))
        .count();
    if heads != 1 {
        return Err(Failed::Batch(StoreError::Corrupt(format!(
            "the log_head table has {heads} rows instead of 1, so appends cannot be serialized"
        ))));
    }

    // 2. Every write's statement, sent together (a composite write's second statement
    //    follows its first's answer).
    let sent = writes.iter().map(|write| run_write(session, write));
    let answers = join_all(sent).await;
    let mut decoded = Vec::with_capacity(writes.len());
    for answer in answers {
        let one = answer?;
        if one.poisoned {
            return Err(Failed::Job(one.result.err().unwrap_or_else(missing)));
        }
        decoded.push(one);
    }

    // 3. Commit, telling the other instances if anything was appended.
    let wrote = decoded.iter().any(|d| d.seq.is_some());
    let end = if wrote {
        commit_written()
    } else {
        "COMMIT".to_string()
    };
    if let Err(e) = session.client.batch_execute(&end).await {
        let err = map("commit", &e);
        return Err(if classify(&e) == Failure::Unreachable {
            // The COMMIT may have reached the server before the connection broke.
            Failed::Unknown(StoreError::Unavailable(format!(
                "{err}; the write may or may not have been committed: read it back \
                 before retrying"
            )))
        } else {
            // The server refused to commit, which rolls the transaction back.
            Failed::Batch(err)
        });
    }
    Ok(decoded.into_iter().map(|d| d.result).collect())
}
