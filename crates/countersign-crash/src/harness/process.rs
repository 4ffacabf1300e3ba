//! The server under test as a child process: started (with a fail point armed or not)
//! on the run's data directory, watched for its listening address or its death, and
//! killed with SIGKILL. Also the one-off `init` that makes the run's tokens.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;

use super::{FAILPOINT_VAR, SECRET, lock};

/// What every start of the server shares: the `countersign-crash` binary, the run's one
/// data directory, the webhook receiver and the outbox lease.
pub(crate) struct Launcher<'a> {
    pub(crate) bin: &'a Path,
    pub(crate) data_dir: &'a Path,
    pub(crate) webhook_url: &'a str,
    pub(crate) lease_seconds: u64,
}

/// The tokens and the outbox cursor `init` made.
pub(crate) struct Init {
    pub(crate) agents: Vec<String>,
    pub(crate) approvers: Vec<String>,
    /// The executor's token: it redeems approved proofs.
    pub(crate) executor: String,
    /// The first event the outbox notifies (events before it predate the webhook).
    pub(crate) outbox_from: u64,
}

/// A running server, killed (SIGKILL) on drop.
pub(crate) struct ServerProc {
    child: Child,
    pub(crate) base: String,
    lines: Arc<Mutex<Vec<String>>>,
}

pub(crate) enum Started {
    Up(ServerProc),
    /// It died before listening (a fail point during start-up).
    Died(Vec<String>),
}

impl Launcher<'_> {
    /// Creates the tokens and the outbox cursor in the fresh data directory.
    pub(crate) async fn init(&self, agents: usize, approvers: usize) -> anyhow::Result<Init> {
        let out = tokio::process::Command::new(self.bin)
            .arg("init")
            .arg("--data-dir")
            .arg(self.data_dir)
            .arg("--agents")
            .arg(agents.to_string())
            .arg("--approvers")
            .arg(approvers.to_string())
            .arg("--webhook-url")
            .arg(self.webhook_url)
            .arg("--webhook-secret")
            .arg(SECRET)
            .env_remove(FAILPOINT_VAR)
            .output()
            .await?;
        if !out.status.success() {
            bail!("init failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let init: Value = serde_json::from_slice(&out.stdout)?;
        let token = |name: String| {
            init["tokens"][&name]
                .as_str()
                .unwrap_or_default()
                .to_string()
        };
        Ok(Init {
            agents: (0..agents).map(|n| token(format!("agent-{n}"))).collect(),
            approvers: (0..approvers)
                .map(|n| token(format!("approver-{n}")))
                .collect(),
            executor: token(crate::server::EXECUTOR.to_string()),
            outbox_from: init["outbox_from_seq"].as_u64().unwrap_or(0),
        })
    }

    /// Starts `serve`, with `failpoint` (`NAME:PROBABILITY`) armed if given, and waits
    /// until it listens or dies.
    pub(crate) async fn start(&self, failpoint: Option<&str>) -> anyhow::Result<Started> {
        let mut cmd = Command::new(self.bin);
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("COUNTERSIGN_") {
                cmd.env_remove(key);
            }
        }
        if let Some(spec) = failpoint {
            cmd.env(FAILPOINT_VAR, spec);
        }
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(self.data_dir)
            .arg("--webhook-url")
            .arg(self.webhook_url)
            .arg("--webhook-secret")
            .arg(SECRET)
            .arg("--lease-seconds")
            .arg(self.lease_seconds.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .with_context(|| format!("could not start {}", self.bin.display()))?;
        let stderr = child.stderr.take().context("no stderr")?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = lines.clone();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let addr = line
                    .split_once("listening on http://")
                    .and_then(|(_, rest)| rest.split_whitespace().next())
                    .map(str::to_string);
                let mut kept = lock(&sink);
                if kept.len() < 200 {
                    kept.push(line);
                }
                drop(kept);
                if let Some(addr) = addr
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(addr);
                }
            }
        });
        let started = Instant::now();
        loop {
            if let Ok(addr) = rx.try_recv() {
                return Ok(Started::Up(ServerProc {
                    child,
                    base: format!("http://{addr}"),
                    lines,
                }));
            }
            if child.try_wait()?.is_some() {
                // Let the reader take the last lines.
                tokio::time::sleep(Duration::from_millis(20)).await;
                return Ok(Started::Died(lock(&lines).clone()));
            }
            if started.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "the server did not start within 60 s:\n{}",
                    lock(&lines).join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

impl ServerProc {
    pub(crate) fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// SIGKILL, and reap.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub(crate) fn stderr(&self) -> Vec<String> {
        lock(&self.lines).clone()
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The fail point a dead server reported, if any.
pub(crate) fn failpoint_hit(lines: &[String]) -> Option<String> {
    lines.iter().find_map(|l| {
        l.split_once("fail point ")
            .and_then(|(_, rest)| rest.strip_suffix(" hit"))
            .map(str::to_string)
    })
}
