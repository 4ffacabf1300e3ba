//! `countersign process|params|probe`: the operator's commands for the processes
//! countersign gates (docs/bridge.md), against the local data directory, acting as the
//! OS user (an admin here). Reading answers at once; a restart, a command or a parameter
//! change is an approval request that another person decides (or a policy), and runs
//! once when approved, its result recorded as the request's outcome. Exit codes: 0 done
//! (and succeeded), 1 refused, failed or still waiting, 2 an error.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use countersign_server::operate::{Hold, Operation, Operations, Performed};
use countersign_server::views::ApprovalView;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::runtime;

/// How long a change waits for its decision, by default.
const DEFAULT_HOLD_SECONDS: u64 = 600;
/// The longest a command waits (a week, as a held call).
const MAX_HOLD_SECONDS: u64 = 7 * 24 * 3600;
/// The session a terminal's asks share: asking again joins the request still open.
const SESSION: &str = "cli";

#[derive(Debug, Subcommand)]
pub enum ProcessCommand {
    /// Running or not: PID, uptime, CPU, memory, disk, the last log line.
    Status {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// The tail of its log.
    Logs {
        name: String,
        #[arg(long, default_value_t = 50)]
        lines: usize,
    },
    /// Restart it (detached, so it outlives this session), once approved.
    Restart {
        name: String,
        #[command(flatten)]
        wait: Wait,
    },
    /// Run a shell command in its directory, once approved: `run NAME -- df -h`.
    Run {
        name: String,
        #[command(flatten)]
        wait: Wait,
        /// The command (joined with spaces, run by sh on the process's host).
        #[arg(last = true, required = true, value_name = "CMD")]
        command: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum ParamsCommand {
    /// What the manifest declares and what is overridden now.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Override one parameter, once approved (the value is checked against the manifest).
    Set {
        name: String,
        /// Coerced to the declared type: `30`, `0.5`, `yes`, `fast`, `{"a": 1}`, `[1, 2]`.
        value: String,
        #[command(flatten)]
        wait: Wait,
    },
    /// Remove one override (or every one with --all), once approved.
    Clear {
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        name: Option<String>,
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        wait: Wait,
    },
}

#[derive(Debug, Subcommand)]
pub enum ProbeCommand {
    /// The probes configured.
    List,
    /// Run one and print its output.
    Run {
        name: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct Wait {
    /// Seconds to wait for the decision; the request stays open after, and the same
    /// command run again joins it (and runs it once it is approved).
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_HOLD_SECONDS)]
    pub hold: u64,
    /// Print the request and the result as JSON.
    #[arg(long)]
    pub json: bool,
}

async fn open(config: &Config) -> anyhow::Result<Operations> {
    if config.operate.is_empty() {
        anyhow::bail!(
            "no [[process]], [params] or [[probe]] is configured in {}",
            config
                .config_file
                .as_ref()
                .map_or("countersign.toml".into(), |f| f.display().to_string())
        );
    }
    let gate = runtime::open(config).await?;
    Ok(Operations::new(
        gate,
        Arc::new(config.operate.clone()),
        format!("cli-{}", std::process::id()),
    ))
}

pub async fn process(config: &Config, command: ProcessCommand) -> anyhow::Result<ExitCode> {
    let ops = open(config).await?;
    let who = runtime::local_admin();
    match command {
        ProcessCommand::Status { name, json } => {
            let status = ops.status(&who, &name).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                print!("{}", status.render());
            }
            Ok(ExitCode::SUCCESS)
        }
        ProcessCommand::Logs { name, lines } => {
            print!("{}", ops.logs(&who, &name, lines).await?);
            Ok(ExitCode::SUCCESS)
        }
        ProcessCommand::Restart { name, wait } => {
            perform(&ops, &who, Operation::Restart { process: name }, &wait).await
        }
        ProcessCommand::Run {
            name,
            wait,
            command,
        } => {
            let op = Operation::Run {
                process: name,
                command: command.join(" "),
            };
            perform(&ops, &who, op, &wait).await
        }
    }
}

pub async fn params(config: &Config, command: ParamsCommand) -> anyhow::Result<ExitCode> {
    let ops = open(config).await?;
    let who = runtime::local_admin();
    match command {
        ParamsCommand::List { json } => {
            let list = ops.list_params(&who).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(ExitCode::SUCCESS);
            }
            print!("{}", list.render());
            Ok(ExitCode::SUCCESS)
        }
        ParamsCommand::Set { name, value, wait } => {
            let op = Operation::SetParam {
                name,
                value: serde_json::Value::String(value),
            };
            perform(&ops, &who, op, &wait).await
        }
        ParamsCommand::Clear { name, all: _, wait } => {
            perform(&ops, &who, Operation::ClearParam { name }, &wait).await
        }
    }
}

pub async fn probe(config: &Config, command: ProbeCommand) -> anyhow::Result<ExitCode> {
    let ops = open(config).await?;
    let who = runtime::local_admin();
    match command {
        ProbeCommand::List => {
            for p in ops.probes(&who)? {
                println!("{:<24} {:<20} {}", p.name, p.host, p.description);
            }
            Ok(ExitCode::SUCCESS)
        }
        ProbeCommand::Run { name, json } => {
            let out = ops.probe(&who, &name).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&out)?);
            } else {
                print!("{}", out.output);
                if out.truncated {
                    eprintln!("countersign: the output was cut at the probe's max_output_bytes");
                }
                if out.timed_out {
                    eprintln!("countersign: the probe timed out");
                }
            }
            Ok(if out.exit_code == Some(0) && !out.timed_out {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}

/// Asks, waits, runs once approved; says what happened.
async fn perform(
    ops: &Operations,
    who: &countersign_core::Principal,
    op: Operation,
    wait: &Wait,
) -> anyhow::Result<ExitCode> {
    if wait.hold > MAX_HOLD_SECONDS {
        anyhow::bail!("--hold: give at most {MAX_HOLD_SECONDS} seconds");
    }
    let mut waiting = |request: &countersign_core::ApprovalRequest| {
        eprintln!(
            "countersign: waiting for a decision on request {} ({}): another approver decides it (yours would be a self-approval)",
            request.id, request.action.description
        );
    };
    let hold = Hold {
        time: Duration::from_secs(wait.hold),
        waiting: &mut waiting,
        progress: &mut |_| {},
        cancel: &CancellationToken::new(),
    };
    let performed = ops.perform(who, &op, SESSION, hold).await?;
    let (request, code) = match &performed {
        Performed::Done { request, executed } => {
            if !wait.json {
                if let Some(output) = &executed.output {
                    print!("{output}");
                    if !output.is_empty() && !output.ends_with('\n') {
                        println!();
                    }
                }
                eprintln!("countersign: request {}: {}", request.id, executed.summary);
            }
            let ok = executed.status == countersign_core::evidence::OutcomeStatus::Succeeded;
            (
                request,
                if ok {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(1)
                },
            )
        }
        Performed::Pending { request } => {
            if !wait.json {
                eprintln!(
                    "countersign: request {} is still waiting for a decision; run the same command again to carry it out once approved",
                    request.id
                );
            }
            (request, ExitCode::from(1))
        }
        Performed::Refused { request, reason } => {
            if !wait.json {
                eprintln!("countersign: {reason}");
            }
            (request, ExitCode::from(1))
        }
    };
    if wait.json {
        let executed = match &performed {
            Performed::Done { executed, .. } => serde_json::to_value(executed)?,
            _ => serde_json::Value::Null,
        };
        let refused = match &performed {
            Performed::Refused { reason, .. } => serde_json::Value::String(reason.clone()),
            _ => serde_json::Value::Null,
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "request": ApprovalView::new(request),
                "executed": executed,
                "refused": refused,
            }))?
        );
    }
    Ok(code)
}
