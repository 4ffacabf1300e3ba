//! `countersign-bench`: starts real countersign processes on loopback and prints measured
//! figures as a table and as JSON.
//!
//! ```sh
//! cargo build --release -p countersign -p countersign-bench
//! target/release/countersign-bench wake --decisions 500
//! target/release/countersign-bench wake --decisions 500 --database postgres://postgres@127.0.0.1/cs_bench
//! target/release/countersign-bench throughput --clients 32 --seconds 10 --database postgres://postgres@127.0.0.1/cs_bench
//! target/release/countersign-bench gateway
//! ```
//!
//! With `--database postgres://...` the benchmarks start two `serve` instances on that
//! database, each with a data directory of its own and one shared keys directory, as
//! several instances behind a load balancer run.
//!
//! One module per benchmark ([`wake`], [`throughput`], [`gateway`], and the figures at
//! scale in [`scale`]); the servers they start are [`instances`] (and, for the gateway,
//! the upstream MCP server in [`upstream`], this binary's hidden `upstream` command), the
//! calls they make [`client`], and [`figures`] turns measurements into percentiles.

mod abuse;
mod audit;
mod client;
mod figures;
mod gateway;
mod instances;
mod policy;
mod scale;
mod throughput;
mod upstream;
mod wake;

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Parser;

use throughput::Plan;

