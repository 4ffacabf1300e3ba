//! `countersign policy`: check the policy files, explain what they do with one request,
//! print the schema they are checked against. None of these opens the database.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use countersign_policy::{Input, PolicySet, RESOURCE};
use countersign_server::gate::{TOOL_DETAIL, read_policy_files};
use serde::Deserialize;

use crate::config::Config;

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Load the policy files (those of `[policy] files`, or the FILES given) and say what
    /// is wrong, naming the file and the policy. Exit 1 when they do not load.
    Validate(FilesArgs),
    /// Evaluate one request (a JSON file, `-` for standard input) against the policies and
    /// print the policies that matched, the outcome and the requirements.
    Test {
        request: PathBuf,
        #[command(flatten)]
        files: FilesArgs,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the Cedar schema the policies are checked against: countersign's, plus an
    /// action for each tool the policies name and the detail keys they read.
    Schema(FilesArgs),
}

#[derive(Debug, Args)]
pub struct FilesArgs {
    /// Policy files to use instead of `[policy] files`.
    #[arg(value_name = "FILES")]
    files: Vec<PathBuf>,
}

/// The request `policy test` reads: what an agent sends, and what the gate adds.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TestRequest {
    agent: String,
    description: String,
    #[serde(default)]
    details: BTreeMap<String, String>,
    /// The tool (default: the `tool` detail, else `Action::"request"`).
    tool: Option<String>,
    /// The agent's groups (default: those `[groups]` gives `token:<agent>`).
    groups: Option<Vec<String>>,
    room: Option<String>,
    /// RFC 3339 (default: now).
    time: Option<String>,
    #[serde(default)]
    pending: u64,
    #[serde(default)]
    recent: u64,
    #[serde(default)]
    gateway: bool,
}

pub async fn run(config: &Config, command: PolicyCommand) -> anyhow::Result<ExitCode> {
    match command {
        PolicyCommand::Validate(files) => {
            let set = match load(config, &files) {
                Ok(set) => set,
                Err(err) => {
                    println!("invalid: {err}");
                    return Ok(ExitCode::from(1));
                }
            };
            let permits = set
                .policies()
                .iter()
                .filter(|p| p.effect == "permit")
                .count();
            println!(
                "valid: {} policies ({permits} permit, {} forbid) in {} file(s); policy set {}",
                set.policies().len(),
                set.policies().len() - permits,
                set.files().len(),
                set.digest()
            );
            Ok(ExitCode::SUCCESS)
        }
        PolicyCommand::Schema(files) => {
            let set = load(config, &files)?;
            print!("{}", set.schema());
            Ok(ExitCode::SUCCESS)
        }
        PolicyCommand::Test {
            request,
            files,
            json,
        } => {
            let set = load(config, &files)?;
            let text = if request.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin()).context("could not read the request")?
            } else {
                std::fs::read_to_string(&request)
                    .with_context(|| format!("could not read {}", request.display()))?
            };
            let req: TestRequest = serde_json::from_str(&text)
                .with_context(|| format!("{} is not a test request", request.display()))?;
            let now = match &req.time {
                Some(t) => countersign_core::Timestamp::parse(t)
                    .map_err(|e| anyhow::anyhow!("time {t:?} is not RFC 3339: {e}"))?
                    .datetime(),
                None => chrono::Utc::now(),
            };
            let groups = req
                .groups
                .clone()
                .unwrap_or_else(|| config.guards.groups.of(&format!("token:{}", req.agent)));
            let tool = req
                .tool
                .as_deref()
                .or(req.details.get(TOOL_DETAIL).map(String::as_str));
            let zone = config.policy.as_ref().map_or(chrono_tz::UTC, |p| p.zone);
            let evaluation = set.evaluate(&Input {
                agent: &req.agent,
                groups: &groups,
                tool,
                resource: RESOURCE,
                gateway: req.gateway,
                description: &req.description,
                details: &req.details,
                room: req.room.as_deref(),
                now,
                zone,
                pending: req.pending,
                recent: req.recent,
            });
            if json {
                println!("{}", serde_json::to_string_pretty(&evaluation)?);
                return Ok(ExitCode::SUCCESS);
            }
            let action = tool.unwrap_or(countersign_policy::DEFAULT_ACTION);
            println!(
                "action: Action::{action:?}, principal: Agent::{:?} in {groups:?}",
                req.agent
            );
            if evaluation.matched.is_empty() {
                println!("matched: none");
            } else {
                println!("matched: {}", evaluation.matched.join(", "));
            }
            for error in &evaluation.errors {
                println!("could not be evaluated: {error}");
            }
            println!("{}", describe(&evaluation.outcome, &set));
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn describe(outcome: &countersign_policy::Outcome, set: &PolicySet) -> String {
    use countersign_policy::Outcome;
    let reason = |id: &str| {
        set.policies()
            .iter()
            .find(|p| p.id == id)
            .and_then(|p| p.reason.clone())
            .map(|r| format!(" ({r})"))
            .unwrap_or_default()
    };
    match outcome {
        Outcome::Reject { policy } => {
            format!("outcome: rejected at once by {policy}{}", reason(policy))
        }
        Outcome::Approve { policy } => {
            format!(
                "outcome: approved without a person by {policy}{}",
                reason(policy)
            )
        }
        Outcome::Person {
            policies,
            requirements,
        } => {
            let mut text = String::from("outcome: a person decides");
            if !policies.is_empty() {
                text.push_str(&format!(", under {}", policies.join(", ")));
            }
            if let Some(hours) = requirements.timeout_hours {
                text.push_str(&format!("; within {hours} h"));
            }
            match requirements.on_timeout {
                Some(countersign_policy::OnTimeout::Approve) => {
                    text.push_str("; if nobody does, approved (fallback)")
                }
                Some(countersign_policy::OnTimeout::Reject) => {
                    text.push_str("; if nobody does, rejected (fallback)")
                }
                None => {}
            }
            text
        }
        Outcome::NoMatch => "outcome: no policy matched: a person decides".to_string(),
    }
}

fn load(config: &Config, args: &FilesArgs) -> anyhow::Result<PolicySet> {
    let paths = if args.files.is_empty() {
        match &config.policy {
            Some(p) => p.files.clone(),
            None => anyhow::bail!(
                "no policy files: name them, or set [policy] files in the config (docs/policies.md)"
            ),
        }
    } else {
        args.files.clone()
    };
    let files = read_policy_files(&paths).map_err(anyhow::Error::msg)?;
    countersign_server::gate::load_policy_set(files, &config.guards.groups)
        .map_err(anyhow::Error::msg)
}
