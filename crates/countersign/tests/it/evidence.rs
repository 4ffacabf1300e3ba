//! Evidence an auditor can hold the server to, tried from outside as an auditor would
//! (issue 12, findings 1, 2 and 5):
//!
//! - a bundle cut short (its first, a middle or its last entry left out and the manifest
//!   rewritten) is refused by `verify-bundle` and `POST /api/v1/evidence/verify`, and so is
//!   the same bundle passed off as an unsigned v1 one;
//! - a bundle made with someone else's key is refused with pinned keys (`--jwks`,
//!   `--server`, `--data-dir`) and reads "keys not pinned" without;
//! - a key that exists only as a `jwk:*` row in the database (SQLite and PostgreSQL) is
//!   neither trusted by `POST /api/v1/proofs/verify` nor published at
//!   `/.well-known/jwks.json`, and `doctor` and `log verify` name it; `keys trust` endorses
//!   it, and two instances with keys of their own on one PostgreSQL database verify each
//!   other's proofs once each endorsed the other's key.

use std::path::Path;
use std::time::{Duration, Instant};

use countersign_core::{Envelope, Signer};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::postgres::TestDb;
use crate::common::{self, Output, Server, create_token, path_str, run, run_ok};

fn unzip(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    use std::io::Read;
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
    (0..archive.len())
        .map(|i| {
            let mut file = archive.by_index(i).unwrap();
            let mut content = Vec::new();
            file.read_to_end(&mut content).unwrap();
            (file.name().unwrap().to_string(), content)
        })
        .collect()
}

