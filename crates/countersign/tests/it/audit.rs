//! `countersign log verify` holds the database to the log, as an auditor would use it:
//! a request's stored body, a committed payload, a token row and an account row are
//! rewritten in the database behind the server's back (SQLite file and PostgreSQL), and
//! `log verify` must name the table and the id and exit non-zero; put back, it is ok.

use std::path::Path;

use reqwest::StatusCode;
use serde_json::json;

use crate::common::postgres::TestDb;
use crate::common::{self, Output, Server};

/// The database under test: where the CLI and the server find it, and raw SQL on it.
enum Db {
    Sqlite(std::path::PathBuf),
    Postgres(TestDb),
}

impl Db {
    async fn cli(&self, data: &Path, args: &[&str]) -> Output {
        let mut cmd = common::command(data, args);
        if let Db::Postgres(db) = self {
            cmd.env("COUNTERSIGN_DATABASE_URL", &db.url);
        }
        common::output(cmd).await
    }

    fn serve(&self, data: &Path) -> Server {
        let mut cmd = common::serve_command();
        cmd.arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(data);
        if let Db::Postgres(db) = self {
            cmd.env("COUNTERSIGN_DATABASE_URL", &db.url);
        }
        Server::spawn(cmd)
    }

    /// One text value (the first column of the first row).
    async fn text(&self, sql: &str) -> String {
        match self {
            Db::Sqlite(path) => {
                let db = rusqlite::Connection::open(path).unwrap();
                db.query_row(sql, [], |r| r.get(0))
                    .unwrap_or_else(|e| panic!("{sql}: {e}"))
            }
            Db::Postgres(db) => db
                .client()
                .await
                .query_one(sql, &[])
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
                .get(0),
        }
    }

    async fn execute(&self, sql: &str) {
        match self {
            Db::Sqlite(path) => {
                let db = rusqlite::Connection::open(path).unwrap();
                db.execute_batch(sql)
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
            }
            Db::Postgres(db) => db
                .client()
                .await
                .batch_execute(sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}")),
        }
    }

    /// How a text column holding JSON is read and written back (PostgreSQL keeps
    /// request bodies as jsonb and documents as json).
    fn as_text(&self, column: &str) -> String {
        match self {
            Db::Sqlite(_) => column.to_string(),
            Db::Postgres(_) => format!("{column}::text"),
        }
    }

    fn json_value(&self, value: &str, json_type: &str) -> String {
        match self {
            Db::Sqlite(_) => value.to_string(),
            Db::Postgres(_) => format!("({value})::{json_type}"),
        }
    }
}

fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// Builds a small history, then rewrites one row at a time and checks what `log
/// verify` says.
async fn rewritten_rows_are_named(db: Db, data: &Path) {
    let token = |role: &'static str, name: &'static str| {
        let db = &db;
        async move {
            let out = db
                .cli(data, &["token", "create", "--role", role, "--name", name])
                .await;
            assert!(out.ok(), "{out}");
            out.stdout.trim().to_string()
        }
    };
    let agent = token("agent", "bot").await;
    let approver = token("approver", "alice").await;
    let added = db
        .cli(
            data,
            &["user", "add", "--username", "ops", "--role", "approver"],
        )
        .await;
    assert!(added.ok(), "{added}");

    let server = db.serve(data);
    let mut ids = Vec::new();
    for n in 0..3 {
        let body = json!({
            "action_description": format!("Pay invoice INV-{n}"),
            "action_details": {"amount": format!("{}", 100 + n), "currency": "EUR"}
        });
        ids.push(server.create_request(&agent, &body).await);
    }
    let (status, body) = server.decide(&ids[0], &approver, "approved").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = server.decide(&ids[1], &approver, "rejected").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = server
        .post(
            &format!("/api/v1/requests/{}/actions", ids[0]),
            Some(&agent),
            &json!({"tool": "pay", "details": {"ref": "T-1"}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    drop(server);

    let verify = || db.cli(data, &["log", "verify"]);
    let out = verify().await;
    assert_eq!(out.code, 0, "an untouched database:\n{out}");
    assert!(
        out.stdout.contains("the database says what the log says"),
        "{out}"
    );

    // What each rewrite must be reported as.
    let target = &ids[0];
    let body = db
        .text(&format!(
            "SELECT {} FROM requests WHERE id = {}",
            db.as_text("body"),
            quote(target)
        ))
        .await;
    let created_seq = db
        .text(&format!(
            "SELECT CAST(seq AS TEXT) FROM events WHERE subject = {} ORDER BY seq LIMIT 1",
            quote(target)
        ))
        .await;
    let payload = db
        .text(&format!(
            "SELECT payload FROM payloads WHERE seq = {created_seq}"
        ))
        .await;
    let token_id = db.text("SELECT id FROM tokens WHERE name = 'bot'").await;
    let (user_id, user_body) = (
        db.text("SELECT id FROM documents WHERE kind = 'user'")
            .await,
        db.text(&format!(
            "SELECT {} FROM documents WHERE kind = 'user'",
            db.as_text("body")
        ))
        .await,
    );

    // The stored body says another amount; the dashboard, Slack and the API would show it.
    let forged = body.replace("INV-0", "INV-9");
    assert_ne!(forged, body);
    db.execute(&format!(
        "UPDATE requests SET body = {} WHERE id = {}",
        db.json_value(&quote(&forged), "jsonb"),
        quote(target)
    ))
    .await;
    let out = verify().await;
    assert_eq!(out.code, 1, "a rewritten request body passed:\n{out}");
    assert!(
        out.stdout
            .contains(&format!("requests {target}: action.description is \"Pay invoice INV-9\" in the row, the log says \"Pay invoice INV-0\"")),
        "{out}"
    );
    assert!(out.stdout.contains("DATABASE DISAGREES"), "{out}");
    db.execute(&format!(
        "UPDATE requests SET body = {} WHERE id = {}",
        db.json_value(&quote(&body), "jsonb"),
        quote(target)
    ))
    .await;

    // The committed payload (what a full bundle discloses) rewritten to match.
    db.execute(&format!(
        "UPDATE payloads SET payload = {} WHERE seq = {created_seq}",
        quote(&payload.replace("INV-0", "INV-9"))
    ))
    .await;
    let out = verify().await;
    assert_eq!(out.code, 1, "a rewritten payload passed:\n{out}");
    assert!(
        out.stdout.contains(&format!(
            "payloads {created_seq}: does not open the commitment"
        )),
        "{out}"
    );
    db.execute(&format!(
        "UPDATE payloads SET payload = {} WHERE seq = {created_seq}",
        quote(&payload)
    ))
    .await;

    // An agent's token made an admin, and its expiry and revocation moved.
    db.execute("UPDATE tokens SET role = 'admin' WHERE name = 'bot'")
        .await;
    let out = verify().await;
    assert_eq!(out.code, 1, "a rewritten token passed:\n{out}");
    assert!(
        out.stdout.contains(&format!(
            "tokens {token_id}: role is \"admin\" in the row, the log says \"agent\""
        )),
        "{out}"
    );
    db.execute("UPDATE tokens SET role = 'agent' WHERE name = 'bot'")
        .await;

    // An account made an admin.
    let promoted = user_body.replace("\"approver\"", "\"admin\"");
    assert_ne!(promoted, user_body);
    db.execute(&format!(
        "UPDATE documents SET body = {} WHERE kind = 'user'",
        db.json_value(&quote(&promoted), "json")
    ))
    .await;
    let out = verify().await;
    assert_eq!(out.code, 1, "a rewritten account passed:\n{out}");
    assert!(
        out.stdout.contains(&format!(
            "users {user_id}: role is \"admin\" in the row, the log says \"approver\""
        )),
        "{out}"
    );
    db.execute(&format!(
        "UPDATE documents SET body = {} WHERE kind = 'user'",
        db.json_value(&quote(&user_body), "json")
    ))
    .await;

    // A request row with no entry behind it.
    let stray = body.replace(target.as_str(), "req_0000000000000000000000000000dead");
    db.execute(&format!(
        "INSERT INTO requests (id, version, status, requested_by, idempotency_key,
             requested_at, expires_at, body)
         SELECT 'req_0000000000000000000000000000dead', version, status, requested_by, NULL,
             requested_at, expires_at, {} FROM requests WHERE id = {}",
        db.json_value(&quote(&stray), "jsonb"),
        quote(target)
    ))
    .await;
    let out = verify().await;
    assert_eq!(out.code, 1, "a request with no log entry passed:\n{out}");
    assert!(
        out.stdout.contains(
            "requests req_0000000000000000000000000000dead: the log has no request_created entry"
        ),
        "{out}"
    );
    db.execute("DELETE FROM requests WHERE id = 'req_0000000000000000000000000000dead'")
        .await;

    // Put back, everything agrees again.
    let out = verify().await;
    assert_eq!(out.code, 0, "the restored database:\n{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_verify_names_rewritten_rows_on_sqlite() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    std::fs::create_dir_all(&data).unwrap();
    rewritten_rows_are_named(Db::Sqlite(data.join("countersign.db")), &data).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_verify_names_rewritten_rows_on_postgres() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    std::fs::create_dir_all(&data).unwrap();
    rewritten_rows_are_named(Db::Postgres(db), &data).await;
}

/// A webhook endpoint: answers 200 to every POST and keeps the bodies.
async fn receiver() -> (
    String,
    std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let bodies = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = bodies.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            let kept = kept.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Ok(n) = conn.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    let Some((head, body)) = text.split_once("\r\n\r\n") else {
                        continue;
                    };
                    let length = head
                        .lines()
                        .find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case("content-length")
                                .then(|| v.trim().parse::<usize>().ok())?
                        })
                        .unwrap_or(0);
                    if body.len() < length {
                        continue;
                    }
                    if let Ok(v) = serde_json::from_str(&body[..length]) {
                        kept.lock().unwrap().push(v);
                    }
                    let _ = conn
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                        )
                        .await;
                    return;
                }
            });
        }
    });
    (url, bodies)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_audits_on_a_schedule_and_reports_a_mismatch() {
    use std::time::{Duration, Instant};
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    let (url, bodies) = receiver().await;
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(
        data.join("countersign.toml"),
        format!(
            "[audit]\ninterval = \"1s\"\n\n[[webhooks]]\nname = \"ops\"\nurl = {url:?}\nsecret = \"whsec_Y3Jhc2gtaGFybmVzcy13ZWJob29rLXNlY3JldA==\"\nevents = [\"audit.mismatch\"]\n"
        ),
    )
    .unwrap();
    let agent = common::create_token(&data, "agent", "bot").await;
    let admin = common::create_token(&data, "admin", "root").await;
    let server = Server::start(&data);
    let id = server
        .create_request(
            &agent,
            &json!({"action_description": "Pay invoice INV-1", "action_details": {"amount": "10"}}),
        )
        .await;

    let audit_of = |token: String| {
        let server = &server;
        async move {
            let (status, body) = server.get("/healthz", Some(&token)).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            body
        }
    };
    // Until the audit has seen the request: ok, for the admin only.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let body = audit_of(admin.clone()).await;
        let audit = &body["detail"]["audit"];
        if audit["status"] == "ok" && audit["rows"].as_u64().unwrap_or(0) >= 3 {
            break;
        }
        assert!(Instant::now() < deadline, "no ok audit: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let body = audit_of(agent.clone()).await;
    assert!(
        body.get("detail").is_none(),
        "an agent sees the detail: {body}"
    );
    let (_, body) = server.get("/healthz", None).await;
    assert!(
        body.get("detail").is_none(),
        "anyone sees the detail: {body}"
    );

    // Rewritten behind the running server's back.
    let db = rusqlite::Connection::open(data.join("countersign.db")).unwrap();
    db.execute(
        "UPDATE requests SET body = replace(body, 'INV-1', 'INV-666') WHERE id = ?1",
        [&id],
    )
    .unwrap();

    let deadline = Instant::now() + Duration::from_secs(20);
    let audit = loop {
        let body = audit_of(admin.clone()).await;
        let audit = body["detail"]["audit"].clone();
        if audit["status"] == "mismatch" {
            break audit;
        }
        assert!(Instant::now() < deadline, "no mismatch reported: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(audit["differences"], 1, "{audit}");
    assert_eq!(
        audit["shown"][0],
        format!(
            "requests {id}: action.description is \"Pay invoice INV-666\" in the row, the log says \"Pay invoice INV-1\""
        ),
        "{audit}"
    );

    // The webhook event, naming the row by table and id (never its values).
    let deadline = Instant::now() + Duration::from_secs(20);
    let hook = loop {
        let found = bodies
            .lock()
            .unwrap()
            .iter()
            .find(|b| b["type"] == "audit.mismatch")
            .cloned();
        if let Some(hook) = found {
            break hook;
        }
        assert!(
            Instant::now() < deadline,
            "no audit.mismatch webhook; server stderr:\n{}",
            server.stderr()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let event = &hook["data"]["event"];
    assert_eq!(event["differences"], 1, "{hook}");
    assert_eq!(event["rows"], json!([format!("requests {id}")]), "{hook}");
    assert_eq!(event["tables"], json!({"requests": 1}), "{hook}");
    assert!(!hook.to_string().contains("INV-666"), "{hook}");

    // The same mismatch is logged once, however many audits see it.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let logged: i64 = db
        .query_row(
            "SELECT count(*) FROM events WHERE kind = 'audit_mismatch'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(logged, 1);
    drop(server);

    // doctor says so too.
    let out = common::run(&data, &["doctor"]).await;
    assert_eq!(out.code, 1, "{out}");
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with("FAIL  the last audit")
                && l.contains("found 1 difference(s)")
                && l.contains(&format!("requests {id}"))),
        "{out}"
    );
}
