//! A long-running process an operator looks after (`[[process]]`): is it running (PID,
//! uptime, CPU, memory, the disk its directory takes, the last log line), its log's tail,
//! a restart that survives the session, and a one-off command in its directory. These
//! only run things; whether they may (a person's approval for restart and run_command)
//! is decided in `operate/mod.rs`.
//!
//! The scripts need a POSIX `sh` and procps (`pgrep`, `pkill`, `ps`) on the host. The
//! values they use (match pattern, directory, log, start command) reach them on standard
//! input, never in a command line: `pgrep -f` would otherwise find the script itself.

use std::time::Duration;

use serde::Serialize;

use super::ssh::{Bounds, Ran, Target};
use crate::error::GateError;

/// The most log lines one call returns.
pub const MAX_LOG_LINES: usize = 10_000;
/// How long status, logs and restart may take.
const QUICK: Duration = Duration::from_secs(60);
/// How long a restart may take (the sweeper counts on it).
pub const RESTART_BOUND: Duration = QUICK;
/// What status and logs keep of the output.
const QUICK_OUTPUT: usize = 1024 * 1024;

/// One `[[process]]`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessConfig {
    pub name: String,
    pub target: Target,
    /// Its working directory (on its host).
    pub dir: String,
    /// How it is started, a shell command run in `dir`.
    pub start: String,
    /// What finds it among the host's processes (`pgrep -f`).
    pub pattern: String,
    /// Its log file (on its host; relative to `dir` unless absolute).
    pub log: String,
    /// The bounds of `run_command`.
    pub run: Bounds,
}

/// What `process_status` answers.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct ProcessStatus {
    pub process: String,
    pub host: String,
    pub running: bool,
    pub pid: Option<u32>,
    pub uptime_seconds: Option<u64>,
    pub cpu_percent: Option<f64>,
    pub memory_kb: Option<u64>,
    /// `du -sh` of its directory.
    pub disk: Option<String>,
    pub last_log_line: Option<String>,
}

impl ProcessStatus {
    /// The seed's report: "Process RUNNING", PID, uptime, CPU, memory, disk, last log.
    pub fn render(&self) -> String {
        let mut out = format!(
            "Process {} ({}) {}\n",
            self.process,
            self.host,
            if self.running {
                "RUNNING"
            } else {
                "NOT RUNNING"
            }
        );
        let na = || "-".to_string();
        if let Some(pid) = self.pid {
            out.push_str(&format!("\n  PID:      {pid}\n"));
            let uptime = self
                .uptime_seconds
                .map_or_else(na, |s| format!("{}h {}m ({s}s)", s / 3600, (s % 3600) / 60));
            out.push_str(&format!("  Uptime:   {uptime}\n"));
            let cpu = self.cpu_percent.map_or_else(na, |c| format!("{c:.1}%"));
            out.push_str(&format!("  CPU:      {cpu}\n"));
            let mem = self
                .memory_kb
                .map_or_else(na, |k| format!("{:.1} MB", k as f64 / 1024.0));
            out.push_str(&format!("  Memory:   {mem}\n"));
        }
        out.push_str(&format!(
            "  Disk:     {}\n",
            self.disk.clone().unwrap_or_else(na)
        ));
        out.push_str(&format!(
            "\n  Last log: {}\n",
            self.last_log_line
                .clone()
                .unwrap_or_else(|| "(empty)".into())
        ));
        out
    }
}

impl ProcessConfig {
    /// The values every script reads, one per line: pattern, directory, log, start.
    fn input(&self) -> Vec<u8> {
        format!(
            "{}\n{}\n{}\n{}\n",
            self.pattern, self.dir, self.log, self.start
        )
        .into_bytes()
    }

    async fn script(&self, body: &str, extra: &str, bounds: Bounds) -> Result<Ran, GateError> {
        let script = format!("{PRELUDE}{body}");
        let mut input = self.input();
        input.extend_from_slice(extra.as_bytes());
        self.target.script(&script, &input, bounds).await
    }

    fn quick() -> Bounds {
        Bounds {
            timeout: QUICK,
            max_output_bytes: QUICK_OUTPUT,
        }
    }

