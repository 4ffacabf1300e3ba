//! Bridges (docs/bridge.md): a real process on approval-gate-mcp's file contract
//! (tests/python/approval_process.py, the seed's example code) gated by a real `serve`.
//! Its proposals become requests, approved and rejected over REST; it acts once on each
//! approval; a crash of countersign between the two file writes never makes it act
//! twice; its concurrent writes under the lock protocol lose no proposal.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{self, Server, create_token, python};

pub(crate) const BRIDGE: &str = "reindexer";

/// The process, killed on drop.
pub(crate) struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A data directory whose config has a `[[bridge]]` for the process folder `proc`.
pub(crate) fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let proc_dir = dir.path().join("proc");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::create_dir_all(&proc_dir).unwrap();
    std::fs::write(
        data.join("countersign.toml"),
        format!(
            "[cli]\nunattended_decisions = true\n\n[[bridge]]\nname = \"{BRIDGE}\"\ndir = {:?}\n",
            proc_dir.display().to_string()
        ),
    )
    .unwrap();
    (dir, data, proc_dir)
}

pub(crate) fn serve(data: &Path, failpoint: Option<&str>) -> Server {
    let mut cmd = common::serve_command();
    cmd.arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--data-dir")
        .arg(data);
    if let Some(point) = failpoint {
        cmd.env("COUNTERSIGN_TEST_BRIDGE_FAILPOINT", point);
    }
    Server::spawn(cmd)
}

/// Starts the process proposing `jobs`, in order.
pub(crate) fn start_process(proc_dir: &Path, jobs: &[Value], extra: &[&str]) -> Process {
    let jobs_file = proc_dir.join("jobs.json");
    std::fs::write(&jobs_file, serde_json::to_vec(jobs).unwrap()).unwrap();
    let script = common::repo_root().join("tests/python/approval_process.py");
    let child = std::process::Command::new(python().0)
        .arg(script)
        .arg("--dir")
        .arg(proc_dir)
        .arg("--jobs")
        .arg(&jobs_file)
        .args(extra)
        .stdin(Stdio::null())
        .spawn()
        .expect("start the process (python3)");
    Process(child)
}

pub(crate) fn job(id: &str) -> Value {
    json!({"id": id, "label": format!("reindex {id}"), "action": "reindex", "cost": 6.00,
           "created_at": "2026-08-18T22:14:07Z"})
}

