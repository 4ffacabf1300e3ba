//! `[[process]]`, `[params]` and `[[probe]]`: what an operator runs, tunes and checks
//! beside a gated process (docs/bridge.md). Nothing here has a default that names a
//! place: a process without its host, user or directory is refused at start, never
//! guessed, as approval-gate-mcp refuses to start without `VPS_HOST`, `VPS_USER` and
//! `PROCESS_DIR`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use countersign_server::operate::ssh::DEFAULT_HOST_KEY_CHECKING;
use countersign_server::operate::{
    Bounds, Manifest, OperateConfig, ParamsConfig, ProbeConfig, ProcessConfig, SshHost, Target,
};
use serde::Deserialize;

/// `host = "local"`: the process runs on this machine.
pub const LOCAL_HOST: &str = "local";
const DEFAULT_RUN_SECONDS: u64 = 60;
const MAX_RUN_SECONDS: u64 = 3600;
const DEFAULT_PROBE_SECONDS: u64 = 10;
const DEFAULT_MAX_OUTPUT_BYTES: usize = 64 * 1024;
const MAX_OUTPUT_BYTES: usize = 1024 * 1024;
const DEFAULT_CONNECT_SECONDS: u64 = 10;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessSection {
    pub name: String,
    /// `local`, or the host to reach with `ssh`.
    pub host: Option<String>,
    pub user: Option<String>,
    pub port: Option<u16>,
    /// `accept-new` (default), `yes` or `no`.
    pub host_key_checking: Option<String>,
    pub identity_file: Option<PathBuf>,
    pub known_hosts_file: Option<PathBuf>,
    pub connect_timeout_seconds: Option<u64>,
    pub dir: Option<String>,
    pub start: Option<String>,
    #[serde(rename = "match")]
    pub pattern: Option<String>,
    pub log: Option<String>,
    pub run_timeout_seconds: Option<u64>,
    pub max_output_bytes: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamsSection {
    /// The manifest (a local file; relative to the config file).
    pub schema: Option<PathBuf>,
    /// The overrides file the process reads (on its host).
    pub overrides: Option<String>,
    /// The `[[process]]` whose host holds the overrides file (default: this machine).
    pub process: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeSection {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub command: Vec<String>,
    /// Run on this `[[process]]`'s host (default: this machine).
    pub process: Option<String>,
    pub timeout_seconds: Option<u64>,
    pub max_output_bytes: Option<usize>,
}

/// The sections, checked: every process's place, the manifest read and validated.
pub fn resolve(
    processes: Vec<ProcessSection>,
    params: Option<ParamsSection>,
    probes: Vec<ProbeSection>,
    config_file: Option<&Path>,
) -> anyhow::Result<OperateConfig> {
    let base = super::base_dir(config_file);
    let mut out = OperateConfig::default();
    for section in processes {
        let process = process(section, &base)?;
        if out.processes.iter().any(|p| p.name == process.name) {
            bail!("[[process]] {:?} is configured twice", process.name);
        }
        out.processes.push(process);
    }
    let target_of = |what: &str, name: Option<String>| -> anyhow::Result<Target> {
        match name {
            None => Ok(Target::Local),
            Some(name) => out
                .processes
                .iter()
                .find(|p| p.name == name)
                .map(|p| p.target.clone())
                .with_context(|| {
                    format!("{what}: process {name:?} is not a [[process]] of this config")
                }),
        }
    };
    if let Some(section) = params {
        let schema = section
            .schema
            .context("[params] needs schema = \"FILE\": the manifest of what may be tuned")?;
        let schema = base.join(schema);
        let text = std::fs::read_to_string(&schema)
            .with_context(|| format!("[params] schema: cannot read {}", schema.display()))?;
        let manifest = Manifest::parse(&text)
            .map_err(|e| anyhow::anyhow!("[params] schema {}: {e}", schema.display()))?;
        let overrides = section.overrides.context(
            "[params] needs overrides = \"/path/params.json\": the file the process reads each cycle",
        )?;
        let overrides = absolute("[params] overrides", &overrides)?;
        let target = target_of("[params] process", section.process)?;
        out.params = Some(ParamsConfig {
            manifest,
            overrides,
            target,
        });
    }
    for section in probes {
        let what = format!("[[probe]] {:?}", section.name);
        super::plain_name(&what, &section.name)?;
        // Each probe is a tool of the approval-gate profile by its name.
        if countersign_server::mcp::APPROVAL_GATE_TOOLS.contains(&section.name.as_str()) {
            bail!(
                "{what}: that is the name of a tool of the approval-gate profile; name the probe otherwise"
            );
        }
        if out.probes.iter().any(|p| p.name == section.name) {
            bail!("{what} is configured twice");
        }
        if section.command.first().is_none_or(|p| p.is_empty()) {
            bail!(
                "{what}: command: give the program and its arguments, e.g. [\"/usr/local/bin/wallet-balance\"]"
            );
        }
        let target = target_of(&what, section.process)?;
        let bounds = bounds(
            &what,
            "timeout_seconds",
            section.timeout_seconds.unwrap_or(DEFAULT_PROBE_SECONDS),
            section.max_output_bytes,
        )?;
        out.probes.push(ProbeConfig {
            name: section.name,
            description: section.description,
            command: section.command,
            target,
            bounds,
        });
    }
    Ok(out)
}

fn process(section: ProcessSection, base: &Path) -> anyhow::Result<ProcessConfig> {
    let what = format!("[[process]] {:?}", section.name);
    super::plain_name(&what, &section.name)?;
    let host = section.host.with_context(|| {
        format!("{what} has no host: give host = \"{LOCAL_HOST}\" for this machine, or the host to reach over ssh (there is no default)")
    })?;
    let target = if host == LOCAL_HOST {
        if section.user.is_some()
            || section.port.is_some()
            || section.host_key_checking.is_some()
            || section.identity_file.is_some()
            || section.known_hosts_file.is_some()
            || section.connect_timeout_seconds.is_some()
        {
            bail!(
                "{what}: user, port and the ssh keys are for a remote host, not host = \"{LOCAL_HOST}\""
            );
        }
        Target::Local
    } else {
        if host.is_empty()
            || host.starts_with('-')
            || host.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            bail!("{what}: host {host:?} is not a host name or address");
        }
        let user = section.user.with_context(|| {
            format!("{what} has no user: give the ssh user for {host} (there is no default)")
        })?;
        if user.is_empty()
            || user.starts_with('-')
            || user
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || c == '@')
        {
            bail!("{what}: user {user:?} is not a user name");
        }
        let host_key_checking = section
            .host_key_checking
            .unwrap_or_else(|| DEFAULT_HOST_KEY_CHECKING.into());
        if !["accept-new", "yes", "no"].contains(&host_key_checking.as_str()) {
            bail!("{what}: host_key_checking: give accept-new, yes or no");
        }
        let connect = section
            .connect_timeout_seconds
            .unwrap_or(DEFAULT_CONNECT_SECONDS);
        if connect == 0 || connect > 300 {
            bail!("{what}: connect_timeout_seconds: give between 1 and 300");
        }
        Target::Ssh(SshHost {
            host,
            user,
            port: section.port,
            host_key_checking,
            identity_file: section.identity_file.map(|f| base.join(f)),
            known_hosts_file: section.known_hosts_file.map(|f| base.join(f)),
            connect_timeout_seconds: connect,
        })
    };
    let dir = section.dir.with_context(|| {
        format!("{what} has no dir: give the process's working directory (there is no default)")
    })?;
    let dir = absolute(&format!("{what}: dir"), &dir)?;
    let start = section.start.with_context(|| {
        format!("{what} has no start: give the shell command that starts it in its dir")
    })?;
    let pattern = section.pattern.with_context(|| {
        format!("{what} has no match: give what finds it among the host's processes (pgrep -f)")
    })?;
    let log = section.log.with_context(|| {
        format!("{what} has no log: give its log file (absolute, or relative to dir)")
    })?;
    for (key, value) in [("start", &start), ("match", &pattern), ("log", &log)] {
        one_line(&format!("{what}: {key}"), value)?;
    }
    let run = bounds(
        &what,
        "run_timeout_seconds",
        section.run_timeout_seconds.unwrap_or(DEFAULT_RUN_SECONDS),
        section.max_output_bytes,
    )?;
    Ok(ProcessConfig {
        name: section.name,
        target,
        dir,
        start,
        pattern,
        log,
        run,
    })
}

