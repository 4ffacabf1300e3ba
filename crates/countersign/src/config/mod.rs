//! Configuration: defaults, then a TOML file, then `COUNTERSIGN_*` environment
//! variables, then command-line flags. Unknown keys and unknown `COUNTERSIGN_*`
//! variables are errors, so a typo never silently falls back to a default.
//!
//! This module holds the order and the settings of the binary itself; `file` is the
//! TOML's shape, `env` the variables, `database` the storage, `channels` Slack, email,
//! webhooks and reminders. What the server has a default for starts from the server's
//! settings types (`HttpConfig`, `Settings`, `NotifyConfig`), so it is stated once, there.

mod bridge;
mod channels;
mod database;
mod env;
mod file;
mod gateway;
mod guards;
mod operate;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::PathBuf;

use anyhow::{Context, bail};
use countersign_core::evidence::Reviewer;
use countersign_server::gate::{DEFAULT_SESSION_SECONDS, MAX_SESSION_SECONDS, ReviewerSettings};
use countersign_server::{HttpConfig, Settings};

pub use bridge::{BridgeSection, check_dirs as check_bridge_dirs, one as bridge_from_keys};
pub use database::Database;
use env::Env;
use file::{
    AuditSection, ChannelSections, FileConfig, HttpKeys, LogSection, ReviewSection, ServerSection,
};
pub use guards::Guards;

pub use countersign_server::http::DEFAULT_LISTEN;
pub const CONFIG_FILE_NAME: &str = "countersign.toml";
/// The signing keys' directory inside the data directory, unless `keys_dir` says otherwise.
const KEYS_DIR_NAME: &str = "keys";
/// `session_hours`: at least an hour, at most the server's longest session.
const SESSION_HOURS: RangeInclusive<u64> = 1..=MAX_SESSION_SECONDS / 3600;

/// The settings every command resolves before it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// Where the settings came from, for `doctor` and error messages.
    pub config_file: Option<PathBuf>,
    /// Hosts the HTTP server answers to (DNS-rebinding protection).
    pub allowed_hosts: Vec<String>,
    /// Offer `list_pending_approvals` / `approve` / `reject` over MCP to approver tokens.
    pub operator_tools: bool,
    pub max_body_bytes: usize,
    /// How often a process looks for changes made by other processes, in milliseconds.
    pub feed_poll_ms: u64,
    /// Allow `countersign approve|reject` without a terminal (scripts). Only settable in
    /// the config file.
    pub cli_unattended_decisions: bool,
    /// The transparency log's origin, used when the log is first created.
    pub log_origin: Option<String>,
    /// Whether evidence bundles may include raw payloads (mode full).
    pub raw_payload_export: bool,
    /// Who may record reviews, and what they show; `None` keeps `record_review` off.
    pub reviewer: Option<ReviewerSettings>,
    /// What the settings are valid but probably not meant as (`serve` and `doctor` say
    /// each).
    pub warnings: Vec<String>,
    /// How people reach this server: links in invitations and emails.
    pub public_url: String,
    /// How long a dashboard session lasts.
    pub session_hours: u64,
    /// Where the data lives: the embedded SQLite file, or a PostgreSQL database shared
    /// by several instances.
    pub database: Database,
    /// The signing keys' directory (default: `keys/` in the data directory). Several
    /// instances on one database share one key: point them all at the same keys.
    pub keys_dir: PathBuf,
    /// Slack, email, webhooks, reminders.
    pub notify: countersign_server::notify::NotifyConfig,
    /// `[groups]`, `[rooms]`, `[limits]`: what keeps one agent from crowding out others.
    pub guards: Guards,
    /// `[server]`: connection timeouts and limits, trusted proxies, waits per token.
    pub server: ServerLimits,
    /// How often `serve` runs the audit (`[audit] interval`); `None`: never.
    pub audit_interval: Option<std::time::Duration>,
    /// `[policy]`: the Cedar policy files and their zone; `None`: no policies.
    pub policy: Option<countersign_server::gate::PolicySettings>,
    /// `[[gateway]]`: the MCP gateways `serve` runs.
    pub gateways: Vec<countersign_server::mcp::gateway::GatewayConfig>,
    /// `[[bridge]]`: the processes on approval-gate-mcp's file contract (docs/bridge.md).
    pub bridges: Vec<countersign_server::bridge::BridgeConfig>,
    /// `[[process]]`, `[params]`, `[[probe]]`: what operators run, tune and check.
    pub operate: countersign_server::operate::OperateConfig,
}

