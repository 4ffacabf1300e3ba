use std::net::TcpListener;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::ExitCode;

use clap::Args;
use countersign_server::KeyRing;
use std::sync::Arc;

use countersign_postgres::PostgresStore;
use countersign_sqlite::SqliteStore;
use countersign_store::Store;

use crate::config::{Config, Database};

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The address `serve` would listen on (default from the config).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
}

struct Report {
    failed: bool,
}

impl Report {
    fn ok(&self, what: &str) {
        println!("ok    {what}");
    }
    fn warn(&self, what: &str) {
        println!("warn  {what}");
    }
    fn fail(&mut self, what: &str) {
        self.failed = true;
        println!("FAIL  {what}");
    }
}

/// Checks, in words, what `serve` and `mcp` need.
pub async fn run(config: &Config) -> anyhow::Result<ExitCode> {
    let mut r = Report { failed: false };
    match &config.config_file {
        Some(path) => r.ok(&format!("config file {} is valid", path.display())),
        None => r.ok("no config file; using defaults and COUNTERSIGN_* variables"),
    }
    for warning in &config.warnings {
        r.warn(warning);
    }
    check_channels(config, &mut r).await;
    check_gateways(config, &mut r).await;

    let dir = &config.data_dir;
    if !dir.exists() {
        r.fail(&format!(
            "data directory {} does not exist; `countersign serve` or `countersign mcp` creates it",
            dir.display()
        ));
        return Ok(finish(&r));
    }
    match std::fs::metadata(dir) {
        Ok(meta) if !meta.is_dir() => r.fail(&format!("{} is not a directory", dir.display())),
        Ok(meta) => {
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                r.warn(&format!(
                    "data directory {} has mode {mode:o}; other users can read it (chmod 700 {})",
                    dir.display(),
                    dir.display()
                ));
            } else {
                r.ok(&format!("data directory {} (mode {mode:o})", dir.display()));
            }
            owner_check(&r, dir, meta.uid());
        }
        Err(e) => r.fail(&format!("cannot read {}: {e}", dir.display())),
    }

    let store: Option<Arc<dyn Store>> = match &config.database {
        Database::Sqlite(db) if !db.exists() => {
            r.fail(&format!(
                "no database at {} yet; start countersign once",
                db.display()
            ));
            None
        }
        Database::Sqlite(db) => match SqliteStore::open(db) {
            Ok(store) => Some(Arc::new(store)),
            Err(e) => {
                r.fail(&format!("cannot open database {}: {e}", db.display()));
                None
            }
        },
        Database::Postgres(url) => {
            match PostgresStore::connect_lazy(url, &countersign_postgres::Options::default()) {
                Ok(store) => {
                    match store.server_info().await {
                        Ok(info) => {
                            r.ok(&format!(
                                "PostgreSQL {} at {} (schema {}, version {})",
                                info.server_version,
                                store.target(),
                                info.schema,
                                info.schema_version
                            ));
                            if info.synchronous_commit != "on" {
                                r.fail(&format!(
                                    "synchronous_commit is {}: acknowledged decisions could be lost in a crash; set it to on",
                                    info.synchronous_commit
                                ));
                            }
                            if info.read_only || info.in_recovery {
                                r.fail("the database is read-only (a standby?): point countersign at the primary");
                            }
                        }
                        Err(e) => r.fail(&format!("{}: {e}", config.database.describe())),
                    }
                    Some(Arc::new(store))
                }
                Err(e) => {
                    r.fail(&format!("{}: {e}", config.database.describe()));
                    None
                }
            }
        }
    };
    if let Some(store) = &store {
        match store.check().await {
            Ok(()) => {
                r.ok(&format!(
                    "database {} answers and is writable",
                    config.database.describe()
                ));
                match store.list_tokens().await {
                    Ok(tokens) => check_tokens(config, &tokens, &mut r),
                    Err(e) => r.fail(&format!("cannot read tokens: {e}")),
                }
            }
            Err(e) => r.fail(&format!("database {}: {e}", config.database.describe())),
        }
        check_approver_accounts(config, store, &mut r).await;
        check_audit(config, &**store, &mut r).await;
    }
    check_policies(config, &mut r);

    match KeyRing::open_existing(&config.keys_dir()) {
        Ok(keys) => {
            r.ok(&format!(
                "signing key {} ({} key file(s))",
                keys.signer().kid(),
                keys.jwks().keys.len()
            ));
            if let Some(store) = &store {
                check_anchored_keys(store.as_ref(), &keys, &mut r).await;
            }
        }
        Err(e) => r.fail(&format!("signing key: {e}")),
    }

    let addr = config.listen;
    match TcpListener::bind(addr) {
        Ok(_) => r.ok(&format!("{addr} is free to listen on")),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            let url = format!("http://{addr}/healthz");
            let ours = reqwest::get(&url)
                .await
                .ok()
                .filter(|resp| resp.status().is_success());
            match ours {
                Some(_) => r.ok(&format!("countersign is already serving on {addr}")),
                None => r.fail(&format!(
                    "{addr} is in use by another program; choose another with --listen or COUNTERSIGN_LISTEN"
                )),
            }
        }
        Err(e) => r.fail(&format!("cannot listen on {addr}: {e}")),
    }
    if !addr.ip().is_loopback() {
        if countersign_server::hosts::only_loopback(&config.allowed_hosts) {
            r.warn(&format!(
                "listening on {} but allowed_hosts only has loopback names: remote clients will get 403; add the server's hostname",
                addr.ip()
            ));
        } else {
            r.warn(&format!(
                "listening on {}: put countersign behind TLS (a reverse proxy) before exposing it",
                addr.ip()
            ));
        }
    }
    Ok(finish(&r))
}

