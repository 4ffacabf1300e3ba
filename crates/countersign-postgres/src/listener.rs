//! Change notifications across instances: every transaction that appends events sends
//! `NOTIFY countersign_events` (delivered by PostgreSQL at commit), and each listener
//! holds a connection of its own that `LISTEN`s and pokes the change feed.
//!
//! A notification can be lost while the listener reconnects; it then pokes the feed
//! once it is back, and the feed's poll covers the rest.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use countersign_store::ChangeCallback;
use tokio::sync::oneshot;
use tokio_postgres::{AsyncMessage, NoTls};

use crate::config::Target;
use crate::connection::AbortOnDrop;
use crate::error::describe;

/// The channel every instance notifies and listens on. The payload is
/// `<schema>:<newest seq>`; listeners ignore other schemas' notifications.
pub(crate) const CHANNEL: &str = "countersign_events";

const FIRST_RETRY: Duration = Duration::from_millis(100);
const LAST_RETRY: Duration = Duration::from_secs(5);

/// A store's listeners. Dropping it stops them at once: their tasks would otherwise
/// keep their connections (and call into a feed) forever.
#[derive(Default)]
pub(crate) struct Listeners(Mutex<Vec<AbortOnDrop>>);

impl Listeners {
    /// Starts a listener that calls `on_change`, and waits until its first `LISTEN` is
    /// in place, so that a change committed after this returns is pushed. If that
    /// failed, the task keeps retrying and the feed's poll covers the gap.
    pub(crate) async fn start(&self, target: Arc<Target>, on_change: ChangeCallback) {
        let (ready, first) = oneshot::channel();
        let task = tokio::spawn(run(target.clone(), on_change, ready));
        let handle = AbortOnDrop(task);
        match self.0.lock() {
            Ok(mut listeners) => listeners.push(handle),
            Err(poisoned) => poisoned.into_inner().push(handle),
        }
        match first.await {
            Ok(Ok(())) => {}
            Ok(Err(reason)) => tracing::warn!(
                target = %target.name,
                %reason,
                "could not listen for changes yet; retrying in the background"
            ),
            Err(_) => tracing::warn!("the change listener stopped before it started"),
        }
    }
}

/// Runs until aborted: listens, calls `on_change` for each notification of this schema,
/// reconnects with backoff when the connection drops. `ready` gets the outcome of the
/// first attempt.
async fn run(
    target: Arc<Target>,
    on_change: ChangeCallback,
    ready: oneshot::Sender<Result<(), String>>,
) {
    let config = target.listener_config();
    let mut ready = Some(ready);
    let mut backoff = FIRST_RETRY;
    loop {
        let ended = session(&config, &on_change, &mut ready).await;
        if ended.listened {
            // It worked for a while: the first retry comes quickly again.
            backoff = FIRST_RETRY;
        }
        if let Some(first) = ready.take() {
            let _ = first.send(Err(ended.reason.clone()));
        }
        tracing::warn!(
            target = %target.name,
            reason = %ended.reason,
            retry_in = ?backoff,
            "lost the PostgreSQL change notifications; reconnecting (changes made \
             elsewhere meanwhile are found by polling)"
        );
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(LAST_RETRY);
    }
}

/// How a listening connection ended.
struct Ended {
    /// Whether it got as far as listening.
    listened: bool,
    reason: String,
}

/// One connection's life, from connecting until it fails.
async fn session(
    config: &tokio_postgres::Config,
    on_change: &ChangeCallback,
    ready: &mut Option<oneshot::Sender<Result<(), String>>>,
) -> Ended {
    let failed = |reason: String| Ended {
        listened: false,
        reason,
    };
    let (client, mut connection) = match config.connect(NoTls).await {
        Ok(pair) => pair,
        Err(e) => return failed(format!("cannot connect: {}", describe(&e))),
    };
    // The client's requests make progress only while the connection is polled, and
    // notifications arrive through the same poll; so both happen in one loop.
    let setup = async {
        let row = client
            .query_one("SELECT coalesce(current_schema(), '')", &[])
            .await?;
        let schema: String = row.try_get(0)?;
        client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
        Ok::<_, tokio_postgres::Error>(schema)
    };
    tokio::pin!(setup);
    let mut schema: Option<String> = None;
    loop {
        tokio::select! {
            done = &mut setup, if schema.is_none() => {
                match done {
                    Ok(own) => schema = Some(own),
                    Err(e) => return failed(format!("cannot LISTEN: {}", describe(&e))),
                }
                if let Some(first) = ready.take() {
                    let _ = first.send(Ok(()));
                }
                // Anything committed while we were not listening is found now.
                on_change();
            }
            message = std::future::poll_fn(|cx| connection.poll_message(cx)) => {
                let reason = match message {
                    Some(Ok(AsyncMessage::Notification(note))) => {
                        let ours = match (&schema, note.payload().rsplit_once(':')) {
                            (Some(own), Some((from, _))) => from == own,
                            // Before setup finished, or an unexpected payload: a poke
                            // too many costs one read.
                            _ => true,
                        };
                        if ours {
                            on_change();
                        }
                        continue;
                    }
                    Some(Ok(_notice)) => continue,
                    Some(Err(err)) => describe(&err),
                    None => "the connection closed".to_string(),
                };
                return Ended {
                    listened: schema.is_some(),
                    reason,
                };
            }
        }
    }
}
