//! Configuration: defaults, then a TOML file, then `COUNTERSIGN_*` environment
//! variables, then command-line flags. Unknown keys and unknown `COUNTERSIGN_*`
//! variables are errors, so a typo never silently falls back to a default.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Deserialize;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8787";
pub const CONFIG_FILE_NAME: &str = "countersign.toml";

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
    /// The reviewer `record_review` records; `None` keeps it off.
    pub reviewer: Option<(String, String)>,
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
}

/// The storage backend, from `database_url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Database {
    Sqlite(PathBuf),
    Postgres(String),
}

impl Database {
    /// Parses `sqlite://PATH` (relative paths are relative to the working directory,
    /// `sqlite:///abs/path` is absolute) or `postgres://...` / `postgresql://...`.
    pub fn parse(url: &str) -> anyhow::Result<Self> {
        if let Some(path) = url.strip_prefix("sqlite://") {
            if path.is_empty() {
                bail!(
                    "database_url {url:?} names no file (e.g. sqlite:///var/lib/countersign/countersign.db)"
                );
            }
            return Ok(Database::Sqlite(PathBuf::from(path)));
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(Database::Postgres(url.to_string()));
        }
        bail!(
            "database_url must start with sqlite:// or postgres:// (got {})",
            redact(url)
        )
    }

    /// A description without any password, for messages.
    pub fn describe(&self) -> String {
        match self {
            Database::Sqlite(path) => format!("SQLite {}", path.display()),
            Database::Postgres(url) => format!("PostgreSQL {}", redact(url)),
        }
    }
}

