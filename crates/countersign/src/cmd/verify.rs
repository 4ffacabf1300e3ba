use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;
use countersign_core::proof::{self, VerifyOptions};
use countersign_core::{Action, Envelope, Jwks, Timestamp};
use countersign_server::KeyRing;
use serde_json::Value;

use crate::config::Config;

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The proof: a DSSE envelope, or a request as the API returns it (with a `proof`
    /// field). `-` reads standard input.
    pub proof: PathBuf,
    /// Verify against this JWKS file (default: the keys in the data directory, whose
    /// database also tells whether the approval was already used).
    #[arg(long, value_name = "FILE", conflicts_with = "server")]
    pub jwks: Option<PathBuf>,
    /// Fetch the JWKS from this countersign server (e.g. http://127.0.0.1:8787).
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// The action about to run, as JSON {"description": ..., "details": {...}}; the proof
    /// must be for exactly this action.
    #[arg(long, value_name = "FILE")]
    pub action: Option<PathBuf>,
    /// Judge validity at this time (RFC 3339) instead of now, e.g. when the action ran.
    #[arg(long, value_name = "TIME")]
    pub at: Option<String>,
    /// Print the full report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(config: &Config, args: &VerifyArgs) -> anyhow::Result<ExitCode> {
    let (envelope, mut used) = read_envelope(&args.proof)?;
    let jwks = load_jwks(config, args).await?;
    if args.jwks.is_none() && args.server.is_none() && used.is_none() {
        used = local_use(config, &envelope).await?;
    }
    let action = args.action.as_deref().map(read_action).transpose()?;
    let now = match &args.at {
        Some(at) => {
            Timestamp::parse(at).with_context(|| format!("--at {at:?} is not an RFC 3339 time"))?
        }
        None => countersign_core::Clock::now(&countersign_core::SystemClock),
    };
    let report = proof::verify(
        &envelope,
        &jwks,
        &VerifyOptions {
            now: Some(now),
            expected_action: action.as_ref(),
            used,
        },
    );
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if report.valid {
        if let Some(s) = &report.statement {
            let by: Vec<String> = s
                .approvers
                .iter()
                .map(|a| format!("{} via {}", a.display_name, a.channel.as_str()))
                .collect();
            println!(
                "valid: {} {} by {} for {} (valid until {}, key {})",
                s.request_id,
                s.decision.as_str(),
                by.join(", "),
                s.action_digest,
                s.valid_until,
                report.keyid.as_deref().unwrap_or("?")
            );
        }
        if !report.bound {
            eprintln!(
                "warning: the action was not checked (no --action): the proof is genuine and approves the action it names, which may not be the one about to run"
            );
        }
    } else {
        println!("INVALID proof:");
        for reason in &report.reasons {
            println!(
                "  - {}: {}",
                serde_json::to_value(reason.code)?.as_str().unwrap_or("?"),
                reason.message
            );
        }
    }
    Ok(if report.valid {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn read_json(path: &Path) -> anyhow::Result<Value> {
    let mut text = String::new();
    if path == Path::new("-") {
        std::io::stdin()
            .read_to_string(&mut text)
            .context("could not read standard input")?;
    } else {
        text = std::fs::read_to_string(path)
            .with_context(|| format!("could not read {}", path.display()))?;
    }
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}

/// The envelope, and the use recorded beside it when the file is a request as the API
/// returns it (a file that says the approval was used is believed: that only makes the
/// verdict stricter).
fn read_envelope(path: &Path) -> anyhow::Result<(Envelope, Option<(Timestamp, String)>)> {
    let value = read_json(path)?;
    let mut used = None;
    let envelope = if value.get("payloadType").is_some() {
        value
    } else if let Some(proof) = value.get("proof").filter(|p| !p.is_null()) {
        if let Some(record) = value.get("used").filter(|u| !u.is_null()) {
            let at = record
                .get("recorded_at")
                .and_then(Value::as_str)
                .and_then(|t| Timestamp::parse(t).ok());
            let tool = record.get("tool").and_then(Value::as_str).unwrap_or("?");
            if let Some(at) = at {
                used = Some((at, tool.to_string()));
            }
        }
        proof.clone()
    } else {
        bail!(
            "{} holds neither a DSSE envelope (payloadType, payload, signatures) nor a decided request with a proof",
            path.display()
        );
    };
    let envelope = serde_json::from_value(envelope)
        .with_context(|| format!("{} is not a valid DSSE envelope", path.display()))?;
    Ok((envelope, used))
}

/// Whether the data directory's database records a use of this proof's approval.
async fn local_use(
    config: &Config,
    envelope: &Envelope,
) -> anyhow::Result<Option<(Timestamp, String)>> {
    let Some(statement) = envelope.unverified_statement() else {
        return Ok(None);
    };
    if let crate::config::Database::Sqlite(db) = &config.database
        && !db.exists()
    {
        return Ok(None);
    }
    let store = crate::runtime::open_store(config).await?;
    let request = store.get_request(&statement.request_id).await?;
    Ok(request
        .filter(|r| r.action_digest == statement.action_digest)
        .and_then(|r| r.used()))
}

fn read_action(path: &Path) -> anyhow::Result<Action> {
    let value = read_json(path)?;
    let (description, details) = if value.get("description").is_some() {
        (value.get("description"), value.get("details"))
    } else {
        (value.get("action_description"), value.get("action_details"))
    };
    let description = description.and_then(Value::as_str).with_context(|| {
        format!(
            "{}: expected {{\"description\": string, \"details\": {{...}}}}",
            path.display()
        )
    })?;
    let details = match details {
        None | Some(Value::Null) => Default::default(),
        Some(d) => serde_json::from_value(d.clone())
            .with_context(|| format!("{}: details must map strings to strings", path.display()))?,
    };
    Ok(Action::new(description, details))
}

async fn load_jwks(config: &Config, args: &VerifyArgs) -> anyhow::Result<Jwks> {
    if let Some(path) = &args.jwks {
        let value = read_json(path)?;
        return serde_json::from_value(value)
            .with_context(|| format!("{} is not a JWKS ({{\"keys\": [...]}})", path.display()));
    }
    if let Some(server) = &args.server {
        return server_jwks(server).await;
    }
    data_dir_jwks(config).await
}

/// The JWKS a countersign server publishes (its trusted keys).
pub async fn server_jwks(server: &str) -> anyhow::Result<Jwks> {
    let url = format!("{}/.well-known/jwks.json", server.trim_end_matches('/'));
    let response = reqwest::get(&url)
        .await
        .with_context(|| format!("could not fetch {url}"))?;
    if !response.status().is_success() {
        bail!("{url} answered {}", response.status());
    }
    response
        .json()
        .await
        .with_context(|| format!("{url} did not return a JWKS"))
}

/// The keys the data directory trusts: its key files, and (when its database exists) the
/// keys they endorsed in the log.
pub async fn data_dir_jwks(config: &Config) -> anyhow::Result<Jwks> {
    let keys = KeyRing::open_existing(&config.keys_dir()).with_context(|| {
        format!(
            "no keys in {}; give --jwks FILE or --server URL",
            config.keys_dir().display()
        )
    })?;
    if let crate::config::Database::Sqlite(db) = &config.database
        && !db.exists()
    {
        return Ok(keys.jwks());
    }
    let store = crate::runtime::open_store(config).await?;
    Ok(countersign_server::keyring::published_jwks(&*store, &keys).await?)
}
