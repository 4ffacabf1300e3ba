//! Who sees what, and floods: an agent reads in full only the log entries about its own
//! requests and the rooms it may use; restricted rooms refuse others; an approval shown
//! in a room shows its description only to its requester and the deciders; room posts
//! and pending requests are limited per token.

use std::collections::BTreeMap;

use countersign_core::{Groups, Principal, Role};
use countersign_server::{HttpConfig, Settings};
use serde_json::{Value, json};

use crate::support::{err, ok, start, start_full};

/// Every log entry's index and subject, from the store.
async fn subjects(server: &crate::support::TestServer) -> Vec<(u64, Option<String>, String)> {
    server
        .gate
        .store()
        .events_after(0, 100_000)
        .await
        .unwrap()
        .into_iter()
        .map(|e| {
            (
                e.index(),
                e.entry.subject.clone(),
                e.entry.kind.as_str().to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_read_in_full_only_the_log_entries_about_what_is_theirs() {
    let server = start().await;
    let mine = server.create_default().await;
    let theirs = server
        .create(
            &server.agent2,
            json!({"action_description": "Wire 9,000 EUR to ACME", "action_details": {"iban": "DE00-SECRET"}}),
        )
        .await;
    let (status, _) = server.decide(&server.approver, &theirs, "approved").await;
    assert_eq!(status, 200);
    let (status, _) = server.decide(&server.approver, &mine, "rejected").await;
    assert_eq!(status, 200);

    let mut full = 0;
    let mut redacted = 0;
    for (index, subject, kind) in subjects(&server).await {
        let path = format!("/api/v1/log/entries/{index}");
        let (status, as_agent) = server.get(&path, &server.agent).await;
        assert_eq!(status, 200, "{as_agent}");
        let (status, as_approver) = server.get(&path, &server.approver).await;
        assert_eq!(status, 200);
        assert!(
            as_approver.get("entry_base64").is_some(),
            "approvers read every entry: {as_approver}"
        );
        // The leaf hash is the same either way: the tree verifies from what anyone gets.
        assert_eq!(as_agent["leaf_hash"], as_approver["leaf_hash"]);
        if subject.as_deref() == Some(mine.as_str()) {
            assert!(as_agent.get("entry_base64").is_some(), "{as_agent}");
            assert_eq!(as_agent["entry"]["subject"], json!(mine));
            full += 1;
        } else {
            let mut members: Vec<&str> = as_agent
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .collect();
            // Sorted here: a JSON object's members have no order (and serde_json keeps
            // the server's when a dependency turns on preserve_order).
            members.sort_unstable();
            assert_eq!(
                members,
                ["index", "leaf_hash", "payload", "redacted", "type"],
                "entry {index} ({kind}, {subject:?}) shown to another agent: {as_agent}"
            );
            assert_eq!(as_agent["type"], json!(kind));
            assert_eq!(as_agent["payload"], as_approver["entry"]["payload"]);
            let text = as_agent.to_string();
            for secret in ["other-bot", "alice", "root", &theirs] {
                assert!(!text.contains(secret), "{secret} leaked in {text}");
            }
            redacted += 1;
        }
    }
    assert_eq!(
        full, 2,
        "request_created and request_decided of its own request"
    );
    assert!(
        redacted >= 8,
        "tokens and the other agent's request: {redacted}"
    );
    // The inclusion proof carries hashes only, and is the same for everyone.
    let (_, proof) = server
        .get("/api/v1/log/proof/inclusion?index=0", &server.agent)
        .await;
    let (_, proof2) = server
        .get("/api/v1/log/proof/inclusion?index=0", &server.approver)
        .await;
    if proof.get("path").is_some() {
        assert_eq!(proof, proof2);
    }
}

fn settings_with_ops_group() -> Settings {
    Settings {
        groups: Groups::new(BTreeMap::from([(
            "ops".to_string(),
            vec!["token:third-bot".to_string()],
        )]))
        .unwrap(),
        ..Settings::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restricted_rooms_refuse_everyone_they_do_not_name() {
    let server = start_full(HttpConfig::default(), settings_with_ops_group()).await;
    let setup = Principal::local_user("test-setup", Role::Admin);
    let (_, third) = server
        .gate
        .create_token("third-bot", Role::Agent, &setup)
        .await
        .unwrap();
    let creator = server.mcp(&server.agent).await;
    let other = server.mcp(&server.agent2).await;
    let member = server.mcp(&third).await;

    ok(&creator.call("join_room", json!({"room": "ops"})).await);
    ok(&creator
        .call(
            "post_message",
            json!({"room": "ops", "text": "rotating the database password"}),
        )
        .await);
    // Open rooms are open: the other agent reads them.
    ok(&other.call("read_messages", json!({"room": "ops"})).await);

    let refused = err(&other
        .call(
            "restrict_room",
            json!({"room": "ops", "allowed": ["token:other-bot"]}),
        )
        .await);
    assert!(refused.contains("only the creator"), "{refused}");
    let unknown = err(&creator
        .call(
            "restrict_room",
            json!({"room": "ops", "allowed": ["group:dev"]}),
        )
        .await);
    assert!(unknown.contains("no group \"dev\""), "{unknown}");
    let restricted = ok(&creator
        .call(
            "restrict_room",
            json!({"room": "ops", "allowed": ["group:ops"]}),
        )
        .await);
    assert_eq!(restricted["allowed"], json!(["group:ops"]));
    assert!(
        server
            .event_kinds()
            .await
            .contains(&"room_restricted".to_string())
    );

    for (tool, args) in [
        ("join_room", json!({"room": "ops"})),
        ("read_messages", json!({"room": "ops"})),
        ("post_message", json!({"room": "ops", "text": "let me in"})),
        (
            "wait_for_message",
            json!({"room": "ops", "timeout_seconds": 0}),
        ),
        ("set_presence", json!({"room": "ops", "status": "working"})),
        ("report_blocker", json!({"room": "ops", "description": "x"})),
    ] {
        let refused = err(&other.call(tool, args).await);
        assert!(
            refused.starts_with("forbidden") && refused.contains("restricted"),
            "{tool}: {refused}"
        );
    }
    let (status, body) = server
        .get("/api/v1/rooms/ops/messages", &server.agent2)
        .await;
    assert_eq!(status, 403, "{body}");
    let (status, _) = server
        .get("/api/v1/rooms/ops/members", &server.agent2)
        .await;
    assert_eq!(status, 403);
    let (status, body) = server
        .post(
            "/api/v1/requests",
            &server.agent2,
            json!({"action_description": "Deploy", "room": "ops"}),
        )
        .await;
    assert_eq!(
        status, 403,
        "an approval cannot be shown there either: {body}"
    );

    // The list shows the room (and what waits there) only to who may use it.
    let names = |body: &Value| -> Vec<String> {
        body["rooms"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_string())
            .collect()
    };
    let (_, listed) = server.get("/api/v1/rooms", &server.agent2).await;
    assert!(!names(&listed).contains(&"ops".to_string()), "{listed}");
    let (_, listed) = server.get("/api/v1/rooms", &third).await;
    assert!(names(&listed).contains(&"ops".to_string()), "{listed}");
    let (_, listed) = server.get("/api/v1/rooms", &server.approver).await;
    assert!(names(&listed).contains(&"ops".to_string()), "{listed}");

    // Its log entries are redacted for the others, whole for members.
    let room_entry = subjects(&server)
        .await
        .into_iter()
        .find(|(_, s, k)| s.as_deref() == Some("room:ops") && k == "message_posted")
        .unwrap()
        .0;
    let path = format!("/api/v1/log/entries/{room_entry}");
    assert_eq!(
        server.get(&path, &server.agent2).await.1["redacted"],
        json!(true)
    );
    assert!(server.get(&path, &third).await.1.get("entry").is_some());

    // Those it names, its creator and the people who decide are let in.
    let read = ok(&member.call("read_messages", json!({"room": "ops"})).await);
    assert_eq!(
        read["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["type"] == "note")
            .count(),
        1
    );
    ok(&member
        .call("post_message", json!({"room": "ops", "text": "here"}))
        .await);
    let (status, _) = server
        .get("/api/v1/rooms/ops/messages", &server.approver)
        .await;
    assert_eq!(status, 200);

    // An admin opens it again.
    let (status, opened) = server
        .post(
            "/api/v1/rooms/ops/access",
            &server.admin,
            json!({"allowed": []}),
        )
        .await;
    assert_eq!(status, 200, "{opened}");
    assert_eq!(opened["allowed"], json!([]));
    ok(&other.call("join_room", json!({"room": "ops"})).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_in_a_room_shows_its_description_to_the_requester_and_deciders_only() {
    let server = start().await;
    let id = server
        .create(
            &server.agent,
            json!({"action_description": "Refund order 4711 to card ending 0042", "room": "payments"}),
        )
        .await;
    let approval = |body: &Value| -> Value {
        body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["type"] == "approval")
            .cloned()
            .unwrap()
    };
    let path = "/api/v1/rooms/payments/messages";
    let (_, seen) = server.get(path, &server.agent2).await;
    let seen = approval(&seen);
    let text = seen["text"].as_str().unwrap();
    assert!(!text.contains("4711"), "{text}");
    assert!(text.starts_with(&id), "{text}");
    assert_eq!(seen["ref"], json!(id));
    for token in [&server.agent, &server.approver] {
        let (_, seen) = server.get(path, token).await;
        assert_eq!(
            approval(&seen)["text"],
            "Refund order 4711 to card ending 0042"
        );
    }
    let other = server.mcp(&server.agent2).await;
    let read = ok(&other
        .call("read_messages", json!({"room": "payments"}))
        .await);
    assert!(!read.to_string().contains("4711"), "{read}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_room_messages_is_refused_with_a_time_to_retry() {
    let settings = Settings {
        room_messages_per_minute: 5,
        ..Settings::default()
    };
    let server = start_full(HttpConfig::default(), settings).await;
    let path = "/api/v1/rooms/flood/messages";
    for i in 0..5 {
        let (status, body) = server
            .post(path, &server.agent, json!({"text": format!("note {i}")}))
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let refused = server
        .http
        .post(server.url(path))
        .bearer_auth(&server.agent)
        .json(&json!({"text": "one too many"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 429);
    let retry: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=12).contains(&retry), "retry after {retry}");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limited");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("messages_per_minute"),
        "{body}"
    );
    let agent = server.mcp(&server.agent).await;
    let refused = err(&agent
        .call("post_message", json!({"room": "flood", "text": "again"}))
        .await);
    assert!(refused.starts_with("rate_limited"), "{refused}");
    let refused = err(&agent
        .call(
            "set_presence",
            json!({"room": "flood", "status": "working"}),
        )
        .await);
    assert!(
        refused.starts_with("rate_limited"),
        "presence too: {refused}"
    );
    // Another token is not slowed by the flood.
    let (status, _) = server
        .post(path, &server.agent2, json!({"text": "hello"}))
        .await;
    assert_eq!(status, 200);
    // And the refused posts were not stored.
    let (_, read) = server.get(path, &server.approver).await;
    let notes = read["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["type"] == "note")
        .count();
    assert_eq!(notes, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_agent_may_have_only_so_many_requests_pending() {
    let settings = Settings {
        pending_per_agent: Some(3),
        ..Settings::default()
    };
    let server = start_full(HttpConfig::default(), settings).await;
    let body = |n: usize| json!({"action_description": format!("Delete bucket {n}"), "idempotency_key": format!("k{n}")});
    // Ten at once: exactly three pass.
    let mut calls = Vec::new();
    for n in 0..10 {
        let http = server.http.clone();
        let url = server.url("/api/v1/requests");
        let token = server.agent.clone();
        let body = body(n);
        calls.push(tokio::spawn(async move {
            let resp = http
                .post(url)
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap())
        }));
    }
    let mut created = Vec::new();
    let mut refused = 0;
    for call in calls {
        let (status, answer) = call.await.unwrap();
        match status {
            201 => created.push(answer["request_id"].as_str().unwrap().to_string()),
            429 => {
                let message = answer["error"]["message"].as_str().unwrap();
                assert!(message.contains("pending_per_agent = 3"), "{message}");
                assert_eq!(answer["error"]["code"], "rate_limited");
                refused += 1;
            }
            other => panic!("{other}: {answer}"),
        }
    }
    assert_eq!((created.len(), refused), (3, 7));
    // A retry of one of them is the same request, not a fourth.
    let first = server
        .gate
        .store()
        .get_request(&created[0])
        .await
        .unwrap()
        .unwrap();
    let n: usize = first
        .idempotency_key
        .unwrap()
        .trim_start_matches('k')
        .parse()
        .unwrap();
    let (status, again) = server
        .post("/api/v1/requests", &server.agent, body(n))
        .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["request_id"], json!(created[0]));
    // Another agent is not held back, and a decision frees a place.
    server
        .create(
            &server.agent2,
            json!({"action_description": "Restart the cache"}),
        )
        .await;
    let (status, _) = server
        .decide(&server.approver, &created[0], "approved")
        .await;
    assert_eq!(status, 200);
    server
        .create(
            &server.agent,
            json!({"action_description": "Delete bucket 99"}),
        )
        .await;
    let agent = server.mcp(&server.agent).await;
    let refused = err(&agent
        .call(
            "request_approval",
            json!({"action_description": "One more"}),
        )
        .await);
    assert!(refused.contains("pending_per_agent"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_room_list_and_waits_read_only_what_is_new() {
    let settings = Settings {
        room_messages_per_minute: 0,
        ..Settings::default()
    };
    let server = start_full(HttpConfig::default(), settings).await;
    let agent = server.mcp(&server.agent).await;
    let asked = ok(&agent
        .call(
            "report_blocker",
            json!({"room": "busy", "description": "need the deploy key"}),
        )
        .await);
    let rooms = server.gate.rooms();
    let server = &server;
    let listed = |expect: usize| async move {
        let (status, body) = server.get("/api/v1/rooms", &server.approver).await;
        assert_eq!(status, 200);
        let room = body["rooms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "busy")
            .cloned()
            .unwrap();
        assert_eq!(room["attention"]["blockers"], json!(expect), "{room}");
    };
    listed(1).await;
    let long = 1200;
    for i in 0..long {
        rooms
            .post_message(
                &Principal::from_token("deploy-bot", Role::Agent),
                "busy",
                &format!("step {i}"),
                "progress",
            )
            .await
            .unwrap();
    }
    let before = rooms.events_read();
    listed(1).await;
    let first = rooms.events_read() - before;
    assert!(
        first as usize <= long + 10,
        "the list read {first} events for {long} new ones"
    );
    // However long the history, a list reads only what came since the last one.
    let before = rooms.events_read();
    listed(1).await;
    listed(1).await;
    assert_eq!(
        rooms.events_read() - before,
        0,
        "the lists re-read the history"
    );

    // The blocker is resolved: the count follows, reading one new event.
    let blocker = asked["blocker_id"].as_str().unwrap().to_string();
    let (status, _) = server
        .post(
            &format!("/api/v1/rooms/busy/blockers/{blocker}/resolve"),
            &server.approver,
            json!({"reply": "use the vault"}),
        )
        .await;
    assert_eq!(status, 200);
    let before = rooms.events_read();
    listed(0).await;
    assert!(rooms.events_read() - before <= 2);

    // A wait for a resolution already given reads from the blocker on once, then the
    // waits for new messages read only after `since`.
    let resolved = ok(&agent
        .call(
            "wait_for_resolution",
            json!({"room": "busy", "blocker_id": blocker, "timeout_seconds": 1}),
        )
        .await);
    assert_eq!(resolved["resolved"], true);
    let (_, latest) = server
        .get(
            "/api/v1/rooms/busy/messages?latest=true&limit=1",
            &server.agent,
        )
        .await;
    let last = latest["messages"][0]["seq"].as_u64().unwrap();
    let before = rooms.events_read();
    let waited = ok(&agent
        .call(
            "wait_for_message",
            json!({"room": "busy", "since": last, "timeout_seconds": 1}),
        )
        .await);
    assert_eq!(waited["timed_out"], true);
    assert_eq!(rooms.events_read() - before, 0);

    // The dashboard's view: the newest page, newest last, and the page before it.
    let (status, page) = server
        .get(
            "/api/v1/rooms/busy/messages?latest=true&limit=50",
            &server.approver,
        )
        .await;
    assert_eq!(status, 200, "{page}");
    let seqs: Vec<u64> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs.len(), 50);
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "oldest first");
    assert_eq!(*seqs.last().unwrap(), last);
    assert_eq!(page["messages"][49]["type"], "resolution");
    let older = page["older_before"].as_u64().unwrap();
    assert_eq!(older, seqs[0]);
    let (_, previous) = server
        .get(
            &format!("/api/v1/rooms/busy/messages?before={older}&limit=50"),
            &server.approver,
        )
        .await;
    let prev: Vec<u64> = previous["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(prev.len(), 50);
    assert!(*prev.last().unwrap() < older);
    assert_eq!(
        previous["messages"][49]["text"],
        json!(format!("step {}", long - 50))
    );
    let (status, _) = server
        .get(
            "/api/v1/rooms/busy/messages?latest=true&since=3",
            &server.approver,
        )
        .await;
    assert_eq!(status, 400);
}

/// The figure in docs/benchmarks.md ("Room lists"): `GET /api/v1/rooms` over four rooms
/// as their histories grow. Run with
/// `cargo test -p countersign-server --test server -- --ignored room_list_cost --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, printed; run on purpose"]
async fn room_list_cost() {
    let settings = Settings {
        room_messages_per_minute: 0,
        ..Settings::default()
    };
    let server = start_full(HttpConfig::default(), settings).await;
    let rooms = server.gate.rooms();
    let bot = Principal::from_token("deploy-bot", Role::Agent);
    let mut posted = 0;
    for target in [100usize, 1_000, 5_000] {
        while posted < target {
            for room in ["r1", "r2", "r3", "r4"] {
                rooms
                    .post_message(&bot, room, &format!("step {posted}"), "progress")
                    .await
                    .unwrap();
            }
            posted += 1;
        }
        // The first list after new messages reads them; the next ones read nothing.
        server.get("/api/v1/rooms", &server.approver).await;
        let read_before = rooms.events_read();
        let mut times = Vec::new();
        for _ in 0..50 {
            let started = std::time::Instant::now();
            let (status, _) = server.get("/api/v1/rooms", &server.approver).await;
            assert_eq!(status, 200);
            times.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        times.sort_by(f64::total_cmp);
        println!(
            "4 rooms x {target:>5} messages: list p50 {:.2} ms, p99 {:.2} ms, events read per list {}",
            times[25],
            times[49],
            (rooms.events_read() - read_before) / 50
        );
    }
}
