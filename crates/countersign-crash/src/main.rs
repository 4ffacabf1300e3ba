//! `countersign-crash`: runs the crash harness (`--cycles N`), or, as the harness's
//! child, serves (`serve`) or sets up a data directory (`init`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use countersign_crash::{harness, server};

#[derive(Debug, Parser)]
#[command(
    name = "countersign-crash",
    about = "Crash countersign under load (SIGKILL and fail points inside commits), restart it, and check that nothing acknowledged was lost"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Crash-and-restart cycles to run.
    #[arg(long, default_value_t = 200)]
    cycles: u64,
    /// Seed of the harness's choices (load length, crash kind and moment); the load's
    /// interleaving is not deterministic.
    #[arg(long)]
    seed: Option<u64>,
    /// Keep the data here (must not hold a database yet) instead of a temporary directory.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// The longest load per cycle, in milliseconds.
    #[arg(long, default_value_t = 300)]
    max_load_ms: u64,
    /// The share of cycles that arm a fail point rather than SIGKILL at a random moment.
    #[arg(long, default_value_t = 0.5)]
    failpoint_share: f64,
    /// The probability a fail point fires each time a write batch passes it.
    #[arg(long, default_value_t = 0.04)]
    failpoint_probability: f64,
    /// The outbox lease (`[notify] lease_seconds`): how long a delivery claimed by a
    /// killed server waits before it is sent again. Production's default is 60.
    #[arg(long, default_value_t = 5)]
    lease_seconds: u64,
    /// Do not wait, after the last cycle, for deliveries leased by a killed sender.
    #[arg(long)]
    no_final_drain: bool,
    /// Print a line per cycle.
    #[arg(long, short)]
    verbose: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve a data directory on 127.0.0.1 (port 0), with a webhook (the harness's child).
    #[command(hide = true)]
    Serve(ServeArgs),
    /// Create tokens and the outbox cursor in a fresh data directory; print them as JSON.
    #[command(hide = true)]
    Init {
        #[command(flatten)]
        serve: ServeArgs,
        #[arg(long, default_value_t = 3)]
        agents: usize,
        #[arg(long, default_value_t = 3)]
        approvers: usize,
    },
}

#[derive(Debug, Args)]
struct ServeArgs {
    #[arg(long, value_name = "DIR")]
    data_dir: PathBuf,
    #[arg(long)]
    webhook_url: String,
    #[arg(long)]
    webhook_secret: String,
    #[arg(long, default_value_t = 0)]
    lease_seconds: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Some(Command::Serve(a)) => {
            server::serve(
                &a.data_dir,
                &a.webhook_url,
                &a.webhook_secret,
                a.lease_seconds,
            )
            .await?;
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Init {
            serve: a,
            agents,
            approvers,
        }) => {
            let out = server::init(
                &a.data_dir,
                agents,
                approvers,
                &a.webhook_url,
                &a.webhook_secret,
            )
            .await?;
            println!("{out}");
            Ok(ExitCode::SUCCESS)
        }
        None => {
            let args = cli.run;
            let mut options = harness::Options::new(std::env::current_exe()?);
            options.cycles = args.cycles;
            options.seed = args.seed.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            });
            options.data_dir = args.data_dir;
            options.max_load = Duration::from_millis(args.max_load_ms);
            options.failpoint_share = args.failpoint_share;
            options.failpoint_probability = args.failpoint_probability;
            options.final_drain = !args.no_final_drain;
            options.lease_seconds = args.lease_seconds;
            options.verbose = args.verbose;
            eprintln!(
                "countersign-crash: {} cycles, seed {:#x}",
                options.cycles, options.seed
            );
            let report = harness::run(&options).await?;
            print!("{report}");
            Ok(if report.violations.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}
