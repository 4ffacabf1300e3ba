//! `countersign grant`: standing grants from the terminal (docs/policies.md#standing-grants),
//! given, listed and revoked as the local user (an admin of this data directory).

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use countersign_core::{Channel, Decider, NewGrant};

use crate::config::Config;
use crate::runtime;

#[derive(Debug, Subcommand)]
pub enum GrantCommand {
    /// Allow an agent a tool, within bounds, for a time or a number of uses.
    Create {
        /// The agent's principal id, e.g. token:deploy-bot.
        #[arg(long)]
        agent: String,
        /// The tool (a request's `tool` detail).
        #[arg(long)]
        tool: String,
        /// A detail a covered request must have with this value (repeatable): KEY=VALUE.
        #[arg(long, value_name = "KEY=VALUE")]
        exact: Vec<String>,
        /// A detail a covered request must have as a number at most this (repeatable):
        /// KEY=NUMBER.
        #[arg(long, value_name = "KEY=NUMBER")]
        max: Vec<String>,
        /// How long it lasts: 90m, 12h, 7d (at most 30d). Default 1h.
        #[arg(long = "for", value_name = "DURATION", default_value = "1h")]
        duration: String,
        /// How many requests it may approve (default: any number until it expires).
        #[arg(long)]
        uses: Option<u32>,
    },
    /// List grants, newest first.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Revoke a grant at once.
    Revoke { id: String },
}

fn pairs(flag: &str, items: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    items
        .iter()
        .map(|item| {
            item.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .with_context(|| format!("--{flag} {item:?}: expected KEY=VALUE"))
        })
        .collect()
}

fn seconds(text: &str) -> anyhow::Result<u64> {
    let text = text.trim();
    let split = text.len().saturating_sub(1);
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().with_context(|| {
        format!("--for {text:?}: expected a number and m, h or d (90m, 12h, 7d)")
    })?;
    let per = match unit {
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => anyhow::bail!("--for {text:?}: expected a number and m, h or d (90m, 12h, 7d)"),
    };
    Ok(n.saturating_mul(per))
}

pub async fn run(config: &Config, command: GrantCommand) -> anyhow::Result<ExitCode> {
    let gate = runtime::open(config).await?;
    let decider = Decider::new(runtime::local_admin())?;
    match command {
        GrantCommand::Create {
            agent,
            tool,
            exact,
            max,
            duration,
            uses,
        } => {
            let new = NewGrant {
                agent,
                tool,
                exact: pairs("exact", &exact)?,
                max: pairs("max", &max)?,
                for_seconds: seconds(&duration)?,
                max_uses: uses,
                from_request: None,
            };
            let grant = gate.create_grant(&decider, new, Channel::Cli).await?;
            println!("{}", grant.id);
            eprintln!(
                "granted {} the tool {} until {}{}",
                grant.agent,
                grant.tool,
                grant.expires_at,
                grant
                    .max_uses
                    .map(|u| format!(", {u} uses"))
                    .unwrap_or_default()
            );
        }
        GrantCommand::List { json } => {
            let now = gate.now();
            let grants = gate.list_grants(&decider, 1000).await?;
            if json {
                let views: Vec<_> = grants
                    .into_iter()
                    .map(|g| countersign_server::views::GrantView::new(g, now))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&views)?);
            } else if grants.is_empty() {
                eprintln!("no grants");
            } else {
                for g in grants {
                    let bounds: Vec<String> = g
                        .exact
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .chain(g.max.iter().map(|(k, v)| format!("{k}<={v}")))
                        .collect();
                    println!(
                        "{}  {:<8}  {} {} [{}]  uses {}{}  until {}  by {}",
                        g.id,
                        g.status(now),
                        g.agent,
                        g.tool,
                        bounds.join(", "),
                        g.uses,
                        g.max_uses.map(|m| format!("/{m}")).unwrap_or_default(),
                        g.expires_at,
                        g.granted_by.display_name
                    );
                }
            }
        }
        GrantCommand::Revoke { id } => {
            let grant = gate.revoke_grant(&decider, &id).await?;
            println!("{} revoked", grant.id);
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_pairs_parse() {
        assert_eq!(seconds("90m").unwrap(), 5400);
        assert_eq!(seconds("2d").unwrap(), 172_800);
        assert!(seconds("soon").is_err());
        assert!(seconds("5y").is_err());
        let p = pairs("max", &["amount=100".into()]).unwrap();
        assert_eq!(p["amount"], "100");
        assert!(pairs("max", &["amount".into()]).is_err());
    }
}