fn bounds(
    what: &str,
    key: &str,
    seconds: u64,
    max_output: Option<usize>,
) -> anyhow::Result<Bounds> {
    if seconds == 0 || seconds > MAX_RUN_SECONDS {
        bail!("{what}: {key}: give between 1 and {MAX_RUN_SECONDS}");
    }
    let max_output_bytes = max_output.unwrap_or(DEFAULT_MAX_OUTPUT_BYTES);
    if max_output_bytes == 0 || max_output_bytes > MAX_OUTPUT_BYTES {
        bail!("{what}: max_output_bytes: give between 1 and {MAX_OUTPUT_BYTES}");
    }
    Ok(Bounds {
        timeout: Duration::from_secs(seconds),
        max_output_bytes,
    })
}

/// A path on the process's host: absolute, since nothing here can say what a relative
/// one would be relative to there.
fn absolute(what: &str, path: &str) -> anyhow::Result<String> {
    one_line(what, path)?;
    if !path.starts_with('/') {
        bail!("{what}: {path:?} must be an absolute path (on the process's host)");
    }
    Ok(path.to_string())
}

/// Values reach the host's scripts one per line.
fn one_line(what: &str, value: &str) -> anyhow::Result<()> {
    if value.trim().is_empty() || value.chars().any(char::is_control) {
        bail!("{what}: give one non-empty line");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn parse(toml_text: &str) -> anyhow::Result<OperateConfig> {
        #[derive(Deserialize)]
        struct Doc {
            #[serde(default)]
            process: Vec<ProcessSection>,
            params: Option<ParamsSection>,
            #[serde(default)]
            probe: Vec<ProbeSection>,
        }
        let doc: Doc = toml::from_str(toml_text)?;
        resolve(doc.process, doc.params, doc.probe, None)
    }

    const WORKER: &str = "name = \"worker\"\ndir = \"/srv/w\"\nstart = \"python3 w.py\"\nmatch = \"w.py\"\nlog = \"w.log\"\n";

    #[test]
    fn a_remote_process_resolves_with_its_ssh_settings() {
        let config = parse(&format!(
            "[[process]]\n{WORKER}host = \"vps\"\nuser = \"ops\"\nport = 2222\n"
        ))
        .unwrap();
        let p = &config.processes[0];
        let Target::Ssh(host) = &p.target else {
            panic!("remote")
        };
        assert_eq!(
            (host.host.as_str(), host.user.as_str(), host.port),
            ("vps", "ops", Some(2222))
        );
        assert_eq!(host.host_key_checking, "accept-new");
        assert_eq!(p.target.describe(), "ops@vps:2222");
    }

    #[test]
    fn nothing_is_guessed() {
        for (toml_text, says) in [
            (format!("[[process]]\n{WORKER}"), "has no host"),
            (format!("[[process]]\n{WORKER}host = \"vps\"\n"), "has no user"),
            (
                "[[process]]\nname = \"w\"\nhost = \"local\"\nstart = \"x\"\nmatch = \"x\"\nlog = \"l\"\n".to_string(),
                "has no dir",
            ),
            (format!("[[process]]\n{WORKER}host = \"local\"\nuser = \"ops\"\n"), "for a remote host"),
            (
                format!("[[process]]\n{}host = \"local\"\n", WORKER.replace("/srv/w", "srv/w")),
                "absolute",
            ),
            (format!("[[process]]\n{WORKER}host = \"vps\"\nuser = \"ops\"\nhost_key_checking = \"maybe\"\n"), "accept-new, yes or no"),
            ("[[probe]]\nname = \"p\"\ncommand = [\"true\"]\nprocess = \"nope\"\n".to_string(), "not a [[process]]"),
            ("[[probe]]\nname = \"approve\"\ncommand = [\"true\"]\n".to_string(), "a tool of the approval-gate profile"),
            ("[params]\noverrides = \"/x.json\"\n".to_string(), "needs schema"),
        ] {
            let err = parse(&toml_text).unwrap_err().to_string();
            assert!(err.contains(says), "{toml_text}: {err}");
        }
    }

    #[test]
    fn a_probe_may_run_on_a_process_host() {
        let config = parse(&format!(
            "[[process]]\n{WORKER}host = \"vps\"\nuser = \"ops\"\n[[probe]]\nname = \"wallet_balance\"\ncommand = [\"cast\", \"balance\"]\nprocess = \"worker\"\ntimeout_seconds = 5\n"
        ))
        .unwrap();
        assert_eq!(config.probes[0].target, config.processes[0].target);
        assert_eq!(config.probes[0].bounds.timeout, Duration::from_secs(5));
    }
}
