//! `countersign process|params|probe`: the operator's commands for the processes
//! countersign gates (docs/bridge.md), against the local data directory, acting as the
//! OS user (an admin here), or with `--server URL --token-file FILE` against a running
//! `serve`'s `/api/v1/operate`, as the token's person. Reading answers at once; a restart, a command or a parameter
//! change is an approval request that another person decides (or a policy), and runs
//! once when approved, its result recorded as the request's outcome. Exit codes: 0 done
//! (and succeeded), 1 refused, failed or still waiting, 2 an error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use countersign_core::Principal;
use countersign_core::evidence::OutcomeStatus;
use countersign_server::operate::{
    Executed, Hold, Operation, Operations, ParamsList, ProbeInfo, ProbeOutput, ProcessStatus,
};
use countersign_server::views::{ApprovalView, OperationView};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::remote::{Remote, RemoteArgs};
use crate::runtime;

/// How long a change waits for its decision, by default.
const DEFAULT_HOLD_SECONDS: u64 = 600;
/// The longest a command waits (a week, as a held call).
const MAX_HOLD_SECONDS: u64 = 7 * 24 * 3600;
/// The session a terminal's asks share: asking again joins the request still open.
const SESSION: &str = "cli";

/// `--server URL --token-file FILE`, given before or after the subcommand.
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Ask a running `countersign serve` at this URL (its /api/v1/operate) instead of
    /// opening the local data directory. Also COUNTERSIGN_SERVER.
    #[arg(long, global = true, env = "COUNTERSIGN_SERVER", value_name = "URL")]
    pub server: Option<String>,
    /// The file that holds an approver's or admin's token for --server. Also
    /// COUNTERSIGN_TOKEN_FILE.
    #[arg(
        long,
        global = true,
        env = "COUNTERSIGN_TOKEN_FILE",
        value_name = "FILE"
    )]
    pub token_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ProcessArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(subcommand)]
    pub command: ProcessCommand,
}

#[derive(Debug, Args)]
pub struct ParamsArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(subcommand)]
    pub command: ParamsCommand,
}

#[derive(Debug, Args)]
pub struct ProbeArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(subcommand)]
    pub command: ProbeCommand,
}

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

/// The longest one request to a server waits for a decision (its /api/v1/operate
/// bound); a longer --hold asks again, which joins the same request.
const REMOTE_HOLD_SECONDS: u64 = 300;

/// Where the commands run: here as the OS user, or on a server as a token's person.
enum Backend {
    Local { ops: Operations, who: Principal },
    Remote(Remote),
}

/// What a change came to, from either backend (the shape of `OperationView`).
#[derive(Debug, Deserialize)]
struct Answer {
    state: String,
    request: ApprovalView,
    #[serde(default)]
    executed: Option<Executed>,
    #[serde(default)]
    reason: Option<String>,
}

/// The quick reads wait this long for a server.
const READ_WAIT: Duration = Duration::from_secs(120);

