use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use countersign_server::KeyRing;

use crate::config::Config;

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Print the public keys as a JWKS (what GET /.well-known/jwks.json serves), for
    /// verifying proofs offline.
    Export,
    /// Start signing with a new key. The old key stays in the JWKS, so everything it
    /// signed still verifies; running processes pick the new key up by themselves.
    Rotate,
    /// Endorse the key KID, published in the database by another instance, with this
    /// data directory's signing key (a signed key_endorsed entry in the log): from then
    /// on it is trusted and published wherever this key is. Run it where a trusted key
    /// is held; see docs/deployment.md.
    Trust {
        /// The key id (RFC 7638 thumbprint), as `doctor` or `log verify` names it (it may
        /// start with `-`).
        #[arg(allow_hyphen_values = true)]
        kid: String,
    },
}

pub async fn run(config: &Config, command: KeysCommand) -> anyhow::Result<ExitCode> {
    match command {
        KeysCommand::Rotate => {
            let gate = crate::runtime::open(config).await?;
            let (old, new) = gate.rotate_key(&crate::runtime::local_admin()).await?;
            gate.log().integrate().await?;
            println!("{new}");
            eprintln!("now signing with {new}; {old} is retired and stays published");
        }
        KeysCommand::Trust { kid } => {
            let gate = crate::runtime::open(config).await?;
            match gate.trust_key(&crate::runtime::local_admin(), &kid).await? {
                countersign_server::gate::Trusted::Endorsed(by) => {
                    gate.log().integrate().await?;
                    println!("{kid}");
                    eprintln!(
                        "{kid} is now endorsed by {by} in the log, and trusted and published wherever {by} is"
                    );
                }
                countersign_server::gate::Trusted::Already => {
                    println!("{kid}");
                    eprintln!("{kid} is already trusted here; nothing was written");
                }
            }
        }
        KeysCommand::Export => {
            let keys = KeyRing::open_existing(&config.keys_dir()).with_context(|| {
                format!(
                    "no signing key in {} (run `countersign serve` once to create one)",
                    config.keys_dir().display()
                )
            })?;
            // With a database, every key published there too (other instances, rotations).
            let jwks = match crate::runtime::open_store(config).await {
                Ok(store) => countersign_server::keyring::published_jwks(&*store, &keys).await?,
                Err(_) => keys.jwks(),
            };
            println!("{}", serde_json::to_string_pretty(&jwks)?);
        }
    }
    Ok(ExitCode::SUCCESS)
}
