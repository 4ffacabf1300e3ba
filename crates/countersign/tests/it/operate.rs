//! `countersign process|params|probe` against a real long-running process, here and on a
//! real `sshd` started on loopback: reading answers at once; a restart, a command and a
//! parameter change wait for another person's approval (the operator's own is refused
//! as a self-approval), run once, and their result (output and exit code, the value
//! before and after) is the request's recorded outcome; what the manifest refuses is
//! never asked; probes are capped and timed out.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{self, Server, create_token, in_ci, path_str, run, run_ok};

/// Kills what a test started by its match pattern when it ends, however it ends.
pub(crate) struct Reaper(pub(crate) String);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = std::process::Command::new("pkill")
            .args(["-KILL", "-f", "--", &self.0])
            .status();
    }
}

/// A process that follows the seed's shape: it appends to its log each cycle, and
/// notes each start (its PID) in `starts.txt`.
pub(crate) fn worker(work: &Path) -> PathBuf {
    std::fs::create_dir_all(work).unwrap();
    let script = work.join("worker.sh");
    std::fs::write(
        &script,
        "echo \"$$\" >> starts.txt\nwhile true; do echo \"cycle $(date +%s%N)\"; sleep 0.2; done\n",
    )
    .unwrap();
    script
}

pub(crate) fn starts(work: &Path) -> Vec<String> {
    std::fs::read_to_string(work.join("starts.txt"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

const MANIFEST: &str = r#"{
  "poll_interval_seconds": {"type": "int", "description": "Seconds between work cycles", "min": 1, "max": 3600},
  "dry_run": {"type": "bool", "description": "Plan work but do not execute"},
  "mode": {"type": "str", "description": "How it works", "allowed": ["fast", "safe"]}
}"#;

/// The data directory's config: the process (`place` says where), its parameters and
/// two probes.
pub(crate) fn configure(data: &Path, work: &Path, script: &Path, place: &str, probe_on: &str) {
    std::fs::create_dir_all(data).unwrap();
    std::fs::write(data.join("params.schema.json"), MANIFEST).unwrap();
    let config = format!(
        r#"[cli]
unattended_decisions = true

[[process]]
name = "worker"
{place}
dir = "{work}"
start = "sh {script}"
match = "{script}"
log = "worker.log"
run_timeout_seconds = 10

[params]
schema = "params.schema.json"
overrides = "{work}/params.json"
{probe_on}

[[probe]]
name = "chatty"
description = "says a lot"
command = ["sh", "-c", "yes probe | head -c 100000"]
max_output_bytes = 64
{probe_on}

[[probe]]
name = "stuck"
command = ["sleep", "30"]
timeout_seconds = 1
{probe_on}
"#,
        work = path_str(work),
        script = path_str(script),
    );
    std::fs::write(data.join("countersign.toml"), config).unwrap();
}

async fn json_ok(data: &Path, args: &[&str]) -> Value {
    let out = run_ok(data, args).await;
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

/// Starts `countersign ARGS...` (a change that waits for its decision).
fn start(data: &Path, args: &[&str]) -> tokio::process::Child {
    let mut cmd = common::command(data, args);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.spawn().expect("start countersign")
}

async fn finished(child: tokio::process::Child) -> (i32, Value, String) {
    let out = tokio::time::timeout(Duration::from_secs(90), child.wait_with_output())
        .await
        .expect("the change ends within 90 s")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = serde_json::from_str(&stdout).unwrap_or(Value::String(stdout));
    (out.status.code().unwrap_or(-1), json, stderr)
}

/// The one pending request (the change a command is waiting on).
async fn pending(data: &Path) -> Value {
    for _ in 0..300 {
        let found: Vec<Value> =
            serde_json::from_str(&run_ok(data, &["pending", "--json"]).await).unwrap();
        if let Some(first) = found.into_iter().next() {
            return first;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no pending request within 15 s");
}

pub(crate) fn outcome(data: &Path, id: &str) -> Value {
    let conn = rusqlite::Connection::open(data.join("countersign.db")).unwrap();
    let text: Option<String> = conn
        .query_row(
            "SELECT json_extract(body, '$.outcome') FROM requests WHERE id = ?1",
            [id],
            |r| r.get(0),
        )
        .unwrap();
    serde_json::from_str(&text.expect("an outcome")).unwrap()
}

/// Asks for `args` (a change), checks nothing ran while it waits, that the operator
/// cannot approve it, approves it as `bob`, and returns what the command printed.
async fn approved_by_bob(
    data: &Path,
    server: &Server,
    bob: &str,
    args: &[&str],
    ran_yet: impl Fn() -> bool,
) -> (Value, Value) {
    let child = start(data, args);
    let request = pending(data).await;
    let id = request["request_id"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!ran_yet(), "{args:?} ran before its approval");
    let own = run(data, &["approve", &id, "-y"]).await;
    assert!(!own.ok(), "the operator approved their own request: {own}");
    assert!(own.stderr.contains("may not decide it"), "{own}");
    let (status, body) = server.decide(&id, bob, "approved").await;
    assert_eq!(status, 200, "{body}");
    let (code, out, stderr) = finished(child).await;
    assert_eq!(out["request"]["request_id"], id.as_str(), "{stderr}");
    let _ = code;
    (request, out)
}

#[tokio::test]
async fn operate_local_process_changes_wait_for_another_person_and_run_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let work = dir.path().join("work");
    let script = worker(&work);
    let _reaper = Reaper(path_str(&script).to_string());
    configure(&data, &work, &script, "host = \"local\"", "");
    let bob = create_token(&data, "approver", "bob").await;
    let server = Server::start(&data);

    let status = json_ok(&data, &["process", "status", "worker", "--json"]).await;
    assert_eq!(status["running"], false, "{status}");
    assert_eq!(status["host"], "local");

    // Restart: not before approval, not on the operator's own, once on bob's.
    let (request, out) = approved_by_bob(
        &data,
        &server,
        &bob,
        &["process", "restart", "worker", "--json"],
        || !starts(&work).is_empty(),
    )
    .await;
    let details = &request["action_details"];
    assert_eq!(details["tool"], "restart_process");
    assert_eq!(details["upstream"], "operate");
    assert_eq!(details["process"], "worker");
    assert_eq!(details["dir"], path_str(&work));
    assert_eq!(out["executed"]["status"], "succeeded", "{out}");
    assert!(
        out["executed"]["output"]
            .as_str()
            .unwrap()
            .contains("started: "),
        "{out}"
    );
    assert_eq!(out["request"]["status"], "approved");
    assert_eq!(starts(&work).len(), 1, "started once");
    tokio::time::sleep(Duration::from_millis(600)).await;
    let status = json_ok(&data, &["process", "status", "worker", "--json"]).await;
    assert_eq!(status["running"], true, "{status}");
    assert!(status["pid"].as_u64().is_some(), "{status}");
    assert!(
        status["last_log_line"]
            .as_str()
            .unwrap()
            .starts_with("cycle "),
        "{status}"
    );
    let logs = run_ok(&data, &["process", "logs", "worker", "--lines", "2"]).await;
    assert_eq!(logs.lines().count(), 2, "{logs}");
    assert!(logs.lines().all(|l| l.starts_with("cycle ")), "{logs}");

    // The same restart again is a new request (the approved one was used), and a
    // rejected one runs nothing.
    let child = start(&data, &["process", "restart", "worker", "--json"]);
    let again = pending(&data).await;
    let id = again["request_id"].as_str().unwrap().to_string();
    assert_ne!(again["request_id"], request["request_id"]);
    let (code, body) = server
        .post(
            &format!("/api/v1/requests/{id}/decision"),
            Some(&bob),
            &serde_json::json!({"decision": "rejected", "comment": "once is enough"}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let (code, out, stderr) = finished(child).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        out["refused"].as_str().unwrap().contains("once is enough"),
        "{out}"
    );
    assert!(out["executed"].is_null(), "{out}");
    assert_eq!(starts(&work).len(), 1, "a rejected restart never runs");

    // run_command: output and exit code, recorded.
    let (request, out) = approved_by_bob(
        &data,
        &server,
        &bob,
        &[
            "process",
            "run",
            "worker",
            "--json",
            "--",
            "echo",
            "in $(basename $PWD); echo oops >&2; exit 3",
        ],
        || false,
    )
    .await;
    assert_eq!(
        request["action_details"]["cmd"],
        "echo in $(basename $PWD); echo oops >&2; exit 3"
    );
    assert_eq!(out["executed"]["exit_code"], 3, "{out}");
    assert_eq!(out["executed"]["status"], "failed");
    let id = request["request_id"].as_str().unwrap();
    let recorded = outcome(&data, id);
    assert_eq!(recorded["status"], "failed", "{recorded}");
    assert_eq!(recorded["details"]["exit_code"], "3", "{recorded}");
    assert_eq!(
        recorded["details"]["output"], "in work\noops\n",
        "{recorded}"
    );
    assert!(
        recorded["summary"].as_str().unwrap().starts_with("exit 3"),
        "{recorded}"
    );

    // An unknown process is refused before anything is asked.
    let unknown = run(&data, &["process", "restart", "nope"]).await;
    assert_eq!(unknown.code, 2, "{unknown}");
    assert!(
        unknown.stderr.contains("worker"),
        "names what is configured: {unknown}"
    );
}

#[tokio::test]
async fn operate_params_are_checked_logged_before_and_after_and_probes_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let work = dir.path().join("work");
    let script = worker(&work);
    configure(&data, &work, &script, "host = \"local\"", "");
    let bob = create_token(&data, "approver", "bob").await;
    let server = Server::start(&data);
    params_and_probes(&data, &work, &server, &bob, |p| {
        std::fs::read_to_string(p).ok()
    })
    .await;
}

/// The parameter and probe checks, wherever the file and the probes are.
async fn params_and_probes(
    data: &Path,
    work: &Path,
    server: &Server,
    bob: &str,
    read: impl Fn(&Path) -> Option<String>,
) {
    let file = work.join("params.json");
    let list = json_ok(data, &["params", "list", "--json"]).await;
    assert_eq!(list["declared"].as_array().unwrap().len(), 3, "{list}");
    assert!(
        list["declared"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["value"].is_null())
    );

    // Refused before anything is asked: not an int, out of bounds, not allowed, undeclared.
    for (name, value, says) in [
        ("poll_interval_seconds", "thirty", "not a valid int"),
        ("poll_interval_seconds", "0", "below"),
        ("mode", "reckless", "not one of the allowed"),
        ("speed", "1", "not a declared parameter"),
    ] {
        let out = run(data, &["params", "set", name, value, "--hold", "1"]).await;
        assert_eq!(out.code, 2, "{out}");
        assert!(out.stderr.contains(says), "{name}={value}: {out}");
    }
    let none: Vec<Value> =
        serde_json::from_str(&run_ok(data, &["pending", "--json"]).await).unwrap();
    assert!(none.is_empty(), "nothing invalid was asked: {none:?}");
    assert!(read(&file).is_none(), "nothing written");

    // Coerced ("30" is an int), written once approved, before and after recorded.
    let (request, out) = approved_by_bob(
        data,
        server,
        bob,
        &["params", "set", "poll_interval_seconds", "30", "--json"],
        || read(&file).is_some(),
    )
    .await;
    assert_eq!(request["action_details"]["value"], "30");
    assert_eq!(request["action_details"]["before"], "null");
    assert_eq!(out["executed"]["after"], 30, "{out}");
    let written: Value = serde_json::from_str(&read(&file).expect("written")).unwrap();
    assert_eq!(written, serde_json::json!({"poll_interval_seconds": 30}));

    let (request, _) = approved_by_bob(
        data,
        server,
        bob,
        &["params", "set", "dry_run", "yes", "--json"],
        || false,
    )
    .await;
    assert_eq!(request["action_details"]["value"], "true");
    let (request, out) = approved_by_bob(
        data,
        server,
        bob,
        &["params", "set", "poll_interval_seconds", "45", "--json"],
        || false,
    )
    .await;
    assert_eq!(request["action_details"]["before"], "30");
    let recorded = outcome(data, request["request_id"].as_str().unwrap());
    assert_eq!(recorded["details"]["before"], "30", "{recorded}");
    assert_eq!(recorded["details"]["after"], "45", "{recorded}");
    assert_eq!(recorded["summary"], "poll_interval_seconds: 30 -> 45");
    assert_eq!(out["executed"]["before"], 30);
    let list = json_ok(data, &["params", "list", "--json"]).await;
    let poll = list["declared"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "poll_interval_seconds")
        .unwrap();
    assert_eq!(poll["value"], 45, "{list}");

    // Clear one, then all.
    approved_by_bob(
        data,
        server,
        bob,
        &["params", "clear", "dry_run", "--json"],
        || false,
    )
    .await;
    let written: Value = serde_json::from_str(&read(&file).unwrap()).unwrap();
    assert_eq!(written, serde_json::json!({"poll_interval_seconds": 45}));
    let (_, out) = approved_by_bob(
        data,
        server,
        bob,
        &["params", "clear", "--all", "--json"],
        || false,
    )
    .await;
    assert_eq!(
        out["executed"]["before"],
        serde_json::json!({"poll_interval_seconds": 45})
    );
    let written: Value = serde_json::from_str(&read(&file).unwrap()).unwrap();
    assert_eq!(written, serde_json::json!({}));

    // Probes: listed, capped, timed out.
    let listed = run_ok(data, &["probe", "list"]).await;
    assert!(
        listed.contains("chatty") && listed.contains("stuck"),
        "{listed}"
    );
    let chatty = json_ok(data, &["probe", "run", "chatty", "--json"]).await;
    assert_eq!(chatty["output"].as_str().unwrap().len(), 64, "{chatty}");
    assert_eq!(chatty["truncated"], true);
    assert_eq!(chatty["exit_code"], 0);
    let started = Instant::now();
    let stuck = run(data, &["probe", "run", "stuck", "--json"]).await;
    assert_eq!(stuck.code, 1, "{stuck}");
    let stuck: Value = serde_json::from_str(&stuck.stdout).unwrap();
    assert_eq!(stuck["timed_out"], true, "{stuck}");
    assert!(started.elapsed() < Duration::from_secs(15));
}

/// A real `sshd` on loopback, for the current user, with keys of its own.
struct Sshd {
    child: std::process::Child,
    port: u16,
    user: String,
    key: PathBuf,
    known_hosts: PathBuf,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_sshd(dir: &Path) -> Option<Sshd> {
    let sshd = Path::new("/usr/sbin/sshd");
    let keygen = which("ssh-keygen");
    let client = which("ssh");
    if !sshd.exists() || keygen.is_none() || client.is_none() {
        let why = "openssh-server (sshd, ssh, ssh-keygen) is not installed: apt-get install -y openssh-server";
        if in_ci() {
            panic!("{why}");
        }
        eprintln!("skipping the remote operations test: {why}");
        return None;
    }
    let keygen = |file: &Path| {
        let ok = std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(file)
            .status()
            .unwrap()
            .success();
        assert!(ok, "ssh-keygen");
    };
    let host_key = dir.join("host_key");
    let key = dir.join("id");
    keygen(&host_key);
    keygen(&key);
    std::fs::copy(dir.join("id.pub"), dir.join("authorized_keys")).unwrap();
    // As root, sshd wants its privilege separation directory.
    let _ = std::fs::create_dir_all("/run/sshd");
    let config = dir.join("sshd_config");
    std::fs::write(
        &config,
        format!(
            "ListenAddress 127.0.0.1\nHostKey {}\nPidFile {}\nAuthorizedKeysFile {}\nStrictModes no\nUsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\nPermitRootLogin prohibit-password\n",
            path_str(&host_key),
            path_str(&dir.join("sshd.pid")),
            path_str(&dir.join("authorized_keys")),
        ),
    )
    .unwrap();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = std::process::Command::new(sshd)
        .arg("-D")
        .arg("-E")
        .arg(dir.join("sshd.log"))
        .arg("-f")
        .arg(&config)
        .arg("-p")
        .arg(port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start sshd");
    // sshd's own log is dir/sshd.log (kept while the test's temporary directory is).
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "sshd did not listen within 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(Sshd {
        child,
        port,
        user: common::os_user(),
        key,
        known_hosts: dir.join("known_hosts"),
    })
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

#[tokio::test]
async fn operate_remote_process_over_a_real_sshd() {
    let dir = tempfile::tempdir().unwrap();
    let Some(sshd) = start_sshd(dir.path()) else {
        return;
    };
    let data = dir.path().join("data");
    // The "remote" directory: on this machine, reached only through ssh.
    let work = dir.path().join("remote");
    let script = worker(&work);
    let _reaper = Reaper(path_str(&script).to_string());
    let place = format!(
        "host = \"127.0.0.1\"\nuser = \"{}\"\nport = {}\nidentity_file = \"{}\"\nknown_hosts_file = \"{}\"",
        sshd.user,
        sshd.port,
        path_str(&sshd.key),
        path_str(&sshd.known_hosts),
    );
    configure(&data, &work, &script, &place, "process = \"worker\"");
    let bob = create_token(&data, "approver", "bob").await;
    let server = Server::start(&data);

    let status = json_ok(&data, &["process", "status", "worker", "--json"]).await;
    assert_eq!(status["running"], false, "{status}");
    assert_eq!(
        status["host"],
        format!("{}@127.0.0.1:{}", sshd.user, sshd.port)
    );
    let known = std::fs::read_to_string(&sshd.known_hosts).unwrap_or_default();
    assert!(
        known.contains("ssh-ed25519"),
        "accept-new remembered the host key: {known}"
    );

    let (_, out) = approved_by_bob(
        &data,
        &server,
        &bob,
        &["process", "restart", "worker", "--json"],
        || !starts(&work).is_empty(),
    )
    .await;
    assert_eq!(out["executed"]["status"], "succeeded", "{out}");
    assert_eq!(starts(&work).len(), 1, "started once");
    tokio::time::sleep(Duration::from_millis(600)).await;
    // Detached: it outlived the ssh session that started it.
    let status = json_ok(&data, &["process", "status", "worker", "--json"]).await;
    assert_eq!(status["running"], true, "{status}");
    assert!(status["memory_kb"].as_u64().is_some(), "{status}");
    let logs = run_ok(&data, &["process", "logs", "worker", "--lines", "3"]).await;
    assert_eq!(logs.lines().count(), 3, "{logs}");

    let (request, out) = approved_by_bob(
        &data,
        &server,
        &bob,
        &["process", "run", "worker", "--json", "--", "pwd; exit 7"],
        || false,
    )
    .await;
    assert_eq!(out["executed"]["exit_code"], 7, "{out}");
    let recorded = outcome(&data, request["request_id"].as_str().unwrap());
    assert_eq!(
        recorded["details"]["output"],
        format!("{}\n", path_str(&work)),
        "{recorded}"
    );

    params_and_probes(&data, &work, &server, &bob, |p| {
        std::fs::read_to_string(p).ok()
    })
    .await;

    // A host that refuses: a clear error, nothing guessed.
    let bad = dir.path().join("bad");
    configure(
        &bad,
        &work,
        &script,
        &format!(
            "host = \"127.0.0.1\"\nuser = \"nobody-here\"\nport = {}\nidentity_file = \"{}\"\nknown_hosts_file = \"{}\"",
            sshd.port,
            path_str(&sshd.key),
            path_str(&sshd.known_hosts)
        ),
        "",
    );
    let out = run(&bad, &["process", "status", "worker"]).await;
    assert_eq!(out.code, 2, "{out}");
    assert!(
        out.stderr.contains("ssh to nobody-here@127.0.0.1 failed"),
        "{out}"
    );
}

#[tokio::test]
async fn operate_a_policy_may_allow_an_operation_and_the_proof_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let work = dir.path().join("work");
    let script = worker(&work);
    configure(&data, &work, &script, "host = \"local\"", "");
    std::fs::write(
        data.join("ops.cedar"),
        r#"@id("uptime-is-routine")
permit(principal, action == Action::"run_command", resource == Server::"operate")
when { context.gateway && context.input has cmd && context.input.cmd == "echo routine" };
"#,
    )
    .unwrap();
    let mut config = std::fs::read_to_string(data.join("countersign.toml")).unwrap();
    config.insert_str(0, "[policy]\nfiles = [\"ops.cedar\"]\n\n");
    std::fs::write(data.join("countersign.toml"), config).unwrap();

    // Allowed by the policy: run at once, with no second person, and signed as such.
    let out = run(
        &data,
        &["process", "run", "worker", "--json", "--", "echo routine"],
    )
    .await;
    assert!(out.ok(), "{out}");
    let out: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(out["executed"]["output"], "routine\n", "{out}");
    let decision = &out["request"]["decision"];
    assert_eq!(decision["authorization_type"], "policy", "{out}");
    assert_eq!(decision["policy"]["id"], "uptime-is-routine");
    assert!(
        decision["approvers"].as_array().unwrap().is_empty(),
        "{out}"
    );
    let statement = common::statement(&out["request"]["proof"]);
    assert_eq!(statement["authorization_type"], "policy");
    assert_eq!(
        statement["requested_by"]["id"],
        format!("local:{}", common::os_user())
    );

    // Anything else still waits for a person.
    let other = run(
        &data,
        &[
            "process",
            "run",
            "worker",
            "--hold",
            "1",
            "--json",
            "--",
            "echo other",
        ],
    )
    .await;
    assert_eq!(other.code, 1, "{other}");
    let other: Value = serde_json::from_str(&other.stdout).unwrap();
    assert_eq!(other["request"]["status"], "pending", "{other}");
}