/// The URL with any password replaced by `***`.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// The config file's shape.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<String>,
    data_dir: Option<PathBuf>,
    allowed_hosts: Option<Vec<String>>,
    operator_tools: Option<bool>,
    max_body_bytes: Option<usize>,
    feed_poll_ms: Option<u64>,
    public_url: Option<String>,
    session_hours: Option<u64>,
    database_url: Option<String>,
    keys_dir: Option<PathBuf>,
    cli: Option<CliSection>,
    log: Option<LogSection>,
    evidence: Option<EvidenceSection>,
    review: Option<ReviewSection>,
    #[serde(default)]
    webhooks: Vec<WebhookSection>,
    notify: Option<NotifySection>,
    reminders: Option<RemindersSection>,
    slack: Option<SlackSection>,
    email: Option<EmailSection>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SlackSection {
    bot_token: Option<String>,
    bot_token_file: Option<PathBuf>,
    signing_secret: Option<String>,
    signing_secret_file: Option<PathBuf>,
    api_base_url: Option<String>,
    /// Slack user id → dashboard username.
    #[serde(default)]
    approvers: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EmailSection {
    smtp_url: String,
    from: String,
    username: Option<String>,
    password: Option<String>,
    password_file: Option<PathBuf>,
    /// PEM certificates to trust for the SMTP server besides the Mozilla roots.
    ca_file: Option<PathBuf>,
    /// Email address → dashboard username.
    #[serde(default)]
    approvers: std::collections::BTreeMap<String, String>,
    token_decisions: Option<bool>,
    token_minutes: Option<u64>,
    follow_ups: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WebhookSection {
    name: String,
    url: String,
    secret: Option<String>,
    secret_file: Option<PathBuf>,
    #[serde(default)]
    events: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct NotifySection {
    #[serde(default)]
    default_routes: Vec<String>,
    max_attempts: Option<u32>,
    lease_seconds: Option<u64>,
    history_days: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RemindersSection {
    after_minutes: u64,
    escalate_after_minutes: Option<u64>,
    #[serde(default)]
    escalate_to: Vec<String>,
}

/// A secret given inline or in a file (a mounted secret); exactly one.
fn secret(what: &str, inline: Option<String>, file: Option<PathBuf>) -> anyhow::Result<String> {
    match (inline, file) {
        (Some(value), None) => Ok(value),
        (None, Some(path)) => Ok(std::fs::read_to_string(&path)
            .with_context(|| format!("could not read {what} from {}", path.display()))?
            .trim()
            .to_string()),
        (Some(_), Some(_)) => bail!("{what}: give the secret or a file holding it, not both"),
        (None, None) => bail!("{what}: a secret is required (or a *_file holding it)"),
    }
}

/// A secret from its environment variable (which wins), inline, or a file.
fn secret_with_env(
    what: &str,
    env: Option<String>,
    inline: Option<String>,
    file: Option<PathBuf>,
) -> anyhow::Result<String> {
    match env.filter(|v| !v.is_empty()) {
        Some(value) => Ok(value),
        None => secret(what, inline, file),
    }
}

/// A username an approver mapping points at.
fn approver_username(what: &str, username: &str) -> anyhow::Result<String> {
    countersign_core::accounts::validate_username(username)
        .map_err(|e| anyhow::anyhow!("{what}: {e}"))
}

fn slack_config(
    section: Option<SlackSection>,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Option<countersign_server::notify::slack::SlackConfig>> {
    use countersign_server::notify::slack::{DEFAULT_API_BASE_URL, SlackConfig, is_user_id};
    let Some(s) = section else {
        for key in [
            "COUNTERSIGN_SLACK_BOT_TOKEN",
            "COUNTERSIGN_SLACK_SIGNING_SECRET",
        ] {
            if env(key).is_some() {
                bail!(
                    "{key} is set but the config has no [slack] section (it names the approvers)"
                );
            }
        }
        return Ok(None);
    };
    let bot_token = secret_with_env(
        "[slack] bot_token",
        env("COUNTERSIGN_SLACK_BOT_TOKEN"),
        s.bot_token,
        s.bot_token_file,
    )?;
    let signing_secret = secret_with_env(
        "[slack] signing_secret",
        env("COUNTERSIGN_SLACK_SIGNING_SECRET"),
        s.signing_secret,
        s.signing_secret_file,
    )?;
    let api_base_url = s
        .api_base_url
        .unwrap_or_else(|| DEFAULT_API_BASE_URL.to_string())
        .trim_end_matches('/')
        .to_string();
    let parsed = reqwest::Url::parse(&api_base_url)
        .with_context(|| format!("[slack] api_base_url {api_base_url:?} is not a URL"))?;
    let loopback = match parsed.host_str() {
        Some("localhost") => true,
        Some(host) => host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback()),
        None => false,
    };
    if !(parsed.scheme() == "https" || (parsed.scheme() == "http" && loopback)) {
        bail!(
            "[slack] api_base_url {api_base_url:?} must be https:// (http:// only on the loopback, for tests): it carries the bot token"
        );
    }
    let mut approvers = std::collections::BTreeMap::new();
    for (user, username) in s.approvers {
        if !is_user_id(&user) {
            bail!(
                "[slack.approvers] {user:?} is not a Slack user id (U… or W…, from the user's profile: More → Copy member ID)"
            );
        }
        let username = approver_username(&format!("[slack.approvers] {user}"), &username)?;
        approvers.insert(user, username);
    }
    Ok(Some(SlackConfig {
        bot_token,
        signing_secret,
        api_base_url,
        approvers,
    }))
}

fn email_config(
    section: Option<EmailSection>,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Option<countersign_server::notify::email::EmailConfig>> {
    use countersign_server::notify::email::EmailConfig;
    use countersign_server::notify::smtp::{Security, SmtpUrl, check_address, load_ca_file};
    let Some(e) = section else {
        if env("COUNTERSIGN_SMTP_PASSWORD").is_some() {
            bail!("COUNTERSIGN_SMTP_PASSWORD is set but the config has no [email] section");
        }
        return Ok(None);
    };
    let smtp = SmtpUrl::parse(&e.smtp_url).map_err(|m| anyhow::anyhow!("[email] {m}"))?;
    check_address(&e.from).map_err(|m| anyhow::anyhow!("[email] from: {m}"))?;
    let env_password = env("COUNTERSIGN_SMTP_PASSWORD").filter(|v| !v.is_empty());
    let password = match (env_password, e.password, e.password_file) {
        (Some(p), _, _) => Some(p),
        (None, None, None) => None,
        (None, inline, file) => Some(secret("[email] password", inline, file)?),
    };
    if password.is_some() && e.username.is_none() {
        bail!("[email] has a password but no username");
    }
    let extra_roots = match &e.ca_file {
        None => None,
        Some(_) if smtp.security == Security::Plain => bail!(
            "[email] ca_file is set but smtp_url {:?} is plain (no TLS): use smtps:// or ?tls=starttls",
            e.smtp_url
        ),
        Some(path) => Some(load_ca_file(path).map_err(|m| anyhow::anyhow!(m))?),
    };
    let mut approvers = std::collections::BTreeMap::new();
    for (address, username) in e.approvers {
        check_address(&address).map_err(|m| anyhow::anyhow!("[email.approvers] {m}"))?;
        let username = approver_username(&format!("[email.approvers] {address}"), &username)?;
        approvers.insert(address.trim().to_ascii_lowercase(), username);
    }
    let token_minutes = e.token_minutes.unwrap_or(30);
    if !(1..=24 * 60).contains(&token_minutes) {
        bail!("[email] token_minutes must be between 1 and 1440");
    }
    Ok(Some(EmailConfig {
        smtp,
        from: e.from,
        username: e.username,
        password,
        extra_roots,
        approvers,
        token_decisions: e.token_decisions.unwrap_or(false),
        token_minutes,
        follow_ups: e.follow_ups.unwrap_or(true),
    }))
}

const EVENT_TYPES: &[&str] = &[
    "request.created",
    "request.decided",
    "request.timed_out",
    "request.cancelled",
    "action.recorded",
    "outcome.recorded",
];

fn notify_config(
    webhooks: Vec<WebhookSection>,
    notify: Option<NotifySection>,
    reminders: Option<RemindersSection>,
) -> anyhow::Result<countersign_server::notify::NotifyConfig> {
    use countersign_server::notify::{NotifyConfig, ReminderConfig, Route, WebhookConfig};
    let mut out = NotifyConfig::default();
    for w in webhooks {
        let what = format!("webhook {:?}", w.name);
        if !(w.url.starts_with("https://") || w.url.starts_with("http://")) {
            bail!(
                "{what}: url {:?} must start with https:// (or http://)",
                w.url
            );
        }
        for e in &w.events {
            if !EVENT_TYPES.contains(&e.as_str()) {
                bail!(
                    "{what}: unknown event {e:?}; events are {}",
                    EVENT_TYPES.join(", ")
                );
            }
        }
        let secret = secret(&what, w.secret, w.secret_file)?;
        countersign_server::notify::webhook::key(&secret)
            .map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
        if out.webhooks.iter().any(|x| x.name == w.name) {
            bail!("{what} is configured twice");
        }
        out.webhooks.push(WebhookConfig {
            name: w.name,
            url: w.url,
            secret,
            events: w.events,
        });
    }
    let parse_routes = |routes: Vec<String>| -> anyhow::Result<Vec<Route>> {
        routes
            .iter()
            .map(|r| r.parse::<Route>().map_err(|e| anyhow::anyhow!(e)))
            .collect()
    };
    if let Some(n) = notify {
        out.default_routes = parse_routes(n.default_routes)?;
        out.max_attempts = n.max_attempts.unwrap_or(out.max_attempts);
        if n.lease_seconds == Some(0) {
            bail!("[notify] lease_seconds must be at least 1");
        }
        out.lease_seconds = n.lease_seconds.unwrap_or(out.lease_seconds);
        if let Some(days) = n.history_days
            && days < countersign_server::notify::MIN_HISTORY_DAYS
        {
            bail!(
                "[notify] history_days is {days}; at least {} are needed (a request can wait up \
                 to 7 days, and its Slack message is updated from the delivery history)",
                countersign_server::notify::MIN_HISTORY_DAYS
            );
        }
        out.history_days = n.history_days.unwrap_or(out.history_days);
    }
    if let Some(r) = reminders {
        if r.after_minutes == 0 {
            bail!("[reminders] after_minutes must be at least 1");
        }
        out.reminders = Some(ReminderConfig {
            after_seconds: r.after_minutes * 60,
            escalate_after_seconds: r.escalate_after_minutes.map(|m| m * 60),
            escalate_to: parse_routes(r.escalate_to)?,
        });
    }
    Ok(out)
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LogSection {
    origin: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct EvidenceSection {
    raw_payload_export: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReviewSection {
    enabled: Option<bool>,
    reviewer_id: Option<String>,
    reviewer_name: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CliSection {
    unattended_decisions: Option<bool>,
}

/// Settings given on the command line (each overrides everything else).
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub config: Option<PathBuf>,
    pub data_dir: Option<PathBuf>,
    pub listen: Option<String>,
    pub database: Option<String>,
}

const ENV_KEYS: &[&str] = &[
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
    "COUNTERSIGN_LOG",
    "COUNTERSIGN_SLACK_BOT_TOKEN",
    "COUNTERSIGN_SLACK_SIGNING_SECRET",
    "COUNTERSIGN_SMTP_PASSWORD",
];

/// The default data directory: `$XDG_DATA_HOME/countersign`, else
/// `~/.local/share/countersign`, else `./countersign-data`. A fixed place, so `serve` and
/// `mcp` processes launched from anywhere share one database.
pub fn default_data_dir(env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    if let Some(xdg) = env("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(xdg).join("countersign");
    }
    if let Some(home) = env("HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(home).join(".local/share/countersign");
    }
    PathBuf::from("countersign-data")
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
        for (key, _) in vars {
            if key.starts_with("COUNTERSIGN_")
                && !ENV_KEYS.contains(&key.as_str())
                && !key.starts_with("COUNTERSIGN_TEST_")
            {
                bail!(
                    "unknown environment variable {key}; countersign reads {}",
                    ENV_KEYS.join(", ")
                );
            }
        }
        let env = |key: &str| vars.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());

        // The data directory decides where the default config file lives, so resolve it
        // first from the flag and the environment.
        let explicit_file = overrides
            .config
            .clone()
            .or_else(|| env("COUNTERSIGN_CONFIG").map(PathBuf::from));
        let early_data_dir = overrides
            .data_dir
            .clone()
            .or_else(|| env("COUNTERSIGN_DATA_DIR").map(PathBuf::from));
        let (file, config_file) = match &explicit_file {
            Some(path) => (read_file(path)?, Some(path.clone())),
            None => {
                let dir = early_data_dir
                    .clone()
                    .unwrap_or_else(|| default_data_dir(&env));
                let path = dir.join(CONFIG_FILE_NAME);
                if path.exists() {
                    (read_file(&path)?, Some(path))
                } else {
                    (FileConfig::default(), None)
                }
            }
        };
        if explicit_file.is_none() && file.data_dir.is_some() {
            bail!(
                "data_dir in {} is ignored because that file already lives in a data directory; set it with --data-dir or COUNTERSIGN_DATA_DIR",
                config_file
                    .as_deref()
                    .map(Path::display)
                    .map(|d| d.to_string())
                    .unwrap_or_default()
            );
        }

        let data_dir = early_data_dir
            .or(file.data_dir)
            .unwrap_or_else(|| default_data_dir(&env));
        let listen_text = overrides
            .listen
            .clone()
            .or_else(|| env("COUNTERSIGN_LISTEN"))
            .or(file.listen)
            .unwrap_or_else(|| DEFAULT_LISTEN.to_string());
        let listen: SocketAddr = listen_text.parse().with_context(|| {
            format!("listen address {listen_text:?} is not an IP:port such as 127.0.0.1:8787")
        })?;
        let allowed_hosts = match env("COUNTERSIGN_ALLOWED_HOSTS") {
            Some(list) => list
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
            None => file
                .allowed_hosts
                .unwrap_or_else(|| vec!["localhost".into(), "127.0.0.1".into(), "::1".into()]),
        };
        let operator_tools = match env("COUNTERSIGN_OPERATOR_TOOLS") {
            Some(v) => parse_bool("COUNTERSIGN_OPERATOR_TOOLS", &v)?,
            None => file.operator_tools.unwrap_or(false),
        };
        let max_body_bytes = match env("COUNTERSIGN_MAX_BODY_BYTES") {
            Some(v) => v
                .parse()
                .with_context(|| format!("COUNTERSIGN_MAX_BODY_BYTES={v:?} is not a number"))?,
            None => file.max_body_bytes.unwrap_or(1024 * 1024),
        };
        if max_body_bytes < 1024 {
            bail!("max_body_bytes must be at least 1024");
        }
        let feed_poll_ms = match env("COUNTERSIGN_FEED_POLL_MS") {
            Some(v) => v
                .parse()
                .with_context(|| format!("COUNTERSIGN_FEED_POLL_MS={v:?} is not a number"))?,
            // 0: not set; the default depends on the database (below).
            None => file.feed_poll_ms.unwrap_or(0),
        };
        if feed_poll_ms != 0 && !(5..=1000).contains(&feed_poll_ms) {
            bail!("feed_poll_ms must be between 5 and 1000 (it bounds cross-process wake-up)");
        }
        if let Some(origin) = file.log.as_ref().and_then(|l| l.origin.as_deref())
            && (origin.is_empty() || origin.chars().any(|c| c.is_whitespace() || c == '+'))
        {
            bail!("[log] origin {origin:?} must be non-empty, without spaces or '+'");
        }
        let reviewer = match file.review {
            Some(ReviewSection {
                enabled: Some(true),
                reviewer_id,
                reviewer_name,
            }) => {
                let id = reviewer_id.filter(|s| !s.trim().is_empty()).context(
                    "[review] enabled = true needs reviewer_id: the identity recorded for every review",
                )?;
                let name = reviewer_name.unwrap_or_else(|| id.clone());
                Some((id, name))
            }
            _ => None,
        };
        let public_url = env("COUNTERSIGN_PUBLIC_URL")
            .or(file.public_url)
            .unwrap_or_else(|| format!("http://{listen}"));
        if !(public_url.starts_with("http://") || public_url.starts_with("https://")) {
            bail!("public_url {public_url:?} must start with http:// or https://");
        }
        let session_hours = file.session_hours.unwrap_or(12);
        // The URL may carry a password: also readable from a file (a mounted secret).
        let database_url = match (
            overrides.database.clone(),
            env("COUNTERSIGN_DATABASE_URL"),
            env("COUNTERSIGN_DATABASE_URL_FILE"),
        ) {
            (Some(url), _, _) => Some(url),
            (None, Some(url), _) => Some(url),
            (None, None, Some(path)) => Some(
                std::fs::read_to_string(&path)
                    .with_context(|| {
                        format!("could not read COUNTERSIGN_DATABASE_URL_FILE {path}")
                    })?
                    .trim()
                    .to_string(),
            ),
            (None, None, None) => file.database_url.clone(),
        };
        let database = match database_url {
            Some(url) => Database::parse(&url)?,
            None => Database::Sqlite(data_dir.join("countersign.db")),
        };
        // SQLite processes learn of each other's writes by polling; PostgreSQL instances
        // are told at once (NOTIFY), and the poll only covers a lost notification.
        let feed_poll_ms = match (feed_poll_ms, &database) {
            (0, Database::Sqlite(_)) => 50,
            (0, Database::Postgres(_)) => 1000,
            (set, _) => set,
        };
        let keys_dir = env("COUNTERSIGN_KEYS_DIR")
            .map(PathBuf::from)
            .or(file.keys_dir)
            .unwrap_or_else(|| data_dir.join("keys"));
        if !(1..=24 * 30).contains(&session_hours) {
            bail!("session_hours must be between 1 and 720");
        }
        let mut notify = notify_config(file.webhooks, file.notify, file.reminders)?;
        notify.slack = slack_config(file.slack, &env)?;
        notify.email = email_config(file.email, &env)?;
        notify.public_url = public_url.trim_end_matches('/').to_string();
        Ok(Self {
            notify,
            database,
            keys_dir,
            public_url: public_url.trim_end_matches('/').to_string(),
            session_hours,
            log_origin: file.log.and_then(|l| l.origin),
            raw_payload_export: file
                .evidence
                .and_then(|e| e.raw_payload_export)
                .unwrap_or(false),
            reviewer,
            listen,
            data_dir,
            config_file,
            allowed_hosts,
            operator_tools,
            max_body_bytes,
            feed_poll_ms,
            cli_unattended_decisions: file
                .cli
                .and_then(|c| c.unattended_decisions)
                .unwrap_or(false),
        })
    }

    /// The SQLite file, when the data lives in one.
    pub fn database_path(&self) -> PathBuf {
        match &self.database {
            Database::Sqlite(path) => path.clone(),
            Database::Postgres(_) => self.data_dir.join("countersign.db"),
        }
    }

    pub fn keys_dir(&self) -> PathBuf {
        self.keys_dir.clone()
    }
}

fn read_file(path: &Path) -> anyhow::Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("could not read the config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("invalid config file {}", path.display()))
}

fn parse_bool(key: &str, value: &str) -> anyhow::Result<bool> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => bail!("{key}={value:?} is not true or false"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

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
    fn slack_and_email_secrets_come_from_the_file_a_file_or_the_environment() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("c.toml");
        std::fs::write(tmp.path().join("smtp-password"), "from-a-file\n").unwrap();
        std::fs::write(
            &path,
            format!(
                "[slack]\nbot_token = \"xoxb-inline\"\nsigning_secret = \"inline-secret\"\n[slack.approvers]\nU0123ABC = \"Alice\"\n[email]\nsmtp_url = \"smtps://mail.example.com\"\nfrom = \"countersign <approvals@example.com>\"\nusername = \"approvals\"\npassword_file = \"{}\"\n[email.approvers]\n\"Alice@Example.com\" = \"alice\"\n",
                tmp.path().join("smtp-password").display()
            ),
        )
        .unwrap();
        let flags = Overrides {
            config: Some(path.clone()),
            ..Overrides::default()
        };
        let c = Config::resolve(&flags, &[]).unwrap();
        let slack = c.notify.slack.as_ref().unwrap();
        assert_eq!(slack.bot_token, "xoxb-inline");
        assert_eq!(slack.api_base_url, "https://slack.com/api");
        assert_eq!(slack.approvers["U0123ABC"], "alice");
        let email = c.notify.email.as_ref().unwrap();
        assert_eq!(email.password.as_deref(), Some("from-a-file"));
        assert_eq!(email.smtp.port, 465);
        assert_eq!(email.approvers["alice@example.com"], "alice");
        assert!(!email.token_decisions);
        assert_eq!(email.token_minutes, 30);
        assert!(email.follow_ups);
        assert!(!c.notify.is_empty());
        assert!(
            !format!("{c:?}").contains("xoxb-inline"),
            "secrets stay out of Debug"
        );

        let c = Config::resolve(
            &flags,
            &vars(&[
                ("COUNTERSIGN_SLACK_BOT_TOKEN", "xoxb-env"),
                ("COUNTERSIGN_SLACK_SIGNING_SECRET", "env-secret"),
                ("COUNTERSIGN_SMTP_PASSWORD", "env-password"),
            ]),
        )
        .unwrap();
        assert_eq!(c.notify.slack.as_ref().unwrap().bot_token, "xoxb-env");
        assert_eq!(
            c.notify.slack.as_ref().unwrap().signing_secret,
            "env-secret"
        );
        assert_eq!(
            c.notify.email.as_ref().unwrap().password.as_deref(),
            Some("env-password")
        );

        let err = Config::resolve(
            &Overrides::default(),
            &vars(&[
                ("HOME", tmp.path().to_str().unwrap()),
                ("COUNTERSIGN_SLACK_BOT_TOKEN", "xoxb-env"),
            ]),
        )
        .unwrap_err();
        assert!(err.to_string().contains("no [slack] section"), "{err}");
    }

    #[test]
    fn unknown_keys_and_variables_are_errors() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("c.toml");
        std::fs::write(&path, "listne = \"127.0.0.1:1\"\n").unwrap();
        let flags = Overrides {
            config: Some(path),
            ..Overrides::default()
        };
        let err = Config::resolve(&flags, &[]).unwrap_err();
        assert!(format!("{err:#}").contains("listne"), "{err:#}");

        let err = Config::resolve(&Overrides::default(), &vars(&[("COUNTERSIGN_LISTN", "x")]))
            .unwrap_err();
        assert!(err.to_string().contains("COUNTERSIGN_LISTN"));

        let err = Config::resolve(
            &Overrides::default(),
            &vars(&[("COUNTERSIGN_LISTEN", "localhost")]),
        )
        .unwrap_err();
        assert!(err.to_string().contains("not an IP:port"));
    }

    #[test]
    fn the_delivery_history_keeps_at_least_eight_days() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("c.toml");
        let flags = Overrides {
            config: Some(path.clone()),
            ..Overrides::default()
        };
        std::fs::write(&path, "[notify]\nhistory_days = 90\n").unwrap();
        let config = Config::resolve(&flags, &[]).unwrap();
        assert_eq!(config.notify.history_days, 90);
        std::fs::write(&path, "[notify]\nhistory_days = 7\n").unwrap();
        let err = Config::resolve(&flags, &[]).unwrap_err();
        assert!(format!("{err:#}").contains("at least 8"), "{err:#}");
    }
}