/// `[server]`, resolved: each default is the server's (`HttpConfig`, `Settings`).
#[derive(Debug, Clone, PartialEq)]
pub struct ServerLimits {
    pub header_timeout: std::time::Duration,
    pub body_timeout: std::time::Duration,
    pub max_connections: usize,
    pub trusted_proxies: countersign_server::http::client::TrustedProxies,
    pub max_waits_per_token: usize,
    pub max_sessions_per_account: usize,
    /// Where `/metrics` is also served, with no credential (a private network's
    /// scraper); off by default.
    pub metrics_listen: Option<SocketAddr>,
}

/// Settings given on the command line (each overrides everything else).
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub config: Option<PathBuf>,
    pub data_dir: Option<PathBuf>,
    pub listen: Option<String>,
    pub database: Option<String>,
}

impl Config {
    /// Resolves the configuration from the process environment.
    pub fn load(overrides: &Overrides) -> anyhow::Result<Self> {
        let vars: Vec<(String, String)> = std::env::vars().collect();
        Self::resolve(overrides, &vars)
    }

    /// Resolves the configuration from explicit variables (testable without touching the
    /// process environment).
    pub fn resolve(overrides: &Overrides, vars: &[(String, String)]) -> anyhow::Result<Self> {
        let env = Env::new(vars)?;
        let Located {
            file,
            config_file,
            data_dir,
        } = locate(overrides, &env)?;
        // Taken apart, so that a key the file has but nothing resolves is an unused
        // variable (a warning, an error in CI) rather than silently ignored.
        let FileConfig {
            listen,
            data_dir: _,
            allowed_hosts,
            operator_tools,
            max_body_bytes,
            feed_poll_ms,
            public_url,
            session_hours,
            database_url,
            keys_dir,
            cli,
            tokens,
            server,
            log,
            evidence,
            review,
            audit,
            policy,
            webhooks,
            notify,
            reminders,
            slack,
            email,
            groups,
            rooms,
            limits,
            gateway,
            bridge,
            process,
            params,
            probe,
        } = file;

        let listen = listen_address(overrides, &env, listen)?;
        let http = http(
            &env,
            HttpKeys {
                allowed_hosts,
                operator_tools,
                max_body_bytes,
                public_url,
            },
            listen,
        )?;
        let server = server_limits(&env, server.unwrap_or_default())?;
        let log_origin = log_origin(log)?;
        let mut warnings = Vec::new();
        let reviewer = reviewer(review, &mut warnings)?;
        let audit_interval = audit_interval(&env, audit)?;
        let policy = policy_settings(policy, config_file.as_deref())?;
        let gateways = gateway::resolve(gateway, config_file.as_deref())?;
        let bridges = bridge::resolve(bridge, config_file.as_deref())?;
        let operate = operate::resolve(process, params, probe, config_file.as_deref())?;
        let database = database::resolve(overrides, &env, database_url, &data_dir)?;
        let feed_poll_ms = database::feed_poll_ms(&env, feed_poll_ms, &database)?;
        let keys_dir = env
            .path("COUNTERSIGN_KEYS_DIR")
            .or(keys_dir)
            .unwrap_or_else(|| data_dir.join(KEYS_DIR_NAME));
        let session_hours = session_hours_or_default(session_hours)?;
        let channels = ChannelSections {
            webhooks,
            notify,
            reminders,
            slack,
            email,
        };
        let mut notify = channels::resolve(channels, &env, &http.public_url)?;
        let identities = guards::identities(
            &tokens.map(|t| t.accounts).unwrap_or_default(),
            cli.as_ref().map_or(&BTreeMap::new(), |c| &c.accounts),
        )?;
        let guards = guards::resolve(groups, identities, rooms, limits)?;
        notify.digest = guards.digest;
        Ok(Self {
            gateways,
            bridges,
            operate,
            notify,
            server,
            guards,
            database,
            keys_dir,
            public_url: http.public_url,
            session_hours,
            log_origin,
            raw_payload_export: evidence
                .and_then(|e| e.raw_payload_export)
                .unwrap_or(Settings::default().raw_payload_export),
            reviewer,
            audit_interval,
            policy,
            warnings,
            listen,
            data_dir,
            config_file,
            allowed_hosts: http.allowed_hosts,
            operator_tools: http.operator_tools,
            max_body_bytes: http.max_body_bytes,
            feed_poll_ms,
            cli_unattended_decisions: cli.and_then(|c| c.unattended_decisions).unwrap_or(false),
        })
    }