fn rezip(files: &[(String, Vec<u8>)]) -> Vec<u8> {
    use std::io::Write;
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .last_modified_time(zip::DateTime::default());
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (path, content) in files {
        zip.start_file(path.as_str(), options).unwrap();
        zip.write_all(content).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

/// RFC 8785 for the plain JSON written here (objects, arrays, strings, small integers):
/// serde_json's map keeps its keys sorted, so its compact form is canonical.
/// RFC 8785, as the bundle writer and every verifier use (not `serde_json::to_vec`,
/// whose key order is not sorted when a dependency turns on `preserve_order`, as Cedar
/// does).
fn canonical(value: &Value) -> Vec<u8> {
    serde_json_canonicalizer::to_vec(value).unwrap()
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// The bundle's files with `manifest.json` parsed.
struct Unpacked {
    files: Vec<(String, Vec<u8>)>,
    manifest: Value,
}

impl Unpacked {
    fn new(zip: &[u8]) -> Self {
        let files = unzip(zip);
        let manifest = serde_json::from_slice(&files[0].1).unwrap();
        assert_eq!(files[0].0, "manifest.json");
        assert_eq!(files[1].0, "manifest.sig", "a v2 bundle signs its manifest");
        Unpacked { files, manifest }
    }

    fn entries(&self) -> Vec<u64> {
        self.manifest["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect()
    }

    /// Leaves out entry `index` (with its proof, and the decision proof when it is the
    /// decision) and rewrites the manifest to list what is left.
    fn without(mut self, index: u64, with_decision: bool) -> Self {
        let mut gone = vec![
            format!("entries/{index}.json"),
            format!("proofs/{index}.json"),
        ];
        if with_decision {
            gone.push("decisions/1.json".into());
        }
        self.files.retain(|(p, _)| !gone.contains(p));
        self.manifest["entries"]
            .as_array_mut()
            .unwrap()
            .retain(|i| i.as_u64() != Some(index));
        self.manifest["files"]
            .as_array_mut()
            .unwrap()
            .retain(|f| !gone.iter().any(|g| f["path"] == g.as_str()));
        self
    }

    fn set(&mut self, path: &str, bytes: Vec<u8>) {
        let hash = sha256_hex(&bytes);
        for f in self.manifest["files"].as_array_mut().unwrap() {
            if f["path"] == path {
                f["sha256"] = json!(hash);
                f["size"] = json!(bytes.len());
            }
        }
        self.files.iter_mut().find(|(p, _)| p == path).unwrap().1 = bytes;
    }

    fn zip(mut self) -> Vec<u8> {
        self.files[0].1 = canonical(&self.manifest);
        rezip(&self.files)
    }
}

async fn verify_over_rest(server: &Server, token: &str, zip: Vec<u8>) -> Value {
    let response = server
        .http()
        .post(server.url("/api/v1/evidence/verify"))
        .bearer_auth(token)
        .header("content-type", "application/zip")
        .body(zip)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.json().await.unwrap()
}

/// An approved request whose action was recorded: three entries (created, decided, used).
async fn approved_and_used(server: &Server, agent: &str, approver: &str, n: usize) -> String {
    let id = server
        .create_request(
            agent,
            &json!({
                "action_description": format!("Pay invoice INV-{n}"),
                "action_details": {"amount": format!("{}", 100 + n), "currency": "EUR"}
            }),
        )
        .await;
    let (status, body) = server.decide(&id, approver, "approved").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = server
        .post(
            &format!("/api/v1/requests/{id}/actions"),
            Some(agent),
            &json!({"tool": "payments.pay"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    id
}

/// A request for `description` (no details), approved: its id and its proof.
async fn approved_proof(
    server: &Server,
    agent: &str,
    approver: &str,
    description: &str,
) -> (String, Value) {
    let id = server
        .create_request(
            agent,
            &json!({"action_description": description, "action_details": {}}),
        )
        .await;
    let (status, decided) = server.decide(&id, approver, "approved").await;
    assert_eq!(status, StatusCode::OK, "{decided}");
    (id, decided["proof"].clone())
}

async fn export(data: &Path, id: &str, to: &Path) -> Vec<u8> {
    let out = run(data, &["evidence", id, "-o", path_str(to)]).await;
    assert!(out.ok(), "{out}");
    std::fs::read(to).unwrap()
}

async fn verify_bundle_file(data: &Path, dir: &Path, name: &str, zip: &[u8]) -> Output {
    let file = dir.join(name);
    std::fs::write(&file, zip).unwrap();
    run(data, &["verify-bundle", path_str(&file)]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_cut_at_the_start_middle_or_end_is_refused_by_cli_and_rest() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    let agent = create_token(&data, "agent", "bot").await;
    let approver = create_token(&data, "approver", "alice").await;
    let server = Server::start(&data);
    let id = approved_and_used(&server, &agent, &approver, 1).await;
    let zip = export(&data, &id, &tmp.path().join("bundle.zip")).await;

    let out = verify_bundle_file(&data, tmp.path(), "whole.zip", &zip).await;
    assert_eq!(out.code, 0, "{out}");
    assert!(
        out.stdout.starts_with(&format!(
            "valid: {id} (3 entries: request_created, request_decided, action_recorded; 1 decision proof(s))"
        )) && out.stdout.contains("complete (manifest signed by "),
        "{out}"
    );
    let report = verify_over_rest(&server, &agent, zip.clone()).await;
    assert_eq!(
        (&report["valid"], &report["complete"]),
        (&json!(true), &json!(true)),
        "{report}"
    );

    let entries = Unpacked::new(&zip).entries();
    assert_eq!(entries.len(), 3, "{entries:?}");
    for (place, n) in [("first", 0), ("middle", 1), ("last", 2)] {
        // The middle one is the decision: its proof goes with it.
        let cut = Unpacked::new(&zip).without(entries[n], n == 1).zip();
        let out = verify_bundle_file(&data, tmp.path(), &format!("cut-{place}.zip"), &cut).await;
        assert_eq!(
            out.code, 1,
            "the bundle without its {place} entry verified:\n{out}"
        );
        assert!(
            out.stdout.contains("INVALID") && out.stdout.contains("manifest.sig"),
            "{place}: {out}"
        );
        let report = verify_over_rest(&server, &agent, cut).await;
        assert_eq!(report["valid"], false, "{place}: {report}");
        assert_eq!(report["complete"], false, "{place}: {report}");
        assert!(
            report["reasons"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r.as_str().unwrap().contains("another manifest")),
            "{place}: {report}"
        );
    }

    // Cut, then passed off as an unsigned v1 bundle: read, but not proven complete.
    let mut v1 = Unpacked::new(&zip).without(entries[2], false);
    v1.files.retain(|(p, _)| p != "manifest.sig");
    v1.manifest["format"] = json!("countersign.evidence/v1");
    let v1 = v1.zip();
    let out = verify_bundle_file(&data, tmp.path(), "v1.zip", &v1).await;
    assert_eq!(out.code, 1, "{out}");
    assert!(out.stdout.contains("not proven complete"), "{out}");
    let report = verify_over_rest(&server, &agent, v1).await;
    assert_eq!(report["valid"], false, "{report}");
    assert_eq!(
        report["events"],
        json!(["request_created", "request_decided"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_signed_with_a_foreign_key_fails_pinned_and_reads_keys_not_pinned() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    let agent = create_token(&data, "agent", "bot").await;
    let approver = create_token(&data, "approver", "alice").await;
    let server = Server::start(&data);
    let id = approved_and_used(&server, &agent, &approver, 2).await;
    let zip = export(&data, &id, &tmp.path().join("bundle.zip")).await;

    // Cut the last entry, put a key of one's own into jwks.json and sign the new
    // manifest with it: consistent with the bundle's own keys, made by nobody trusted.
    let foreign = Signer::from_seed([42; 32]);
    let mut forged = Unpacked::new(&zip);
    let last = *forged.entries().last().unwrap();
    forged = forged.without(last, false);
    let jwks_bytes = forged
        .files
        .iter()
        .find(|(p, _)| p == "jwks.json")
        .unwrap()
        .1
        .clone();
    let mut jwks: Value = serde_json::from_slice(&jwks_bytes).unwrap();
    jwks["keys"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::to_value(foreign.jwk()).unwrap());
    forged.set("jwks.json", canonical(&jwks));
    let manifest = canonical(&forged.manifest);
    let sig = Envelope::sign(
        countersign_core::bundle::MANIFEST_PAYLOAD_TYPE,
        &manifest,
        &foreign,
    );
    forged.files[1].1 = canonical(&serde_json::to_value(&sig).unwrap());
    let forged = forged.zip();
    let file = tmp.path().join("forged.zip");
    std::fs::write(&file, &forged).unwrap();

    // Without pinned keys: not plainly valid.
    let mut cmd = common::bare_command();
    cmd.args(["verify-bundle", path_str(&file)]);
    let out = common::output(cmd).await;
    assert!(
        out.stdout.starts_with("keys not pinned: "),
        "a bundle checked only against its own keys reads:\n{out}"
    );
    assert!(!out.stdout.starts_with("valid"), "{out}");
    assert_eq!(out.code, 1, "{out}");
    let mut cmd = common::bare_command();
    cmd.args(["verify-bundle", path_str(&file), "--json"]);
    let report: Value = serde_json::from_str(&common::output(cmd).await.stdout).unwrap();
    assert_eq!(report["keys_pinned"], false, "{report}");
    assert_eq!(
        report["manifest_signed_by"],
        json!(foreign.kid()),
        "{report}"
    );

    // Pinned three ways: the data directory's keys, a JWKS file, the server's JWKS.
    let out = run(&data, &["verify-bundle", path_str(&file)]).await;
    assert_eq!(out.code, 1, "--data-dir: {out}");
    assert!(
        out.stdout.contains("INVALID") && out.stdout.contains("no signature by a trusted key"),
        "--data-dir: {out}"
    );
    let pinned = tmp.path().join("jwks.json");
    std::fs::write(&pinned, run_ok(&data, &["keys", "export"]).await).unwrap();
    let mut cmd = common::bare_command();
    cmd.args([
        "verify-bundle",
        path_str(&file),
        "--jwks",
        path_str(&pinned),
    ]);
    let out = common::output(cmd).await;
    assert_eq!(out.code, 1, "--jwks: {out}");
    assert!(out.stdout.contains("manifest.sig"), "--jwks: {out}");
    let mut cmd = common::bare_command();
    cmd.args(["verify-bundle", path_str(&file), "--server", &server.base]);
    let out = common::output(cmd).await;
    assert_eq!(out.code, 1, "--server: {out}");
    assert!(out.stdout.contains("manifest.sig"), "--server: {out}");
    let report = verify_over_rest(&server, &agent, forged).await;
    assert_eq!(report["valid"], false, "{report}");

    // The genuine bundle, pinned by --server, is valid.
    let genuine = tmp.path().join("genuine.zip");
    std::fs::write(&genuine, &zip).unwrap();
    let mut cmd = common::bare_command();
    cmd.args([
        "verify-bundle",
        path_str(&genuine),
        "--server",
        &server.base,
    ]);
    let out = common::output(cmd).await;
    assert_eq!(out.code, 0, "{out}");
    assert!(out.stdout.starts_with("valid: "), "{out}");
}

// ---------------------------------------------------------------------------------------
// Keys only the database knows

/// A proof "approved" for `pending`, signed with `key`: another request's genuine
/// statement with the request id swapped.
fn forged_proof(genuine: &Value, pending: &str, key: &Signer) -> Value {
    let envelope: Envelope = serde_json::from_value(genuine.clone()).unwrap();
    let mut statement = envelope.unverified_statement().unwrap();
    statement.request_id = pending.to_string();
    serde_json::to_value(Envelope::sign_statement(&statement, key)).unwrap()
}

fn jwk_row(key: &Signer) -> (String, String) {
    let jwk = key.jwk();
    (
        format!("jwk:{}", jwk.kid),
        serde_json::to_string(&jwk).unwrap(),
    )
}

/// What an injected key must not get, and that doctor and log verify name it.
async fn check_untrusted(
    server: &Server,
    agent: &str,
    proof: &Value,
    kid: &str,
    doctor: Output,
    log_verify: Output,
) {
    let (_, jwks) = server.get("/.well-known/jwks.json", None).await;
    assert!(
        !jwks.to_string().contains(kid),
        "the injected key is published: {jwks}"
    );
    let (status, report) = server
        .post(
            "/api/v1/proofs/verify",
            Some(agent),
            &json!({"proof": proof}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["valid"], false, "a forged proof verified: {report}");
    assert_eq!(report["reasons"][0]["code"], "unknown_key", "{report}");
    assert_ne!(doctor.code, 0, "doctor is content:\n{doctor}");
    assert!(
        doctor.stdout.contains(kid) || doctor.stderr.contains(kid),
        "doctor does not name {kid}:\n{doctor}"
    );
    assert_eq!(log_verify.code, 1, "log verify is content:\n{log_verify}");
    assert!(
        log_verify
            .stdout
            .contains(&format!("key {kid} is published")),
        "log verify does not name {kid}:\n{log_verify}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_only_in_the_sqlite_database_is_not_trusted_not_published_and_named() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    let agent = create_token(&data, "agent", "bot").await;
    let approver = create_token(&data, "approver", "alice").await;
    let server = Server::start(&data);
    let decided = approved_and_used(&server, &agent, &approver, 3).await;
    let (_, decided) = server
        .get(&format!("/api/v1/requests/{decided}"), Some(&agent))
        .await;
    let pending = server
        .create_request(
            &agent,
            &json!({"action_description": "Wire EUR 1,000,000", "action_details": {}}),
        )
        .await;

    // Write access to the database alone: a key row, no key file touched.
    let intruder = Signer::from_seed([7; 32]);
    let (key, value) = jwk_row(&intruder);
    let db = rusqlite::Connection::open(data.join("countersign.db")).unwrap();
    db.execute(
        "INSERT INTO log_meta (key, value) VALUES (?1, ?2)",
        rusqlite::params![key, value],
    )
    .unwrap();
    drop(db);
    let proof = forged_proof(&decided["proof"], &pending, &intruder);
    // Nor by `countersign verify`, with the data directory's keys or the JWKS the server
    // publishes.
    let file = common::write_json(tmp.path(), "forged.json", &proof);
    let out = run(&data, &["verify", path_str(&file)]).await;
    assert!(out.code == 1 && out.stdout.contains("unknown_key"), "{out}");
    let mut cmd = common::bare_command();
    cmd.args(["verify", path_str(&file), "--server", &server.base]);
    let out = common::output(cmd).await;
    assert!(out.code == 1 && out.stdout.contains("unknown_key"), "{out}");
    check_untrusted(
        &server,
        &agent,
        &proof,
        intruder.kid(),
        run(&data, &["doctor"]).await,
        run(&data, &["log", "verify"]).await,
    )
    .await;

    // The operator endorses it where the trusted key is held: from then on it is
    // trusted, published, and logged as a key_endorsed entry.
    let out = run(&data, &["keys", "trust", intruder.kid()]).await;
    assert!(out.ok(), "{out}");
    let (_, jwks) = server.get("/.well-known/jwks.json", None).await;
    assert!(jwks.to_string().contains(intruder.kid()), "{jwks}");
    let (_, report) = server
        .post(
            "/api/v1/proofs/verify",
            Some(&agent),
            &json!({"proof": proof}),
        )
        .await;
    assert_eq!(report["valid"], true, "{report}");
    let out = run(&data, &["log", "verify"]).await;
    assert_eq!(out.code, 0, "{out}");
    let again = run(&data, &["keys", "trust", intruder.kid()]).await;
    assert!(
        again.ok() && again.stderr.contains("already trusted"),
        "{again}"
    );
}

/// `countersign --data-dir DIR --database URL ARGS...`: a data directory (and key) of
/// its own, one shared database.
async fn on(data: &Path, db: &TestDb, args: &[&str]) -> Output {
    let mut cmd = common::command(data, args);
    cmd.arg("--database").arg(&db.url);
    common::output(cmd).await
}

fn serve_on(data: &Path, db: &TestDb) -> Server {
    let mut cmd = common::serve_command();
    cmd.arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--data-dir")
        .arg(data)
        .env("COUNTERSIGN_DATABASE_URL", &db.url)
        .env("COUNTERSIGN_LOG", "warn");
    Server::spawn(cmd)
}

async fn verify_at(server: &Server, token: &str, proof: &Value) -> Value {
    let (status, report) = server
        .post(
            "/api/v1/proofs/verify",
            Some(token),
            &json!({"proof": proof}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{report}");
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_two_instances_with_keys_of_their_own_trust_each_other_once_endorsed() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let token = |out: Output| {
        assert!(out.ok(), "{out}");
        out.stdout.trim().to_string()
    };
    let agent = token(
        on(
            &a,
            &db,
            &["token", "create", "--role", "agent", "--name", "bot"],
        )
        .await,
    );
    let approver = token(
        on(
            &a,
            &db,
            &["token", "create", "--role", "approver", "--name", "alice"],
        )
        .await,
    );
    let kid = |dir: &Path| {
        let text = std::fs::read_to_string(dir.join("keys/signing-key.json")).unwrap();
        serde_json::from_str::<Value>(&text).unwrap()["kid"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let sa = serve_on(&a, &db);
    let sb = serve_on(&b, &db);
    let (ka, kb) = (kid(&a), kid(&b));
    assert_ne!(ka, kb, "each instance made a key of its own");

    let id = approved_and_used(&sa, &agent, &approver, 4).await;
    let (_, proof_a) = approved_proof(&sa, &agent, &approver, "Deploy 4.2").await;
    assert_eq!(proof_a["signatures"][0]["keyid"], json!(ka));
    // Approved, but not used: a forged statement names it below.
    let (pending, proof_b) = approved_proof(&sb, &agent, &approver, "Rotate the credentials").await;
    assert_eq!(proof_b["signatures"][0]["keyid"], json!(kb));

    // Each other's key is only a database row: not trusted, and doctor says so.
    assert_eq!(
        verify_at(&sb, &agent, &proof_a).await["reasons"][0]["code"],
        "unknown_key"
    );
    assert_eq!(
        verify_at(&sa, &agent, &proof_b).await["reasons"][0]["code"],
        "unknown_key"
    );
    let doctor = on(&a, &db, &["doctor"]).await;
    assert!(
        doctor.stdout.contains(&kb) || doctor.stderr.contains(&kb),
        "{doctor}"
    );

    // An intruder's row besides: named, never trusted, whatever the instances endorse.
    let intruder = Signer::from_seed([8; 32]);
    let (key, value) = jwk_row(&intruder);
    db.client()
        .await
        .execute(
            "INSERT INTO log_meta (key, value) VALUES ($1, $2)",
            &[&key, &value],
        )
        .await
        .unwrap();

    // The migration for an existing deployment: each instance endorses the other's key.
    assert!(on(&a, &db, &["keys", "trust", &kb]).await.ok());
    assert!(on(&b, &db, &["keys", "trust", &ka]).await.ok());
    let deadline = Instant::now() + Duration::from_secs(5);
    for (server, proof) in [(&sa, &proof_b), (&sb, &proof_a)] {
        loop {
            let report = verify_at(server, &agent, proof).await;
            if report["valid"] == true {
                break;
            }
            assert!(Instant::now() < deadline, "after endorsement: {report}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    for server in [&sa, &sb] {
        let (_, jwks) = server.get("/.well-known/jwks.json", None).await;
        let text = jwks.to_string();
        assert!(text.contains(&ka) && text.contains(&kb), "{text}");
    }
    // A bundle exported through one instance verifies at the other.
    let zip = export_on(&a, &db, &id, &tmp.path().join("a.zip")).await;
    let report = verify_over_rest(&sb, &agent, zip).await;
    assert_eq!(report["valid"], true, "{report}");

    let (_, used) = sa
        .get(&format!("/api/v1/requests/{id}"), Some(&agent))
        .await;
    let forged = forged_proof(&used["proof"], &pending, &intruder);
    for (server, dir) in [(&sa, &a), (&sb, &b)] {
        check_untrusted(
            server,
            &agent,
            &forged,
            intruder.kid(),
            on(dir, &db, &["doctor"]).await,
            on(dir, &db, &["log", "verify"]).await,
        )
        .await;
        let out = on(dir, &db, &["log", "verify"]).await;
        assert!(
            !out.stdout.contains(&format!("key {ka} "))
                && !out.stdout.contains(&format!("key {kb} ")),
            "an endorsed key is still named:\n{out}"
        );
    }
}

async fn export_on(data: &Path, db: &TestDb, id: &str, to: &Path) -> Vec<u8> {
    let out = on(data, db, &["evidence", id, "-o", path_str(to)]).await;
    assert!(out.ok(), "{out}");
    std::fs::read(to).unwrap()
}

/// The migration for an existing deployment of several instances with keys of their own:
/// the keys published in the database before the upgrade are endorsed, once, by each
/// instance that starts (here `migrate`); a key row added after that never is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_migrate_endorses_the_keys_published_before_the_upgrade_once() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (a, b, schema) = (
        tmp.path().join("a"),
        tmp.path().join("b"),
        tmp.path().join("schema"),
    );
    // Each instance's key, made before it ever saw this database (on a SQLite file of
    // its own), and the schema, made where there is no key.
    for dir in [&a, &b] {
        run_ok(dir, &["token", "create", "--role", "agent", "--name", "x"]).await;
        // Key files of the previous version have no record of an anchored start.
        std::fs::remove_file(dir.join("keys/anchored.json")).unwrap();
    }
    let out = on(&schema, &db, &["migrate"]).await;
    assert!(out.ok() && !schema.join("keys").exists(), "{out}");
    let kid = |dir: &Path| {
        let text = std::fs::read_to_string(dir.join("keys/signing-key.json")).unwrap();
        serde_json::from_str::<Value>(&text).unwrap()["kid"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (ka, kb) = (kid(&a), kid(&b));
    // What the previous version did: each instance wrote its key into log_meta.
    let client = db.client().await;
    for dir in [&a, &b] {
        let text = std::fs::read_to_string(dir.join("keys/signing-key.json")).unwrap();
        let mut jwk: Value = serde_json::from_str(&text).unwrap();
        let object = jwk.as_object_mut().unwrap();
        object.remove("d");
        object.remove("created_at");
        object.insert("alg".into(), json!("EdDSA"));
        object.insert("use".into(), json!("sig"));
        client
            .execute(
                "INSERT INTO log_meta (key, value) VALUES ($1, $2)",
                &[&format!("jwk:{}", kid(dir)), &jwk.to_string()],
            )
            .await
            .unwrap();
    }

    for dir in [&a, &b] {
        let out = on(dir, &db, &["migrate"]).await;
        assert!(out.ok() && out.stdout.contains("2 trusted key(s)"), "{out}");
    }
    for (dir, other) in [(&a, &kb), (&b, &ka)] {
        let jwks = on(dir, &db, &["keys", "export"]).await;
        assert!(jwks.stdout.contains(other.as_str()), "{jwks}");
        let out = on(dir, &db, &["log", "verify"]).await;
        assert_eq!(out.code, 0, "{out}");
    }
    assert_eq!(
        db.count("SELECT count(*) FROM events WHERE subject = 'keys'")
            .await,
        2,
        "one endorsement per instance"
    );

    // After the upgrade, a new row is not endorsed by another migrate, even when it is
    // written into the list of keys published before the upgrade too.
    let intruder = Signer::from_seed([9; 32]);
    let (key, value) = jwk_row(&intruder);
    client
        .execute(
            "INSERT INTO log_meta (key, value) VALUES ($1, $2)",
            &[&key, &value],
        )
        .await
        .unwrap();
    let listed = json!([ka, kb, intruder.kid()]).to_string();
    let changed = client
        .execute(
            "UPDATE log_meta SET value = $1 WHERE key = 'anchor:legacy_keys'",
            &[&listed],
        )
        .await
        .unwrap();
    assert_eq!(changed, 1);
    let out = on(&a, &db, &["migrate"]).await;
    assert!(out.ok() && out.stdout.contains("2 trusted key(s)"), "{out}");
    let out = on(&a, &db, &["log", "verify"]).await;
    assert_eq!(out.code, 1, "{out}");
    assert!(
        out.stdout
            .contains(&format!("key {} is published", intruder.kid())),
        "{out}"
    );
}