/// How many tokens work, tokens that share a name (made before names were unique: they
/// act as one principal), and whether the configured reviewer is a token that works.
/// The keys trusted here, and every key published in the database that is not (a key
/// that exists only as a database row).
async fn check_anchored_keys(store: &dyn Store, keys: &KeyRing, r: &mut Report) {
    match countersign_server::keyring::published_jwks(store, keys).await {
        Ok(jwks) => r.ok(&format!(
            "{} trusted key(s): the key files and the keys they endorsed in the log",
            jwks.keys.len()
        )),
        Err(e) => r.fail(&format!("cannot read the key endorsements: {e}")),
    }
    match countersign_server::keyring::untrusted_candidates(store, keys).await {
        Ok(untrusted) => {
            for kid in untrusted {
                r.fail(&format!(
                    "key {kid} is published in the database but not traceable to a key file (no endorsement in the log): it is neither trusted nor published. If it is one of your instances' keys, run `countersign keys trust {kid}` where a trusted key is held; if not, someone with write access to the database added it"
                ));
            }
        }
        Err(e) => r.fail(&format!("cannot read the published keys: {e}")),
    }
}

fn check_tokens(config: &Config, tokens: &[countersign_core::TokenRecord], r: &mut Report) {
    let now = countersign_core::Clock::now(&countersign_core::SystemClock);
    let usable = tokens.iter().filter(|t| t.is_usable(now)).count();
    if usable > 0 {
        r.ok(&format!("{usable} active token(s)"));
    } else {
        r.warn("no active tokens: HTTP clients cannot authenticate (countersign token create --role agent --name NAME)");
    }
    let mut by_name: std::collections::BTreeMap<String, Vec<&str>> = Default::default();
    for t in tokens.iter().filter(|t| t.is_active()) {
        by_name
            .entry(countersign_core::token::name_key(&t.name))
            .or_default()
            .push(&t.id);
    }
    for (name, ids) in by_name.iter().filter(|(_, ids)| ids.len() > 1) {
        r.warn(&format!(
            "tokens {} share the name {name:?} (made before names were unique): they act as one principal, token:{name}, with one another's requests and approvals; revoke all but one",
            ids.join(", ")
        ));
    }
    if let Some(reviewer) = &config.reviewer
        && let Some(name) = reviewer.principal.strip_prefix("token:")
        && !tokens.iter().any(|t| t.name == name && t.is_usable(now))
    {
        r.warn(&format!(
            "[review] reviewer is {}, but no active token has that name: nobody can record reviews",
            reviewer.principal
        ));
    }
}

/// Slack, email and webhooks: each configured channel gets an ok or FAIL line.
/// Each `[[gateway]]` upstream started (or reached) and asked for its tools, as `serve`
/// will; then stopped.
async fn check_gateways(config: &Config, r: &mut Report) {
    for gateway in &config.gateways {
        for upstream in gateway.upstreams() {
            let what = format!(
                "gateway {} upstream {} ({}{})",
                gateway.name,
                upstream.name,
                upstream.transport().describe(),
                if upstream.trusted { ", trusted" } else { "" }
            );
            match upstream.refresh().await {
                Ok(tools) => {
                    let read_only = tools
                        .iter()
                        .filter(|t| {
                            t.annotations
                                .as_ref()
                                .and_then(|a| a.read_only_hint)
                                .unwrap_or(false)
                        })
                        .count();
                    r.ok(&format!(
                        "{what}: {} tools, {read_only} marked read-only{}",
                        tools.len(),
                        if upstream.trusted || read_only == 0 {
                            ""
                        } else {
                            " (not trusted: they are held like the rest)"
                        }
                    ));
                }
                Err(e) => r.fail(&format!("{what}: {}", e.message)),
            }
            upstream.close().await;
        }
    }
}

