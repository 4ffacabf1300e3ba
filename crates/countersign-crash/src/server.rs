//! The server under test: `countersign serve` as `crates/countersign/src/runtime.rs` and
//! `cmd/serve.rs` wire it (SQLite store, signing key, change feed, transparency log,
//! gate, HTTP router, expiry sweeper, log integration, notification outbox), built here
//! because `countersign` is a binary crate and this one needs the SQLite backend with
//! its fail points compiled in. Only configuration parsing is left out: the data
//! directory and the webhook come from the command line.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use countersign_core::{Principal, Role, Scope, Scopes};
use countersign_server::gate::NewToken;
use countersign_server::notify::{Notifier, NotifyConfig, WebhookConfig};
use countersign_server::{Gate, HttpConfig, Settings};
use countersign_sqlite::SqliteStore;
use countersign_store::Store;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The log origin of every harness data directory.
pub const ORIGIN: &str = "countersign/crash-harness";
/// The executor token's name: it redeems approved proofs, racing the agents' actions.
pub const EXECUTOR: &str = "executor-0";
/// The name of the one webhook the harness configures.
pub const WEBHOOK: &str = "receiver";
/// `countersign serve`'s default change-feed poll interval.
const FEED_POLL: Duration = Duration::from_millis(50);

pub fn db_path(data_dir: &Path) -> PathBuf {
    data_dir.join("countersign.db")
}

pub fn keys_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("keys")
}

/// What `runtime::open` does: the data directory, key, store, feed, log and gate.
pub async fn open(data_dir: &Path) -> anyhow::Result<Arc<Gate>> {
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("could not create {}", data_dir.display()))?;
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(&db_path(data_dir)).context("could not open the database")?);
    Gate::builder(store, keys_dir(data_dir))
        .feed_poll(FEED_POLL)
        .log_origin(ORIGIN)
        .settings(Settings {
            backup_dir: Some(data_dir.join("backups")),
            ..Settings::default()
        })
        .build()
        .await
        .context("could not open the gate")
}

/// One webhook to the harness's receiver, for every event type. `lease_seconds` is
/// `[notify] lease_seconds` (0: the default, 60 s).
pub fn notify_config(webhook_url: &str, secret: &str, lease_seconds: u64) -> NotifyConfig {
    NotifyConfig {
        webhooks: vec![WebhookConfig {
            name: WEBHOOK.into(),
            url: webhook_url.into(),
            secret: secret.into(),
            events: Vec::new(),
            format: Default::default(),
        }],
        lease_seconds: match lease_seconds {
            0 => countersign_server::notify::DEFAULT_LEASE_SECONDS,
            set => set,
        },
        ..NotifyConfig::default()
    }
}

/// Sets up a fresh data directory: tokens for `agents` agents and `approvers` approvers
/// (returned as `(name, secret)`), and the outbox cursor, so that every event from here
/// on is notified (a fresh outbox starts at the end of the log).
pub async fn init(
    data_dir: &Path,
    agents: usize,
    approvers: usize,
    webhook_url: &str,
    secret: &str,
) -> anyhow::Result<serde_json::Value> {
    let gate = open(data_dir).await?;
    let setup = Principal::local_user("crash-harness", Role::Admin);
    let mut tokens = serde_json::Map::new();
    // Agents and the executor have an expiry and scopes (their `token_created` entries
    // record both), approvers neither; one token is revoked at once.
    let names = (0..agents)
        .map(|n| (format!("agent-{n}"), Role::Agent))
        .chain((0..approvers).map(|n| (format!("approver-{n}"), Role::Approver)))
        .chain([(EXECUTOR.to_string(), Role::Executor)]);
    for (name, role) in names {
        let mut new = NewToken::new(&name, role);
        match role {
            Role::Agent => {
                new.expires = Some("30d".into());
                new.scopes = Some(Scopes::of([Scope::Request, Scope::Verify]));
            }
            Role::Executor => {
                new.expires = Some("30d".into());
                new.scopes = Some(Scopes::of([Scope::Redeem]));
            }
            _ => {}
        }
        let (_, secret) = gate.create_token_as(new, &setup).await?;
        tokens.insert(name, secret.into());
    }
    gate.create_token("retired-bot", Role::Agent, &setup)
        .await?;
    gate.revoke_token("retired-bot", &setup).await?;
    let notifier = Notifier::new(gate.clone(), notify_config(webhook_url, secret, 0))?;
    notifier.plan_new_events().await?;
    let cursor = gate.store().last_event_seq().await?;
    Ok(serde_json::json!({"tokens": tokens, "outbox_from_seq": cursor}))
}

/// Serves on 127.0.0.1 (port 0) until killed, announcing `listening on http://ADDR` on
/// standard error as `countersign serve` does.
pub async fn serve(
    data_dir: &Path,
    webhook_url: &str,
    secret: &str,
    lease_seconds: u64,
) -> anyhow::Result<()> {
    let gate = open(data_dir).await?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let shutdown = CancellationToken::new();
    let mut notify = notify_config(webhook_url, secret, lease_seconds);
    notify.public_url = format!("http://{addr}");
    let app = countersign_server::router(gate.clone(), &HttpConfig::default(), shutdown.clone());
    let app = countersign_server::with_channels(app, &notify)?;
    tokio::spawn(gate.clone().run_expiry(shutdown.clone()));
    tokio::spawn(
        gate.log()
            .clone()
            .run(gate.feed().clone(), shutdown.clone()),
    );
    let notifier = Arc::new(Notifier::new(gate.clone(), notify)?);
    tokio::spawn(notifier.run(gate.feed().clone(), shutdown.clone()));
    eprintln!(
        "countersign-crash listening on http://{addr} (data directory {})",
        data_dir.display()
    );
    let app = app.into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app)
        .await
        .context("the HTTP server failed")?;
    Ok(())
}
