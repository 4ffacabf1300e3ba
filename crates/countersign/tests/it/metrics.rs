//! `/metrics`, scraped from a real `serve` and read with the Prometheus client library's
//! own text parser (tests/python/metrics_check.py): the values move as requests are
//! created, waited for and decided; an admin's token or the separate metrics address
//! is needed; and the Grafana dashboard in docs/ queries only series that exist.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// A scrape as the parser read it.
struct Scrape {
    families: BTreeMap<String, String>,
    samples: Vec<(String, BTreeMap<String, String>, Option<f64>)>,
    dashboard: Value,
}

impl Scrape {
    /// The value of the one sample `name` with (at least) these labels; 0 when absent.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found: Vec<_> = self
            .samples
            .iter()
            .filter(|(n, l, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
            })
            .collect();
        assert!(found.len() <= 1, "{name} {labels:?} matches {found:?}");
        found.first().and_then(|(_, _, v)| *v).unwrap_or(0.0)
    }

    fn has(&self, name: &str, labels: &[(&str, &str)]) -> bool {
        self.samples.iter().any(|(n, l, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
    }
}

fn parse(python: &Path, text: &str, dashboard: Option<&Path>) -> Scrape {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("scrape.txt");
    std::fs::write(&file, text).unwrap();
    let mut cmd = std::process::Command::new(python);
    cmd.arg(repo_root().join("tests/python/metrics_check.py"))
        .arg(&file);
    if let Some(board) = dashboard {
        cmd.arg(board);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "the Prometheus parser refused the scrape: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    let families = json["families"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
        .collect();
    let samples = json["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let labels = s[1]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect();
            (s[0].as_str().unwrap().to_string(), labels, s[2].as_f64())
        })
        .collect();
    Scrape {
        families,
        samples,
        dashboard: json["dashboard"].clone(),
    }
}

async fn scrape_text(server: &Server, url: &str, token: Option<&str>) -> (StatusCode, String) {
    let mut req = server.http().get(url);
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    if status == StatusCode::OK {
        let kind = resp.headers()["content-type"].to_str().unwrap().to_string();
        assert!(kind.starts_with("text/plain; version=0.0.4"), "{kind}");
    }
    (status, resp.text().await.unwrap())
}

fn invoice(n: usize) -> Value {
    json!({
        "action_description": format!("Pay invoice M-{n}"),
        "action_details": {"amount": format!("{}", 100 + n), "currency": "EUR"}
    })
}

/// The `metrics at http://ADDR/metrics` line serve prints for `[server] metrics_listen`.
/// It comes after the `listening on` line `Server::spawn` waits for.
async fn metrics_url(server: &Server) -> String {
    for _ in 0..100 {
        let log = server.stderr();
        if let Some(url) = log
            .lines()
            .find_map(|l| l.split_once("metrics at "))
            .and_then(|(_, rest)| rest.split_whitespace().next())
        {
            return url.to_string();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no metrics address announced:\n{}", server.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_with_requests_and_need_an_admin() {
    let python = match python_with(&["prometheus_client"]) {
        Ok(python) => python,
        Err(why) => return skip(&why),
    };
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let agent = create_token(&data, "agent", "metrics-bot").await;
    let approver = create_token(&data, "approver", "alice@example.com").await;
    let admin = create_token(&data, "admin", "ops").await;
    let mut cmd = serve_command();
    cmd.args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .env("COUNTERSIGN_METRICS_LISTEN", "127.0.0.1:0");
    let server = Server::spawn(cmd);
    let open_url = metrics_url(&server).await;
    let url = server.url("/metrics");

    // Refused without a credential, and to an agent or an approver.
    let (status, _) = scrape_text(&server, &url, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    for token in [&agent, &approver] {
        let (status, _) = scrape_text(&server, &url, Some(token)).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
    }
    let (status, text) = scrape_text(&server, &url, Some(&admin)).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let before = parse(&python, &text, None);
    for (family, kind) in [
        ("countersign_requests", "counter"),
        ("countersign_decisions", "counter"),
        ("countersign_request_wait_seconds", "histogram"),
        ("countersign_wakeup_seconds", "histogram"),
        ("countersign_requests_pending", "gauge"),
        ("countersign_outbox_depth", "gauge"),
        ("countersign_delivery_failures", "counter"),
        ("countersign_log_entries", "gauge"),
        ("countersign_log_checkpoint_age_seconds", "gauge"),
        ("countersign_http_requests", "counter"),
        ("countersign_http_request_duration_seconds", "histogram"),
    ] {
        assert_eq!(
            before.families.get(family).map(String::as_str),
            Some(kind),
            "{family} in {:?}",
            before.families
        );
    }
    assert_eq!(before.value("countersign_requests_pending", &[]), 0.0);
    let entries_before = before.value("countersign_log_entries", &[]);
    assert!(
        entries_before >= 3.0,
        "three tokens logged: {entries_before}"
    );

    // Three requests: one waited for and approved, one rejected, one left pending.
    let ids: Vec<String> = {
        let mut ids = Vec::new();
        for n in 0..3 {
            ids.push(server.create_request(&agent, &invoice(n)).await);
        }
        ids
    };
    let waiting = {
        let http = server.http().clone();
        let url = server.url(&format!(
            "/api/v1/requests/{}/wait?timeout_seconds=30",
            ids[0]
        ));
        let agent = agent.clone();
        tokio::spawn(async move { send(http.get(url).bearer_auth(agent)).await })
    };
    // The wait is parked before the decision, so that it is woken by it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, body) = server.decide(&ids[0], &approver, "approved").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, woken) = waiting.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(woken["status"], "approved", "{woken}");
    let (status, body) = server.decide(&ids[1], &approver, "rejected").await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // The log signs a checkpoint soon after; its age is then a number of seconds.
    let mut after = None;
    for _ in 0..50 {
        let (_, text) = scrape_text(&server, &url, Some(&admin)).await;
        let scrape = parse(&python, &text, None);
        if scrape.samples.iter().any(|(n, _, v)| {
            n == "countersign_log_checkpoint_size" && v.is_some_and(|v| v >= entries_before + 5.0)
        }) {
            after = Some(scrape);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = after.expect("a checkpoint covering the new entries");
    let moved = |name: &str, labels: &[(&str, &str)]| {
        after.value(name, labels) - before.value(name, labels)
    };
    assert_eq!(
        moved("countersign_requests_total", &[("status", "pending")]),
        3.0
    );
    assert_eq!(
        moved("countersign_requests_total", &[("status", "approved")]),
        1.0
    );
    assert_eq!(
        moved("countersign_requests_total", &[("status", "rejected")]),
        1.0
    );
    let human_api = |decision| {
        [
            ("channel", "api"),
            ("authorization_type", "human"),
            ("decision", decision),
        ]
    };
    assert_eq!(
        moved("countersign_decisions_total", &human_api("approved")),
        1.0
    );
    assert_eq!(
        moved("countersign_decisions_total", &human_api("rejected")),
        1.0
    );
    assert_eq!(
        after.value("countersign_decisions_total", &human_api("approved")),
        1.0
    );
    // Every decision a person can make is a series from the start.
    assert!(before.has(
        "countersign_decisions_total",
        &[("channel", "slack"), ("authorization_type", "human")]
    ));
    assert_eq!(
        moved(
            "countersign_request_wait_seconds_count",
            &[("authorization_type", "human")]
        ),
        2.0
    );
    assert_eq!(moved("countersign_wakeup_seconds_count", &[]), 1.0);
    // The woken wait answered within a second of the decision.
    let le_1 = after
        .samples
        .iter()
        .find_map(|(n, l, _)| {
            let le = l.get("le")?;
            (n == "countersign_wakeup_seconds_bucket" && le.parse::<f64>().ok()? == 1.0)
                .then(|| le.clone())
        })
        .expect("a 1 s bucket");
    assert_eq!(
        moved(
            "countersign_wakeup_seconds_bucket",
            &[("le", le_1.as_str())]
        ),
        1.0
    );
    assert_eq!(after.value("countersign_requests_pending", &[]), 1.0);
    assert!(after.value("countersign_log_entries", &[]) >= entries_before + 5.0);
    let age = after.value("countersign_log_checkpoint_age_seconds", &[]);
    assert!((0.0..60.0).contains(&age), "checkpoint age {age}");
    assert_eq!(after.value("countersign_outbox_depth", &[]), 0.0);

    // HTTP by route template (never the raw path) and status.
    let http = |route: &str, method: &str, status: &str| {
        moved(
            "countersign_http_requests_total",
            &[("route", route), ("method", method), ("status", status)],
        )
    };
    assert_eq!(http("/api/v1/requests", "POST", "201"), 3.0);
    assert_eq!(http("/api/v1/requests/{id}/decision", "POST", "200"), 2.0);
    assert_eq!(http("/api/v1/requests/{id}/wait", "GET", "200"), 1.0);
    assert!(
        after.value(
            "countersign_http_requests_total",
            &[("route", "/metrics"), ("status", "401")]
        ) >= 1.0
    );
    assert!(
        !after
            .samples
            .iter()
            .any(|(_, l, _)| l.get("route").is_some_and(|r| r.contains(&ids[0]))),
        "a request id became a label"
    );
    assert_eq!(
        moved(
            "countersign_http_request_duration_seconds_count",
            &[("route", "/api/v1/requests"), ("method", "POST")]
        ),
        3.0
    );
    let _ = server.get("/no/such/page", None).await;
    let (_, text) = scrape_text(&server, &url, Some(&admin)).await;
    let last = parse(&python, &text, None);
    assert!(
        last.value(
            "countersign_http_requests_total",
            &[("route", "unmatched"), ("status", "404")]
        ) >= 1.0
    );

    // The separate address needs no credential and serves only /metrics.
    let (status, text) = scrape_text(&server, &open_url, None).await;
    assert_eq!(status, StatusCode::OK);
    let open = parse(&python, &text, None);
    assert_eq!(open.value("countersign_requests_pending", &[]), 1.0);
    let (status, _) = scrape_text(
        &server,
        &open_url.replace("/metrics", "/api/v1/requests"),
        Some(&admin),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // The dashboard queries only what a scrape has.
    let board = dashboard_path();
    let checked = parse(&python, &text, Some(&board));
    let queried = checked.dashboard["queried"].as_array().unwrap();
    assert!(queried.len() >= 10, "{}", checked.dashboard);
    assert_eq!(
        checked.dashboard["missing"],
        json!([]),
        "the dashboard queries series /metrics lacks"
    );
}

fn dashboard_path() -> PathBuf {
    repo_root().join("docs/grafana-dashboard.json")
}

/// The dashboard is Grafana's JSON model: panels for every group of series, each with
/// queries, and a Prometheus data source chosen on import.
#[test]
fn the_grafana_dashboard_has_a_panel_for_each_group() {
    let board: Value = serde_json::from_str(&std::fs::read_to_string(dashboard_path()).unwrap())
        .expect("docs/grafana-dashboard.json is JSON");
    let panels = board["panels"].as_array().unwrap();
    let exprs: Vec<String> = panels
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().unwrap_or_default().to_string())
        .collect();
    for group in [
        "countersign_requests_total",
        "countersign_decisions_total",
        "countersign_request_wait_seconds_bucket",
        "countersign_wakeup_seconds_bucket",
        "countersign_requests_pending",
        "countersign_outbox_depth",
        "countersign_delivery_failures_total",
        "countersign_log_entries",
        "countersign_log_checkpoint_age_seconds",
        "countersign_http_requests_total",
        "countersign_http_request_duration_seconds_bucket",
    ] {
        assert!(
            exprs.iter().any(|e| e.contains(group)),
            "no panel queries {group}"
        );
    }
    assert!(
        board["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["type"] == "datasource" && v["query"] == "prometheus"),
        "a Prometheus data source variable"
    );
}
