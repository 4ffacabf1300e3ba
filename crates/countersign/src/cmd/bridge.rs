//! `countersign bridge [--name NAME --dir DIR]`: runs bridges (docs/bridge.md) against
//! the local data directory without serving HTTP, for an installation that decides
//! from the CLI or from a `serve` on the same database. `serve` runs the config's
//! `[[bridge]]`s itself, so run a bridge in one place only (two would each ask and
//! deliver through the same requests, never twice, but each would rewrite the files).
//!
//! With `--server URL --token-file F` the bridge runs next to the process, on another
//! machine than the central `serve`, and asks it over REST as the token's agent
//! ([`RemoteAsks`]): the seed's remote host (`VPS_HOST`, `PROCESS_DIR`) without SSH.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::bail;
use clap::Args;
use countersign_core::evidence::OutcomeStatus;
use countersign_core::{NewRequest, Status};
use countersign_server::Gate;
use countersign_server::bridge::{
    Bridge, BridgeAsks, BridgeConfig, LocalAsks, Proposed, principal,
};
use countersign_server::error::{ErrorKind, GateError};
use countersign_server::views::ApprovalView;
use tokio_util::sync::CancellationToken;

use crate::config::{BridgeSection, Config};
use crate::remote::{Remote, RemoteArgs};
use crate::runtime;

#[derive(Debug, Args)]
pub struct BridgeArgs {
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// The bridge's name (its requests are `bridge:<name>`'s): with --dir, one bridge
    /// instead of the config's; alone, the config's bridge of that name.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// The folder of the process's pending.json, approved.json and records.json.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

pub async fn run(config: &Config, args: &BridgeArgs) -> anyhow::Result<ExitCode> {
    let bridges = chosen(config, args)?;
    for bridge in &bridges {
        crate::config::check_bridge_dirs(bridge)?;
    }
    if let Some(remote) = Remote::from_args(&args.remote, None)? {
        return run_remote(remote, bridges).await;
    }
    let gate = runtime::open(config).await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(gate.clone().run_expiry(shutdown.clone()));
    tokio::spawn(
        gate.log()
            .clone()
            .run(gate.feed().clone(), shutdown.clone()),
    );
    let tasks = spawn_local(&gate, &bridges, &shutdown);
    eprintln!(
        "countersign {} bridging {} (data directory {})",
        env!("CARGO_PKG_VERSION"),
        bridges
            .iter()
            .map(|b| format!("{} ({})", b.name, b.paths.pending.display()))
            .collect::<Vec<_>>()
            .join(", "),
        config.data_dir.display()
    );
    let _ = tokio::signal::ctrl_c().await;
    gate.begin_shutdown();
    shutdown.cancel();
    for task in tasks {
        let _ = task.await;
    }
    Ok(ExitCode::SUCCESS)
}

/// The bridges, asking the server `remote` names as its token's agent.
async fn run_remote(remote: Remote, bridges: Vec<BridgeConfig>) -> anyhow::Result<ExitCode> {
    let describe = remote.describe();
    let asks = Arc::new(RemoteAsks::new(remote));
    // The token works, and is an agent's: before anything reads the folder.
    asks.own(Status::Pending)
        .await
        .map_err(|e| anyhow::anyhow!("{describe} refused this bridge's token: {e}"))?;
    let shutdown = CancellationToken::new();
    let tasks: Vec<_> = bridges
        .iter()
        .map(|config| {
            tokio::spawn(
                Bridge::new(config.clone(), asks.clone() as Arc<dyn BridgeAsks>)
                    .run(shutdown.clone()),
            )
        })
        .collect();
    eprintln!(
        "countersign {} bridging {} to {describe}",
        env!("CARGO_PKG_VERSION"),
        bridges
            .iter()
            .map(|b| format!("{} ({})", b.name, b.paths.pending.display()))
            .collect::<Vec<_>>()
            .join(", "),
    );
    let _ = tokio::signal::ctrl_c().await;
    shutdown.cancel();
    for task in tasks {
        let _ = task.await;
    }
    Ok(ExitCode::SUCCESS)
}

/// How long one remote status poll waits before the bridge looks again: a remote bridge
/// notices a decision within this (a local one, at once, from the change feed).
const REMOTE_POLL: Duration = Duration::from_secs(1);
/// Answers the bridge waits for, at most.
const REMOTE_WAIT: Duration = Duration::from_secs(30);

/// The gate of a remote `serve`, over REST, as the agent its token names. The requests
/// are that agent's (`token:<name>`), not `bridge:<name>`: policies and `[groups]` name
/// the token.
pub struct RemoteAsks {
    remote: Remote,
}

impl RemoteAsks {
    pub fn new(remote: Remote) -> Self {
        Self { remote }
    }

