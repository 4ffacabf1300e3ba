use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;
use countersign_core::{Channel, DecisionInput, Status, Verdict};
use countersign_server::Decider;
use countersign_server::views::ApprovalView;
use countersign_store::RequestQuery;

use crate::config::Config;
use crate::runtime;

#[derive(Debug, Args)]
pub struct PendingArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DecideArgs {
    /// The request id (see `countersign pending`).
    pub id: String,
    /// A comment for the record; for a rejection, the reason the agent receives.
    #[arg(long)]
    pub comment: Option<String>,
    /// A structured reply field for the proof, e.g. --field po_number=PO-7 (repeatable).
    #[arg(long = "field", value_name = "KEY=VALUE")]
    pub fields: Vec<String>,
    /// Do not ask for confirmation at the terminal.
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Print the decided request (with its proof) as JSON.
    #[arg(long)]
    pub json: bool,
}

pub async fn pending(config: &Config, args: &PendingArgs) -> anyhow::Result<ExitCode> {
    let gate = runtime::open(config).await?;
    let decider = Decider::new(runtime::local_admin())?;
    let query = RequestQuery {
        status: Some(Status::Pending),
        requested_by: None,
        limit: 1000,
    };
    let requests = gate.list(&decider, &query).await?;
    if args.json {
        let views: Vec<ApprovalView> = requests.iter().map(ApprovalView::new).collect();
        println!("{}", serde_json::to_string_pretty(&views)?);
        return Ok(ExitCode::SUCCESS);
    }
    if requests.is_empty() {
        eprintln!("nothing is waiting for a decision");
        return Ok(ExitCode::SUCCESS);
    }
    for r in &requests {
        println!(
            "{}  from {}  expires {}",
            r.id, r.requested_by.display_name, r.expires_at
        );
        println!("    {}", r.action.description);
        for (k, v) in &r.action.details {
            println!("    {k}: {v}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn parse_fields(raw: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    raw.iter()
        .map(|f| {
            f.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.to_string()))
                .with_context(|| format!("--field {f:?} must be KEY=VALUE"))
        })
        .collect()
}

/// Decides as the local OS user. An agent running as the same user could run this
/// command too, so by default it insists on a person at a terminal; scripts need
/// `[cli] unattended_decisions = true` in the config file.
pub async fn decide(
    config: &Config,
    args: &DecideArgs,
    verdict: Verdict,
) -> anyhow::Result<ExitCode> {
    let fields = parse_fields(&args.fields)?;
    let gate = runtime::open(config).await?;
    let decider = Decider::new(runtime::local_admin())?;
    let request = gate.get(decider.principal(), &args.id).await?;
    if request.status != Status::Pending {
        // Let the gate produce the precise reason (who decided, or when it expired).
        let err = gate
            .decide(
                &decider,
                &args.id,
                verdict,
                DecisionInput::default(),
                Channel::Cli,
            )
            .await
            .err();
        bail!(
            "{}",
            err.map(|e| e.to_string())
                .unwrap_or_else(|| format!("request {} is {}", request.id, request.status))
        );
    }
    let interactive = std::io::stdin().is_terminal();
    if !interactive && !config.cli_unattended_decisions {
        // Not a recipe: the error is read by whatever ran the command, which may be an
        // agent. The operator's documentation (docs/config.md) says how scripts opt in.
        bail!(
            "refusing to {} without a terminal: CLI decisions are made by a person at the keyboard, who sees the request and confirms it",
            verb(verdict)
        );
    }
    if interactive && !args.yes {
        eprintln!("{} from {}", request.id, request.requested_by.display_name);
        eprintln!("  {}", request.action.description);
        for (k, v) in &request.action.details {
            eprintln!("  {k}: {v}");
        }
        eprint!(
            "{} this request as {}? [y/N] ",
            verb(verdict),
            runtime::os_user()
        );
        std::io::stderr().flush()?;
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer)?;
        if !matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
            eprintln!("not decided");
            return Ok(ExitCode::from(1));
        }
    }
    let decided = gate
        .decide(
            &decider,
            &args.id,
            verdict,
            DecisionInput {
                comment: args.comment.clone(),
                fields,
            },
            Channel::Cli,
        )
        .await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&ApprovalView::new(&decided))?
        );
    } else if let Some(quorum) = countersign_server::views::QuorumView::of(&decided)
        .filter(|_| decided.status == Status::Pending)
    {
        println!(
            "{} approval recorded as {}: {}",
            decided.id,
            runtime::os_user(),
            quorum.summary()
        );
    } else {
        let valid = decided
            .decision
            .as_ref()
            .map(|d| d.valid_until.to_string())
            .unwrap_or_default();
        println!(
            "{} {} as {} (approval usable until {valid})",
            decided.id,
            decided.status,
            runtime::os_user()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn verb(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::Approved => "approve",
        Verdict::Rejected => "reject",
    }
}