    /// The SQLite file, when the data lives in one.
    pub fn database_path(&self) -> PathBuf {
        match &self.database {
            Database::Sqlite(path) => path.clone(),
            Database::Postgres(_) => database::sqlite_file(&self.data_dir),
        }
    }

    pub fn keys_dir(&self) -> PathBuf {
        self.keys_dir.clone()
    }
}

/// The config file, as read, and the data directory.
struct Located {
    file: FileConfig,
    config_file: Option<PathBuf>,
    data_dir: PathBuf,
}

/// The data directory and the config file decide each other: the default file lives in
/// the data directory, and an explicit file may name the directory. So the flag and the
/// variable for the directory count first, then the file.
fn locate(overrides: &Overrides, env: &Env) -> anyhow::Result<Located> {
    let explicit_file = overrides
        .config
        .clone()
        .or_else(|| env.path("COUNTERSIGN_CONFIG"));
    let early_data_dir = overrides
        .data_dir
        .clone()
        .or_else(|| env.path("COUNTERSIGN_DATA_DIR"));
    let (file, config_file) = match explicit_file {
        Some(path) => (file::read(&path)?, Some(path)),
        None => {
            let dir = early_data_dir
                .clone()
                .unwrap_or_else(|| default_data_dir(env));
            let path = dir.join(CONFIG_FILE_NAME);
            if path.exists() {
                let file = file::read(&path)?;
                if file.data_dir.is_some() {
                    bail!(
                        "data_dir in {} is ignored because that file already lives in a data directory; set it with --data-dir or COUNTERSIGN_DATA_DIR",
                        path.display()
                    );
                }
                (file, Some(path))
            } else {
                (FileConfig::default(), None)
            }
        }
    };
    let data_dir = early_data_dir
        .or_else(|| file.data_dir.clone())
        .unwrap_or_else(|| default_data_dir(env));
    Ok(Located {
        file,
        config_file,
        data_dir,
    })
}

/// The default data directory: `$XDG_DATA_HOME/countersign`, else
/// `~/.local/share/countersign`, else `./countersign-data`. A fixed place, so `serve` and
/// `mcp` processes launched from anywhere share one database.
fn default_data_dir(env: &Env) -> PathBuf {
    if let Some(xdg) = env.get("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(xdg).join("countersign");
    }
    if let Some(home) = env.get("HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(home).join(".local/share/countersign");
    }
    PathBuf::from("countersign-data")
}