async fn check_channels(config: &Config, r: &mut Report) {
    use countersign_server::notify::{Route, slack, smtp};
    let notify = &config.notify;
    let http = match reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(10))
        .build()
    {
        Ok(http) => http,
        Err(e) => {
            r.fail(&format!("cannot build an HTTP client: {e}"));
            return;
        }
    };
    let public_is_loopback = reqwest::Url::parse(&config.public_url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_string))
        .is_some_and(|h| countersign_server::hosts::is_loopback(&h));
    match &notify.slack {
        None => r.ok("Slack: not configured"),
        Some(s) => {
            match slack::auth_test(&http, s).await {
                Ok(who) => r.ok(&format!("Slack: {who} ({})", s.api_base_url)),
                Err(e) => r.fail(&format!("Slack: {e}")),
            }
            if s.approvers.is_empty() {
                r.warn("Slack: [slack.approvers] is empty, so nobody can decide from Slack (clicks are refused)");
            } else {
                r.ok(&format!(
                    "Slack: {} approver(s) mapped; interactivity URL {}/slack/interactivity",
                    s.approvers.len(),
                    config.public_url
                ));
            }
            if public_is_loopback {
                r.warn(&format!(
                    "Slack: public_url is {}, which Slack cannot reach: set public_url to this server's public https:// address",
                    config.public_url
                ));
            } else {
                // What doctor can see from here; whether Slack reaches it, Slack says.
                r.ok(&format!(
                    "Slack: public_url {} is not a loopback address (doctor cannot tell whether Slack reaches it: Slack checks the Request URL when it is saved in the app's Interactivity settings)",
                    config.public_url
                ));
            }
        }
    }
    match &notify.email {
        None => r.ok("email: not configured"),
        Some(e) => {
            match smtp::test_connection(e).await {
                Ok(()) => r.ok(&format!(
                    "email: connected to {}{}",
                    e.smtp.describe(),
                    if e.username.is_some() {
                        " and signed in"
                    } else {
                        ""
                    }
                )),
                Err(err) => r.fail(&format!("email: {err}")),
            }
            if e.token_decisions {
                r.ok(&format!(
                    "email: one-time decision links are on ({} minutes, single use)",
                    e.token_minutes
                ));
                if config.public_url.starts_with("http://") && !public_is_loopback {
                    r.warn("email: decision links use public_url over plain http://; put countersign behind TLS");
                }
            }
        }
    }
    for w in &notify.webhooks {
        // Shown redacted: a token in the URL's query or userinfo stays in the config.
        let shown = countersign_server::notify::webhook::redact_url(&w.url);
        match reqwest::Url::parse(&w.url) {
            Ok(url) if url.host_str().is_some() => {
                if countersign_server::notify::webhook::is_plain_http_off_machine(&w.url) {
                    r.warn(&format!(
                        "webhook {}: {shown} is plain http:// (allowed by allow_plain_http = true); receivers should use https://",
                        w.name
                    ));
                } else {
                    r.ok(&format!("webhook {}: {shown}", w.name));
                }
            }
            Ok(_) => r.fail(&format!("webhook {}: {shown} has no host", w.name)),
            Err(e) => r.fail(&format!("webhook {}: {shown} is not a URL: {e}", w.name)),
        }
    }
    let mut routes: Vec<&Route> = notify.default_routes.iter().collect();
    if let Some(rem) = &notify.reminders {
        routes.extend(rem.escalate_to.iter());
    }
    for route in routes {
        match route {
            Route::Slack(to) if notify.slack.is_none() => r.fail(&format!(
                "route slack:{to} is configured but Slack is not ([slack])"
            )),
            Route::Email(to) if notify.email.is_none() => r.fail(&format!(
                "route email:{to} is configured but email is not ([email])"
            )),
            _ => {}
        }
    }
}

