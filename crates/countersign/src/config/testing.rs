//! What the config's unit tests share: variables as `Config::resolve` takes them, and a
//! config file named by `--config`.

use std::path::PathBuf;

use super::{Config, Overrides};

pub fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A config file in a temporary directory (removed on drop), and the flags naming it.
pub struct ConfigFile {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
    pub flags: Overrides,
}

impl ConfigFile {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        let flags = Overrides {
            config: Some(path.clone()),
            ..Overrides::default()
        };
        Self { dir, path, flags }
    }

    /// Writes `toml` to the file and resolves it without environment variables.
    pub fn resolve(&self, toml: &str) -> anyhow::Result<Config> {
        std::fs::write(&self.path, toml).unwrap();
        Config::resolve(&self.flags, &[])
    }
}