fn listen_address(
    overrides: &Overrides,
    env: &Env,
    file: Option<String>,
) -> anyhow::Result<SocketAddr> {
    let text = overrides
        .listen
        .clone()
        .or_else(|| env.get("COUNTERSIGN_LISTEN"))
        .or(file)
        .unwrap_or_else(|| DEFAULT_LISTEN.to_string());
    text.parse().with_context(|| {
        format!("listen address {text:?} is not an IP:port such as {DEFAULT_LISTEN}")
    })
}

/// The HTTP server's settings: the variable, else the file, else the server's default.
/// The public URL defaults to the listen address instead, so that links work wherever
/// the server listens.
fn http(env: &Env, file: HttpKeys, listen: SocketAddr) -> anyhow::Result<HttpConfig> {
    let defaults = HttpConfig::default();
    let allowed_hosts = env
        .list("COUNTERSIGN_ALLOWED_HOSTS")
        .or(file.allowed_hosts)
        .unwrap_or(defaults.allowed_hosts);
    let operator_tools = env
        .flag("COUNTERSIGN_OPERATOR_TOOLS")?
        .or(file.operator_tools)
        .unwrap_or(defaults.operator_tools);
    let max_body_bytes = env
        .number("COUNTERSIGN_MAX_BODY_BYTES")?
        .or(file.max_body_bytes)
        .unwrap_or(defaults.max_body_bytes);
    let public_url = env
        .get("COUNTERSIGN_PUBLIC_URL")
        .or(file.public_url)
        .unwrap_or_else(|| format!("http://{listen}"));
    if !(public_url.starts_with("http://") || public_url.starts_with("https://")) {
        bail!("public_url {public_url:?} must start with http:// or https://");
    }
    let http = HttpConfig {
        allowed_hosts,
        operator_tools,
        max_body_bytes,
        public_url: public_url.trim_end_matches('/').to_string(),
        ..defaults
    };
    http.validate().map_err(anyhow::Error::msg)?;
    Ok(http)
}

/// `[server]`: the server's defaults, checked by its own `validate()`s.
fn server_limits(env: &Env, section: ServerSection) -> anyhow::Result<ServerLimits> {
    let http = HttpConfig::default();
    let settings = Settings::default();
    let seconds = |set: Option<u64>, default: std::time::Duration| {
        set.map(std::time::Duration::from_secs).unwrap_or(default)
    };
    let proxies = env
        .list("COUNTERSIGN_TRUSTED_PROXIES")
        .or(section.trusted_proxies)
        .unwrap_or_default();
    let trusted_proxies = countersign_server::http::client::TrustedProxies::parse(&proxies)
        .map_err(|e| anyhow::anyhow!("[server] {e}"))?;
    let metrics_listen = env
        .get("COUNTERSIGN_METRICS_LISTEN")
        .or(section.metrics_listen)
        .map(|text| {
            text.parse::<SocketAddr>().map_err(|_| {
                anyhow::anyhow!(
                    "[server] metrics_listen {text:?} is not an IP:port such as 127.0.0.1:9464"
                )
            })
        })
        .transpose()?;
    let limits = ServerLimits {
        metrics_listen,
        header_timeout: seconds(section.header_timeout_seconds, http.header_timeout),
        body_timeout: seconds(section.body_timeout_seconds, http.body_timeout),
        max_connections: section.max_connections.unwrap_or(http.max_connections),
        trusted_proxies,
        max_waits_per_token: section
            .max_waits_per_token
            .unwrap_or(settings.max_waits_per_token),
        max_sessions_per_account: section
            .max_sessions_per_account
            .unwrap_or(settings.max_sessions_per_account),
    };
    HttpConfig {
        header_timeout: limits.header_timeout,
        body_timeout: limits.body_timeout,
        max_connections: limits.max_connections,
        ..http
    }
    .validate()
    .map_err(|e| anyhow::anyhow!("[server] {e}"))?;
    Settings {
        max_waits_per_token: limits.max_waits_per_token,
        max_sessions_per_account: limits.max_sessions_per_account,
        ..settings
    }
    .validate()
    .map_err(|e| anyhow::anyhow!("[server] {e}"))?;
    Ok(limits)
}