/// Every approver mapping points at an account that can decide.
async fn check_approver_accounts(config: &Config, store: &Arc<dyn Store>, r: &mut Report) {
    let mut mappings: Vec<(String, String)> = Vec::new();
    if let Some(s) = &config.notify.slack {
        for (id, user) in &s.approvers {
            mappings.push((format!("[slack.approvers] {id}"), user.clone()));
        }
    }
    if let Some(e) = &config.notify.email {
        for (address, user) in &e.approvers {
            mappings.push((format!("[email.approvers] {address}"), user.clone()));
        }
    }
    for (what, username) in mappings {
        let doc = store.doc_by_key("user", &username).await;
        match doc {
            Ok(Some(doc)) => {
                let disabled = doc.body.get("disabled").and_then(|v| v.as_bool()) == Some(true);
                let active = doc.body.get("password_hash").is_some_and(|v| !v.is_null());
                let role = doc.body.get("role").and_then(|v| v.as_str()).unwrap_or("");
                if disabled {
                    r.warn(&format!("{what} → {username}: that account is disabled"));
                } else if !active {
                    r.warn(&format!("{what} → {username}: that account has not accepted its invitation yet"));
                } else if !matches!(role, "approver" | "admin") {
                    r.warn(&format!("{what} → {username}: that account cannot decide (role {role})"));
                }
            }
            Ok(None) => r.warn(&format!(
                "{what} → {username}: no dashboard account has that username (countersign user add --username {username} --role approver)"
            )),
            Err(e) => r.fail(&format!("cannot read accounts: {e}")),
        }
    }
}

/// The user who runs this command: under `sudo -u <service user>`, the one who called
/// sudo (`SUDO_UID`); otherwise this process's user (the owner of `/proc/self`).
fn current_uid() -> Option<u32> {
    std::env::var("SUDO_UID")
        .ok()
        .and_then(|u| u.parse().ok())
        .or_else(|| std::fs::metadata("/proc/self").ok().map(|m| m.uid()))
}

/// Warns when the data directory belongs to the user running this command: an agent
/// whose shell runs as that user can read the signing key, write the database, decide
/// from the CLI and change its own client's settings. `serve` belongs under its own OS
/// user (docs/deployment.md).
fn owner_check(r: &Report, dir: &std::path::Path, owner: u32) {
    match current_uid() {
        Some(me) if me == owner => r.warn(&format!(
            "the data directory {} is owned by uid {owner}, the user running this command: an agent whose shell runs as this user can read the signing key and edit the database; run `countersign serve` as its own OS user and give agents only a token",
            dir.display()
        )),
        Some(me) => r.ok(&format!(
            "the data directory belongs to uid {owner}, not to this user (uid {me})"
        )),
        None => {}
    }
}

/// Whether the policy files load (what `serve` would put in force).
fn check_policies(config: &Config, r: &mut Report) {
    let Some(policy) = &config.policy else {
        r.ok("no [policy] files: one person decides every request");
        return;
    };
    let loaded = countersign_server::gate::read_policy_files(&policy.files)
        .and_then(|files| countersign_server::gate::load_policy_set(files, &config.guards.groups));
    match loaded {
        Ok(set) => r.ok(&format!(
            "policies: {} in {} file(s), zone {}, policy set {}",
            set.policies().len(),
            set.files().len(),
            policy.zone.name(),
            set.digest()
        )),
        Err(e) => r.fail(&format!(
            "the policy files do not load ({e}); serve will not start with them, and a running serve keeps the set it has"
        )),
    }
}

/// What the scheduled audit (`[audit] interval`) last found.
async fn check_audit(config: &Config, store: &dyn Store, r: &mut Report) {
    let last = match store.doc_get(countersign_store::kinds::AUDIT, "last").await {
        Ok(doc) => {
            doc.map(|d| serde_json::from_value::<countersign_server::audit::AuditStatus>(d.body))
        }
        Err(e) => {
            r.fail(&format!("cannot read the last audit: {e}"));
            return;
        }
    };
    match (last, config.audit_interval) {
        (Some(Ok(status)), _) if status.ok => r.ok(&format!(
            "the last audit ({}) held {} rows to {} log entries: they agree",
            status.at, status.rows, status.entries
        )),
        (Some(Ok(status)), _) => {
            let shown: Vec<&str> = status.shown.iter().take(5).map(String::as_str).collect();
            r.fail(&format!(
                "the last audit ({}) found {} difference(s) between the database and its log, e.g. {}; `countersign log verify` names each",
                status.at,
                status.differences,
                shown.join("; ")
            ));
        }
        (Some(Err(e)), _) => r.fail(&format!("the last audit's result does not read: {e}")),
        (None, Some(every)) => r.ok(&format!(
            "serve audits the database against the log every {} s (no audit has run yet)",
            every.as_secs()
        )),
        (None, None) => r.ok(
            "[audit] interval is off: `countersign log verify` holds the database to the log when run",
        ),
    }
}

fn finish(r: &Report) -> ExitCode {
    if r.failed {
        println!("\nsome checks failed: see FAIL lines above");
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