async fn backend(config: &Config, server: &ServerArgs) -> anyhow::Result<Backend> {
    let args = RemoteArgs {
        server: server.server.clone(),
        token_file: server.token_file.clone(),
    };
    if let Some(remote) = Remote::from_args(&args, None)? {
        return Ok(Backend::Remote(remote));
    }
    Ok(Backend::Local {
        ops: open(config).await?,
        who: runtime::local_admin(),
    })
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

impl Backend {
    async fn status(&self, name: &str) -> anyhow::Result<ProcessStatus> {
        Ok(match self {
            Backend::Local { ops, who } => ops.status(who, name).await?,
            Backend::Remote(r) => {
                r.get_json(
                    &format!("api/v1/operate/processes/{name}/status"),
                    READ_WAIT,
                )
                .await?
            }
        })
    }

    async fn logs(&self, name: &str, lines: usize) -> anyhow::Result<String> {
        Ok(match self {
            Backend::Local { ops, who } => ops.logs(who, name, lines).await?,
            Backend::Remote(r) => {
                let view: Value = r
                    .get_json(
                        &format!("api/v1/operate/processes/{name}/logs?lines={lines}"),
                        READ_WAIT,
                    )
                    .await?;
                view["log"].as_str().unwrap_or_default().to_string()
            }
        })
    }

    async fn list_params(&self) -> anyhow::Result<ParamsList> {
        Ok(match self {
            Backend::Local { ops, who } => ops.list_params(who).await?,
            Backend::Remote(r) => r.get_json("api/v1/operate/params", READ_WAIT).await?,
        })
    }

    async fn probes(&self) -> anyhow::Result<Vec<ProbeInfo>> {
        Ok(match self {
            Backend::Local { ops, who } => ops.probes(who)?,
            Backend::Remote(r) => r.get_json("api/v1/operate/probes", READ_WAIT).await?,
        })
    }

    async fn probe(&self, name: &str) -> anyhow::Result<ProbeOutput> {
        Ok(match self {
            Backend::Local { ops, who } => ops.probe(who, name).await?,
            Backend::Remote(r) => {
                r.post_json(
                    &format!("api/v1/operate/probes/{name}"),
                    &json!({}),
                    READ_WAIT,
                )
                .await?
            }
        })
    }

    /// Asks for `op`, waits up to `hold` for the decision, runs it once approved.
    async fn perform(&self, op: Operation, hold: Duration) -> anyhow::Result<Answer> {
        let mut waiting = |request: &countersign_core::ApprovalRequest| {
            eprintln!(
                "countersign: waiting for a decision on request {} ({}): another approver decides it (yours would be a self-approval)",
                request.id, request.action.description
            );
        };
        match self {
            Backend::Local { ops, who } => {
                let hold = Hold {
                    time: hold,
                    waiting: &mut waiting,
                    progress: &mut |_| {},
                    cancel: &CancellationToken::new(),
                };
                let performed = ops.perform(who, &op, SESSION, hold).await?;
                Ok(serde_json::from_value(serde_json::to_value(
                    OperationView::new(&performed),
                )?)?)
            }
            Backend::Remote(r) => {
                let (path, mut body) = match op {
                    Operation::Restart { process } => (
                        format!("api/v1/operate/processes/{process}/restart"),
                        json!({}),
                    ),
                    Operation::Run { process, command } => (
                        format!("api/v1/operate/processes/{process}/run"),
                        json!({"cmd": command}),
                    ),
                    Operation::SetParam { name, value } => (
                        "api/v1/operate/params/set".to_string(),
                        json!({"name": name, "value": value}),
                    ),
                    Operation::ClearParam { name } => (
                        "api/v1/operate/params/clear".to_string(),
                        match name {
                            Some(name) => json!({"name": name}),
                            None => json!({"all": true}),
                        },
                    ),
                };
                // The first ask answers at once, so that the wait can be announced;
                // each later one joins the same request.
                let deadline = tokio::time::Instant::now() + hold;
                let mut seconds = 0;
                loop {
                    body["hold_seconds"] = json!(seconds);
                    let answer: Answer = r
                        .post_json(&path, &body, Duration::from_secs(seconds))
                        .await?;
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    if answer.state != "pending" || left.is_zero() {
                        return Ok(answer);
                    }
                    if seconds == 0 {
                        eprintln!(
                            "countersign: waiting for a decision on request {} ({}): another approver decides it (yours would be a self-approval)",
                            answer.request.request_id, answer.request.action_description
                        );
                    }
                    seconds = left.as_secs().clamp(1, REMOTE_HOLD_SECONDS);
                }
            }
        }
    }
}

pub async fn process(config: &Config, args: ProcessArgs) -> anyhow::Result<ExitCode> {
    let backend = backend(config, &args.server).await?;
    match args.command {
        ProcessCommand::Status { name, json } => {
            let status = backend.status(&name).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                print!("{}", status.render());
            }
            Ok(ExitCode::SUCCESS)
        }
        ProcessCommand::Logs { name, lines } => {
            print!("{}", backend.logs(&name, lines).await?);
            Ok(ExitCode::SUCCESS)
        }
        ProcessCommand::Restart { name, wait } => {
            perform(&backend, Operation::Restart { process: name }, &wait).await
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
            perform(&backend, op, &wait).await
        }
    }
}

pub async fn params(config: &Config, args: ParamsArgs) -> anyhow::Result<ExitCode> {
    let backend = backend(config, &args.server).await?;
    match args.command {
        ParamsCommand::List { json } => {
            let list = backend.list_params().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                print!("{}", list.render());
            }
            Ok(ExitCode::SUCCESS)
        }
        ParamsCommand::Set { name, value, wait } => {
            let op = Operation::SetParam {
                name,
                value: Value::String(value),
            };
            perform(&backend, op, &wait).await
        }
        ParamsCommand::Clear { name, all: _, wait } => {
            perform(&backend, Operation::ClearParam { name }, &wait).await
        }
    }
}

pub async fn probe(config: &Config, args: ProbeArgs) -> anyhow::Result<ExitCode> {
    let backend = backend(config, &args.server).await?;
    match args.command {
        ProbeCommand::List => {
            for p in backend.probes().await? {
                println!("{:<24} {:<20} {}", p.name, p.host, p.description);
            }
            Ok(ExitCode::SUCCESS)
        }
        ProbeCommand::Run { name, json } => {
            let out = backend.probe(&name).await?;
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
async fn perform(backend: &Backend, op: Operation, wait: &Wait) -> anyhow::Result<ExitCode> {
    if wait.hold > MAX_HOLD_SECONDS {
        anyhow::bail!("--hold: give at most {MAX_HOLD_SECONDS} seconds");
    }
    let answer = backend.perform(op, Duration::from_secs(wait.hold)).await?;
    let code = match answer.state.as_str() {
        "done" => {
            let executed = answer.executed.as_ref();
            if !wait.json
                && let Some(executed) = executed
            {
                if let Some(output) = &executed.output {
                    print!("{output}");
                    if !output.is_empty() && !output.ends_with('\n') {
                        println!();
                    }
                }
                eprintln!(
                    "countersign: request {}: {}",
                    answer.request.request_id, executed.summary
                );
            }
            if executed.is_some_and(|e| e.status == OutcomeStatus::Succeeded) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        "pending" => {
            if !wait.json {
                eprintln!(
                    "countersign: request {} is still waiting for a decision; run the same command again to carry it out once approved",
                    answer.request.request_id
                );
            }
            ExitCode::from(1)
        }
        _ => {
            if !wait.json {
                eprintln!(
                    "countersign: {}",
                    answer.reason.as_deref().unwrap_or("refused")
                );
            }
            ExitCode::from(1)
        }
    };
    if wait.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "request": answer.request,
                "executed": answer.executed,
                "refused": answer.reason,
            }))?
        );
    }
    Ok(code)
}
