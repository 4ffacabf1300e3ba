//! Throughput: clients repeating full approval cycles, then decisions, then creations,
//! for a fixed time each, on SQLite and on PostgreSQL instances; with the CPU the
//! servers and the clients spent per operation.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::json;

use crate::client::Api;
use crate::figures::{Sample, load_average, micros};
use crate::instances::{Backend, Setup};
use crate::scale;

/// One measured phase: how many operations the clients completed, in how long, and
/// each operation's latency.
struct Phase {
    ops: usize,
    elapsed: Duration,
    latency: Sample,
    /// CPU seconds the countersign server processes used during the phase.
    server_cpu: f64,
    /// CPU seconds this process (the clients) used during the phase.
    client_cpu: f64,
}

impl Phase {
    fn rate(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }

    /// Server CPU time per operation, in microseconds.
    fn server_us(&self) -> f64 {
        self.server_cpu * 1e6 / self.ops.max(1) as f64
    }

    /// Client CPU time per operation, in microseconds.
    fn client_us(&self) -> f64 {
        self.client_cpu * 1e6 / self.ops.max(1) as f64
    }
}

/// CPU seconds used so far by the server processes `pids` and by this process.
fn cpu_now(pids: &[u32]) -> (f64, f64) {
    let server = pids
        .iter()
        .map(|pid| scale::cpu_seconds(*pid).unwrap_or(0.0))
        .sum();
    let client = scale::cpu_seconds(std::process::id()).unwrap_or(0.0);
    (server, client)
}

/// Runs `phase` and charges it the CPU the servers and the clients used meanwhile.
async fn with_cpu<Fut>(pids: &[u32], phase: Fut) -> anyhow::Result<Phase>
where
    Fut: std::future::Future<Output = anyhow::Result<Phase>>,
{
    let (server0, client0) = cpu_now(pids);
    let mut phase = phase.await?;
    let (server1, client1) = cpu_now(pids);
    phase.server_cpu = server1 - server0;
    phase.client_cpu = client1 - client0;
    Ok(phase)
}

/// Runs `clients` clients for `seconds`, each repeating `op(client, iteration)`.
async fn run_clients<F, Fut>(clients: usize, seconds: u64, op: F) -> anyhow::Result<Phase>
where
    F: Fn(usize, usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let op = Arc::new(op);
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for client in 0..clients {
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut i = 0;
            while Instant::now() < deadline {
                let t = Instant::now();
                op(client, i).await?;
                latencies.push(micros(t.elapsed()));
                i += 1;
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await??);
    }
    Ok(Phase {
        ops: all.len(),
        elapsed: start.elapsed(),
        latency: Sample::new(all),
        server_cpu: 0.0,
        client_cpu: 0.0,
    })
}

/// What every client repeats during a phase.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// Create on one instance and wait there, approve on the next instance (the same one
    /// when there is only one), see the decision, record the action.
    Cycle,
    /// Create on one instance, approve on the next.
    Decision,
    /// Create only.
    Create,
    /// Create a request a policy approves at once (signed proof, log append, durable).
    Policy,
}

/// The instances' policy: `bench_refund` under 100 is approved by rule. The other
/// phases' requests name no tool, so no policy applies to them and a person decides.
const POLICY: &str = r#"@id("bench-small-refunds")
@reason("refunds under 100 need no person")
permit(principal, action == Action::"bench_refund", resource)
when { context.decimal has amount && context.decimal.amount.lessThan(decimal("100.0")) };
"#;
const POLICY_CONFIG: &str = "[policy]\nfiles = [\"bench.cedar\"]\n";

impl Op {
    /// Runs once; `turn` (client + iteration) picks the instances.
    async fn once(self, api: &Api, bases: &[String], turn: usize) -> anyhow::Result<()> {
        let n = bases.len();
        let (here, there) = (&bases[turn % n], &bases[(turn + 1) % n]);
        match self {
            Op::Cycle => {
                let id = api.create(here).await?;
                let waiter = {
                    let (api, base, id) = (api.clone(), here.clone(), id.clone());
                    tokio::spawn(async move { api.wait(&base, &id).await })
                };
                api.approve(there, &id).await?;
                let status = waiter.await??;
                if status != "approved" {
                    bail!("the waiter for {id} returned {status:?}");
                }
                api.record_action(here, &id).await
            }
            Op::Decision => {
                let id = api.create(here).await?;
                api.approve(there, &id).await
            }
            Op::Create => {
                api.create(here).await?;
                Ok(())
            }
            Op::Policy => {
                let body = json!({
                    "action_description": "refund order 1234",
                    "action_details": {"tool": "bench_refund", "amount": "12.50"},
                });
                let created = api.create_with(here, &body).await?;
                if created["status"] != "approved" {
                    bail!("a request the policy approves came back {created}");
                }
                Ok(())
            }
        }
    }
}

/// What the phases of one backend's measurement share: its instances and its clients.
struct Phases {
    name: &'static str,
    clients: usize,
    seconds: u64,
    api: Api,
    bases: Arc<Vec<String>>,
    pids: Vec<u32>,
}

