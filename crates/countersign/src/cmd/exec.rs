//! `countersign exec [--description TEXT] -- CMD ARGS...`: asks for approval of exactly
//! that command line (the program's resolved path, the argv, the working directory and
//! the names of the environment variables), runs it only once approved (and claimed, so
//! that it runs once), with its output streamed as it comes, and records its exit code as
//! the outcome. docs/gateway.md.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use countersign_core::evidence::OutcomeStatus;
use countersign_server::gate::GatewayCall;
use countersign_server::held::{self, MAX_HOLD_SECONDS, Verdict};
use serde_json::{Map, Value, json};

use crate::config::Config;
use crate::remote::RemoteArgs;
use crate::runtime;

/// The upstream every guarded command is recorded under (`Server::"exec"` in policies).
pub const UPSTREAM: &str = "exec";
/// How long a command waits for its approval, by default.
const DEFAULT_HOLD_SECONDS: u64 = 600;
/// The exit status when the command was not approved (or could not be asked for): the
/// shell's "found but not executed".
const NOT_RUN: u8 = 126;

#[derive(Debug, Args)]
pub struct ExecArgs {
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// What the approver reads (default: the command line).
    #[arg(long, value_name = "TEXT")]
    pub description: Option<String>,
    /// Seconds to wait for a decision before giving up (the request is withdrawn).
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_HOLD_SECONDS)]
    pub hold: u64,
    /// The name this agent's requests are recorded under (default: the OS user).
    #[arg(long, value_name = "NAME")]
    pub agent_name: Option<String>,
    /// The command to run once approved, and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

pub async fn run(config: &Config, args: &ExecArgs) -> anyhow::Result<ExitCode> {
    if args.hold == 0 || args.hold > MAX_HOLD_SECONDS {
        anyhow::bail!("--hold: give between 1 and {MAX_HOLD_SECONDS} seconds");
    }
    let (program, rest) = args
        .command
        .split_first()
        .context("give the command after --")?;
    let resolved = resolve(program)?;
    let cwd = std::env::current_dir().context("the working directory is not readable")?;
    let call = GatewayCall {
        upstream: UPSTREAM.into(),
        tool: Path::new(program)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or(program)
            .to_string(),
        arguments: arguments(&resolved, &args.command, &cwd),
        read_only: false,
        // A retry from the same shell joins the request still waiting (or approved and
        // unused) for the same command line.
        session: format!("exec:{}", std::os::unix::process::parent_id()),
        hold: Duration::from_secs(args.hold),
        description: Some(args.description.clone().unwrap_or_else(|| {
            format!("run `{}` in {}", shell_words(&args.command), cwd.display())
        })),
        // Set by the held-call flow, for this process.
        claim_for: None,
    };
    let (gate, _, shutdown) =
        runtime::open_gateway(config, &args.remote, args.agent_name.as_deref(), false).await?;
    let instance = format!("exec-{}", std::process::id());
    let mut said = false;
    let verdict = held::ask(
        gate.as_ref(),
        &call,
        &instance,
        &mut |_, message| {
            if !said {
                eprintln!("countersign: {message}");
                said = true;
            }
        },
        async {
            let _ = tokio::signal::ctrl_c().await;
        },
    )
    .await;
    let request = match verdict {
        Ok(Verdict::Forward { request }) => request,
        Ok(Verdict::Refused { reason }) => {
            shutdown.cancel();
            eprintln!("countersign: {reason}");
            return Ok(ExitCode::from(NOT_RUN));
        }
        Err(err) => {
            shutdown.cancel();
            eprintln!(
                "countersign: {}: {} (the command was not run)",
                err.code(),
                err.public_message()
            );
            return Ok(ExitCode::from(NOT_RUN));
        }
    };
    let started = std::time::Instant::now();
    let status = tokio::process::Command::new(&resolved)
        .arg0(program)
        .args(rest)
        .status()
        .await;
    let (outcome, summary, code) = match &status {
        Ok(status) => match (
            status.code(),
            std::os::unix::process::ExitStatusExt::signal(status),
        ) {
            (Some(0), _) => (OutcomeStatus::Succeeded, "exit 0".to_string(), 0u8),
            (Some(code), _) => (
                OutcomeStatus::Failed,
                format!("exit {code}"),
                u8::try_from(code).unwrap_or(1),
            ),
            (None, Some(signal)) => (
                OutcomeStatus::Failed,
                format!("killed by signal {signal}"),
                128u8.saturating_add(u8::try_from(signal).unwrap_or(0)),
            ),
            (None, None) => (OutcomeStatus::Unknown, "no exit status".to_string(), 1),
        },
        Err(err) => (
            OutcomeStatus::Failed,
            format!("could not start: {err}"),
            NOT_RUN,
        ),
    };
    if let Some(id) = &request {
        let summary = format!("{summary} after {:.1} s", started.elapsed().as_secs_f64());
        if let Err(err) = gate.outcome(id, outcome, summary).await {
            eprintln!(
                "countersign: the outcome of request {id} was not recorded: {}",
                err.public_message()
            );
        }
    }
    shutdown.cancel();
    if let Err(err) = status {
        eprintln!("countersign: could not start {}: {err}", resolved.display());
    }
    Ok(ExitCode::from(code))
}

/// What the request binds: the program as it will be run, the argv, the directory and
/// the names (never the values) of the environment.
fn arguments(resolved: &Path, argv: &[String], cwd: &Path) -> Map<String, Value> {
    let mut env: Vec<String> = std::env::vars_os()
        .map(|(k, _)| k.to_string_lossy().into_owned())
        .collect();
    env.sort();
    let Value::Object(map) = json!({
        "program": resolved.display().to_string(),
        "argv": argv,
        "cwd": cwd.display().to_string(),
        "env": env,
    }) else {
        unreachable!("an object literal")
    };
    map
}

/// The program's path as it will be run: as given when it names a path, else found on
/// PATH the way the process would find it.
fn resolve(program: &str) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |path: &Path| {
        path.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let path =
            std::fs::canonicalize(program).with_context(|| format!("{program}: no such file"))?;
        if !executable(&path) {
            anyhow::bail!("{program} is not an executable file");
        }
        return Ok(path);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| executable(candidate))
        .with_context(|| format!("{program}: not found on PATH"))
}

/// The command line as one readable string for the default description.
fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_reads_as_a_shell_would_take_it() {
        let argv: Vec<String> = ["rm", "-rf", "my dir", "it's"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(shell_words(&argv), r#"rm -rf 'my dir' 'it'\''s'"#);
    }

    #[test]
    fn programs_resolve_on_path_or_as_given() {
        let sh = resolve("sh").unwrap();
        assert!(sh.is_absolute() && sh.ends_with("sh"), "{}", sh.display());
        assert!(resolve("no-such-program-here").is_err());
        assert!(resolve("/etc/passwd").is_err(), "not executable");
    }
}
