//! The seed's record views over a bridged process's `records.json`: `record_summary(n)`
//! (totals, resolved against open, by `record_type`, the n most recent) and
//! `record_dashboard` (the wider table, and the open records with their exposure: the
//! sum of `cost` of open records). Each record is joined with countersign's own
//! requests: a record whose `id` is a bridged proposal's carries that request's id, its
//! status, and the outcome countersign recorded from it. Served by the approval-gate
//! profile, `countersign records` and the dashboard's Records page alike.
//!
//! The seed interprets four keys when present (`id`, `record_type`, `resolved`,
//! `outcome`) and carries every other field through; so does this. A record is open when
//! it says `"resolved": false`, and resolved otherwise, as the bridge reads outcomes.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use countersign_core::Decider;
use countersign_store::RequestQuery;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::files::{self, Proposal};
use super::proposals::bridged;
use super::{BridgeConfig, blocking};
use crate::error::GateError;
use crate::gate::Gate;
use crate::views::ApprovalView;

/// The most requests of one bridge joined with its records.
const JOIN_LIMIT: usize = 10_000;
/// How many of the latest records the dashboard's table shows.
pub const DASHBOARD_ROWS: usize = 50;
/// The most recent entries `record_summary` shows at most.
pub const MAX_RECENT: usize = 500;

/// Which view: the summary with its n most recent entries, or the dashboard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordsView {
    Summary { recent: usize },
    Dashboard,
}

/// The countersign request a record is the outcome of.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RecordRequest {
    pub request_id: String,
    /// pending, approved, rejected, timed_out or cancelled.
    pub status: String,
    /// The outcome countersign recorded from this record (succeeded, failed, partial,
    /// unknown), once it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
}

/// One record of the process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RecordRow {
    /// Its place in records.json, from 0.
    pub position: usize,
    pub id: Option<String>,
    pub record_type: Option<String>,
    pub resolved: bool,
    pub outcome: Option<String>,
    pub cost: Option<f64>,
    pub result: Option<f64>,
    pub label: Option<String>,
    /// Every field, as the process wrote it.
    pub fields: Map<String, Value>,
    /// The countersign request it is the outcome of: set when its `id` is a bridged
    /// proposal's.
    pub request: Option<RecordRequest>,
}

/// Counts and sums over some records.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Totals {
    pub records: usize,
    pub resolved: usize,
    pub open: usize,
    /// Sum of `cost` over every record that has one.
    pub cost: f64,
    /// Sum of `result` over every record that has one.
    pub result: f64,
    /// Sum of `cost` over the open records.
    pub exposure: f64,
    /// Records whose `id` is a proposal countersign approved.
    pub countersign_approved: usize,
    /// Records by `outcome` (`win`, `loss`, ...).
    pub outcomes: BTreeMap<String, usize>,
}

impl Totals {
    fn add(&mut self, row: &RecordRow) {
        self.records += 1;
        if row.resolved {
            self.resolved += 1;
        } else {
            self.open += 1;
            self.exposure += row.cost.unwrap_or(0.0);
        }
        self.cost += row.cost.unwrap_or(0.0);
        self.result += row.result.unwrap_or(0.0);
        if row.request.as_ref().is_some_and(|r| r.status == "approved") {
            self.countersign_approved += 1;
        }
        if let Some(outcome) = &row.outcome {
            *self.outcomes.entry(outcome.clone()).or_default() += 1;
        }
    }

    fn merge(&mut self, other: &Totals) {
        self.records += other.records;
        self.resolved += other.resolved;
        self.open += other.open;
        self.cost += other.cost;
        self.result += other.result;
        self.exposure += other.exposure;
        self.countersign_approved += other.countersign_approved;
        for (outcome, n) in &other.outcomes {
            *self.outcomes.entry(outcome.clone()).or_default() += n;
        }
    }

