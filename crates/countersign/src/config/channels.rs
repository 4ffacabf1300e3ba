//! The channels' settings: Slack, email, webhooks, `[notify]` and `[reminders]`, resolved
//! into the server's `NotifyConfig`. Kept apart from the rest of the config because they
//! are most of it: each channel has its secrets, approvers and checks. They start from
//! `NotifyConfig::default()` and the email defaults, and end with `validate()`, so what
//! the server states (defaults, `[notify]` bounds) is not repeated here.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, bail};
use countersign_server::notify::slack::{self, SlackConfig};
use countersign_server::notify::smtp::{self, Security, SmtpUrl};
use countersign_server::notify::{
    self, EVENT_TYPES, EmailConfig, NotifyConfig, ReminderConfig, Route, WebhookConfig,
    WebhookFormat,
};

use super::env::Env;
use super::file::{
    ChannelSections, EmailSection, NotifySection, RemindersSection, SlackSection, WebhookSection,
};

/// Everything about notifications; `public_url` is where their links point.
pub fn resolve(
    sections: ChannelSections,
    env: &Env,
    public_url: &str,
) -> anyhow::Result<NotifyConfig> {
    let mut notify = NotifyConfig {
        webhooks: webhooks(sections.webhooks)?,
        public_url: public_url.to_string(),
        ..NotifyConfig::default()
    };
    if let Some(section) = sections.notify {
        apply_notify(&mut notify, section)?;
    }
    notify.reminders = sections.reminders.map(reminders).transpose()?;
    notify.slack = slack_config(sections.slack, env)?;
    notify.email = email_config(sections.email, env)?;
    notify.validate().map_err(anyhow::Error::msg)?;
    Ok(notify)
}

