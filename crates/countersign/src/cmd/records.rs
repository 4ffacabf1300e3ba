//! `countersign records [--bridge NAME] [--json] [-n N]`: the record dashboard of the
//! configured bridges (docs/bridge.md): each process's records.json joined with
//! countersign's requests, as the approval-gate profile's `record_dashboard` shows it.
//! Read by the local user, like `countersign pending`.

use std::process::ExitCode;

use clap::Args;
use countersign_server::Decider;
use countersign_server::bridge::records::{self, RecordsView};

use crate::config::Config;
use crate::runtime;

#[derive(Debug, Args)]
pub struct RecordsArgs {
    /// Only this bridge's records (default: every [[bridge]] of the config).
    #[arg(long, value_name = "NAME")]
    pub bridge: Option<String>,
    /// The summary with the N most recent records instead of the dashboard.
    #[arg(long, short = 'n', value_name = "N")]
    pub recent: Option<usize>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(config: &Config, args: &RecordsArgs) -> anyhow::Result<ExitCode> {
    let gate = runtime::open(config).await?;
    let decider = Decider::new(runtime::local_admin())?;
    let view = match args.recent {
        Some(recent) => RecordsView::Summary { recent },
        None => RecordsView::Dashboard,
    };
    let report = records::report(
        &gate,
        &decider,
        &config.bridges,
        args.bridge.as_deref(),
        view,
    )
    .await
    .map_err(|e| anyhow::anyhow!("{}", e.public_message()))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if args.recent.is_some() {
        println!("{}", report.summary_text());
    } else {
        println!("{}", report.dashboard_text());
    }
    let unreadable = report.bridges.iter().filter(|b| b.error.is_some()).count();
    Ok(if unreadable > 0 {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}
