//! `countersign hook claude-code | cursor`: a coding agent's pre-tool hook. It reads the
//! hook's JSON on stdin, asks countersign for the call (policies, grants or a person),
//! waits within `--timeout`, and prints the hook's answer: allow, or deny with the reason.
//! A timeout denies and withdraws the request; it never answers "ask", which would hand
//! the decision to whoever sits at the agent's keyboard. An input this command cannot
//! read exits with status 2, which both clients treat as a block. docs/gateway.md.

use std::io::Read;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use countersign_server::gate::GatewayCall;
use countersign_server::held::{self, Verdict};
use serde_json::{Map, Value, json};

use crate::config::Config;
use crate::remote::RemoteArgs;
use crate::runtime;

/// Below Claude Code's and Cursor's own hook timeouts (60 s by their older documented
/// default), so that countersign answers, and withdraws the request, before they give up.
const DEFAULT_TIMEOUT_SECONDS: u64 = 50;
/// The most stdin may hold (a tool's input, e.g. a file's content to write).
const MAX_INPUT_BYTES: u64 = 4 * 1024 * 1024;
/// Claude Code's own tools that only read: they pass when no policy speaks of them.
const CLAUDE_READ_ONLY: [&str; 5] = ["Read", "Glob", "Grep", "LS", "NotebookRead"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Client {
    /// Claude Code's PreToolUse hook.
    ClaudeCode,
    /// Cursor's beforeShellExecution and beforeMCPExecution hooks.
    Cursor,
}

#[derive(Debug, Args)]
pub struct HookArgs {
    /// Which coding agent runs this hook.
    #[arg(value_enum)]
    pub client: Client,
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// Seconds to wait for a decision before denying (and withdrawing the request).
    /// Keep it below the client's own hook timeout.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_TIMEOUT_SECONDS)]
    pub timeout: u64,
    /// The name this agent's requests are recorded under (default: the OS user).
    #[arg(long, value_name = "NAME")]
    pub agent_name: Option<String>,
}

/// One tool call as the hook describes it.
#[derive(Debug)]
struct HookCall {
    tool: String,
    arguments: Map<String, Value>,
    session: String,
    read_only: bool,
    description: String,
}

pub async fn run(config: &Config, args: &HookArgs) -> anyhow::Result<ExitCode> {
    if args.timeout == 0 || args.timeout > 3600 {
        anyhow::bail!("--timeout: give between 1 and 3600 seconds");
    }
    let mut input = String::new();
    std::io::stdin()
        .take(MAX_INPUT_BYTES)
        .read_to_string(&mut input)
        .context("could not read the hook's JSON on stdin")?;
    let value: Value = serde_json::from_str(&input).context("the hook's stdin is not JSON")?;
    let call = match args.client {
        Client::ClaudeCode => claude_code(&value)?,
        Client::Cursor => cursor(&value)?,
    };
    let upstream = match args.client {
        Client::ClaudeCode => "claude-code",
        Client::Cursor => "cursor",
    };
    // The log's integration is left to the next process that runs it (serve, mcp).
    let (gate, _, shutdown) =
        runtime::open_gateway(config, &args.remote, args.agent_name.as_deref(), false).await?;
    let gateway_call = GatewayCall {
        upstream: upstream.into(),
        tool: call.tool.clone(),
        arguments: call.arguments,
        read_only: call.read_only,
        session: call.session,
        hold: Duration::from_secs(args.timeout),
        description: Some(call.description),
        // Set by the held-call flow, for this process.
        claim_for: None,
    };
    let instance = format!("hook-{}", std::process::id());
    let verdict = held::ask(
        gate.as_ref(),
        &gateway_call,
        &instance,
        &mut |_, _| {},
        std::future::pending::<()>(),
    )
    .await;
    shutdown.cancel();
    let (allow, reason) = match verdict {
        Ok(Verdict::Forward { request: None }) => (
            true,
            format!("countersign: {} passes (read-only)", call.tool),
        ),
        Ok(Verdict::Forward { request: Some(id) }) => {
            (true, format!("countersign: approved (request {id})"))
        }
        Ok(Verdict::Refused { reason }) => (false, format!("countersign: {reason}")),
        Err(err) => (
            false,
            format!(
                "countersign: {}: {} (the call was not made)",
                err.code(),
                err.public_message()
            ),
        ),
    };
    let answer = match args.client {
        Client::ClaudeCode => json!({
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": if allow { "allow" } else { "deny" },
                "permissionDecisionReason": reason,
            }
        }),
        Client::Cursor => json!({
            "permission": if allow { "allow" } else { "deny" },
            "user_message": reason,
            "agent_message": reason,
        }),
    };
    println!("{answer}");
    Ok(ExitCode::SUCCESS)
}

