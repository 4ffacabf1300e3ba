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
    /// The request id (see `countersign pending`); several ids, or `--agent` / `--tool`,
    /// decide them all with one confirmation (each with its own proof).
    #[arg(required_unless_present_any = ["agent", "tool"])]
    pub ids: Vec<String>,
    /// Every pending request from this requester (e.g. token:deploy-bot).
    #[arg(long)]
    pub agent: Option<String>,
    /// Every pending request for this tool (its `tool` detail).
    #[arg(long)]
    pub tool: Option<String>,
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
    let id = match (args.ids.as_slice(), &args.agent, &args.tool) {
        ([one], None, None) => one.as_str(),
        _ => return decide_many(config, args, verdict, &gate, &decider).await,
    };
    let request = gate.get(decider.principal(), id).await?;
    if request.status != Status::Pending {
        // Let the gate produce the precise reason (who decided, or when it expired).
        let err = gate
            .decide(
                &decider,
                id,
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
        let question = format!("{} this request as {}?", verb(verdict), runtime::os_user());
        if !confirmed(&question)? {
            return Ok(ExitCode::from(1));
        }
    }
    let decided = gate
        .decide(
            &decider,
            id,
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

/// Several requests, named or selected by `--agent` / `--tool`, shown and confirmed once,
/// then each decided at the version shown (one that changed meanwhile is reported).
async fn decide_many(
    config: &Config,
    args: &DecideArgs,
    verdict: Verdict,
    gate: &countersign_server::Gate,
    decider: &Decider,
) -> anyhow::Result<ExitCode> {
    if !args.fields.is_empty() {
        bail!("--field is for one request at a time: a batch gives no reply fields");
    }
    let mut chosen = Vec::new();
    for id in &args.ids {
        chosen.push(gate.get(decider.principal(), id).await?);
    }
    if args.agent.is_some() || args.tool.is_some() {
        let query = RequestQuery {
            status: Some(Status::Pending),
            requested_by: args.agent.clone(),
            limit: countersign_server::gate::MAX_BATCH_DECISIONS + 1,
        };
        for r in gate.list(decider, &query).await? {
            let tool_matches = args
                .tool
                .as_ref()
                .is_none_or(|t| r.action.details.get("tool") == Some(t));
            if tool_matches && !chosen.iter().any(|c| c.id == r.id) {
                chosen.push(r);
            }
        }
    }
    if chosen.is_empty() {
        eprintln!("no pending request matches");
        return Ok(ExitCode::from(1));
    }
    let interactive = std::io::stdin().is_terminal();
    if !interactive && !config.cli_unattended_decisions {
        bail!(
            "refusing to {} without a terminal: CLI decisions are made by a person at the keyboard, who sees the requests and confirms them",
            verb(verdict)
        );
    }
    for r in &chosen {
        eprintln!(
            "{}  {} from {}  {}",
            r.id, r.status, r.requested_by.display_name, r.action.description
        );
    }
    if interactive && !args.yes {
        let question = format!(
            "{} these {} requests as {}?",
            verb(verdict),
            chosen.len(),
            runtime::os_user()
        );
        if !confirmed(&question)? {
            return Ok(ExitCode::from(1));
        }
    }
    let selected: Vec<(String, u64)> = chosen.iter().map(|r| (r.id.clone(), r.version)).collect();
    let input = DecisionInput {
        comment: args.comment.clone(),
        fields: BTreeMap::new(),
    };
    let batch = gate
        .decide_batch(decider, &selected, verdict, input, Channel::Cli)
        .await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&countersign_server::views::BatchView::of(&batch))?
        );
    } else {
        for r in &batch.decided {
            println!("{} {}", r.id, r.status);
        }
        for (id, err) in &batch.not_decided {
            println!("{id} not decided: {err}");
        }
    }
    Ok(if batch.not_decided.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}

/// Asks `question` at the terminal; yes only for `y` or `yes` (else says "not decided").
fn confirmed(question: &str) -> anyhow::Result<bool> {
    eprint!("{question} [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    let yes = matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes");
    if !yes {
        eprintln!("not decided");
    }
    Ok(yes)
}

fn verb(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::Approved => "approve",
        Verdict::Rejected => "reject",
    }
}
