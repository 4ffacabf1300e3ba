use std::process::ExitCode;

use clap::Subcommand;
use countersign_core::Role;

use crate::config::Config;
use crate::runtime;

#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Create a dashboard account and print its one-time invitation link (alone on
    /// stdout); the person opens it to set their password.
    Add {
        #[arg(long)]
        username: String,
        /// approver (decides) or admin (decides and manages accounts).
        #[arg(long)]
        role: Role,
        /// The name shown in proofs (default: the username).
        #[arg(long)]
        display_name: Option<String>,
    },
    /// List accounts.
    List,
    /// Disable an account and end its sessions.
    Disable { username: String },
}

pub async fn run(config: &Config, command: UserCommand) -> anyhow::Result<ExitCode> {
    let gate = runtime::open(config).await?;
    let accounts = gate.accounts();
    match command {
        UserCommand::Add {
            username,
            role,
            display_name,
        } => {
            let (user, token) = accounts
                .invite(
                    &username,
                    display_name.as_deref(),
                    role,
                    &runtime::local_admin(),
                    countersign_server::accounts::INVITE_SECONDS,
                )
                .await?;
            println!(
                "{}/invite?kind=invite&username={}&token={token}",
                config.public_url, user.username
            );
            eprintln!(
                "created {} account {}; send them the link above (it works once, for 24 hours)",
                user.role, user.username
            );
        }
        UserCommand::List => {
            println!("{:<24} {:<9} {:<9} NAME", "USERNAME", "ROLE", "STATE");
            for u in accounts.users().await? {
                let state = if u.disabled {
                    "disabled"
                } else if u.is_active() {
                    "active"
                } else {
                    "invited"
                };
                println!(
                    "{:<24} {:<9} {:<9} {}",
                    u.username,
                    u.role.as_str(),
                    state,
                    u.display_name
                );
            }
        }
        UserCommand::Disable { username } => {
            let user = accounts
                .user_by_name(&username)
                .await?
                .ok_or_else(|| anyhow::anyhow!("no account named {username:?}"))?;
            accounts.disable(&user.id, &runtime::local_admin()).await?;
            eprintln!("disabled {username} and ended its sessions");
        }
    }
    Ok(ExitCode::SUCCESS)
}
