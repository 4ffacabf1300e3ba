//! Where an operation runs: this machine, or a host reached with the system's OpenSSH
//! client. We call the `ssh` binary rather than speak SSH ourselves, as approval-gate-mcp
//! does, so that the operator's agent, hardware keys, `~/.ssh/config` and `known_hosts`
//! work unchanged and no private key is ever read by countersign.
//!
//! Every run is bounded: a timeout (the local process group, or the local `ssh` client,
//! is killed when it passes) and a cap on the output kept (the rest is read and dropped,
//! so a chatty command never blocks on a full pipe).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::error::GateError;

/// `StrictHostKeyChecking` unless configured: an unknown host is trusted on first
/// connection and remembered; a changed key still fails (as approval-gate-mcp).
pub const DEFAULT_HOST_KEY_CHECKING: &str = "accept-new";
/// What `ssh` exits with when it failed itself (could not connect, authenticate...).
const SSH_FAILED: i32 = 255;

/// A host reached over SSH. Host and user have no default: a missing one is a
/// configuration error, never a guess.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshHost {
    pub host: String,
    pub user: String,
    pub port: Option<u16>,
    /// `StrictHostKeyChecking`: `accept-new` (default), `yes` or `no`.
    pub host_key_checking: String,
    /// `-i`: a key file; the agent and `~/.ssh/config` apply otherwise.
    pub identity_file: Option<PathBuf>,
    /// `UserKnownHostsFile`; the user's default otherwise.
    pub known_hosts_file: Option<PathBuf>,
    /// `ConnectTimeout`, in seconds.
    pub connect_timeout_seconds: u64,
}

/// Where commands run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Local,
    Ssh(SshHost),
}

/// How long a run may take and how much of its output is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub timeout: Duration,
    pub max_output_bytes: usize,
}

/// What a finished (or stopped) run gave.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Ran {
    /// The exit code; `None` when it was killed (by a signal, or at its timeout).
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// Output beyond `max_output_bytes` was dropped.
    pub truncated: bool,
    /// The timeout passed and the run was killed.
    pub timed_out: bool,
}

impl Ran {
    pub fn succeeded(&self) -> bool {
        self.exit_code == Some(0) && !self.timed_out
    }

    /// Standard output, then standard error when there is any.
    pub fn combined(&self) -> String {
        if self.stderr.is_empty() {
            self.stdout.clone()
        } else if self.stdout.is_empty() {
            self.stderr.clone()
        } else {
            format!("{}\n{}", self.stdout.trim_end_matches('\n'), self.stderr)
        }
    }

    /// "exit 0", "exit 3", "timed out after 5 s", "killed by a signal".
    pub fn ending(&self, bounds: &Bounds) -> String {
        match (self.timed_out, self.exit_code) {
            (true, _) => format!("timed out after {} s", bounds.timeout.as_secs()),
            (false, Some(code)) => format!("exit {code}"),
            (false, None) => "killed by a signal".into(),
        }
    }
}

impl Target {
    /// `local`, or `user@host[:port]`, for messages and request details.
    pub fn describe(&self) -> String {
        match self {
            Target::Local => "local".into(),
            Target::Ssh(h) => match h.port {
                Some(port) => format!("{}@{}:{port}", h.user, h.host),
                None => format!("{}@{}", h.user, h.host),
            },
        }
    }

    /// Runs a POSIX `sh` script there, with `stdin` as its input (how values reach the
    /// script without appearing in any command line, where `pgrep -f` would find them).
    pub async fn script(
        &self,
        script: &str,
        stdin: &[u8],
        bounds: Bounds,
    ) -> Result<Ran, GateError> {
        match self {
            Target::Local => {
                let mut cmd = tokio::process::Command::new("sh");
                cmd.arg("-c").arg(script);
                run(cmd, stdin, bounds, None).await
            }
            Target::Ssh(host) => {
                let remote = format!("sh -c {}", quote(script));
                run(ssh_command(host, &remote), stdin, bounds, Some(host)).await
            }
        }
    }

    /// Runs a program with its arguments there (no shell here; over SSH, each argument
    /// is quoted for the remote shell).
    pub async fn argv(&self, argv: &[String], bounds: Bounds) -> Result<Ran, GateError> {
        let Some((program, args)) = argv.split_first() else {
            return Err(GateError::BadInput("no command to run".into()));
        };
        match self {
            Target::Local => {
                let mut cmd = tokio::process::Command::new(program);
                cmd.args(args);
                run(cmd, b"", bounds, None).await
            }
            Target::Ssh(host) => {
                let remote = argv.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" ");
                run(ssh_command(host, &remote), b"", bounds, Some(host)).await
            }
        }
    }
}