/// Every proposal the process acted on, in order.
pub(crate) fn actions(proc_dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(proc_dir.join("actions.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

pub(crate) fn times_acted(proc_dir: &Path, id: &str) -> usize {
    actions(proc_dir).iter().filter(|a| a["id"] == id).count()
}

/// The bridge's requests in `status`, by the proposal id they carry.
async fn requests(server: &Server, token: &str, status: &str) -> Vec<Value> {
    let (code, body) = server
        .get(
            &format!("/api/v1/requests?status={status}&requested_by=bridge:{BRIDGE}&limit=1000"),
            Some(token),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    body["requests"].as_array().unwrap().clone()
}

/// The id of the proposal a request carries ("" for one without).
fn proposal_id(request: &Value) -> String {
    let proposal = request["action_details"]["proposal"].as_str().unwrap();
    let proposal: Value = serde_json::from_str(proposal).unwrap();
    proposal["id"].as_str().unwrap_or_default().to_string()
}

/// Polls `check` every 50 ms for up to 30 s.
pub(crate) async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    for _ in 0..600 {
        if let Some(found) = check().await {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: not within 30 s");
}

/// The pending request for proposal `id`.
pub(crate) async fn pending_request(server: &Server, token: &str, id: &str) -> Value {
    eventually(&format!("a pending request for {id}"), async || {
        requests(server, token, "pending")
            .await
            .into_iter()
            .find(|r| proposal_id(r) == id)
    })
    .await
}

pub(crate) fn pending_ids(proc_dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(proc_dir.join("pending.json")).unwrap_or_default();
    let Ok(value) = serde_json::from_str::<Value>(&text) else {
        return vec!["(unreadable)".into()];
    };
    value["proposals"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| p["id"].as_str().unwrap_or("?").to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn bridge_gates_a_process_on_the_file_contract() {
    let (_dir, data, proc_dir) = setup();
    let mut server = serve(&data, None);
    let approver = create_token(&data, "approver", "alice").await;
    let _process = start_process(&proc_dir, &[job("job-1"), job("job-2"), job("job-3")], &[]);

    // Each proposal is a request of bridge:reindexer, described by its label and bound to
    // every field and its exact text.
    let first = pending_request(&server, &approver, "job-1").await;
    assert_eq!(first["requested_by"], format!("bridge:{BRIDGE}"));
    assert_eq!(first["action_description"], "reindex job-1");
    let details = &first["action_details"];
    assert_eq!(details["bridge"], BRIDGE);
    assert_eq!(details["tool"], "reindex");
    assert_eq!(details["/id"], "\"job-1\"");
    assert_eq!(details["/cost"], "6");
    let second = pending_request(&server, &approver, "job-2").await;
    let third = pending_request(&server, &approver, "job-3").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        actions(&proc_dir).is_empty(),
        "nothing acted before a decision"
    );
    assert_eq!(pending_ids(&proc_dir), ["job-1", "job-2", "job-3"]);

    // Approve 1 and 3, reject 2, over REST.
    for (request, decision) in [
        (&first, "approve"),
        (&second, "reject"),
        (&third, "approve"),
    ] {
        let (code, body) = server
            .decide(request["request_id"].as_str().unwrap(), &approver, decision)
            .await;
        assert_eq!(code, StatusCode::OK, "{body}");
    }
    eventually("the process acted on both approvals", async || {
        (times_acted(&proc_dir, "job-1") == 1 && times_acted(&proc_dir, "job-3") == 1).then_some(())
    })
    .await;
    eventually("pending.json emptied", async || {
        pending_ids(&proc_dir).is_empty().then_some(())
    })
    .await;
    // Delivered byte for byte: the process's own `6.00` came back as a float.
    let acted = actions(&proc_dir);
    assert_eq!(acted[0]["cost"], json!(6.0));

    // Its records are the outcomes.
    let outcome = eventually("the outcome of job-1 recorded", async || {
        let view = server
            .request_view(&approver, first["request_id"].as_str().unwrap())
            .await;
        (!view["outcome"].is_null()).then(|| view["outcome"].clone())
    })
    .await;
    assert_eq!(outcome["status"], "succeeded", "{outcome}");
    assert_eq!(outcome["summary"], "record reindex: win", "{outcome}");
    let rejected = server
        .request_view(&approver, second["request_id"].as_str().unwrap())
        .await;
    assert_eq!(rejected["status"], "rejected");
    assert!(
        rejected["used"].is_null(),
        "a rejected proposal is never delivered"
    );

    // A decided proposal written back (a stale copy) is removed again, not asked again,
    // and not acted on again.
    let stale = json!({"proposals": [job("job-2"), job("job-1")]});
    std::fs::write(proc_dir.join("pending.json"), stale.to_string()).unwrap();
    eventually("the stale proposals removed again", async || {
        pending_ids(&proc_dir).is_empty().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(times_acted(&proc_dir, "job-1"), 1, "acted once only");
    assert_eq!(times_acted(&proc_dir, "job-2"), 0);
    assert!(requests(&server, &approver, "pending").await.is_empty());
    assert!(server.stderr().contains("came back"), "{}", server.stderr());

    // Malformed JSON: said, nothing written over it, read again once fixed.
    std::fs::write(proc_dir.join("pending.json"), "{\"proposals\": [").unwrap();
    eventually("the malformed file reported", async || {
        server.stderr().contains("is not valid JSON").then_some(())
    })
    .await;
    assert_eq!(
        std::fs::read_to_string(proc_dir.join("pending.json")).unwrap(),
        "{\"proposals\": [",
        "left as it is"
    );
    std::fs::write(
        proc_dir.join("pending.json"),
        json!({"proposals": [job("job-4")]}).to_string(),
    )
    .unwrap();
    let fourth = pending_request(&server, &approver, "job-4").await;
    let (code, _) = server
        .decide(fourth["request_id"].as_str().unwrap(), &approver, "approve")
        .await;
    assert_eq!(code, StatusCode::OK);
    eventually("job-4 acted on", async || {
        (times_acted(&proc_dir, "job-4") == 1).then_some(())
    })
    .await;
    assert!(
        server.exited_within(Duration::ZERO).is_none(),
        "serve keeps running through a bad file"
    );
}

#[tokio::test]
async fn a_crash_between_the_two_writes_never_acts_twice() {
    // Where the crash falls, and how often the approved proposal is acted on in the end:
    // before the claim it is delivered after the restart; after the claim (the approved
    // file may or may not have been written) it is dropped; after the write, once.
    for (point, expected) in [
        ("bridge_after_pending", 1),
        ("bridge_after_claim", 0),
        ("bridge_after_approved", 1),
    ] {
        let (_dir, data, proc_dir) = setup();
        let approver = create_token(&data, "approver", "alice").await;
        let mut server = serve(&data, Some(point));
        let _process = start_process(&proc_dir, &[job("job-1")], &["--interval", "0.05"]);
        let request = pending_request(&server, &approver, "job-1").await;
        let id = request["request_id"].as_str().unwrap().to_string();
        let (code, body) = server.decide(&id, &approver, "approve").await;
        assert_eq!(code, StatusCode::OK, "{point}: {body}");
        let status = server.exited_within(Duration::from_secs(20));
        assert!(
            status.is_some_and(|s| !s.success()),
            "{point}: serve stops at the fail point: {}",
            server.stderr()
        );
        assert!(server.stderr().contains(&format!("fail point {point} hit")));
        assert!(
            !pending_ids(&proc_dir).contains(&"job-1".to_string()),
            "{point}: removed from pending.json first"
        );

        // Restarted: what was left half-way is finished, never repeated.
        let server = serve(&data, None);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            times_acted(&proc_dir, "job-1"),
            expected,
            "{point}: {}",
            server.stderr()
        );
        let view = server.request_view(&approver, &id).await;
        assert!(!view["used"].is_null(), "{point}: claimed: {view}");
        if expected == 1 {
            let outcome = eventually("the outcome recorded", async || {
                let view = server.request_view(&approver, &id).await;
                (!view["outcome"].is_null()).then(|| view["outcome"].clone())
            })
            .await;
            assert_eq!(outcome["status"], "succeeded", "{point}");
        }
        assert!(
            pending_ids(&proc_dir).is_empty(),
            "{point}: {:?}",
            pending_ids(&proc_dir)
        );
    }
}

#[tokio::test]
async fn concurrent_writes_under_the_lock_lose_no_proposal() {
    let (_dir, data, proc_dir) = setup();
    let server = serve(&data, None);
    let approver = create_token(&data, "approver", "alice").await;
    let ids: Vec<String> = (0..40).map(|i| format!("job-{i:02}")).collect();
    let jobs: Vec<Value> = ids.iter().map(|id| job(id)).collect();
    // Two proposals every 10 ms while countersign rewrites pending.json for every
    // decision: without the lock, a proposal written in the moment between
    // countersign's check and its rename could be lost.
    let _process = start_process(
        &proc_dir,
        &jobs,
        &["--lock", "--interval", "0.01", "--per-cycle", "2"],
    );
    let mut decided = std::collections::BTreeSet::new();
    eventually("every proposal asked for and approved", async || {
        for request in requests(&server, &approver, "pending").await {
            let id = request["request_id"].as_str().unwrap();
            let (code, body) = server.decide(id, &approver, "approve").await;
            assert_eq!(code, StatusCode::OK, "{body}");
            decided.insert(proposal_id(&request));
        }
        (decided.len() == ids.len()).then_some(())
    })
    .await;
    eventually("every approval acted on", async || {
        (actions(&proc_dir).len() >= ids.len()).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    for id in &ids {
        assert_eq!(times_acted(&proc_dir, id), 1, "{id}");
    }
    assert_eq!(actions(&proc_dir).len(), ids.len());
    assert!(pending_ids(&proc_dir).is_empty());
    let approved = requests(&server, &approver, "approved").await;
    assert_eq!(approved.len(), ids.len(), "one request per proposal");
}

#[tokio::test]
async fn a_bridge_without_its_folder_stops_serve_at_start() {
    let (dir, data, _proc_dir) = setup();
    std::fs::write(
        data.join("countersign.toml"),
        format!(
            "[[bridge]]\nname = \"{BRIDGE}\"\ndir = {:?}\n",
            dir.path().join("missing").display().to_string()
        ),
    )
    .unwrap();
    let out = common::run(&data, &["serve", "--listen", "127.0.0.1:0"]).await;
    assert_eq!(out.code, 2, "{out}");
    assert!(out.stderr.contains("does not exist"), "{out}");
}

#[tokio::test]
async fn a_proposal_that_vanished_is_kept_and_still_delivered_once_approved() {
    let (_dir, data, proc_dir) = setup();
    let server = serve(&data, None);
    let approver = create_token(&data, "approver", "alice").await;
    let pending = proc_dir.join("pending.json");
    std::fs::write(
        &pending,
        json!({"proposals": [job("job-1"), {"label": "no id", "n": 1}]}).to_string(),
    )
    .unwrap();
    let request = pending_request(&server, &approver, "job-1").await;
    // The process rewrites the file without it: reported, and its request stays open.
    std::fs::write(
        &pending,
        json!({"proposals": [{"label": "no id", "n": 1}]}).to_string(),
    )
    .unwrap();
    eventually("the vanished proposal reported", async || {
        server
            .stderr()
            .contains("vanished from pending.json")
            .then_some(())
    })
    .await;
    let id = request["request_id"].as_str().unwrap();
    assert_eq!(
        server.request_view(&approver, id).await["status"],
        "pending"
    );
    // A proposal without an id is known by its content: one request, however often read.
    assert_eq!(requests(&server, &approver, "pending").await.len(), 2);

    let (code, _) = server.decide(id, &approver, "approve").await;
    assert_eq!(code, StatusCode::OK);
    let delivered = eventually("delivered to approved.json", async || {
        let text = std::fs::read_to_string(proc_dir.join("approved.json")).ok()?;
        let value: Value = serde_json::from_str(&text).ok()?;
        let proposals = value["proposals"].as_array()?.clone();
        (!proposals.is_empty()).then_some(proposals)
    })
    .await;
    assert_eq!(delivered, [job("job-1")]);
    assert_eq!(
        serde_json::from_str::<Value>(&std::fs::read_to_string(&pending).unwrap()).unwrap(),
        json!({"proposals": [{"label": "no id", "n": 1}]}),
        "the other proposal is untouched"
    );
}

/// The pending request of `agent` for proposal `id`, as the approver lists it.
async fn pending_of(server: &Server, approver: &str, agent: &str, id: &str) -> Value {
    eventually(&format!("a pending request for {id}"), async || {
        let (code, body) = server
            .get(
                &format!("/api/v1/requests?status=pending&requested_by={agent}&limit=1000"),
                Some(approver),
            )
            .await;
        if code != StatusCode::OK {
            return None;
        }
        body["requests"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| proposal_id(r) == id)
            .cloned()
    })
    .await
}

/// `countersign bridge --server URL --token-file F --name N --dir D`: the bridge runs
/// next to the process and relays to a central serve over REST, as its agent token. The
/// process acts once per approval and never on a rejection, its record becomes the
/// outcome, and a restart of the central serve while a proposal waits loses nothing and
/// duplicates nothing.
#[tokio::test]
async fn a_remote_bridge_relays_a_process_to_a_central_serve() {
    let dir = tempfile::tempdir().unwrap();
    let central = dir.path().join("central");
    let proc_dir = dir.path().join("proc");
    std::fs::create_dir_all(&central).unwrap();
    std::fs::create_dir_all(&proc_dir).unwrap();
    let mut server = serve(&central, None);
    let port = server.addr.port();
    let approver = create_token(&central, "approver", "alice").await;
    let agent_token = create_token(&central, "agent", "bridge-remote").await;
    let token_file = dir.path().join("bridge.token");
    std::fs::write(&token_file, &agent_token).unwrap();
    let agent = "token:bridge-remote";

    // The bridge's own machine has no countersign data of its own to speak of.
    let mut bridge = common::command(
        &dir.path().join("edge"),
        &[
            "bridge",
            "--server",
            &server.base,
            "--name",
            "remote",
            "--dir",
        ],
    );
    bridge
        .arg(&proc_dir)
        .arg("--token-file")
        .arg(&token_file)
        .stderr(Stdio::inherit());
    let mut bridge = bridge.spawn().expect("spawn countersign bridge --server");
    let _process = start_process(&proc_dir, &[job("job-1"), job("job-2")], &[]);

    let first = pending_of(&server, &approver, agent, "job-1").await;
    let second = pending_of(&server, &approver, agent, "job-2").await;
    assert_eq!(first["action_description"], "reindex job-1");
    assert_eq!(first["action_details"]["bridge"], "remote");
    for (request, decision) in [(&first, "approve"), (&second, "reject")] {
        let (code, body) = server
            .decide(request["request_id"].as_str().unwrap(), &approver, decision)
            .await;
        assert_eq!(code, StatusCode::OK, "{body}");
    }
    eventually("the process acted on the approval", async || {
        (times_acted(&proc_dir, "job-1") == 1).then_some(())
    })
    .await;
    eventually("pending.json emptied", async || {
        pending_ids(&proc_dir).is_empty().then_some(())
    })
    .await;
    let outcome = eventually("the outcome of job-1 recorded", async || {
        let view = server
            .request_view(&approver, first["request_id"].as_str().unwrap())
            .await;
        (!view["outcome"].is_null()).then(|| view["outcome"].clone())
    })
    .await;
    assert_eq!(outcome["status"], "succeeded", "{outcome}");

    // The central serve restarts while a new proposal waits: the bridge keeps asking,
    // and the approval given after the restart is delivered once.
    let waiting = job("job-3");
    let mut pending: Value =
        serde_json::from_str(&std::fs::read_to_string(proc_dir.join("pending.json")).unwrap())
            .unwrap();
    pending["proposals"].as_array_mut().unwrap().push(waiting);
    std::fs::write(proc_dir.join("pending.json"), pending.to_string()).unwrap();
    let third = pending_of(&server, &approver, agent, "job-3").await;
    server.kill();
    drop(server);
    let mut cmd = common::serve_command();
    cmd.arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--data-dir")
        .arg(&central);
    server = Server::spawn(cmd);
    let (code, body) = server
        .decide(third["request_id"].as_str().unwrap(), &approver, "approve")
        .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    eventually("the process acted on job-3", async || {
        (times_acted(&proc_dir, "job-3") == 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(times_acted(&proc_dir, "job-1"), 1, "acted once only");
    assert_eq!(times_acted(&proc_dir, "job-2"), 0, "never on a rejection");
    assert_eq!(times_acted(&proc_dir, "job-3"), 1, "once after the restart");
    let _ = bridge.kill().await;
}