impl Phases {
    /// Runs one phase (`what`, for the progress line): every client repeats `op` for
    /// the phase's seconds, charged the CPU the servers and the clients used.
    async fn run(&self, what: &str, op: Op) -> anyhow::Result<Phase> {
        let (name, clients, seconds) = (self.name, self.clients, self.seconds);
        eprintln!("{name}: {clients} clients, {what} for {seconds} s ...");
        let (api, bases) = (self.api.clone(), self.bases.clone());
        let clients = run_clients(clients, seconds, move |client, i| {
            let (api, bases) = (api.clone(), bases.clone());
            async move { op.once(&api, &bases, client + i).await }
        });
        with_cpu(&self.pids, clients).await
    }
}

struct Row {
    backend: &'static str,
    instances: usize,
    cycles: Phase,
    decisions: Phase,
    creates: Phase,
    policy: Phase,
}

async fn measure(
    bin: &Path,
    backend: Backend<'_>,
    name: &'static str,
    instances: usize,
    clients: usize,
    seconds: u64,
) -> anyhow::Result<Row> {
    let setup = Setup::start_with_files(
        bin,
        backend,
        instances,
        POLICY_CONFIG,
        &[("bench.cedar", POLICY)],
    )
    .await?;
    let phases = Phases {
        name,
        clients,
        seconds,
        api: Api::new(&setup)?,
        bases: Arc::new(setup.instances.iter().map(|i| i.base.clone()).collect()),
        pids: setup
            .instances
            .iter()
            .filter_map(|i| i.child.id())
            .collect(),
    };
    let cycles = phases.run("full cycles", Op::Cycle).await?;
    let decisions = phases
        .run("decisions (create, approve)", Op::Decision)
        .await?;
    let creates = phases.run("creations", Op::Create).await?;
    let policy = phases
        .run("policy decisions (create, approved by rule)", Op::Policy)
        .await?;
    drop(setup);
    Ok(Row {
        backend: name,
        instances,
        cycles,
        decisions,
        creates,
        policy,
    })
}

/// What `throughput` measures.
pub(crate) struct Plan<'a> {
    pub(crate) clients: usize,
    pub(crate) seconds: u64,
    pub(crate) sqlite: bool,
    /// The database and how many instances to run on it.
    pub(crate) postgres: Option<(&'a str, usize)>,
}

/// Measures what `plan` asks for and prints a table and the JSON line.
pub(crate) async fn throughput(bin: &Path, plan: &Plan<'_>) -> anyhow::Result<()> {
    let (clients, seconds) = (plan.clients, plan.seconds);
    let load_before = load_average();
    let mut rows = Vec::new();
    if plan.sqlite {
        rows.push(measure(bin, Backend::Sqlite, "sqlite", 1, clients, seconds).await?);
    }
    if let Some((url, instances)) = plan.postgres {
        rows.push(
            measure(
                bin,
                Backend::Postgres(url),
                "postgres",
                instances,
                clients,
                seconds,
            )
            .await?,
        );
    }
    let load_after = load_average();
    println!(
        "throughput, {clients} clients, {seconds} s per phase; load average {load_before:.2} before, {load_after:.2} after"
    );
    println!(
        "  cycle: create, wait (REST long poll), approve, woken, record_action; decision: create, approve (signed proof, log append, durable); create: create only; policy: create, approved by a Cedar policy (signed proof, log append, durable)"
    );
    println!(
        "{:<10} {:>4} {:<9} {:>9} {:>9} {:>9} {:>12} {:>12}",
        "backend", "inst", "phase", "per s", "p50 ms", "p99 ms", "server us/op", "client us/op"
    );
    let mut json_rows = Vec::new();
    for row in &rows {
        let mut phases = serde_json::Map::new();
        for (phase, data) in [
            ("cycle", &row.cycles),
            ("decision", &row.decisions),
            ("create", &row.creates),
            ("policy", &row.policy),
        ] {
            println!(
                "{:<10} {:>4} {:<9} {:>9.0} {:>9.2} {:>9.2} {:>12.0} {:>12.0}",
                row.backend,
                row.instances,
                phase,
                data.rate(),
                data.latency.pct(0.5),
                data.latency.pct(0.99),
                data.server_us(),
                data.client_us(),
            );
            phases.insert(
                phase.to_string(),
                json!({
                    "ops": data.ops,
                    "per_s": data.rate(),
                    "p50_ms": data.latency.pct(0.5),
                    "p99_ms": data.latency.pct(0.99),
                    "server_cpu_us_per_op": data.server_us(),
                    "client_cpu_us_per_op": data.client_us(),
                }),
            );
        }
        json_rows.push(json!({
            "backend": row.backend,
            "instances": row.instances,
            "phases": phases,
        }));
    }
    println!(
        "{}",
        serde_json::to_string(&json!({
            "bench": "throughput", "clients": clients, "seconds": seconds,
            "load_average_before": load_before, "load_average_after": load_after,
            "results": json_rows,
        }))?
    );
    Ok(())
}