    /// Sums rounded to 12 decimals, so that 0.1 + 0.2 reads 0.3.
    fn rounded(mut self) -> Self {
        for sum in [&mut self.cost, &mut self.result, &mut self.exposure] {
            *sum = round(*sum);
        }
        self
    }
}

/// One `record_type`'s share.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TypeRow {
    /// The record type (`(none)` for records without one).
    pub record_type: String,
    #[serde(flatten)]
    pub totals: Totals,
}

/// One bridge's records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BridgeRecords {
    pub bridge: String,
    pub records_file: String,
    /// Why records.json could not be read (then everything else is empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub totals: Totals,
    pub by_type: Vec<TypeRow>,
    /// Proposals of this bridge awaiting a decision in countersign now.
    pub awaiting_decision: usize,
    /// The latest records, newest first: the summary's n, the dashboard's table.
    pub recent: Vec<RecordRow>,
    /// The open records, oldest first (the dashboard only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub open: Vec<RecordRow>,
}

/// What `record_summary`, `record_dashboard`, `countersign records` and the Records page
/// show.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RecordsReport {
    /// Over every bridge shown.
    pub totals: Totals,
    pub bridges: Vec<BridgeRecords>,
}

/// The records of `bridges` (of `only` that one, when given), joined with countersign's
/// requests. An approver's or admin's view: `decider` says the caller may see it.
pub async fn report(
    gate: &Gate,
    _decider: &Decider,
    bridges: &[BridgeConfig],
    only: Option<&str>,
    view: RecordsView,
) -> Result<RecordsReport, GateError> {
    if let Some(name) = only
        && !bridges.iter().any(|b| b.name == name)
    {
        return Err(GateError::NotFound(format!(
            "bridge {name:?} (the bridges here: {})",
            names(bridges)
        )));
    }
    let mut out = RecordsReport {
        totals: Totals::default(),
        bridges: Vec::new(),
    };
    for bridge in bridges.iter().filter(|b| only.is_none_or(|o| o == b.name)) {
        let requests = bridge_requests(gate, &bridge.name).await?;
        let path = bridge.paths.records.clone();
        let read = blocking(move || files::read_records(&path)).await;
        let records_file = bridge.paths.records.display().to_string();
        let shown = match read {
            Ok(records) => summarize(&bridge.name, records_file, &records, &requests, view),
            Err(err) => BridgeRecords {
                bridge: bridge.name.clone(),
                records_file,
                error: Some(err.to_string()),
                totals: Totals::default(),
                by_type: Vec::new(),
                awaiting_decision: requests.awaiting,
                recent: Vec::new(),
                open: Vec::new(),
            },
        };
        out.totals.merge(&shown.totals);
        out.bridges.push(shown);
    }
    out.totals = out.totals.rounded();
    Ok(out)
}