    /// This agent's own requests of `status`.
    async fn own(&self, status: Status) -> Result<Vec<ApprovalView>, GateError> {
        #[derive(serde::Deserialize)]
        struct List {
            requests: Vec<ApprovalView>,
        }
        let list: List = self
            .remote
            .get_json(
                &format!("api/v1/requests/own?status={status}&limit=10000"),
                REMOTE_WAIT,
            )
            .await?;
        Ok(list.requests)
    }
}

/// The request an idempotency mismatch names: the server's message says `(request
/// req_...)`.
fn mismatched_request(message: &str) -> Option<&str> {
    let (_, rest) = message.split_once("(request ")?;
    let id = rest.split(')').next()?;
    id.starts_with("req_").then_some(id)
}

#[async_trait::async_trait]
impl BridgeAsks for RemoteAsks {
    async fn propose(&self, new: NewRequest) -> Result<Proposed, GateError> {
        let body = serde_json::json!({
            "action_description": new.description,
            "action_details": new.details,
            "timeout_hours": new.timeout_hours,
            "timeout_seconds": new.timeout_seconds,
            "valid_for_seconds": new.valid_for_seconds,
            "idempotency_key": new.idempotency_key,
            "requested_fields": new.requested_fields,
            "room": new.room,
        });
        let made: Result<serde_json::Value, GateError> = self
            .remote
            .post_json("api/v1/requests", &body, REMOTE_WAIT)
            .await;
        match made {
            Ok(made) => {
                let id = made["request_id"].as_str().unwrap_or_default().to_string();
                Ok(Proposed {
                    request: self.status(&id).await?,
                    differs: false,
                })
            }
            Err(err) if err.kind() == ErrorKind::IdempotencyMismatch => {
                let message = err.public_message();
                let Some(id) = mismatched_request(&message) else {
                    return Err(err);
                };
                Ok(Proposed {
                    request: self.status(id).await?,
                    differs: true,
                })
            }
            Err(err) => Err(err),
        }
    }

    async fn status(&self, id: &str) -> Result<ApprovalView, GateError> {
        self.remote
            .get_json(&format!("api/v1/requests/{id}"), REMOTE_WAIT)
            .await
    }

    async fn claim(&self, id: &str, details: BTreeMap<String, String>) -> Result<(), GateError> {
        let _: serde_json::Value = self
            .remote
            .post_json(
                &format!("api/v1/requests/{id}/actions"),
                &serde_json::json!({"tool": "bridge", "details": details}),
                REMOTE_WAIT,
            )
            .await?;
        Ok(())
    }

    async fn outcome(
        &self,
        id: &str,
        status: OutcomeStatus,
        summary: String,
        details: BTreeMap<String, String>,
    ) -> Result<(), GateError> {
        let _: serde_json::Value = self
            .remote
            .post_json(
                &format!("api/v1/requests/{id}/outcome"),
                &serde_json::json!({"status": status, "summary": summary, "details": details}),
                REMOTE_WAIT,
            )
            .await?;
        Ok(())
    }

    async fn open_requests(&self) -> Result<Vec<ApprovalView>, GateError> {
        let mut out = self.own(Status::Pending).await?;
        out.extend(
            self.own(Status::Approved)
                .await?
                .into_iter()
                .filter(|r| r.outcome.is_none()),
        );
        Ok(out)
    }

    async fn changed(
        &self,
        timeout: Duration,
        _concerns: &(dyn for<'a> Fn(&'a str) -> bool + Sync),
    ) -> bool {
        // No change feed over REST: say "maybe" every poll, and the bridge reads the
        // state of what it waits for.
        tokio::time::sleep(timeout.min(REMOTE_POLL)).await;
        true
    }
}

/// The bridges the arguments name.
fn chosen(config: &Config, args: &BridgeArgs) -> anyhow::Result<Vec<BridgeConfig>> {
    match (&args.name, &args.dir) {
        (Some(name), Some(dir)) => {
            let section = BridgeSection {
                name: name.clone(),
                dir: Some(dir.clone()),
                pending: None,
                approved: None,
                records: None,
                lock_file: None,
                timeout_hours: None,
            };
            let cwd = std::env::current_dir()?;
            Ok(vec![crate::config::bridge_from_keys(
                &format!("--name {name:?}"),
                section,
                &cwd,
            )?])
        }
        (None, Some(_)) => bail!("--dir needs --name: the bridge's requests are bridge:<name>'s"),
        (Some(name), None) => match config.bridges.iter().find(|b| &b.name == name) {
            Some(bridge) => Ok(vec![bridge.clone()]),
            None => bail!(
                "there is no [[bridge]] named {name:?} in the config; give --dir too for one that is not configured"
            ),
        },
        (None, None) if config.bridges.is_empty() => bail!(
            "no bridge to run: add a [[bridge]] to the config (docs/bridge.md), or give --name and --dir"
        ),
        (None, None) => Ok(config.bridges.clone()),
    }
}

/// Starts each bridge against this process's gate, as `bridge:<name>`.
pub fn spawn_local(
    gate: &Arc<Gate>,
    bridges: &[BridgeConfig],
    shutdown: &CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    bridges
        .iter()
        .map(|config| {
            let asks = Arc::new(LocalAsks::new(gate.clone(), principal(&config.name)));
            tokio::spawn(Bridge::new(config.clone(), asks).run(shutdown.clone()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_an_idempotency_mismatch_names() {
        assert_eq!(
            mismatched_request(
                "idempotency key \"p-1\" was already used for a different action (request req_01abc); use a new key for a new action"
            ),
            Some("req_01abc")
        );
        assert_eq!(mismatched_request("something else (request x)"), None);
        assert_eq!(mismatched_request("no request here"), None);
    }
}