fn webhooks(sections: Vec<WebhookSection>) -> anyhow::Result<Vec<WebhookConfig>> {
    let mut out: Vec<WebhookConfig> = Vec::new();
    for w in sections {
        let what = format!("webhook {:?}", w.name);
        let shown = countersign_server::notify::webhook::redact_url(&w.url);
        if !(w.url.starts_with("https://") || w.url.starts_with("http://")) {
            bail!("{what}: url {shown} must start with https://");
        }
        if countersign_server::notify::webhook::is_plain_http_off_machine(&w.url)
            && w.allow_plain_http != Some(true)
        {
            bail!(
                "{what}: url {shown} is plain http:// to another machine, where anyone on the way reads and changes what is sent: use https://, or set allow_plain_http = true in this [[webhooks]] section if the network between is trusted"
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
        let format = match w.format.as_deref() {
            None | Some("standard") => WebhookFormat::Standard,
            Some("looppause") => WebhookFormat::LoopPause,
            Some(other) => {
                bail!("{what}: unknown format {other:?}; formats are standard and looppause")
            }
        };
        let secret = secret(&what, w.secret, w.secret_file)?;
        match format {
            WebhookFormat::Standard => {
                countersign_server::notify::webhook::key(&secret)
                    .map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
            }
            // LoopPause's secret is used as it is; it must not be empty.
            WebhookFormat::LoopPause if secret.trim().is_empty() => {
                bail!("{what}: the secret is empty")
            }
            WebhookFormat::LoopPause => {}
        }
        if out.iter().any(|x| x.name == w.name) {
            bail!("{what} is configured twice");
        }
        out.push(WebhookConfig {
            name: w.name,
            url: w.url,
            secret,
            events: w.events,
            format,
        });
    }
    Ok(out)
}

/// `[notify]`: what is set replaces the default; the bounds are checked by `validate`.
fn apply_notify(notify: &mut NotifyConfig, section: NotifySection) -> anyhow::Result<()> {
    notify.default_routes = routes(section.default_routes)?;
    notify.allowed_recipients = routes(section.allowed_recipients)?;
    notify.max_attempts = section.max_attempts.unwrap_or(notify.max_attempts);
    notify.lease_seconds = section.lease_seconds.unwrap_or(notify.lease_seconds);
    notify.history_days = section.history_days.unwrap_or(notify.history_days);
    Ok(())
}

fn reminders(section: RemindersSection) -> anyhow::Result<ReminderConfig> {
    Ok(ReminderConfig {
        after_seconds: section.after_minutes * 60,
        escalate_after_seconds: section.escalate_after_minutes.map(|m| m * 60),
        escalate_to: routes(section.escalate_to)?,
    })
}

fn routes(routes: Vec<String>) -> anyhow::Result<Vec<Route>> {
    routes
        .iter()
        .map(|r| r.parse::<Route>().map_err(|e| anyhow::anyhow!(e)))
        .collect()
}

fn slack_config(section: Option<SlackSection>, env: &Env) -> anyhow::Result<Option<SlackConfig>> {
    let Some(s) = section else {
        for key in [
            "COUNTERSIGN_SLACK_BOT_TOKEN",
            "COUNTERSIGN_SLACK_SIGNING_SECRET",
        ] {
            if env.get(key).is_some() {
                bail!(
                    "{key} is set but the config has no [slack] section (it names the approvers)"
                );
            }
        }
        return Ok(None);
    };
    let bot_token = secret_with_env(
        "[slack] bot_token",
        env.get("COUNTERSIGN_SLACK_BOT_TOKEN"),
        s.bot_token,
        s.bot_token_file,
    )?;
    let signing_secret = secret_with_env(
        "[slack] signing_secret",
        env.get("COUNTERSIGN_SLACK_SIGNING_SECRET"),
        s.signing_secret,
        s.signing_secret_file,
    )?;
    let api_base_url = slack_api_base_url(s.api_base_url)?;
    let mut approvers = BTreeMap::new();
    for (user, username) in s.approvers {
        if !slack::is_user_id(&user) {
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

/// `[slack] api_base_url`, by default Slack's own.
fn slack_api_base_url(set: Option<String>) -> anyhow::Result<String> {
    let url = set.unwrap_or_else(|| slack::DEFAULT_API_BASE_URL.to_string());
    slack::check_api_base_url(&url).map_err(anyhow::Error::msg)
}

fn email_config(section: Option<EmailSection>, env: &Env) -> anyhow::Result<Option<EmailConfig>> {
    let Some(e) = section else {
        if env.get("COUNTERSIGN_SMTP_PASSWORD").is_some() {
            bail!("COUNTERSIGN_SMTP_PASSWORD is set but the config has no [email] section");
        }
        return Ok(None);
    };
    let smtp = SmtpUrl::parse(&e.smtp_url).map_err(|m| anyhow::anyhow!("[email] {m}"))?;
    smtp::check_address(&e.from).map_err(|m| anyhow::anyhow!("[email] from: {m}"))?;
    let env_password = env
        .get("COUNTERSIGN_SMTP_PASSWORD")
        .filter(|v| !v.is_empty());
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
        Some(path) => Some(smtp::load_ca_file(path).map_err(|m| anyhow::anyhow!(m))?),
    };
    let mut approvers = BTreeMap::new();
    for (address, username) in e.approvers {
        smtp::check_address(&address).map_err(|m| anyhow::anyhow!("[email.approvers] {m}"))?;
        let username = approver_username(&format!("[email.approvers] {address}"), &username)?;
        approvers.insert(address.trim().to_ascii_lowercase(), username);
    }
    let token_minutes = e.token_minutes.unwrap_or(notify::DEFAULT_TOKEN_MINUTES);
    Ok(Some(EmailConfig {
        smtp,
        from: e.from,
        username: e.username,
        password,
        extra_roots,
        approvers,
        token_decisions: e.token_decisions.unwrap_or(notify::DEFAULT_TOKEN_DECISIONS),
        token_minutes,
        follow_ups: e.follow_ups.unwrap_or(notify::DEFAULT_FOLLOW_UPS),
    }))
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

#[cfg(test)]
mod tests {
    use crate::config::testing::{ConfigFile, vars};
    use crate::config::{Config, Overrides};

    #[test]
    fn plain_http_webhooks_go_only_to_this_machine_unless_allowed_and_errors_hide_secrets() {
        let file = ConfigFile::new();
        let hook = |url: &str, extra: &str| {
            format!(
                "[[webhooks]]\nname = \"audit\"\nurl = \"{url}\"\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n{extra}"
            )
        };
        let err = file
            .resolve(&hook("http://hooks.example.com/in?token=s3cret", ""))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("plain http://") && err.contains("allow_plain_http"),
            "{err}"
        );
        assert!(!err.contains("s3cret"), "{err}");
        assert!(err.contains("http://hooks.example.com/in?***"), "{err}");
        let allowed = file
            .resolve(&hook(
                "http://hooks.example.com/in",
                "allow_plain_http = true\n",
            ))
            .unwrap();
        assert_eq!(allowed.notify.webhooks.len(), 1);
        file.resolve(&hook("http://127.0.0.1:9000/in", "")).unwrap();
        file.resolve(&hook("https://hooks.example.com/in", ""))
            .unwrap();
        let err = file
            .resolve(&hook("ftp://u:pw@hooks.example.com/", ""))
            .unwrap_err()
            .to_string();
        assert!(!err.contains("pw@"), "{err}");
    }

    #[test]
    fn a_webhook_is_standard_unless_its_format_says_looppause() {
        use countersign_server::notify::WebhookFormat;
        let file = ConfigFile::new();
        let hook = |secret: &str, extra: &str| {
            format!(
                "[[webhooks]]\nname = \"lp\"\nurl = \"https://hooks.example.com/in\"\nsecret = \"{secret}\"\n{extra}"
            )
        };
        let standard = file
            .resolve(&hook("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", ""))
            .unwrap();
        assert_eq!(standard.notify.webhooks[0].format, WebhookFormat::Standard);
        // LoopPause's secret is any string, used as it is; a standard one must be whsec_.
        let lp = file
            .resolve(&hook("lp secret!", "format = \"looppause\"\n"))
            .unwrap();
        assert_eq!(lp.notify.webhooks[0].format, WebhookFormat::LoopPause);
        assert_eq!(lp.notify.webhooks[0].secret, "lp secret!");
        file.resolve(&hook("lp secret!", "")).unwrap_err();
        let err = file
            .resolve(&hook("x", "format = \"svix\"\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("standard and looppause"), "{err}");
    }

    #[test]
    fn slack_and_email_secrets_come_from_the_file_a_file_or_the_environment() {
        let file = ConfigFile::new();
        let tmp = &file.dir;
        std::fs::write(tmp.path().join("smtp-password"), "from-a-file\n").unwrap();
        let c = file
            .resolve(&format!(
                "[slack]\nbot_token = \"xoxb-inline\"\nsigning_secret = \"inline-secret\"\n[slack.approvers]\nU0123ABC = \"Alice\"\n[email]\nsmtp_url = \"smtps://mail.example.com\"\nfrom = \"countersign <approvals@example.com>\"\nusername = \"approvals\"\npassword_file = \"{}\"\n[email.approvers]\n\"Alice@Example.com\" = \"alice\"\n",
                tmp.path().join("smtp-password").display()
            ))
            .unwrap();
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
            &file.flags,
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
    fn the_delivery_history_keeps_at_least_eight_days() {
        let file = ConfigFile::new();
        let config = file.resolve("[notify]\nhistory_days = 90\n").unwrap();
        assert_eq!(config.notify.history_days, 90);
        let err = file.resolve("[notify]\nhistory_days = 7\n").unwrap_err();
        assert!(format!("{err:#}").contains("at least 8"), "{err:#}");
    }

    #[test]
    fn notify_starts_from_the_servers_defaults_and_keeps_its_bounds() {
        use countersign_server::notify::NotifyConfig;
        let file = ConfigFile::new();
        let config = file.resolve("[notify]\ndefault_routes = []\n").unwrap();
        let defaults = NotifyConfig::default();
        assert_eq!(config.notify.max_attempts, defaults.max_attempts);
        assert_eq!(config.notify.lease_seconds, defaults.lease_seconds);
        assert_eq!(config.notify.history_days, defaults.history_days);
        for (key, message) in [
            ("max_attempts", "[notify] max_attempts must be at least 1"),
            ("lease_seconds", "[notify] lease_seconds must be at least 1"),
        ] {
            let err = file.resolve(&format!("[notify]\n{key} = 0\n")).unwrap_err();
            assert_eq!(err.to_string(), message);
        }
    }

    #[test]
    fn requests_may_name_mapped_approvers_listed_recipients_and_the_routes() {
        use countersign_server::notify::Route;
        let file = ConfigFile::new();
        let c = file
            .resolve(
                "[notify]\ndefault_routes = [\"email:ops@example.com\"]\nallowed_recipients = [\"slack:#approvals\", \"email:Finance@Example.com\"]\n[email]\nsmtp_url = \"smtp://127.0.0.1:2525\"\nfrom = \"countersign <approvals@example.com>\"\n[email.approvers]\n\"alice@example.com\" = \"alice\"\n",
            )
            .unwrap();
        assert_eq!(
            c.notify.allowed_recipients,
            [
                Route::Slack("#approvals".into()),
                Route::Email("Finance@Example.com".into())
            ]
        );
        let known = c.notify.recipients();
        assert_eq!(known.email["alice@example.com"].as_deref(), Some("alice"));
        assert_eq!(known.email["finance@example.com"], None);
        assert_eq!(known.email["ops@example.com"], None);
        assert_eq!(known.slack["#approvals"], None);
        assert!(!known.email.contains_key("mallory@evil.example"));
        let err = file
            .resolve("[notify]\nallowed_recipients = [\"mallory@evil.example\"]\n")
            .unwrap_err();
        assert!(err.to_string().contains("email:<address>"), "{err}");
    }
}