fn names(bridges: &[BridgeConfig]) -> String {
    if bridges.is_empty() {
        "none".to_string()
    } else {
        bridges
            .iter()
            .map(|b| b.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A bridge's requests, by the proposal id they carry.
#[derive(Debug, Default)]
pub struct JoinedRequests {
    by_id: HashMap<String, RecordRequest>,
    awaiting: usize,
}

async fn bridge_requests(gate: &Gate, bridge: &str) -> Result<JoinedRequests, GateError> {
    let query = RequestQuery {
        status: None,
        requested_by: Some(super::principal(bridge).id),
        limit: JOIN_LIMIT,
    };
    let mut out = JoinedRequests::default();
    // Newest first: the first request seen for an id is its latest.
    for request in gate.store().list_requests(&query).await? {
        let view = ApprovalView::new(&request);
        let Some((_, raw)) = bridged(&view) else {
            continue;
        };
        if view.status == "pending" && !request.is_past_expiry(gate.now()) {
            out.awaiting += 1;
        }
        let Some(id) = Proposal::parse(raw).and_then(|p| p.id()) else {
            continue;
        };
        out.by_id.entry(id).or_insert_with(|| RecordRequest {
            request_id: view.request_id.clone(),
            status: view.status.clone(),
            outcome: view.outcome.as_ref().map(|o| o.status.clone()),
        });
    }
    Ok(out)
}

/// One bridge's records as `view` shows them.
pub fn summarize(
    bridge: &str,
    records_file: String,
    records: &[Map<String, Value>],
    requests: &JoinedRequests,
    view: RecordsView,
) -> BridgeRecords {
    let rows: Vec<RecordRow> = records
        .iter()
        .enumerate()
        .map(|(position, fields)| row(position, fields, requests))
        .collect();
    let mut totals = Totals::default();
    let mut by_type: BTreeMap<String, Totals> = BTreeMap::new();
    for row in &rows {
        totals.add(row);
        let kind = row.record_type.clone().unwrap_or_else(|| "(none)".into());
        by_type.entry(kind).or_default().add(row);
    }
    let recent_n = match view {
        RecordsView::Summary { recent } => recent.min(MAX_RECENT),
        RecordsView::Dashboard => DASHBOARD_ROWS,
    };
    let open = match view {
        RecordsView::Summary { .. } => Vec::new(),
        RecordsView::Dashboard => rows.iter().filter(|r| !r.resolved).cloned().collect(),
    };
    BridgeRecords {
        bridge: bridge.to_string(),
        records_file,
        error: None,
        totals: totals.rounded(),
        by_type: by_type
            .into_iter()
            .map(|(record_type, totals)| TypeRow {
                record_type,
                totals: totals.rounded(),
            })
            .collect(),
        awaiting_decision: requests.awaiting,
        recent: rows.iter().rev().take(recent_n).cloned().collect(),
        open,
    }
}

fn row(position: usize, fields: &Map<String, Value>, requests: &JoinedRequests) -> RecordRow {
    let text = |key: &str| match fields.get(key) {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Null) | None => None,
        Some(other) => Some(other.to_string()),
    };
    let number = |key: &str| match fields.get(key) {
        Some(Value::Number(n)) => n.as_f64(),
        Some(Value::String(s)) => s.trim().parse::<f64>().ok().filter(|f| f.is_finite()),
        _ => None,
    };
    let id = files::id_text(fields.get("id"));
    RecordRow {
        position,
        request: id.as_ref().and_then(|id| requests.by_id.get(id).cloned()),
        id,
        record_type: text("record_type"),
        resolved: fields.get("resolved") != Some(&Value::Bool(false)),
        outcome: text("outcome"),
        cost: number("cost"),
        result: number("result"),
        label: text("label"),
        fields: fields.clone(),
    }
}

fn round(value: f64) -> f64 {
    let rounded = (value * 1e12).round() / 1e12;
    if rounded == 0.0 { 0.0 } else { rounded }
}

/// A number as people write it: no trailing zeros, no exponent for ordinary amounts.
fn amount(value: f64) -> String {
    let value = round(value);
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{value:.0}")
    } else {
        let text = format!("{value:.12}");
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn optional(value: Option<f64>) -> String {
    value.map(amount).unwrap_or_else(|| "-".into())
}

impl RecordsReport {
    /// The summary as text: per bridge, the totals, the types and the recent entries.
    pub fn summary_text(&self) -> String {
        self.text(false)
    }

    /// The dashboard as text: per bridge, the totals, the types, the wider table of the
    /// latest records, and the open records with their exposure.
    pub fn dashboard_text(&self) -> String {
        self.text(true)
    }

    fn text(&self, dashboard: bool) -> String {
        if self.bridges.is_empty() {
            return "No bridges are configured ([[bridge]] in the config; docs/bridge.md)."
                .to_string();
        }
        let mut out = String::new();
        for (i, b) in self.bridges.iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            let _ = writeln!(out, "=== {} ({}) ===", b.bridge, b.records_file);
            if let Some(err) = &b.error {
                let _ = writeln!(out, "  records.json cannot be read: {err}");
                continue;
            }
            totals_text(&mut out, &b.totals, b.awaiting_decision);
            if !b.by_type.is_empty() {
                out.push_str("\n  By type:\n");
                let _ = writeln!(
                    out,
                    "    {:<16} {:>7} {:>8} {:>5} {:>10} {:>10} {:>10}",
                    "type", "records", "resolved", "open", "cost", "result", "exposure"
                );
                for t in &b.by_type {
                    let _ = writeln!(
                        out,
                        "    {:<16} {:>7} {:>8} {:>5} {:>10} {:>10} {:>10}",
                        t.record_type,
                        t.totals.records,
                        t.totals.resolved,
                        t.totals.open,
                        amount(t.totals.cost),
                        amount(t.totals.result),
                        amount(t.totals.exposure)
                    );
                }
            }
            if dashboard {
                let _ = writeln!(
                    out,
                    "\n  Latest {} record(s), newest first:",
                    b.recent.len()
                );
                table_text(&mut out, &b.recent);
                let _ = writeln!(
                    out,
                    "\n  Open records: {}, exposure {}",
                    b.open.len(),
                    amount(b.totals.exposure)
                );
                table_text(&mut out, &b.open);
            } else if !b.recent.is_empty() {
                let _ = writeln!(out, "\n  {} most recent:", b.recent.len());
                for r in &b.recent {
                    let _ = writeln!(out, "    {}", entry_text(r));
                }
            }
        }
        if self.bridges.len() > 1 {
            out.push_str("\n=== all bridges ===\n");
            totals_text(
                &mut out,
                &self.totals,
                self.bridges.iter().map(|b| b.awaiting_decision).sum(),
            );
        }
        out.trim_end().to_string()
    }
}

fn totals_text(out: &mut String, t: &Totals, awaiting: usize) {
    let _ = writeln!(
        out,
        "  Records: {} ({} resolved, {} open)",
        t.records, t.resolved, t.open
    );
    let _ = writeln!(
        out,
        "  Cost: {}   Result: {}   Exposure (cost of open records): {}",
        amount(t.cost),
        amount(t.result),
        amount(t.exposure)
    );
    if !t.outcomes.is_empty() {
        let outcomes: Vec<String> = t.outcomes.iter().map(|(o, n)| format!("{o} {n}")).collect();
        let _ = writeln!(out, "  Outcomes: {}", outcomes.join(", "));
    }
    let _ = writeln!(
        out,
        "  countersign: {} record(s) of approved proposals; {} proposal(s) awaiting a decision",
        t.countersign_approved, awaiting
    );
}

fn entry_text(r: &RecordRow) -> String {
    let mut line = format!(
        "{}  {}  {}  {}  cost {}  result {}",
        r.id.as_deref().unwrap_or("(no id)"),
        r.record_type.as_deref().unwrap_or("-"),
        if r.resolved { "resolved" } else { "open" },
        r.outcome.as_deref().unwrap_or("-"),
        optional(r.cost),
        optional(r.result),
    );
    if let Some(label) = &r.label {
        let _ = write!(line, "  {label}");
    }
    if let Some(req) = &r.request {
        let _ = write!(line, "  [{} {}]", req.request_id, req.status);
    }
    line
}

fn table_text(out: &mut String, rows: &[RecordRow]) {
    if rows.is_empty() {
        out.push_str("    (none)\n");
        return;
    }
    let _ = writeln!(
        out,
        "    {:<14} {:<12} {:<8} {:<8} {:>9} {:>9}  {:<24} {:<28} label",
        "id", "type", "state", "outcome", "cost", "result", "request", "status"
    );
    for r in rows {
        let (request, status) = match &r.request {
            Some(q) => (
                q.request_id.clone(),
                match &q.outcome {
                    Some(o) => format!("{} (outcome {o})", q.status),
                    None => q.status.clone(),
                },
            ),
            None => ("-".into(), "-".into()),
        };
        let _ = writeln!(
            out,
            "    {:<14} {:<12} {:<8} {:<8} {:>9} {:>9}  {:<24} {:<28} {}",
            r.id.as_deref().unwrap_or("-"),
            r.record_type.as_deref().unwrap_or("-"),
            if r.resolved { "resolved" } else { "open" },
            r.outcome.as_deref().unwrap_or("-"),
            optional(r.cost),
            optional(r.result),
            request,
            status,
            r.label.as_deref().unwrap_or("")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(value: Value) -> Vec<Map<String, Value>> {
        value
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_object().unwrap().clone())
            .collect()
    }

    #[test]
    fn totals_types_exposure_and_the_join() {
        let records = records(serde_json::json!([
            {"id": "job-1041", "record_type": "reindex", "resolved": true, "outcome": "win",
             "cost": 4.25, "result": 11.80, "label": "nightly reindex, shard 3"},
            {"id": "job-1042", "record_type": "reindex", "resolved": false, "cost": 6.00},
            {"id": "job-7", "record_type": "backup", "resolved": false, "cost": "0.1"},
            {"id": "job-8", "record_type": "backup", "resolved": false, "cost": 0.2},
            {"record_type": "backup", "outcome": "loss", "result": -1}
        ]));
        let mut requests = JoinedRequests::default();
        requests.by_id.insert(
            "job-1042".into(),
            RecordRequest {
                request_id: "req_1".into(),
                status: "approved".into(),
                outcome: None,
            },
        );
        requests.awaiting = 2;
        let dashboard = summarize(
            "reindexer",
            "records.json".into(),
            &records,
            &requests,
            RecordsView::Dashboard,
        );
        let t = &dashboard.totals;
        assert_eq!((t.records, t.resolved, t.open), (5, 2, 3));
        assert_eq!(t.exposure, 6.3);
        assert_eq!(t.cost, 10.55);
        assert_eq!(t.result, 10.8);
        assert_eq!(t.countersign_approved, 1);
        assert_eq!(t.outcomes["win"], 1);
        assert_eq!(t.outcomes["loss"], 1);
        assert_eq!(dashboard.awaiting_decision, 2);
        let types: Vec<(&str, usize, usize, f64)> = dashboard
            .by_type
            .iter()
            .map(|r| {
                (
                    r.record_type.as_str(),
                    r.totals.records,
                    r.totals.open,
                    r.totals.exposure,
                )
            })
            .collect();
        assert_eq!(types, [("backup", 3, 2, 0.3), ("reindex", 2, 1, 6.0)]);
        let open: Vec<_> = dashboard.open.iter().map(|r| r.id.clone()).collect();
        assert_eq!(
            open,
            [
                Some("job-1042".into()),
                Some("job-7".into()),
                Some("job-8".into())
            ]
        );
        assert_eq!(dashboard.recent[0].position, 4, "newest first");
        assert_eq!(
            dashboard.open[0].request.as_ref().unwrap().request_id,
            "req_1"
        );

        let summary = summarize(
            "reindexer",
            "records.json".into(),
            &records,
            &requests,
            RecordsView::Summary { recent: 2 },
        );
        assert_eq!(summary.recent.len(), 2);
        assert!(summary.open.is_empty());
        let report = RecordsReport {
            totals: summary.totals.clone(),
            bridges: vec![summary],
        };
        let text = report.summary_text();
        assert!(text.contains("Records: 5 (2 resolved, 3 open)"), "{text}");
        assert!(
            text.contains("Exposure (cost of open records): 6.3"),
            "{text}"
        );
    }

    #[test]
    fn amounts_read_as_written() {
        assert_eq!(amount(6.0), "6");
        assert_eq!(amount(0.1 + 0.2), "0.3");
        assert_eq!(amount(-1.5), "-1.5");
    }
}
