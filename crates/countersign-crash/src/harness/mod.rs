//! The crash loop: start the server on a data directory, run a mixed load against it,
//! crash it (SIGKILL at a random moment, or a fail point inside a commit), restart it,
//! and check that everything it acknowledged survived and that the log and the outbox
//! are whole. One data directory for the whole run, so crashes compound.
//!
//! What counts as acknowledged: an HTTP answer the client received. A request in flight
//! when the server died has an unknown fate and is checked only for consistency (at most
//! one of everything, and the log agrees with the state).
//!
//! One file per part: the server as a child process ([`process`]), the webhook receiver
//! it notifies ([`receiver`]), the load ([`load`]) and what it saw acknowledged
//! ([`ledger`]), the checks after each restart ([`checks`]), and the [`Report`].

mod checks;
mod ledger;
mod load;
mod process;
mod receiver;
mod report;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::bail;
use countersign_sqlite::SqliteStore;

use checks::{Carry, check_audit, check_log, check_outbox, check_state};
use ledger::{Ledger, Shared};
use load::Load;
use process::{Launcher, ServerProc, Started, failpoint_hit};
use receiver::start_receiver;
pub use report::{Acked, Report};

use crate::server;

/// The environment variable that arms the fail points (see `countersign-sqlite`'s
/// `failpoints` module).
pub const FAILPOINT_VAR: &str = "COUNTERSIGN_TEST_FAILPOINT";
/// The fail points, in the order a write batch passes them.
pub const FAILPOINTS: [&str; 4] = ["after_begin", "after_job", "before_commit", "after_commit"];
const SECRET: &str = "whsec_Y3Jhc2gtaGFybmVzcy13ZWJob29rLXNlY3JldA==";
/// Outbox document kinds (`countersign_server::notify`).
const PENDING_DELIVERY: &str = "delivery.pending";
const DONE_DELIVERY: &str = "delivery.done";

/// How a run is shaped.
#[derive(Debug, Clone)]
pub struct Options {
    pub cycles: u64,
    pub seed: u64,
    /// The `countersign-crash` binary (its `serve` and `init` subcommands).
    pub server: PathBuf,
    /// Where the data lives; a temporary directory when `None`.
    pub data_dir: Option<PathBuf>,
    pub agents: usize,
    pub approvers: usize,
    /// Each cycle's load lasts a random time up to this.
    pub max_load: Duration,
    /// The share of cycles that arm a fail point instead of killing with SIGKILL.
    pub failpoint_share: f64,
    /// The probability a fail point fires each time a batch passes it.
    pub failpoint_probability: f64,
    /// How long after a restart a delivery that is due (not leased by a dead sender, not
    /// backing off) may take to arrive, and the log to be integrated.
    pub settle: Duration,
    /// The outbox lease (`[notify] lease_seconds`; production's default is 60 s): how
    /// long a delivery claimed by a killed server waits before another send.
    pub lease_seconds: u64,
    /// After the last cycle, wait out the leases of deliveries claimed by killed
    /// processes so that every event's webhook is seen to arrive.
    pub final_drain: bool,
    /// Print every cycle.
    pub verbose: bool,
}

impl Options {
    pub fn new(server: PathBuf) -> Self {
        Self {
            cycles: 200,
            seed: 0x00c0_ffee,
            server,
            data_dir: None,
            agents: 3,
            approvers: 3,
            max_load: Duration::from_millis(300),
            failpoint_share: 0.5,
            failpoint_probability: 0.04,
            settle: Duration::from_secs(15),
            lease_seconds: 5,
            final_drain: true,
            verbose: false,
        }
    }
}

/// splitmix64: deterministic choices from the seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    /// One of `items` (none from an empty slice, which draws nothing).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        if items.is_empty() {
            None
        } else {
            items.get(self.below(items.len() as u64) as usize)
        }
    }
}

