//! `countersign bridge [--name NAME --dir DIR]`: runs bridges (docs/bridge.md) against
//! the local data directory without serving HTTP, for an installation that decides
//! from the CLI or from a `serve` on the same database. `serve` runs the config's
//! `[[bridge]]`s itself, so run a bridge in one place only (two would each ask and
//! deliver through the same requests, never twice, but each would rewrite the files).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::bail;
use clap::Args;
use countersign_server::Gate;
use countersign_server::bridge::{Bridge, BridgeConfig, LocalAsks, principal};
use tokio_util::sync::CancellationToken;

use crate::config::{BridgeSection, Config};
use crate::runtime;

#[derive(Debug, Args)]
pub struct BridgeArgs {
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
