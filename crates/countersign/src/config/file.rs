//! The config file's shape. Kept apart from the resolution so that the TOML a user writes
//! can be read at a glance; `deny_unknown_fields` everywhere makes a typo an error.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Deserialize;

/// The whole file. Every key is optional: what is missing comes from the environment or a
/// default.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub allowed_hosts: Option<Vec<String>>,
    pub operator_tools: Option<bool>,
    pub max_body_bytes: Option<usize>,
    pub feed_poll_ms: Option<u64>,
    pub public_url: Option<String>,
    pub session_hours: Option<u64>,
    pub database_url: Option<String>,
    pub keys_dir: Option<PathBuf>,
    pub cli: Option<CliSection>,
    pub tokens: Option<TokensSection>,
    pub server: Option<ServerSection>,
    pub log: Option<LogSection>,
    pub evidence: Option<EvidenceSection>,
    pub review: Option<ReviewSection>,
    pub audit: Option<AuditSection>,
    pub policy: Option<PolicySection>,
    #[serde(default)]
    pub webhooks: Vec<WebhookSection>,
    pub notify: Option<NotifySection>,
    pub reminders: Option<RemindersSection>,
    pub slack: Option<SlackSection>,
    pub email: Option<EmailSection>,
    /// Named groups of principals: `ops = ["token:deploy-bot", "user:alice"]`.
    pub groups: Option<BTreeMap<String, Vec<String>>>,
    pub rooms: Option<super::guards::RoomsSection>,
    pub limits: Option<super::guards::LimitsSection>,
    /// The MCP gateways `serve` runs (docs/gateway.md).
    #[serde(default)]
    pub gateway: Vec<super::gateway::GatewaySection>,
    /// The processes on approval-gate-mcp's file contract (docs/bridge.md).
    #[serde(default)]
    pub bridge: Vec<super::bridge::BridgeSection>,
    /// The processes an operator looks after (docs/bridge.md).
    #[serde(default)]
    pub process: Vec<super::operate::ProcessSection>,
    /// The parameters those processes read, and their manifest.
    pub params: Option<super::operate::ParamsSection>,
    /// Read-only checks beside them.
    #[serde(default)]
    pub probe: Vec<super::operate::ProbeSection>,
}

/// The keys about the HTTP server, resolved together into the server's `HttpConfig`.
pub struct HttpKeys {
    pub allowed_hosts: Option<Vec<String>>,
    pub operator_tools: Option<bool>,
    pub max_body_bytes: Option<usize>,
    pub public_url: Option<String>,
}

/// The sections about channels, resolved together into the server's `NotifyConfig`.
pub struct ChannelSections {
    pub webhooks: Vec<WebhookSection>,
    pub notify: Option<NotifySection>,
    pub reminders: Option<RemindersSection>,
    pub slack: Option<SlackSection>,
    pub email: Option<EmailSection>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CliSection {
    pub unattended_decisions: Option<bool>,
    /// OS user → dashboard username: whose account a terminal decision counts as.
    #[serde(default)]
    pub accounts: BTreeMap<String, String>,
}

/// `[tokens]`: what the config says of tokens.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokensSection {
    /// Token name → dashboard username: whose account the token's decisions count as
    /// (and whose requests its account may not approve).
    #[serde(default)]
    pub accounts: BTreeMap<String, String>,
}

/// `[server]`: what a connection, a credential and an account may hold at once.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    pub header_timeout_seconds: Option<u64>,
    pub body_timeout_seconds: Option<u64>,
    pub max_connections: Option<usize>,
    pub trusted_proxies: Option<Vec<String>>,
    pub max_waits_per_token: Option<usize>,
    pub max_sessions_per_account: Option<usize>,
    /// A second address serving only `/metrics`, without a credential.
    pub metrics_listen: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSection {
    pub origin: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvidenceSection {
    pub raw_payload_export: Option<bool>,
}

/// `[policy]`: Cedar policy files (docs/policies.md).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySection {
    /// The files, in order (relative paths are from the config file's directory).
    #[serde(default)]
    pub files: Vec<PathBuf>,
    /// The IANA zone `context.time` is in (default `UTC`).
    pub timezone: Option<String>,
}

/// `[audit]`: how often `serve` holds the database to the log.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditSection {
    /// `off` (the default), or a duration: `30s`, `15m`, `1h`, `1d`.
    pub interval: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReviewSection {
    pub enabled: Option<bool>,
    /// Who may record reviews: `token:<name>` or `user:<username>`.
    pub reviewer: Option<String>,
    /// What reviews show as their reviewer (from before `reviewer`).
    pub reviewer_id: Option<String>,
    pub reviewer_name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlackSection {
    pub bot_token: Option<String>,
    pub bot_token_file: Option<PathBuf>,
    pub signing_secret: Option<String>,
    pub signing_secret_file: Option<PathBuf>,
    pub api_base_url: Option<String>,
    /// Slack user id → dashboard username.
    #[serde(default)]
    pub approvers: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmailSection {
    pub smtp_url: String,
    pub from: String,
    pub username: Option<String>,
    pub password: Option<String>,
    pub password_file: Option<PathBuf>,
    /// PEM certificates to trust for the SMTP server besides the Mozilla roots.
    pub ca_file: Option<PathBuf>,
    /// Email address → dashboard username.
    #[serde(default)]
    pub approvers: BTreeMap<String, String>,
    pub token_decisions: Option<bool>,
    pub token_minutes: Option<u64>,
    pub follow_ups: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSection {
    pub name: String,
    pub url: String,
    pub secret: Option<String>,
    pub secret_file: Option<PathBuf>,
    #[serde(default)]
    pub events: Vec<String>,
    /// Allows a plain `http://` URL to a host other than this machine.
    pub allow_plain_http: Option<bool>,
    /// `standard` (the default, Standard Webhooks) or `looppause` (LoopPause's
    /// `sha256=` HMAC header as well).
    pub format: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifySection {
    #[serde(default)]
    pub default_routes: Vec<String>,
    #[serde(default)]
    pub allowed_recipients: Vec<String>,
    pub max_attempts: Option<u32>,
    pub lease_seconds: Option<u64>,
    pub history_days: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemindersSection {
    pub after_minutes: u64,
    pub escalate_after_minutes: Option<u64>,
    #[serde(default)]
    pub escalate_to: Vec<String>,
}

/// Reads and parses the file at `path`.
pub fn read(path: &Path) -> anyhow::Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("could not read the config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("invalid config file {}", path.display()))
}

#[cfg(test)]
mod tests {
    use crate::config::testing::ConfigFile;

    #[test]
    fn unknown_keys_are_errors() {
        let err = ConfigFile::new()
            .resolve("listne = \"127.0.0.1:1\"\n")
            .unwrap_err();
        assert!(format!("{err:#}").contains("listne"), "{err:#}");
    }
}
