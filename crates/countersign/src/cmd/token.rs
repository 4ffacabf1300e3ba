use std::process::ExitCode;

use clap::Subcommand;
use countersign_core::{Role, Scopes};
use countersign_server::gate::NewToken;

use crate::config::Config;
use crate::runtime;

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token; prints it once, alone on stdout.
    Create {
        /// agent (asks), executor (verifies and redeems proofs before acting), approver
        /// (decides) or admin (decides and manages tokens).
        #[arg(long)]
        role: Role,
        /// Who holds it: shown in requests and proofs (e.g. deploy-bot, alice@example.com).
        /// Unique forever: a name is never given to a second token, even after the
        /// first is revoked.
        #[arg(long)]
        name: String,
        /// When it stops working: a duration (90m, 12h, 30d, 2w) or a UTC time such as
        /// 2027-01-31T00:00:00Z. Without it, the token works until revoked.
        #[arg(long, value_name = "WHEN")]
        expires: Option<String>,
        /// What it may reach, comma-separated, within its role: request, rooms,
        /// evidence, verify, redeem, gateway, decide, admin. Without it, all its role may
        /// but `gateway`, which an agent token has only when named (a token for a remote
        /// `proxy`, `hook` or `exec`: docs/gateway.md).
        #[arg(long, value_name = "LIST", value_parser = Scopes::parse_list)]
        scopes: Option<Scopes>,
    },
    /// List tokens (never their secrets).
    List {
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token by id (or by name, if one active token has it).
    Revoke { id: String },
}

pub async fn run(config: &Config, command: TokenCommand) -> anyhow::Result<ExitCode> {
    let gate = runtime::open(config).await?;
    let actor = runtime::local_admin();
    match command {
        TokenCommand::Create {
            role,
            name,
            expires,
            scopes,
        } => {
            let new = NewToken {
                name,
                role,
                expires,
                scopes,
            };
            let (record, secret) = gate.create_token_as(new, &actor).await?;
            println!("{secret}");
            eprintln!(
                "created {} token {} for {:?} (scopes {}; {}); it is shown only this once",
                record.role,
                record.id,
                record.name,
                record.effective_scopes(),
                match record.expires_at {
                    Some(at) => format!("expires {at}"),
                    None => "does not expire".into(),
                }
            );
        }
        TokenCommand::List { json } => {
            let tokens = gate.list_tokens().await?;
            let now = gate.now();
            if json {
                let rows: Vec<_> = tokens
                    .iter()
                    .map(|t| {
                        serde_json::json!({
                            "id": t.id, "name": t.name, "role": t.role,
                            "scopes": t.effective_scopes(),
                            "scoped": t.scopes.is_some(),
                            "created_at": t.created_at.to_string(),
                            "expires_at": t.expires_at.map(|r| r.to_string()),
                            "revoked_at": t.revoked_at.map(|r| r.to_string()),
                            "status": t.status(now),
                        })
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else if tokens.is_empty() {
                eprintln!(
                    "no tokens; create one with `countersign token create --role agent --name NAME`"
                );
            } else {
                println!(
                    "{:<22} {:<9} {:<8} {:<25} {:<25} {:<36} NAME",
                    "ID", "ROLE", "STATUS", "CREATED", "EXPIRES", "SCOPES"
                );
                for t in tokens {
                    let scopes = match &t.scopes {
                        Some(_) => t.effective_scopes().to_text(),
                        None => format!("all ({})", t.effective_scopes()),
                    };
                    println!(
                        "{:<22} {:<9} {:<8} {:<25} {:<25} {:<36} {}",
                        t.id,
                        t.role.as_str(),
                        t.status(now),
                        t.created_at.to_string(),
                        t.expires_at
                            .map(|r| r.to_string())
                            .unwrap_or_else(|| "never".into()),
                        scopes,
                        t.name
                    );
                }
            }
        }
        TokenCommand::Revoke { id } => {
            let record = gate.revoke_token(&id, &actor).await?;
            eprintln!("revoked {} ({}, {})", record.id, record.name, record.role);
        }
    }
    Ok(ExitCode::SUCCESS)
}