    /// Running or not, and how it fares.
    pub async fn status(&self) -> Result<ProcessStatus, GateError> {
        let ran = self.script(STATUS, "", Self::quick()).await?;
        let ran = self.checked(ran, "status")?;
        let mut status = ProcessStatus {
            process: self.name.clone(),
            host: self.target.describe(),
            running: false,
            pid: None,
            uptime_seconds: None,
            cpu_percent: None,
            memory_kb: None,
            disk: None,
            last_log_line: None,
        };
        for line in ran.stdout.lines() {
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            let value = value.trim();
            let some = || Some(value.to_string()).filter(|v| !v.is_empty());
            match key {
                "pid" => status.pid = value.parse().ok(),
                "uptime" => status.uptime_seconds = value.parse().ok(),
                "cpu" => status.cpu_percent = value.parse().ok(),
                "rss" => status.memory_kb = value.parse().ok(),
                "disk" => status.disk = some(),
                "last" => status.last_log_line = some(),
                _ => {}
            }
        }
        status.running = status.pid.is_some();
        Ok(status)
    }

    /// The last `lines` lines of its log.
    pub async fn logs(&self, lines: usize) -> Result<String, GateError> {
        if lines == 0 || lines > MAX_LOG_LINES {
            return Err(GateError::BadInput(format!(
                "lines: give between 1 and {MAX_LOG_LINES}"
            )));
        }
        let ran = self
            .script(LOGS, &format!("{lines}\n"), Self::quick())
            .await?;
        Ok(self.checked(ran, "logs")?.stdout)
    }

    /// Stops every process that matches (TERM, then KILL after 10 s) and starts it
    /// again in its directory, detached (`setsid nohup`) so that it outlives this
    /// session, its output appended to its log. Succeeds when a process matches after.
    pub async fn restart(&self) -> Result<Ran, GateError> {
        self.script(RESTART, "", Self::quick()).await
    }

    /// `command` run by `sh` in its directory, within the `run` bounds.
    pub async fn run_command(&self, command: &str) -> Result<Ran, GateError> {
        if command.trim().is_empty() {
            return Err(GateError::BadInput("cmd: give a command to run".into()));
        }
        let script = format!(
            "cd -- {} || exit 126\n{command}",
            super::ssh::quote(&self.dir)
        );
        self.target.script(&script, b"", self.run).await
    }

    /// A script of ours that failed is an error, with what it said.
    fn checked(&self, ran: Ran, what: &str) -> Result<Ran, GateError> {
        if ran.succeeded() {
            return Ok(ran);
        }
        let said = ran.stderr.trim();
        Err(GateError::Unavailable(format!(
            "{what} of process {} on {} failed ({}){}",
            self.name,
            self.target.describe(),
            ran.ending(&Self::quick()),
            if said.is_empty() {
                String::new()
            } else {
                format!(": {said}")
            }
        )))
    }
}

/// Reads the values, and resolves the log against the directory.
const PRELUDE: &str = r#"IFS= read -r pat; IFS= read -r dir; IFS= read -r log; IFS= read -r start
case "$log" in /*) ;; *) log="$dir/$log" ;; esac
"#;

const STATUS: &str = r#"pid=$(pgrep -o -f -- "$pat")
if [ -n "$pid" ]; then
  echo "pid=$pid"
  echo "uptime=$(ps -o etimes= -p "$pid" | tr -d ' ')"
  echo "cpu=$(ps -o %cpu= -p "$pid" | tr -d ' ')"
  echo "rss=$(ps -o rss= -p "$pid" | tr -d ' ')"
fi
echo "disk=$(du -sh -- "$dir" 2>/dev/null | cut -f1)"
echo "last=$(tail -n 1 -- "$log" 2>/dev/null | tr -d '\r')"
"#;

const LOGS: &str = r#"IFS= read -r n
if [ ! -e "$log" ]; then echo "no log file at $log" >&2; exit 2; fi
tail -n "$n" -- "$log"
"#;

const RESTART: &str = r#"cd -- "$dir" || { echo "no directory $dir" >&2; exit 2; }
old=$(pgrep -f -- "$pat" | tr '\n' ' ')
if [ -n "$old" ]; then
  pkill -TERM -f -- "$pat"
  i=0
  while pgrep -f -- "$pat" >/dev/null && [ "$i" -lt 50 ]; do sleep 0.2; i=$((i+1)); done
  pkill -KILL -f -- "$pat" || true
fi
setsid nohup sh -c "$start" >>"$log" 2>&1 </dev/null &
i=0
new=""
while [ -z "$new" ] && [ "$i" -lt 25 ]; do sleep 0.2; new=$(pgrep -o -f -- "$pat"); i=$((i+1)); done
echo "stopped: ${old:-none}"
echo "started: ${new:-none}"
[ -n "$new" ] || { echo "nothing matches the pattern after the start; see the log $log" >&2; exit 1; }
"#;
