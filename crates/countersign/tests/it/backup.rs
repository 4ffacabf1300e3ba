//! `countersign backup` and `countersign restore`: an online backup taken while `serve`
//! is under load, restored into an empty data directory, passes `log verify` and serves
//! the same proofs to the same tokens.

use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

fn pay(n: usize) -> Value {
    json!({
        "action_description": format!("Pay invoice B-{n}"),
        "action_details": {"amount": format!("{}", 100 + n), "currency": "EUR"}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_load_restores_verifies_and_serves_the_same_proofs() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("live");
    let server = Arc::new(Server::start(&data));
    let agent = create_token(&data, "agent", "backup-bot").await;
    let approver = create_token(&data, "approver", "alice@example.com").await;

    // Decided before the backup: these must come back with the very same proofs.
    let mut before = Vec::new();
    for n in 0..5 {
        let id = server.create_request(&agent, &pay(n)).await;
        let (status, body) = server.decide(&id, &approver, "approve").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        before.push(id);
    }

    // Load: requests created and approved without pause while the backup runs.
    let stop = Arc::new(AtomicBool::new(false));
    let made = Arc::new(AtomicUsize::new(0));
    let mut load = Vec::new();
    for worker in 0..4 {
        let (server, agent, approver) = (server.clone(), agent.clone(), approver.clone());
        let (stop, made) = (stop.clone(), made.clone());
        load.push(tokio::spawn(async move {
            let mut n = 1000 * (worker + 1);
            while !stop.load(Ordering::Relaxed) {
                let id = server.create_request(&agent, &pay(n)).await;
                let (status, body) = server.decide(&id, &approver, "approve").await;
                assert_eq!(status, StatusCode::OK, "{body}");
                made.fetch_add(1, Ordering::Relaxed);
                n += 1;
            }
        }));
    }
    while made.load(Ordering::Relaxed) < 20 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let archive = tmp.path().join("countersign-backup.zip");
    let out = run(&data, &["backup", path_str(&archive)]).await;
    let during = made.load(Ordering::Relaxed);
    assert!(out.ok(), "backup failed: {}", out.stderr);
    assert!(out.stdout.contains("backed up"), "{}", out.stdout);
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }
    assert!(
        made.load(Ordering::Relaxed) > during,
        "the load had stopped before the backup ended: not a backup under load"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&archive).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the archive holds the signing keys");

    // Never over an existing file.
    let again = run(&data, &["backup", path_str(&archive)]).await;
    assert!(
        !again.ok() && again.stderr.contains("exists already"),
        "{}",
        again.stderr
    );

    // Restore into an empty data directory: checked against its log.
    let restored = tmp.path().join("restored");
    let out = run(&restored, &["restore", path_str(&archive)]).await;
    assert!(out.ok(), "restore failed: {}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("restored"), "{}", out.stdout);
    assert!(
        out.stdout.contains("ok: every checkpoint matches"),
        "{}",
        out.stdout
    );
    let verify = run(&restored, &["log", "verify"]).await;
    assert!(
        verify.ok(),
        "log verify on the copy: {}\n{}",
        verify.stdout,
        verify.stderr
    );
    assert_eq!(
        std::fs::read(restored.join("keys/signing-key.json")).unwrap(),
        std::fs::read(data.join("keys/signing-key.json")).unwrap(),
        "the signing key came back"
    );

    // A second restore into the same place is refused: it is no longer empty.
    let twice = run(&restored, &["restore", path_str(&archive)]).await;
    assert!(
        !twice.ok() && twice.stderr.contains("empty data directory"),
        "{}",
        twice.stderr
    );

    // The copy serves the same proofs, to the same tokens.
    let copy = Server::start(&restored);
    for id in &before {
        let original = server.request_view(&agent, id).await;
        let served = copy.request_view(&agent, id).await;
        assert_eq!(served["status"], "approved", "{served}");
        assert!(original["proof"].is_object(), "no proof in {original}");
        assert_eq!(
            served["proof"], original["proof"],
            "request {id}'s proof differs"
        );
    }
    // And it goes on working: a new request there is signed and logged.
    let id = copy.create_request(&agent, &pay(1)).await;
    let (status, body) = copy.decide(&id, &approver, "approve").await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_or_foreign_archive_is_refused_and_restores_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("live");
    let agent = create_token(&data, "agent", "backup-bot").await;
    let _ = agent;
    let archive = tmp.path().join("b.zip");
    let out = run(&data, &["backup", path_str(&archive)]).await;
    assert!(out.ok(), "backup failed: {}", out.stderr);

    // The same archive with the database's bytes changed (its manifest unchanged).
    let damaged = tmp.path().join("damaged.zip");
    {
        let mut zip = zip::ZipArchive::new(std::fs::File::open(&archive).unwrap()).unwrap();
        let mut writer = zip::ZipWriter::new(std::fs::File::create(&damaged).unwrap());
        let options = zip::write::SimpleFileOptions::default();
        for i in 0..zip.len() {
            let mut entry = zip.by_index(i).unwrap();
            let name = entry.name().unwrap().to_string();
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).unwrap();
            if name == "countersign.db" {
                let at = bytes.len() - 10;
                bytes[at] ^= 0xff;
            }
            writer.start_file(name, options).unwrap();
            writer.write_all(&bytes).unwrap();
        }
        writer.finish().unwrap();
    }
    let target = tmp.path().join("into");
    let out = run(&target, &["restore", path_str(&damaged)]).await;
    assert!(!out.ok(), "a damaged archive was restored: {}", out.stdout);
    assert!(out.stderr.contains("SHA-256"), "{}", out.stderr);
    assert!(
        !target.join("countersign.db").exists(),
        "a damaged database was put in place"
    );

    // Not a backup at all.
    let foreign = tmp.path().join("foreign.zip");
    std::fs::write(&foreign, b"not a zip").unwrap();
    let out = run(&target, &["restore", path_str(&foreign)]).await;
    assert!(
        !out.ok() && out.stderr.contains("not a countersign backup"),
        "{}",
        out.stderr
    );
}

/// `countersign demo` on a data directory that has a database backs it up (database and
/// keys, as `countersign backup` does) and fills a fresh one; the backup restores the
/// old installation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_backs_up_an_existing_database_then_fills_a_fresh_one() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("live");
    create_token(&data, "agent", "mine-before-demo").await;
    let out = run(&data, &["demo", "--no-serve"]).await;
    assert!(out.ok(), "demo failed on an existing database:\n{out}");
    let backups: Vec<_> = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("countersign-before-demo-")
        })
        .collect();
    assert_eq!(backups.len(), 1, "one backup: {backups:?}\n{out}");
    assert!(
        out.stderr.contains("backed up") || out.stdout.contains("backed up"),
        "it says where the old database went:\n{out}"
    );
    let tokens = run_ok(&data, &["token", "list"]).await;
    assert!(
        tokens.contains("deploy-bot") && !tokens.contains("mine-before-demo"),
        "the demo filled a fresh database: {tokens}"
    );

    // The backup brings the old installation back.
    let back = tmp.path().join("back");
    let out = run(&back, &["restore", path_str(&backups[0])]).await;
    assert!(out.ok(), "restore of the demo's backup failed:\n{out}");
    let tokens = run_ok(&back, &["token", "list"]).await;
    assert!(tokens.contains("mine-before-demo"), "{tokens}");
}