fn text<'a>(value: &'a Value, field: &str) -> anyhow::Result<&'a str> {
    value
        .get(field)
        .and_then(Value::as_str)
        .with_context(|| format!("the hook's JSON has no string {field:?}"))
}

/// Claude Code's PreToolUse input: `session_id`, `tool_name`, `tool_input`.
fn claude_code(value: &Value) -> anyhow::Result<HookCall> {
    let event = text(value, "hook_event_name")?;
    if event != "PreToolUse" {
        anyhow::bail!(
            "hook_event_name is {event:?}: countersign answers PreToolUse only (register it under PreToolUse)"
        );
    }
    let tool = text(value, "tool_name")?.to_string();
    let arguments = value
        .get("tool_input")
        .and_then(Value::as_object)
        .cloned()
        .context("the hook's JSON has no object \"tool_input\"")?;
    let summary = ["command", "file_path", "path", "url", "pattern"]
        .iter()
        .find_map(|k| arguments.get(*k).and_then(Value::as_str))
        .map(|s| format!(": {}", shorten(s)))
        .unwrap_or_default();
    Ok(HookCall {
        description: format!("Claude Code: {tool}{summary}"),
        read_only: CLAUDE_READ_ONLY.contains(&tool.as_str()),
        session: text(value, "session_id")?.to_string(),
        tool,
        arguments,
    })
}

/// Cursor's beforeShellExecution (`command`, `cwd`) and beforeMCPExecution (`tool_name`,
/// `tool_input` as a JSON string) inputs; `conversation_id` is the session.
fn cursor(value: &Value) -> anyhow::Result<HookCall> {
    let event = text(value, "hook_event_name")?;
    let session = text(value, "conversation_id")?.to_string();
    match event {
        "beforeShellExecution" => {
            let command = text(value, "command")?;
            let mut arguments = Map::new();
            arguments.insert("command".into(), Value::String(command.into()));
            if let Some(cwd) = value.get("cwd").and_then(Value::as_str) {
                arguments.insert("cwd".into(), Value::String(cwd.into()));
            }
            Ok(HookCall {
                tool: "shell".into(),
                description: format!("Cursor: shell: {}", shorten(command)),
                arguments,
                session,
                read_only: false,
            })
        }
        "beforeMCPExecution" => {
            let tool = text(value, "tool_name")?.to_string();
            let arguments = match value.get("tool_input") {
                Some(Value::String(s)) if s.trim().is_empty() => Map::new(),
                Some(Value::String(s)) => serde_json::from_str::<Map<String, Value>>(s)
                    .context("tool_input is not a JSON object")?,
                Some(Value::Object(map)) => map.clone(),
                None | Some(Value::Null) => Map::new(),
                Some(_) => anyhow::bail!("tool_input is neither a JSON object nor its text"),
            };
            Ok(HookCall {
                description: format!("Cursor: MCP tool {tool}"),
                tool,
                arguments,
                session,
                read_only: false,
            })
        }
        other => anyhow::bail!(
            "hook_event_name is {other:?}: countersign answers beforeShellExecution and beforeMCPExecution"
        ),
    }
}

fn shorten(text: &str) -> String {
    const MOST: usize = 200;
    let mut out: String = text.chars().take(MOST).collect();
    if text.chars().count() > MOST {
        out.push('…');
    }
    out
}