/// `[log] origin`: it becomes the first line of every checkpoint.
fn log_origin(log: Option<LogSection>) -> anyhow::Result<Option<String>> {
    let origin = log.and_then(|l| l.origin);
    if let Some(origin) = &origin
        && (origin.is_empty() || origin.chars().any(|c| c.is_whitespace() || c == '+'))
    {
        bail!("[log] origin {origin:?} must be non-empty, without spaces or '+'");
    }
    Ok(origin)
}

/// `[policy]`: the files (relative to the config file's directory) and a known zone.
/// No files means no policies, whatever the zone.
fn policy_settings(
    section: Option<file::PolicySection>,
    config_file: Option<&std::path::Path>,
) -> anyhow::Result<Option<countersign_server::gate::PolicySettings>> {
    let Some(section) = section else {
        return Ok(None);
    };
    let zone = match section.timezone.as_deref() {
        None => chrono_tz::UTC,
        Some(name) => name.parse().map_err(|_| {
            anyhow::anyhow!(
                "[policy] timezone {name:?} is not an IANA time zone (e.g. \"Europe/Paris\", \"UTC\")"
            )
        })?,
    };
    if section.files.is_empty() {
        return Ok(None);
    }
    let base = base_dir(config_file);
    let files = section.files.into_iter().map(|f| base.join(f)).collect();
    Ok(Some(countersign_server::gate::PolicySettings {
        files,
        zone,
    }))
}

/// Where the config file's relative paths start: the file's own directory (with no file,
/// the working directory: the paths stay as given). An absolute path joined to it stays
/// itself.
fn base_dir(config_file: Option<&std::path::Path>) -> PathBuf {
    config_file
        .and_then(std::path::Path::parent)
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default()
}

/// A name that goes into principal ids, paths, tool names and Cedar entity ids
/// (`[[gateway]]`, its upstreams, `[[bridge]]`, `[[process]]`, `[[probe]]`): 1 to 64 of
/// `a-z 0-9 - _`.
fn plain_name(what: &str, name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !ok {
        bail!("{what}: name: give 1 to 64 of a-z, 0-9, - and _");
    }
    Ok(())
}

/// `[audit] interval` (or `COUNTERSIGN_AUDIT_INTERVAL`): `off`, or how often `serve`
/// holds the database to the log, as `30s`, `15m`, `1h` or `1d`.
fn audit_interval(
    env: &Env,
    audit: Option<AuditSection>,
) -> anyhow::Result<Option<std::time::Duration>> {
    let text = env
        .get("COUNTERSIGN_AUDIT_INTERVAL")
        .or(audit.and_then(|a| a.interval));
    let Some(text) = text.map(|t| t.trim().to_string()) else {
        return Ok(None);
    };
    if text == "off" {
        return Ok(None);
    }
    let unit = |u: char| match u {
        's' => Some(1),
        'm' => Some(60),
        'h' => Some(3600),
        'd' => Some(86_400),
        _ => None,
    };
    let seconds = text
        .char_indices()
        .last()
        .and_then(|(i, u)| text[..i].parse::<u64>().ok()?.checked_mul(unit(u)?))
        .filter(|s| *s > 0);
    match seconds {
        Some(s) => Ok(Some(std::time::Duration::from_secs(s))),
        None => bail!(
            "[audit] interval {text:?} is not a duration: give off, or a number with s, m, h or d (e.g. 1h)"
        ),
    }
}

