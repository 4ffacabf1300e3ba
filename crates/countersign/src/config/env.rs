//! The `COUNTERSIGN_*` environment variables: which exist, and how their values read.
//! The list is stated once here and checked before anything else, so a misspelt variable
//! stops countersign instead of being ignored.

use std::path::PathBuf;
use std::str::FromStr;

use anyhow::{Context, bail};

/// Every variable countersign reads (`COUNTERSIGN_LOG` is read by the logger).
const KEYS: &[&str] = &[
    "COUNTERSIGN_CONFIG",
    "COUNTERSIGN_DATA_DIR",
    "COUNTERSIGN_LISTEN",
    "COUNTERSIGN_ALLOWED_HOSTS",
    "COUNTERSIGN_OPERATOR_TOOLS",
    "COUNTERSIGN_MAX_BODY_BYTES",
    "COUNTERSIGN_FEED_POLL_MS",
    "COUNTERSIGN_PUBLIC_URL",
    "COUNTERSIGN_DATABASE_URL",
    "COUNTERSIGN_DATABASE_URL_FILE",
    "COUNTERSIGN_KEYS_DIR",
    "COUNTERSIGN_TRUSTED_PROXIES",
    "COUNTERSIGN_METRICS_LISTEN",
    "COUNTERSIGN_AUDIT_INTERVAL",
    "COUNTERSIGN_LOG",
    "COUNTERSIGN_SLACK_BOT_TOKEN",
    "COUNTERSIGN_SLACK_SIGNING_SECRET",
    "COUNTERSIGN_SMTP_PASSWORD",
    // The remote client's (`mcp`, `proxy`, `hook` with --server), read by clap.
    "COUNTERSIGN_SERVER",
    "COUNTERSIGN_TOKEN_FILE",
];

/// Variables of the test suites, which run the binary with their own settings around.
const TEST_PREFIX: &str = "COUNTERSIGN_TEST_";

/// The process environment (or a test's stand-in for it).
pub struct Env<'a> {
    vars: &'a [(String, String)],
}

impl<'a> Env<'a> {
    /// Refuses an unknown `COUNTERSIGN_*` variable.
    pub fn new(vars: &'a [(String, String)]) -> anyhow::Result<Self> {
        for (key, _) in vars {
            if key.starts_with("COUNTERSIGN_")
                && !KEYS.contains(&key.as_str())
                && !key.starts_with(TEST_PREFIX)
            {
                bail!(
                    "unknown environment variable {key}; countersign reads {}",
                    KEYS.join(", ")
                );
            }
        }
        Ok(Self { vars })
    }

    pub fn get(&self, key: &str) -> Option<String> {
        self.vars
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }

    pub fn path(&self, key: &str) -> Option<PathBuf> {
        self.get(key).map(PathBuf::from)
    }

    /// `true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off`.
    pub fn flag(&self, key: &str) -> anyhow::Result<Option<bool>> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        match value.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(Some(true)),
            "0" | "false" | "no" | "off" => Ok(Some(false)),
            _ => bail!("{key}={value:?} is not true or false"),
        }
    }

    pub fn number<T>(&self, key: &str) -> anyhow::Result<Option<T>>
    where
        T: FromStr,
        T::Err: std::error::Error + Send + Sync + 'static,
    {
        self.get(key)
            .map(|v| {
                v.parse()
                    .with_context(|| format!("{key}={v:?} is not a number"))
            })
            .transpose()
    }

    /// A comma-separated list; empty items are dropped.
    pub fn list(&self, key: &str) -> Option<Vec<String>> {
        self.get(key).map(|list| {
            list.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::config::testing::vars;
    use crate::config::{Config, Overrides};

    #[test]
    fn unknown_variables_are_errors() {
        let err = Config::resolve(&Overrides::default(), &vars(&[("COUNTERSIGN_LISTN", "x")]))
            .unwrap_err();
        assert!(err.to_string().contains("COUNTERSIGN_LISTN"));
    }
}