/// The `ssh` command line for `remote` on `host`: never interactive (`BatchMode`), the
/// host key checked as configured.
fn ssh_command(host: &SshHost, remote: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new("ssh");
    cmd.arg("-o")
        .arg("BatchMode=yes")
        .arg("-o")
        .arg(format!("StrictHostKeyChecking={}", host.host_key_checking))
        .arg("-o")
        .arg(format!("ConnectTimeout={}", host.connect_timeout_seconds))
        // Errors only: a notice ("Permanently added ... to the list of known hosts")
        // would otherwise land in a command's recorded output.
        .arg("-o")
        .arg("LogLevel=ERROR")
        .arg("-l")
        .arg(&host.user);
    if let Some(port) = host.port {
        cmd.arg("-p").arg(port.to_string());
    }
    if let Some(key) = &host.identity_file {
        cmd.arg("-i").arg(key).arg("-o").arg("IdentitiesOnly=yes");
    }
    if let Some(file) = &host.known_hosts_file {
        cmd.arg("-o")
            .arg(format!("UserKnownHostsFile={}", file.display()));
    }
    cmd.arg("--").arg(&host.host).arg(remote);
    cmd
}

/// Runs `cmd` in its own process group, feeding `stdin`, within `bounds`.
async fn run(
    mut cmd: tokio::process::Command,
    stdin: &[u8],
    bounds: Bounds,
    ssh: Option<&SshHost>,
) -> Result<Ran, GateError> {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| {
        GateError::Unavailable(match ssh {
            Some(_) => format!("could not start ssh (is the OpenSSH client installed?): {e}"),
            None => format!("could not start the command: {e}"),
        })
    })?;
    let pid = child.id();
    let (Some(mut input), Some(out), Some(err)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(GateError::Internal(
            "the child's pipes were not opened".into(),
        ));
    };
    let stdin = stdin.to_vec();
    let feed = async move {
        // A script that does not read its input closes the pipe early: not an error.
        let _ = input.write_all(&stdin).await;
        drop(input);
    };
    let work = async {
        let ((), out, err, status) = tokio::join!(
            feed,
            capped(out, bounds.max_output_bytes),
            capped(err, bounds.max_output_bytes),
            child.wait()
        );
        (out, err, status)
    };
    let Ok(((stdout, out_cut), (stderr, err_cut), status)) =
        tokio::time::timeout(bounds.timeout, work).await
    else {
        kill_group(pid);
        return Ok(Ran {
            exit_code: None,
            timed_out: true,
            ..Ran::default()
        });
    };
    let status =
        status.map_err(|e| GateError::Internal(format!("could not wait for the command: {e}")))?;
    let ran = Ran {
        exit_code: status.code(),
        stdout,
        stderr,
        truncated: out_cut || err_cut,
        timed_out: false,
    };
    if let Some(host) = ssh
        && ran.exit_code == Some(SSH_FAILED)
    {
        let reason = ran
            .stderr
            .lines()
            .last()
            .unwrap_or("no message")
            .to_string();
        return Err(GateError::Unavailable(format!(
            "ssh to {}@{} failed: {reason}",
            host.user, host.host
        )));
    }
    Ok(ran)
}

/// Reads `from` to its end, keeping the first `cap` bytes (cut at a character
/// boundary); whether anything was dropped.
async fn capped(mut from: impl AsyncRead + Unpin, cap: usize) -> (String, bool) {
    let mut kept = Vec::new();
    let mut cut = false;
    let mut buf = [0u8; 8192];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = cap.saturating_sub(kept.len());
                if n > room {
                    cut = true;
                }
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    let mut text = String::from_utf8_lossy(&kept).into_owned();
    if cut {
        // A multibyte character split at the cap shows as a replacement character.
        while text.len() > cap {
            text.pop();
        }
    }
    (text, cut)
}

/// Kills the process group a timed-out run leads, so that what it started (a `sleep`,
/// a pipeline) does not outlive it holding the pipes. Safe Rust has no `killpg`: the
/// system's `kill` does it.
fn kill_group(pid: Option<u32>) {
    if let Some(pid) = pid {
        let _ = std::process::Command::new("kill")
            .arg("-KILL")
            .arg("--")
            .arg(format!("-{pid}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// `text` as one word for a POSIX shell.
pub fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn bounds(ms: u64, cap: usize) -> Bounds {
        Bounds {
            timeout: Duration::from_millis(ms),
            max_output_bytes: cap,
        }
    }

    #[tokio::test]
    async fn a_script_reads_its_values_from_stdin() {
        let ran = Target::Local
            .script(
                "IFS= read -r a; echo \"got $a\"; exit 4",
                b"it's me\n",
                bounds(5000, 1000),
            )
            .await
            .unwrap();
        assert_eq!(ran.stdout, "got it's me\n");
        assert_eq!(ran.exit_code, Some(4));
        assert!(!ran.succeeded());
    }

    #[tokio::test]
    async fn output_is_capped_and_runs_are_timed_out() {
        let ran = Target::Local
            .argv(
                &["sh".into(), "-c".into(), "yes x | head -c 100000".into()],
                bounds(5000, 10),
            )
            .await
            .unwrap();
        assert_eq!(ran.stdout, "x\nx\nx\nx\nx\n");
        assert!(ran.truncated);
        let started = std::time::Instant::now();
        let ran = Target::Local
            .argv(
                &["sh".into(), "-c".into(), "sleep 30; echo late".into()],
                bounds(300, 100),
            )
            .await
            .unwrap();
        assert!(ran.timed_out && ran.exit_code.is_none(), "{ran:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn quoting_survives_quotes() {
        assert_eq!(quote("it's"), r#"'it'\''s'"#);
    }
}