/// `[review]`: who may record reviews (`reviewer`, a token or a dashboard account), and
/// what every review shows as its reviewer (`reviewer_id` and `reviewer_name`, which
/// were once the only settings and said nothing about who may review: kept as the label,
/// with a warning).
fn reviewer(
    review: Option<ReviewSection>,
    warnings: &mut Vec<String>,
) -> anyhow::Result<Option<ReviewerSettings>> {
    let Some(ReviewSection {
        enabled,
        reviewer,
        reviewer_id,
        reviewer_name,
    }) = review
    else {
        return Ok(None);
    };
    let present = |s: Option<String>| s.map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
    let label = match (present(reviewer_id), present(reviewer_name)) {
        (Some(id), name) => Some(Reviewer {
            display_name: name.unwrap_or_else(|| id.clone()),
            id,
        }),
        (None, Some(_)) => bail!("[review] reviewer_name needs reviewer_id"),
        (None, None) => None,
    };
    if enabled == Some(false) {
        return Ok(None);
    }
    let Some(principal) = present(reviewer) else {
        if label.is_some() {
            warnings.push(
                "[review] reviewer_id only says what reviews show as their reviewer; name who may record them with [review] reviewer = \"token:<name>\" or \"user:<username>\": until then record_review is off"
                    .into(),
            );
            return Ok(None);
        }
        if enabled == Some(true) {
            bail!(
                "[review] enabled = true needs reviewer: who may record reviews, \"token:<name>\" (a bearer token) or \"user:<username>\" (a dashboard account)"
            );
        }
        return Ok(None);
    };
    let principal = check_reviewer(&principal)?;
    if let Some(label) = &label {
        warnings.push(format!(
            "[review] reviewer_id {:?} is shown as the reviewer of every review {principal} records; remove reviewer_id and reviewer_name to show {principal} itself",
            label.id
        ));
    }
    Ok(Some(ReviewerSettings { principal, label }))
}

/// A reviewer is named as a principal: `token:<name>` or `user:<username>` (usernames
/// are lowercase, as accounts store them).
fn check_reviewer(principal: &str) -> anyhow::Result<String> {
    match principal.split_once(':') {
        Some(("token", name)) if countersign_core::token::validate_token_name(name).is_ok() => {
            Ok(principal.to_string())
        }
        Some(("user", name))
            if !name.is_empty() && name.chars().all(|c| !c.is_whitespace() && !c.is_control()) =>
        {
            Ok(format!("user:{}", name.to_ascii_lowercase()))
        }
        _ => bail!(
            "[review] reviewer {principal:?} must name who may record reviews: \"token:<name>\" for a bearer token (countersign token list), or \"user:<username>\" for a dashboard account"
        ),
    }
}

/// `session_hours`, by default the server's session length (a whole number of hours).
fn session_hours_or_default(set: Option<u64>) -> anyhow::Result<u64> {
    let hours = set.unwrap_or(DEFAULT_SESSION_SECONDS / 3600);
    if !SESSION_HOURS.contains(&hours) {
        bail!(
            "session_hours must be between {} and {}",
            SESSION_HOURS.start(),
            SESSION_HOURS.end()
        );
    }
    Ok(hours)
}

#[cfg(test)]
mod testing;

#[cfg(test)]
mod tests {
    use super::*;
    use testing::vars;