/// A poisoned lock still holds what the harness recorded; a panicking task must not
/// hide it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How a cycle ends its server.
#[derive(Debug, Clone, Copy)]
enum Crash {
    /// SIGKILL this many milliseconds into the cycle (possibly after the load ended).
    Kill(u64),
    /// Arm a fail point; SIGKILL at the end of the window if it never fired.
    FailPoint(&'static str),
}

/// Runs the cycles `options` asks for, and reports what the checks found.
pub async fn run(options: &Options) -> anyhow::Result<Report> {
    let started = Instant::now();
    let tmp = tempfile::tempdir()?;
    let data_dir = options
        .data_dir
        .clone()
        .unwrap_or_else(|| tmp.path().join("data"));
    if server::db_path(&data_dir).exists() {
        bail!(
            "{} already holds a database; the harness starts from an empty data directory",
            data_dir.display()
        );
    }
    let (webhook_url, received) = start_receiver().await?;

    let launcher = Launcher {
        bin: &options.server,
        data_dir: &data_dir,
        webhook_url: &webhook_url,
        lease_seconds: options.lease_seconds,
    };
    // Tokens and the outbox cursor.
    let init = launcher.init(options.agents, options.approvers).await?;
    let (agents, approvers, executor, outbox_from) =
        (init.agents, init.approvers, init.executor, init.outbox_from);

    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(20))
        .build()?;
    let ledger: Shared = Arc::new(Mutex::new(Ledger {
        next_key: vec![0; options.agents],
        ..Ledger::default()
    }));
    let mut rng = Rng::new(options.seed);
    let mut report = Report {
        seed: options.seed,
        ..Report::default()
    };
    let mut carry = Carry::default();
    let mut current: Option<ServerProc> = None;
    let mut violations: Vec<String> = Vec::new();

