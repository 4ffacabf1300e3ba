//! `countersign send-test-email --to ADDR`: sends one plain message through the
//! configured SMTP server and says in words what went wrong, if anything.

use std::process::ExitCode;

use clap::Args;
use countersign_server::notify::{email, smtp};

use crate::config::Config;

#[derive(Debug, Args)]
pub struct SendTestEmailArgs {
    /// Where to send the test message.
    #[arg(long, value_name = "ADDR")]
    pub to: String,
}

pub async fn run(config: &Config, args: &SendTestEmailArgs) -> anyhow::Result<ExitCode> {
    let Some(email_config) = &config.notify.email else {
        anyhow::bail!(
            "email is not configured: add an [email] section with smtp_url and from to {} (see docs/channels.md)",
            config
                .config_file
                .as_deref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "the config file".into())
        );
    };
    if let Err(e) = smtp::check_address(&args.to) {
        anyhow::bail!("--to: {e}");
    }
    println!(
        "sending a test message to {} through {} as {}",
        args.to,
        email_config.smtp.describe(),
        email_config.from
    );
    match email::send_test(email_config, &args.to, &config.public_url).await {
        Ok(()) => {
            println!(
                "ok    the SMTP server accepted the message; check {}'s inbox (and spam folder)",
                args.to
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            println!("FAIL  {}", e.strip_prefix("permanent: ").unwrap_or(&e));
            Ok(ExitCode::from(1))
        }
    }
}
