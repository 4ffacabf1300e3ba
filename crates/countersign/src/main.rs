//! `countersign`: the approval gate for AI agents.

mod cmd;
mod config;
mod remote;
mod runtime;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};

use crate::config::Overrides;

/// mimalloc instead of glibc's malloc: under load, serve's threads allocate and free many
/// short-lived buffers (requests, JSON, SQLite pages) across threads, where glibc's arenas
/// spent a sixth of the process's CPU (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(name = "countersign", version, about = "A self-hosted approval gate for AI agents", long_about = None)]
struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Args, Clone)]
struct GlobalArgs {
    /// Data directory (database, keys, config). Default: $XDG_DATA_HOME/countersign or
    /// ~/.local/share/countersign. Also COUNTERSIGN_DATA_DIR.
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Config file (TOML). Default: countersign.toml in the data directory, if present.
    /// Also COUNTERSIGN_CONFIG.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Database URL: postgres://... for several instances, sqlite://PATH for the embedded
    /// default. Also COUNTERSIGN_DATABASE_URL (or COUNTERSIGN_DATABASE_URL_FILE).
    #[arg(long, global = true, value_name = "URL")]
    database: Option<String>,
    /// How logs (on stderr) are written: text for people, json for a log collector (one
    /// JSON object per line). Also COUNTERSIGN_LOG_FORMAT.
    #[arg(long, global = true, value_enum, env = "COUNTERSIGN_LOG_FORMAT", default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the HTTP server: MCP at /mcp, REST at /api/v1, JWKS, health.
    Serve(cmd::serve::ServeArgs),
    /// Run the MCP tools over stdio (for clients that launch countersign themselves).
    Mcp(cmd::mcp::McpArgs),
    /// The MCP gateway: serve an upstream MCP server's tools over stdio, holding each
    /// call the policies do not let pass until it is approved (docs/gateway.md).
    Proxy(cmd::proxy::ProxyArgs),
    /// A coding agent's pre-tool hook (Claude Code, Cursor): ask, wait, answer allow or
    /// deny (docs/gateway.md).
    Hook(cmd::hook::HookArgs),
    /// Run a command only once approved: exactly that command line (program, argv,
    /// directory, environment names); its exit code is recorded (docs/gateway.md).
    Exec(cmd::exec::ExecArgs),
    /// Gate a process on approval-gate-mcp's file contract (pending.json, approved.json,
    /// records.json) without serving HTTP: the config's [[bridge]]s, or one given by
    /// --name and --dir (docs/bridge.md). `serve` runs the config's bridges itself.
    Bridge(cmd::bridge::BridgeArgs),
    /// Create, list and revoke bearer tokens.
    #[command(subcommand)]
    Token(cmd::token::TokenCommand),
    /// Give, list and revoke standing grants (an agent, a tool, bounds, a time or uses).
    #[command(subcommand)]
    Grant(cmd::grant::GrantCommand),
    /// List requests waiting for a decision.
    Pending(cmd::decide::PendingArgs),
    /// The bridged processes' records (records.json) joined with countersign's requests:
    /// totals, by type, the latest, the open ones and their exposure (docs/bridge.md).
    Records(cmd::records::RecordsArgs),
    /// Approve a pending request as the local user (channel `cli`).
    Approve(cmd::decide::DecideArgs),
    /// Reject a pending request as the local user (channel `cli`).
    Reject(cmd::decide::DecideArgs),
    /// Verify a proof offline.
    Verify(cmd::verify::VerifyArgs),
    /// Manage dashboard accounts.
    #[command(subcommand)]
    User(cmd::user::UserCommand),
    /// Fill a fresh data directory with sample agents and requests, then serve it.
    Demo(cmd::demo::DemoArgs),
    /// Manage signing keys.
    #[command(subcommand)]
    Keys(cmd::keys::KeysCommand),
    /// Export the evidence bundle (ZIP) of a request or recorded decision.
    Evidence(cmd::log::EvidenceArgs),
    /// Verify an evidence bundle offline.
    VerifyBundle(cmd::log::VerifyBundleArgs),
    /// Inspect and verify the transparency log.
    #[command(subcommand)]
    Log(cmd::log::LogCommand),
    /// Check, test and explain the Cedar policies (docs/policies.md).
    #[command(subcommand)]
    Policy(cmd::policy::PolicyCommand),
    /// Bring the database's schema up to date (serve and mcp also do it on start).
    Migrate,
    /// Copy an installation into a fresh database (e.g. SQLite to PostgreSQL), log,
    /// proofs, requests, tokens and accounts intact.
    MigrateData(cmd::migrate::MigrateDataArgs),
    /// Status, logs, restart and one-off commands of a `[[process]]` (docs/bridge.md);
    /// a restart or a command runs once another person approved it.
    Process(cmd::operate::ProcessArgs),
    /// List, set and clear the parameters a process reads (`[params]`), checked against
    /// the manifest; a change runs once approved.
    Params(cmd::operate::ParamsArgs),
    /// List and run the read-only probes (`[[probe]]`).
    Probe(cmd::operate::ProbeArgs),
    /// Check the data directory, database, key, listening address and channels (Slack,
    /// email, webhooks).
    Doctor(cmd::doctor::DoctorArgs),
    /// Send a test email through the configured SMTP server.
    SendTestEmail(cmd::send_test_email::SendTestEmailArgs),
    /// Copy the database (online, consistent, while serve runs) and the signing keys
    /// into one archive (SQLite; docs/deployment.md).
    Backup(cmd::backup::BackupArgs),
    /// Restore a backup into an empty data directory and check it against its log.
    Restore(cmd::backup::RestoreArgs),
    /// Ask a running serve for /healthz: exit 0 when healthy, 1 otherwise (a container's
    /// HEALTHCHECK, with no curl needed).
    Healthcheck(cmd::healthcheck::HealthcheckArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages (countersign.1 and one per subcommand) into a directory.
    Man {
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Generated from the definition above; they need no configuration.
    match &cli.command {
        Command::Completions { shell } => {
            return cmd::cli_docs::completions(Cli::command(), *shell);
        }
        Command::Man { dir } => {
            return match cmd::cli_docs::man_pages(Cli::command(), dir) {
                Ok(code) => code,
                Err(err) => {
                    eprintln!("error: {err:#}");
                    ExitCode::from(2)
                }
            };
        }
        _ => {}
    }
    let overrides = Overrides {
        config: cli.global.config.clone(),
        data_dir: cli.global.data_dir.clone(),
        database: cli.global.database.clone(),
        listen: match &cli.command {
            Command::Serve(args) => args.listen.clone(),
            Command::Doctor(args) => args.listen.clone(),
            Command::Demo(args) => args.listen.clone(),
            _ => None,
        },
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: could not start the async runtime: {err}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(cmd::run(cli.command, overrides, cli.global.log_format)) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}
