//! The `countersign serve` processes a benchmark measures: started on loopback (port 0)
//! on SQLite or on a shared PostgreSQL, with the tokens the clients use, and killed when
//! the benchmark drops them.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Reads a starting `serve`'s standard error (piped) until it says where it listens, and
/// returns that base URL; the rest of its output is drained in the background.
pub(crate) async fn listening_address(child: &mut Child) -> anyhow::Result<String> {
    let stderr = child.stderr.take().context("no stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    let base = loop {
        let line = lines
            .next_line()
            .await?
            .context("serve exited before listening")?;
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest
                .split_whitespace()
                .next()
                .context("no address")?
                .to_string();
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(base)
}

/// Where the instances keep their data.
pub(crate) enum Backend<'a> {
    Sqlite,
    Postgres(&'a str),
}

/// A running `countersign serve`, killed on drop.
pub(crate) struct Instance {
    pub(crate) child: Child,
    pub(crate) base: String,
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Instances on one backend, with an agent and an approver token.
pub(crate) struct Setup {
    // Declared before `dir`: the processes stop before their directory goes.
    pub(crate) instances: Vec<Instance>,
    dir: tempfile::TempDir,
    backend_env: Vec<(&'static str, String)>,
    /// A `countersign.toml` every instance starts with (none when empty).
    config: String,
    /// Files written beside it (name, text), such as the policy files it names.
    files: Vec<(String, String)>,
    pub(crate) agent: String,
    pub(crate) approver: String,
}

impl Setup {
    /// Data directory of instance `i`.
    pub(crate) fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("instance-{i}"))
    }

    pub(crate) async fn start(
        bin: &Path,
        backend: Backend<'_>,
        count: usize,
    ) -> anyhow::Result<Setup> {
        Self::start_configured(bin, backend, count, "").await
    }

    /// Like [`Setup::start`], each instance with `config` as its `countersign.toml`.
    pub(crate) async fn start_configured(
        bin: &Path,
        backend: Backend<'_>,
        count: usize,
        config: &str,
    ) -> anyhow::Result<Setup> {
        Self::start_with_files(bin, backend, count, config, &[]).await
    }

    /// Like [`Setup::start_configured`], with `files` (name, text) beside the config.
    pub(crate) async fn start_with_files(
        bin: &Path,
        backend: Backend<'_>,
        count: usize,
        config: &str,
        files: &[(&str, &str)],
    ) -> anyhow::Result<Setup> {
        let dir = tempfile::tempdir()?;
        let backend_env = match backend {
            Backend::Sqlite => Vec::new(),
            Backend::Postgres(url) => vec![
                ("COUNTERSIGN_DATABASE_URL", url.to_string()),
                (
                    "COUNTERSIGN_KEYS_DIR",
                    dir.path().join("keys").display().to_string(),
                ),
            ],
        };
        let mut setup = Setup {
            instances: Vec::new(),
            dir,
            backend_env,
            config: config.to_string(),
            files: files
                .iter()
                .map(|(name, text)| (name.to_string(), text.to_string()))
                .collect(),
            agent: String::new(),
            approver: String::new(),
        };
        // The first command creates the (shared) signing key, before any instance runs.
        setup.agent = setup.token(bin, "agent", "bench-agent").await?;
        setup.approver = setup.token(bin, "approver", "bench-approver").await?;
        for i in 0..count {
            let instance = setup.serve(bin, i).await?;
            setup.instances.push(instance);
        }
        Ok(setup)
    }

    fn command(&self, bin: &Path, instance: usize) -> Command {
        let mut cmd = Command::new(bin);
        cmd.arg("--data-dir")
            .arg(self.data_dir(instance))
            .env("COUNTERSIGN_LOG", "warn")
            .stdin(Stdio::null());
        for (key, value) in &self.backend_env {
            cmd.env(key, value);
        }
        cmd
    }

    /// Runs `countersign <args>` on instance 0's data; its standard output.
    pub(crate) async fn cli(&self, bin: &Path, args: &[&str]) -> anyhow::Result<String> {
        let out = self.command(bin, 0).args(args).output().await?;
        if !out.status.success() {
            bail!(
                "countersign {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8(out.stdout)?)
    }

    async fn token(&self, bin: &Path, role: &str, name: &str) -> anyhow::Result<String> {
        let out = self
            .command(bin, 0)
            .args(["token", "create", "--role", role, "--name", name])
            .output()
            .await?;
        if !out.status.success() {
            bail!(
                "token create failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8(out.stdout)?.trim().to_string())
    }

    async fn serve(&self, bin: &Path, i: usize) -> anyhow::Result<Instance> {
        if !self.config.is_empty() {
            use std::os::unix::fs::PermissionsExt;
            let dir = self.data_dir(i);
            std::fs::create_dir_all(&dir)?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
            std::fs::write(dir.join("countersign.toml"), &self.config)?;
            for (name, text) in &self.files {
                std::fs::write(dir.join(name), text)?;
            }
        }
        let mut child = self
            .command(bin, i)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let base = listening_address(&mut child).await?;
        Ok(Instance { child, base })
    }

    pub(crate) fn base(&self, i: usize) -> &str {
        &self.instances[i % self.instances.len()].base
    }
}
