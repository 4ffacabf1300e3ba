//! The subcommands. Each returns the process exit code: 0 for success, 1 for a negative
//! answer (an invalid proof, a failed check), 2 for an error (bad input, I/O).

pub mod backup;
pub mod bridge;
pub mod decide;
pub mod demo;
pub mod doctor;
pub mod exec;
pub mod grant;
pub mod hook;
pub mod keys;
pub mod log;
pub mod mcp;
pub mod migrate;
pub mod operate;
pub mod policy;
pub mod proxy;
pub mod records;
pub mod send_test_email;
pub mod serve;
pub mod token;
pub mod user;
pub mod verify;

use std::process::ExitCode;

use crate::Command;
use crate::config::{Config, Overrides};

pub async fn run(command: Command, overrides: Overrides) -> anyhow::Result<ExitCode> {
    let remote = match &command {
        Command::Mcp(args) => args.remote.server.is_some(),
        Command::Hook(args) => args.remote.server.is_some(),
        Command::Proxy(args) => args.remote.server.is_some(),
        Command::Exec(args) => args.remote.server.is_some(),
        _ => false,
    };
    if remote && overrides.data_dir.is_some() {
        anyhow::bail!(
            "give --data-dir or --server, not both: --server asks a running serve, which keeps its own data"
        );
    }
    let config = Config::load(&overrides)?;
    match command {
        Command::Serve(_) => {
            init_logging("info");
            serve::run(&config).await
        }
        Command::Mcp(args) => {
            init_logging("warn");
            mcp::run(&config, &args).await
        }
        Command::Hook(args) => {
            init_logging("warn");
            hook::run(&config, &args).await
        }
        Command::Proxy(args) => {
            init_logging("warn");
            proxy::run(&config, &args).await
        }
        Command::Exec(args) => {
            init_logging("warn");
            exec::run(&config, &args).await
        }
        Command::Bridge(args) => {
            init_logging("info");
            bridge::run(&config, &args).await
        }
        Command::Token(command) => token::run(&config, command).await,
        Command::Grant(command) => grant::run(&config, command).await,
        Command::User(command) => user::run(&config, command).await,
        Command::Demo(args) => {
            init_logging("info");
            demo::run(&config, &args).await
        }
        Command::Pending(args) => decide::pending(&config, &args).await,
        Command::Records(args) => records::run(&config, &args).await,
        Command::Approve(args) => {
            decide::decide(&config, &args, countersign_core::Verdict::Approved).await
        }
        Command::Reject(args) => {
            decide::decide(&config, &args, countersign_core::Verdict::Rejected).await
        }
        Command::Verify(args) => verify::run(&config, &args).await,
        Command::Keys(command) => keys::run(&config, command).await,
        Command::Evidence(args) => log::evidence(&config, &args).await,
        Command::VerifyBundle(args) => {
            let data_dir_given =
                overrides.data_dir.is_some() || std::env::var_os("COUNTERSIGN_DATA_DIR").is_some();
            log::verify_bundle(&config, &args, data_dir_given).await
        }
        Command::Log(command) => log::run(&config, command).await,
        Command::Policy(command) => policy::run(&config, command).await,
        Command::Process(command) => operate::process(&config, command).await,
        Command::Params(command) => operate::params(&config, command).await,
        Command::Probe(command) => operate::probe(&config, command).await,
        Command::Doctor(_) => doctor::run(&config).await,
        Command::SendTestEmail(args) => send_test_email::run(&config, &args).await,
        Command::Backup(args) => backup::backup(&config, &args).await,
        Command::Restore(args) => backup::restore(&config, &args).await,
        Command::Migrate => migrate::migrate(&config).await,
        Command::MigrateData(args) => migrate::migrate_data(&config, &args).await,
    }
}

/// Logs go to stderr (stdout carries the MCP protocol in `mcp`, and tokens in `token
/// create`). `COUNTERSIGN_LOG` takes a tracing filter such as `debug` or
/// `countersign_server=debug`.
fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("COUNTERSIGN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