    for cycle in 1..=options.cycles {
        let load_ms = 20 + rng.below(options.max_load.as_millis() as u64);
        let crash = if rng.chance(options.failpoint_share) {
            Crash::FailPoint(FAILPOINTS[rng.below(FAILPOINTS.len() as u64) as usize])
        } else {
            Crash::Kill(rng.below(load_ms + 150))
        };
        // The server for this cycle: the one that passed the last checks, or a fresh one
        // with a fail point armed.
        let mut kind = String::new();
        let phase = Instant::now();
        let server = match (crash, current.take()) {
            (Crash::Kill(_), Some(s)) => Some(s),
            (_, previous) => {
                if let Some(mut s) = previous {
                    s.kill();
                    *report
                        .kills
                        .entry("SIGKILL, idle (before an armed restart)".into())
                        .or_default() += 1;
                }
                let spec = match crash {
                    Crash::FailPoint(name) => {
                        Some(format!("{name}:{}", options.failpoint_probability))
                    }
                    Crash::Kill(_) => None,
                };
                match launcher.start(spec.as_deref()).await? {
                    Started::Up(s) => Some(s),
                    Started::Died(lines) => {
                        kind = match failpoint_hit(&lines) {
                            Some(point) => format!("fail point {point}, during start-up"),
                            None => {
                                violations.push(format!(
                                    "cycle {cycle}: the server died starting:\n{}",
                                    lines.join("\n")
                                ));
                                "died starting (no fail point)".into()
                            }
                        };
                        None
                    }
                }
            }
        };

        *report.phases.entry("starting servers").or_default() += phase.elapsed();
        let phase = Instant::now();
        if let Some(mut server) = server {
            let stop = Arc::new(AtomicBool::new(false));
            let load = Arc::new(Load {
                http: http.clone(),
                base: server.base.clone(),
                agents: agents.clone(),
                approvers: approvers.clone(),
                executor: executor.clone(),
                ledger: ledger.clone(),
                stop: stop.clone(),
            });
            let mut tasks = Vec::new();
            for a in 0..options.agents {
                tasks.push(tokio::spawn(
                    load.clone().agent(a, Rng::new(rng.next_u64())),
                ));
            }
            tasks.push(tokio::spawn(
                load.clone().executor(Rng::new(rng.next_u64())),
            ));
            for p in 0..options.approvers {
                tasks.push(tokio::spawn(
                    load.clone().approver(p, Rng::new(rng.next_u64())),
                ));
            }
            let t0 = Instant::now();
            loop {
                tokio::time::sleep(Duration::from_millis(1)).await;
                let ms = t0.elapsed().as_millis() as u64;
                if ms >= load_ms {
                    stop.store(true, Ordering::Relaxed);
                }
                if server.exited() {
                    stop.store(true, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let lines = server.stderr();
                    kind = match failpoint_hit(&lines) {
                        Some(point) => format!("fail point {point}"),
                        None => {
                            violations.push(format!(
                                "cycle {cycle}: the server exited on its own:\n{}",
                                lines.join("\n")
                            ));
                            "exited on its own".into()
                        }
                    };
                    break;
                }
                match crash {
                    Crash::Kill(at) if ms >= at => {
                        server.kill();
                        kind = if ms < load_ms {
                            "SIGKILL during the load".into()
                        } else {
                            "SIGKILL after the load (outbox and log catching up)".into()
                        };
                        break;
                    }
                    Crash::FailPoint(point) if ms >= load_ms + 150 => {
                        server.kill();
                        kind = format!("SIGKILL (fail point {point} armed, never hit)");
                        break;
                    }
                    _ => {}
                }
            }
            stop.store(true, Ordering::Relaxed);
            for t in tasks {
                let _ = t.await;
            }
        }
        *report.kills.entry(kind.clone()).or_default() += 1;

        *report.phases.entry("load and crash").or_default() += phase.elapsed();
        // Restart, clean, and check.
        let phase = Instant::now();
        let server = match launcher.start(None).await? {
            Started::Up(s) => s,
            Started::Died(lines) => {
                violations.push(format!(
                    "cycle {cycle}: the server did not restart after {kind}:\n{}",
                    lines.join("\n")
                ));
                report.cycles = cycle;
                break;
            }
        };
        *report.phases.entry("starting servers").or_default() += phase.elapsed();
        let phase = Instant::now();
        let before = violations.len();
        let last_cycle = cycle == options.cycles;
        let store = SqliteStore::open(&server::db_path(&data_dir))?;
        // What was written since the last restart (everything, at the last one).
        let (found, events) = check_state(&store, &ledger, &mut carry.state, last_cycle).await?;
        violations.extend(
            found
                .into_iter()
                .map(|v| format!("cycle {cycle} ({kind}): {v}")),
        );
        *report.phases.entry("checking").or_default() += phase.elapsed();
        let phase = Instant::now();
        violations.extend(
            check_outbox(
                &store,
                &events,
                &received,
                &mut carry,
                outbox_from,
                options.settle,
                last_cycle && options.final_drain,
            )
            .await?
            .into_iter()
            .map(|v| format!("cycle {cycle} ({kind}): {v}")),
        );
        *report
            .phases
            .entry("waiting for deliveries and integration")
            .or_default() += phase.elapsed();
        let phase = Instant::now();
        // The log as it stands now, integrated.
        violations.extend(
            check_log(&store, &data_dir, &mut carry, last_cycle)
                .await?
                .into_iter()
                .map(|v| format!("cycle {cycle} ({kind}): {v}")),
        );
        if last_cycle {
            violations.extend(
                check_audit(&store)
                    .await?
                    .into_iter()
                    .map(|v| format!("cycle {cycle} ({kind}): {v}")),
            );
        }
        carry.requests = carry.state.requests();
        drop(store);
        *report.phases.entry("checking").or_default() += phase.elapsed();
        {
            let mut l = lock(&ledger);
            violations.extend(
                l.violations
                    .drain(..)
                    .map(|v| format!("cycle {cycle} ({kind}), during the load: {v}")),
            );
        }
        if options.verbose || violations.len() > before {
            let l = lock(&ledger);
            eprintln!(
                "cycle {cycle}: {kind}; {} requests, {} log entries, {} webhooks outstanding, {} new violations",
                l.reqs.len(),
                carry.log_entries,
                carry.expected.len(),
                violations.len() - before
            );
            for v in &violations[before..] {
                eprintln!("  {v}");
            }
        }
        report.cycles = cycle;
        current = Some(server);
    }
    if let Some(mut s) = current.take() {
        s.kill();
    }

    let l = lock(&ledger);
    report.acked = l.acked;
    report.unanswered = l.unanswered_ops;
    drop(l);
    let r = lock(&received);
    report.webhook_events = r.by_index.len() as u64;
    report.webhook_posts = r.posts;
    report.redeliveries = r.redeliveries;
    report.refused = r.refused;
    drop(r);
    report.requests = carry.requests;
    report.log_entries = carry.log_entries;
    report.checkpoints = carry.checkpoint_count;
    report.slowest_settle = carry.slowest_settle;
    report.undrained = carry.expected.len();
    let mut delays = carry.delays.clone();
    delays.sort_unstable();
    let at = |q: f64| {
        let i = ((delays.len() as f64 - 1.0) * q).round() as usize;
        Duration::from_millis(delays.get(i).copied().unwrap_or(0).max(0) as u64)
    };
    report.delivery_delay = [at(0.5), at(0.99), at(1.0)];
    report.lease_waits = carry.leased.len();
    report.violations = violations;
    report.elapsed = started.elapsed();
    Ok(report)
}