    #[test]
    fn defaults_apply_without_file_or_env() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().to_str().unwrap();
        let c = Config::resolve(&Overrides::default(), &vars(&[("HOME", home)])).unwrap();
        assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(c.data_dir, tmp.path().join(".local/share/countersign"));
        assert!(!c.operator_tools);
        assert_eq!(c.feed_poll_ms, 50);
        assert_eq!(c.config_file, None);
        // The server's defaults, in the units of the config.
        let http = HttpConfig::default();
        assert_eq!(c.allowed_hosts, http.allowed_hosts);
        assert_eq!(c.max_body_bytes, http.max_body_bytes);
        assert_eq!(c.session_hours * 3600, Settings::default().session_seconds);
        assert_eq!(c.public_url, format!("http://{DEFAULT_LISTEN}"));
        assert_eq!(c.keys_dir, c.data_dir.join("keys"));
        assert_eq!(
            c.database,
            Database::Sqlite(c.data_dir.join("countersign.db"))
        );
    }

    #[test]
    fn file_then_env_then_flags() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(
            data.join(CONFIG_FILE_NAME),
            "listen = \"127.0.0.1:9000\"\noperator_tools = true\nallowed_hosts = [\"gate.example.com\"]\n[cli]\nunattended_decisions = true\n",
        )
        .unwrap();
        let d = data.to_str().unwrap();
        let c =
            Config::resolve(&Overrides::default(), &vars(&[("COUNTERSIGN_DATA_DIR", d)])).unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:9000");
        assert!(c.operator_tools);
        assert!(c.cli_unattended_decisions);
        assert_eq!(c.allowed_hosts, vec!["gate.example.com".to_string()]);

        let c = Config::resolve(
            &Overrides::default(),
            &vars(&[
                ("COUNTERSIGN_DATA_DIR", d),
                ("COUNTERSIGN_LISTEN", "127.0.0.1:9001"),
                ("COUNTERSIGN_OPERATOR_TOOLS", "false"),
            ]),
        )
        .unwrap();
        assert_eq!(c.listen.port(), 9001);
        assert!(!c.operator_tools);

        let flags = Overrides {
            listen: Some("127.0.0.1:9002".into()),
            ..Overrides::default()
        };
        let c = Config::resolve(
            &flags,
            &vars(&[
                ("COUNTERSIGN_DATA_DIR", d),
                ("COUNTERSIGN_LISTEN", "127.0.0.1:9001"),
            ]),
        )
        .unwrap();
        assert_eq!(c.listen.port(), 9002);
    }

    #[test]
    fn a_listen_address_is_an_ip_and_a_port() {
        let err = Config::resolve(
            &Overrides::default(),
            &vars(&[("COUNTERSIGN_LISTEN", "localhost")]),
        )
        .unwrap_err();
        assert!(err.to_string().contains("not an IP:port"));
    }

    #[test]
    fn the_server_section_sets_timeouts_limits_and_trusted_proxies() {
        use countersign_server::http::client::TrustedProxies;
        use std::time::Duration;
        use testing::ConfigFile;
        let file = ConfigFile::new();
        let c = file.resolve("").unwrap();
        let http = HttpConfig::default();
        assert_eq!(c.server.header_timeout, http.header_timeout);
        assert_eq!(c.server.header_timeout, Duration::from_secs(10));
        assert_eq!(c.server.max_connections, http.max_connections);
        assert!(c.server.trusted_proxies.is_empty());
        assert_eq!(
            c.server.max_waits_per_token,
            Settings::default().max_waits_per_token
        );

        let c = file
            .resolve("[server]\nheader_timeout_seconds = 5\nbody_timeout_seconds = 60\nmax_connections = 100\ntrusted_proxies = [\"10.0.0.0/8\", \"::1\"]\nmax_waits_per_token = 7\nmax_sessions_per_account = 3\n")
            .unwrap();
        assert_eq!(c.server.header_timeout, Duration::from_secs(5));
        assert_eq!(c.server.body_timeout, Duration::from_secs(60));
        assert_eq!(c.server.max_connections, 100);
        assert_eq!(
            c.server.trusted_proxies,
            TrustedProxies::parse(&["10.0.0.0/8".into(), "::1".into()]).unwrap()
        );
        assert_eq!(c.server.max_waits_per_token, 7);
        assert_eq!(c.server.max_sessions_per_account, 3);
        assert_eq!(c.server.metrics_listen, None, "off unless given");
        let c = file
            .resolve("[server]\nmetrics_listen = \"127.0.0.1:9464\"\n")
            .unwrap();
        assert_eq!(
            c.server.metrics_listen.map(|a| a.to_string()).as_deref(),
            Some("127.0.0.1:9464")
        );
        let err = file
            .resolve("[server]\nmetrics_listen = \"localhost\"\n")
            .unwrap_err();
        assert!(format!("{err:#}").contains("metrics_listen"), "{err:#}");

        // The variable wins over the file.
        std::fs::write(&file.path, "[server]\ntrusted_proxies = [\"10.0.0.1\"]\n").unwrap();
        let c = Config::resolve(
            &file.flags,
            &vars(&[("COUNTERSIGN_TRUSTED_PROXIES", "192.0.2.1, 192.0.2.2")]),
        )
        .unwrap();
        assert_eq!(
            c.server.trusted_proxies,
            TrustedProxies::parse(&["192.0.2.1".into(), "192.0.2.2".into()]).unwrap()
        );

        for (toml, says) in [
            (
                "[server]\nheader_timeout_seconds = 0\n",
                "header_timeout_seconds must be",
            ),
            (
                "[server]\nbody_timeout_seconds = 7200\n",
                "body_timeout_seconds must be",
            ),
            ("[server]\nmax_connections = 0\n", "max_connections must be"),
            (
                "[server]\ntrusted_proxies = [\"proxy\"]\n",
                "\"proxy\" is not an IP address",
            ),
            (
                "[server]\nmax_waits_per_token = 0\n",
                "max_waits_per_token must be",
            ),
            (
                "[server]\nmax_sessions_per_account = 0\n",
                "max_sessions_per_account must be",
            ),
            ("[server]\nheader_timeout = 5\n", "unknown field"),
        ] {
            let err = format!("{:#}", file.resolve(toml).unwrap_err());
            assert!(err.contains(says), "{toml}: {err}");
        }
    }

    #[test]
    fn the_reviewer_is_a_principal_and_the_old_label_keeps_working() {
        use testing::ConfigFile;
        let file = ConfigFile::new();
        // A config from before `reviewer`: it still loads, with reviews off and a warning.
        let old = file
            .resolve("[review]\nenabled = true\nreviewer_id = \"audit-team\"\nreviewer_name = \"Audit team\"\n")
            .unwrap();
        assert_eq!(old.reviewer, None);
        assert_eq!(old.warnings.len(), 1);
        assert!(
            old.warnings[0].contains("[review] reviewer ="),
            "{:?}",
            old.warnings
        );

        // Naming the reviewer turns reviews on; the label is still what reviews show.
        let upgraded = file
            .resolve("[review]\nreviewer = \"token:audit-bot\"\nreviewer_id = \"audit-team\"\nreviewer_name = \"Audit team\"\n")
            .unwrap();
        let reviewer = upgraded.reviewer.unwrap();
        assert_eq!(reviewer.principal, "token:audit-bot");
        let label = reviewer.label.unwrap();
        assert_eq!(
            (label.id.as_str(), label.display_name.as_str()),
            ("audit-team", "Audit team")
        );
        assert!(
            upgraded.warnings[0].contains("reviewer_id"),
            "{:?}",
            upgraded.warnings
        );

        let plain = file
            .resolve("[review]\nreviewer = \"user:Rita\"\n")
            .unwrap();
        let reviewer = plain.reviewer.unwrap();
        assert_eq!(reviewer.principal, "user:rita", "as accounts store it");
        assert_eq!(reviewer.label, None);
        assert!(plain.warnings.is_empty());
        let off = file
            .resolve("[review]\nenabled = false\nreviewer = \"user:rita\"\n")
            .unwrap();
        assert_eq!(off.reviewer, None);

        for (toml, says) in [
            ("[review]\nreviewer = \"audit-bot\"\n", "\"token:<name>\""),
            (
                "[review]\nreviewer = \"group:audit\"\n",
                "\"user:<username>\"",
            ),
            ("[review]\nenabled = true\n", "needs reviewer"),
            ("[review]\nreviewer_name = \"Audit\"\n", "needs reviewer_id"),
        ] {
            let err = file.resolve(toml).unwrap_err();
            assert!(err.to_string().contains(says), "{toml}: {err}");
        }
    }
}
