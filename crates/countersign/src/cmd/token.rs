use std::process::ExitCode;

use clap::Subcommand;
use countersign_core::Role;

use crate::config::Config;
use crate::runtime;

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token; prints it once, alone on stdout.
    Create {
        /// agent (asks), approver (decides) or admin (decides and manages tokens).
        #[arg(long)]
        role: Role,
        /// Who holds it: shown in requests and proofs (e.g. deploy-bot, alice@example.com).
        #[arg(long)]
        name: String,
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
        TokenCommand::Create { role, name } => {
            let (record, secret) = gate.create_token(&name, role, &actor).await?;
            println!("{secret}");
            eprintln!(
                "created {} token {} for {:?}; it is shown only this once",
                record.role, record.id, record.name
            );
        }
        TokenCommand::List { json } => {
            let tokens = gate.list_tokens().await?;
            if json {
                let rows: Vec<_> = tokens
                    .iter()
                    .map(|t| {
                        serde_json::json!({
                            "id": t.id, "name": t.name, "role": t.role,
                            "created_at": t.created_at.to_string(),
                            "revoked_at": t.revoked_at.map(|r| r.to_string()),
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
                    "{:<22} {:<9} {:<25} {:<25} NAME",
                    "ID", "ROLE", "CREATED", "REVOKED"
                );
                for t in tokens {
                    println!(
                        "{:<22} {:<9} {:<25} {:<25} {}",
                        t.id,
                        t.role.as_str(),
                        t.created_at.to_string(),
                        t.revoked_at
                            .map(|r| r.to_string())
                            .unwrap_or_else(|| "-".into()),
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
