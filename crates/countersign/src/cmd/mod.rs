//! The subcommands. Each returns the process exit code: 0 for success, 1 for a negative
//! answer (an invalid proof, a failed check), 2 for an error (bad input, I/O).

pub mod backup;
pub mod bridge;
pub mod cli_docs;
pub mod decide;
pub mod demo;
pub mod doctor;
pub mod exec;
pub mod grant;
pub mod healthcheck;
pub mod hook;
pub mod keys;
pub mod lan;
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

use crate::config::{Config, Overrides};
use crate::{Command, LogFormat};

pub async fn run(
    command: Command,
    overrides: Overrides,
    log_format: LogFormat,
) -> anyhow::Result<ExitCode> {
    LOG_FORMAT.get_or_init(|| log_format);
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
        Command::Healthcheck(args) => healthcheck::run(&config, &args).await,
        Command::Completions { .. } | Command::Man { .. } => {
            anyhow::bail!("completions and man pages are written before any configuration is read")
        }
        Command::Migrate => migrate::migrate(&config).await,
        Command::MigrateData(args) => migrate::migrate_data(&config, &args).await,
    }
}

/// Logs go to stderr (stdout carries the MCP protocol in `mcp`, and tokens in `token
/// create`). `COUNTERSIGN_LOG` takes a tracing filter such as `debug` or
/// `countersign_server=debug`.
/// `--log-format json` writes one JSON object per line (time, level, target, message
/// and fields) for a log collector.
fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("COUNTERSIGN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match LOG_FORMAT.get().copied().unwrap_or(LogFormat::Text) {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Says `message` on stderr whatever `COUNTERSIGN_LOG` filters (what `serve` prints at
/// start: its address, the setup link, warnings): a plain line, or with `--log-format
/// json` one JSON object like the logs' own, so that a log collector reads every line.
pub fn announce(level: &str, message: &str) {
    match LOG_FORMAT.get().copied().unwrap_or(LogFormat::Text) {
        LogFormat::Text if level == "WARN" => eprintln!("warning: {message}"),
        LogFormat::Text => eprintln!("{message}"),
        LogFormat::Json => eprintln!(
            "{}",
            serde_json::json!({
                "timestamp": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                "level": level,
                "target": "countersign",
                "message": message,
            })
        ),
    }
}

/// The process's `--log-format`, set once by [`run`].
static LOG_FORMAT: std::sync::OnceLock<LogFormat> = std::sync::OnceLock::new();