#[derive(Debug, Parser)]
#[command(about = "countersign benchmarks")]
enum Bench {
    /// Wake-up latency: from the approver's decision call returning to the waiting
    /// agent's wait returning. Without --database: a REST long poll on the deciding
    /// server and a stdio MCP process waiting on the shared SQLite database. With
    /// --database: two instances on PostgreSQL, the agent waiting on instance A (REST
    /// long poll and MCP over HTTP), the decision made on instance B.
    Wake {
        /// Decisions per scenario.
        #[arg(long, default_value_t = 300)]
        decisions: usize,
        /// Run two instances on this PostgreSQL database (postgres://...) instead of one
        /// on SQLite. An empty database is best; the benchmark leaves its data there.
        #[arg(long, value_name = "URL")]
        database: Option<String>,
        /// The countersign binary (default: next to this one).
        #[arg(long)]
        bin: Option<PathBuf>,
    },
    /// Throughput of full cycles: each client creates a request, waits for it (REST long
    /// poll), has it approved, sees the decision and records the action; then the same
    /// clients only create requests, then create requests a Cedar policy approves at once
    /// (end-to-end policy decisions). One instance on SQLite, and with --database two
    /// instances on PostgreSQL, each cycle waiting on one instance and deciding on the
    /// other.
    Throughput {
        /// Concurrent clients.
        #[arg(long, default_value_t = 32)]
        clients: usize,
        /// Seconds per measurement (cycles, then creations).
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Also measure instances on this PostgreSQL database (postgres://...).
        #[arg(long, value_name = "URL")]
        database: Option<String>,
        /// How many instances to run on PostgreSQL (clients spread over them).
        #[arg(long, default_value_t = 2)]
        instances: usize,
        /// Skip the SQLite measurement (with --database).
        #[arg(long, requires = "database")]
        no_sqlite: bool,
        /// The countersign binary (default: next to this one).
        #[arg(long)]
        bin: Option<PathBuf>,
    },
    /// Many agents waiting at once: the server's memory (RSS) and open connections with
    /// COUNT REST long polls parked, then the wake-up latency when all are decided.
    Waiters {
        /// Agents waiting at once.
        #[arg(long, default_value_t = 10_000)]
        count: usize,
        /// Run on this PostgreSQL database (postgres://...) instead of SQLite.
        #[arg(long, value_name = "URL")]
        database: Option<String>,
        /// The countersign binary (default: next to this one).
        #[arg(long)]
        bin: Option<PathBuf>,
    },
    /// Verification speed, in-process: signed proofs verified per second, and the time
    /// to verify a log of ENTRIES entries against its signed checkpoints.
    Verify {
        /// Proofs to verify.
        #[arg(long, default_value_t = 100_000)]
        proofs: usize,
        /// Log entries to build and verify.
        #[arg(long, default_value_t = 1_000_000)]
        entries: u64,
    },
    /// Policy evaluation, in-process: POLICIES generated Cedar policies and the time to
    /// settle one request against them (docs/policies.md).
    Policy {
        /// Policies in the set.
        #[arg(long, default_value_t = 1_000)]
        policies: usize,
        /// Requests to evaluate.
        #[arg(long, default_value_t = 100_000)]
        requests: usize,
    },
    /// The audit at scale: writes a data directory of ENTRIES log entries (requests
    /// created, decided and acted on) through the store API, then times `countersign log
    /// verify` on it (the tree, every payload opening, every row held to the log).
    Audit {
        #[arg(long, default_value_t = 1_000_000)]
        entries: u64,
        /// Keep the data here (generated if it holds no database yet, reused if it does).
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
        /// Times to run `log verify`.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// The countersign binary (default: next to this one).
        #[arg(long)]
        bin: Option<PathBuf>,
    },
    /// Start-up time from spawning `countersign serve` to a served /healthz, and the
    /// idle memory after start.
    Startup {
        /// Starts to time.
        #[arg(long, default_value_t = 20)]
        runs: usize,
        /// Start on this PostgreSQL database (postgres://...) instead of SQLite.
        #[arg(long, value_name = "URL")]
        database: Option<String>,
        /// The countersign binary (default: next to this one).
        #[arg(long)]
        bin: Option<PathBuf>,
    },
    /// The server under abuse, side by side in one run: sockets that never finish a
    /// request (closed within the header and body timeouts) while long polls wait; a
    /// flood of the largest evidence uploads (zip bombs) while another client's calls
    /// are timed, with the server's peak memory; then 20 wrong passwords at once
    /// against one account, and the right one.
    Abuse {
        /// Sockets of each abusive kind (silent, one byte, half the headers, half a
        /// body, idle keep-alive).
        #[arg(long, default_value_t = 200)]
        sockets: usize,
        /// Concurrent uploaders in the flood.
        #[arg(long, default_value_t = 32)]
        uploads: usize,
        /// Seconds the flood lasts.
        #[arg(long, default_value_t = 20)]
        seconds: u64,
        /// The countersign binary (default: next to this one).
        #[arg(long)]
        bin: Option<PathBuf>,
    },
    /// Push against polling: the same workload with agents polling check_approval every
    /// second (the best peer's interval) and with agents waiting on wait_for_approval,
    /// reporting both latencies and the requests each puts on the server.
    Poll {
        /// Agents, each with one request per round.
        #[arg(long, default_value_t = 50)]
        agents: usize,
        /// Rounds per mode.
        #[arg(long, default_value_t = 4)]
        rounds: usize,
        /// The countersign binary (default: next to this one).
        #[arg(long)]
        bin: Option<PathBuf>,
    },
    /// The latency the MCP gateway adds, side by side in one run: one client's calls to
    /// an upstream MCP server made directly and through the gateway in front of it, over
    /// stdio (`countersign proxy`) and Streamable HTTP (`serve`'s /mcp/gateway/<name>).
    /// `echo` is read-only and passes straight through; `write` is approved by a Cedar
    /// policy (signed, logged, claimed, its outcome recorded). The rows take turns, a
    /// block of calls each.
    Gateway {
        /// Measured calls per row.
        #[arg(long, default_value_t = 2_000)]
        calls: usize,
        /// Calls per row before measuring.
        #[arg(long, default_value_t = 200)]
        warmup: usize,
        /// Calls a row makes in its turn.
        #[arg(long, default_value_t = 200)]
        block: usize,
        /// Measure stdio only (no `serve`, no HTTP upstream).
        #[arg(long)]
        no_http: bool,
        /// The countersign binary (default: next to this one).
        #[arg(long)]
        bin: Option<PathBuf>,
    },
    /// The upstream MCP server the gateway benchmark fronts: `echo` (read-only) and
    /// `write`, over stdio, or over Streamable HTTP at /mcp with --listen.
    #[command(hide = true)]
    Upstream {
        /// Serve Streamable HTTP on this address (e.g. 127.0.0.1:0) instead of stdio.
        #[arg(long, value_name = "ADDRESS")]
        listen: Option<String>,
    },
}

/// The countersign binary: `--bin`, or the one next to this one.
fn binary(bin: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let bin = match bin {
        Some(bin) => bin,
        None => std::env::current_exe()?
            .parent()
            .context("no parent directory")?
            .join("countersign"),
    };
    if !bin.exists() {
        bail!(
            "{} not found; build it with `cargo build --release -p countersign`",
            bin.display()
        );
    }
    Ok(bin)
}

/// `--database`, if given, must name PostgreSQL: SQLite is what runs without it.
fn check_database(url: Option<&str>) -> anyhow::Result<()> {
    if let Some(url) = url
        && !(url.starts_with("postgres://") || url.starts_with("postgresql://"))
    {
        bail!("--database must be a postgres:// URL (SQLite is what runs without it)");
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Bench::parse() {
        Bench::Wake {
            decisions,
            database,
            bin,
        } => {
            let bin = binary(bin)?;
            check_database(database.as_deref())?;
            match database {
                None => wake::wake(&bin, decisions).await,
                Some(url) => wake::wake_postgres(&bin, decisions, &url).await,
            }
        }
        Bench::Throughput {
            clients,
            seconds,
            database,
            instances,
            no_sqlite,
            bin,
        } => {
            let bin = binary(bin)?;
            if clients == 0 || seconds == 0 || instances == 0 {
                bail!("--clients, --seconds and --instances must be at least 1");
            }
            check_database(database.as_deref())?;
            let plan = Plan {
                clients,
                seconds,
                sqlite: !no_sqlite,
                postgres: database.as_deref().map(|url| (url, instances)),
            };
            throughput::throughput(&bin, &plan).await
        }
        Bench::Waiters {
            count,
            database,
            bin,
        } => {
            let bin = binary(bin)?;
            check_database(database.as_deref())?;
            scale::waiters(&bin, count, database.as_deref()).await
        }
        Bench::Verify { proofs, entries } => scale::verify(proofs, entries),
        Bench::Policy { policies, requests } => policy::run(policies, requests),
        Bench::Audit {
            entries,
            data_dir,
            runs,
            bin,
        } => {
            let bin = binary(bin)?;
            audit::audit(&bin, entries, data_dir, runs).await
        }
        Bench::Startup {
            runs,
            database,
            bin,
        } => {
            let bin = binary(bin)?;
            check_database(database.as_deref())?;
            scale::startup(&bin, runs, database.as_deref()).await
        }
        Bench::Abuse {
            sockets,
            uploads,
            seconds,
            bin,
        } => {
            let bin = binary(bin)?;
            if uploads == 0 || seconds == 0 {
                bail!("--uploads and --seconds must be at least 1");
            }
            abuse::abuse(&bin, sockets, uploads, seconds).await
        }
        Bench::Poll {
            agents,
            rounds,
            bin,
        } => {
            let bin = binary(bin)?;
            scale::poll(&bin, agents, rounds).await
        }
        Bench::Gateway {
            calls,
            warmup,
            block,
            no_http,
            bin,
        } => {
            let bin = binary(bin)?;
            if calls == 0 || block == 0 {
                bail!("--calls and --block must be at least 1");
            }
            let plan = gateway::Plan {
                calls,
                warmup,
                block,
                http: !no_http,
            };
            gateway::gateway(&bin, &plan).await
        }
        Bench::Upstream { listen } => upstream::serve(listen.as_deref()).await,
    }
}
