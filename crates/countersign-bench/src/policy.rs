//! Policy evaluation, in-process: a set of N generated policies (permits and forbids
//! over tools, amounts, groups, rooms and the time, like docs/policies.md's), and the
//! time Cedar and countersign take to settle one request against it.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::bail;
use countersign_policy::{Input, Outcome, PolicyFile, PolicySet, RESOURCE};

use crate::figures::load_average;

/// Tools the generated policies and requests use.
const TOOLS: usize = 50;

/// The generated policies. `opaque`: each condition starts with a test countersign does
/// not settle itself (`like`), so every policy that names the action goes to Cedar.
fn policies(count: usize, opaque: bool) -> String {
    let mut text = String::new();
    for i in 0..count {
        let tool = i % TOOLS;
        let policy = match i % 5 {
            0 => format!(
                "permit(principal, action == Action::\"tool{tool}\", resource) when {{ context.decimal has amount && context.decimal.amount.lessThan(decimal(\"{}.0\")) }};\n",
                100 + i
            ),
            1 => format!(
                "forbid(principal in Group::\"g{}\", action == Action::\"tool{tool}\", resource) when {{ context.input has env && context.input.env == \"production\" }};\n",
                i % 7
            ),
            2 => format!(
                "@timeout_hours(\"2\") permit(principal, action in [Action::\"tool{tool}\", Action::\"tool{}\"], resource) when {{ context.number has count && context.number.count > {i} }};\n",
                (tool + 1) % TOOLS
            ),
            3 => format!(
                "forbid(principal, action == Action::\"tool{tool}\", resource) when {{ context.time.hour < 6 && context.description like \"*drop*{i}*\" }};\n"
            ),
            _ => format!(
                "forbid(principal, action, resource) when {{ context has room && context.room == \"room{i}\" }};\n"
            ),
        };
        if opaque {
            text.push_str(&policy.replace("when { ", "when { context.description like \"*\" && "));
        } else {
            text.push_str(&policy);
        }
    }
    text
}

pub(crate) fn run(count: usize, requests: usize) -> anyhow::Result<()> {
    if count == 0 || requests == 0 {
        bail!("--policies and --requests must be at least 1");
    }
    for (opaque, label) in [
        (
            false,
            "as written: countersign settles the tests it can, Cedar the rest",
        ),
        (
            true,
            "opaque: each condition starts with `like`, every policy to Cedar",
        ),
    ] {
        println!("-- {label}");
        measure(count, requests, opaque)?;
    }
    Ok(())
}

fn measure(count: usize, requests: usize, opaque: bool) -> anyhow::Result<()> {
    let started = Instant::now();
    let set = PolicySet::load(vec![PolicyFile {
        name: "bench.cedar".into(),
        text: policies(count, opaque),
    }])?;
    let load = started.elapsed();

    let groups = vec!["g1".to_string(), "g3".to_string()];
    let mut nanos = Vec::with_capacity(requests);
    let (mut approved, mut rejected, mut people, mut none) = (0u64, 0u64, 0u64, 0u64);
    // Every hour of one day in turn: the policies that test the hour are settled by
    // countersign by day and go to Cedar at night (their `like`).
    let day = chrono::DateTime::<chrono::Utc>::from_timestamp(1_764_547_200, 0).unwrap_or_default();
    let all = Instant::now();
    for r in 0..requests {
        let tool = format!("tool{}", r % (TOOLS + 5));
        let mut details = BTreeMap::new();
        details.insert("amount".to_string(), format!("{}.50", r % 400));
        details.insert("count".to_string(), format!("{}", r % 1200));
        details.insert(
            "env".to_string(),
            if r % 3 == 0 { "production" } else { "staging" }.to_string(),
        );
        let room = format!("room{}", r % 2000);
        let input = Input {
            agent: "bench-bot",
            groups: &groups,
            tool: Some(&tool),
            resource: RESOURCE,
            gateway: false,
            description: "refund an order",
            details: &details,
            room: Some(&room),
            now: day + chrono::Duration::minutes((r % 1440) as i64 * 37 % 1440),
            zone: chrono_tz::UTC,
            pending: 0,
            recent: 0,
        };
        let t = Instant::now();
        let evaluation = set.evaluate(&input);
        nanos.push(t.elapsed().as_nanos() as u64);
        match evaluation.outcome {
            Outcome::Approve { .. } => approved += 1,
            Outcome::Reject { .. } => rejected += 1,
            Outcome::Person { .. } => people += 1,
            Outcome::NoMatch => none += 1,
        }
    }
    let total = all.elapsed();
    nanos.sort_unstable();
    let pct = |p: f64| nanos[((nanos.len() as f64 - 1.0) * p).round() as usize] as f64 / 1000.0;
    println!(
        "{count} policies (loaded and validated in {:.1} ms), {requests} requests, load average {:.2}",
        load.as_secs_f64() * 1000.0,
        load_average()
    );
    println!(
        "evaluation us: p50 {:.1}  p99 {:.1}  max {:.1}   ({:.0} evaluations/s on one core)",
        pct(0.5),
        pct(0.99),
        pct(1.0),
        requests as f64 / total.as_secs_f64()
    );
    println!(
        "outcomes: {approved} approved, {rejected} rejected, {people} to people, {none} no match"
    );
    println!(
        "{}",
        serde_json::json!({
            "bench": "policy", "policies": count, "requests": requests, "opaque": opaque,
            "load_ms": load.as_secs_f64() * 1000.0,
            "p50_us": pct(0.5), "p99_us": pct(0.99), "max_us": pct(1.0),
            "per_second": requests as f64 / total.as_secs_f64(),
            "approved": approved, "rejected": rejected, "people": people, "no_match": none,
        })
    );
    Ok(())
}
