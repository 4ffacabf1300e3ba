//! Rooms with a real MCP client: messages, presence, questions and blockers.

use std::time::{Duration, Instant};

use countersign_server::{HttpConfig, Settings};
use serde_json::json;

use crate::support::{err, ok, start, start_full};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn messages_presence_and_concurrent_agents() {
    let server = start().await;
    let agent = server.mcp(&server.agent).await;
    let names = agent.tool_names().await;
    for tool in [
        "post_message",
        "read_messages",
        "wait_for_message",
        "join_room",
        "leave_room",
        "set_presence",
        "wait_for_feedback",
        "report_blocker",
        "wait_for_resolution",
    ] {
        assert!(
            names.contains(&tool.to_string()),
            "{tool} missing: {names:?}"
        );
    }
    assert!(
        !names.contains(&"kick".to_string()),
        "agents are not room admins"
    );

    let joined = ok(&agent
        .call("join_room", json!({"room": "Release-Train"}))
        .await);
    assert_eq!(joined["room"], "release-train");
    assert_eq!(joined["members"][0]["id"], "token:deploy-bot");
    let posted = ok(&agent
        .call(
            "post_message",
            json!({"room": "release-train", "text": "starting the rollout", "type": "progress"}),
        )
        .await);
    assert!(posted["id"].as_str().unwrap().starts_with('m'));
    let presence = ok(&agent
        .call(
            "set_presence",
            json!({"room": "release-train", "status": "done", "note": "all green"}),
        )
        .await);
    assert_eq!(presence["status"], "done");
    let bad = err(&agent
        .call(
            "set_presence",
            json!({"room": "release-train", "status": "asleep"}),
        )
        .await);
    assert!(bad.contains("asleep"), "{bad}");

    // Ten agents post at once: every message is there, once, in log order.
    let mut tasks = Vec::new();
    for i in 0..10 {
        let client = server
            .mcp(if i % 2 == 0 {
                &server.agent
            } else {
                &server.agent2
            })
            .await;
        tasks.push(tokio::spawn(async move {
            for j in 0..3 {
                ok(&client
                    .call(
                        "post_message",
                        json!({"room": "release-train", "text": format!("agent {i} step {j}")}),
                    )
                    .await);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let read = ok(&agent
        .call(
            "read_messages",
            json!({"room": "release-train", "limit": 500}),
        )
        .await);
    let texts: Vec<String> = read["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["text"].as_str().map(str::to_string))
        .collect();
    for i in 0..10 {
        for j in 0..3 {
            assert_eq!(
                texts
                    .iter()
                    .filter(|t| **t == format!("agent {i} step {j}"))
                    .count(),
                1
            );
        }
    }
    let seqs: Vec<u64> = read["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["seq"].as_u64().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "in order");
    // Reading from next_since gives nothing new.
    let next = read["next_since"].as_u64().unwrap();
    let empty = ok(&agent
        .call(
            "read_messages",
            json!({"room": "release-train", "since": next}),
        )
        .await);
    assert_eq!(empty["messages"].as_array().unwrap().len(), 0);

    let left = ok(&agent
        .call("leave_room", json!({"room": "release-train"}))
        .await);
    assert!(
        left["members"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["id"] != "token:deploy-bot")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_message_is_woken_by_the_message() {
    let server = start().await;
    let agent = server.mcp(&server.agent).await;
    ok(&agent.call("join_room", json!({"room": "ops"})).await);
    let read = ok(&agent.call("read_messages", json!({"room": "ops"})).await);
    let since = read["next_since"].as_u64().unwrap();
    let waiter = {
        let client = server.mcp(&server.agent2).await;
        tokio::spawn(async move {
            let started = Instant::now();
            let r = client
                .call(
                    "wait_for_message",
                    json!({"room": "ops", "since": since, "timeout_seconds": 60}),
                )
                .await;
            (r, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    ok(&agent
        .call(
            "post_message",
            json!({"room": "ops", "text": "deploy finished", "type": "done"}),
        )
        .await);
    let (result, waited) = waiter.await.unwrap();
    let got = ok(&result);
    assert!(
        waited < Duration::from_secs(10),
        "woken by the message: {waited:?}"
    );
    assert_eq!(got["timed_out"], false);
    assert_eq!(got["messages"][0]["text"], "deploy finished");
    assert_eq!(got["messages"][0]["type"], "done");
    // A wait with nothing coming times out.
    let next = got["next_since"].as_u64().unwrap();
    let quiet = ok(&agent
        .call(
            "wait_for_message",
            json!({"room": "ops", "since": next, "timeout_seconds": 1}),
        )
        .await);
    assert_eq!(quiet["timed_out"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_message_with_mentions_only_wakes_for_a_mention_of_the_caller() {
    let server = start().await;
    let agent = server.mcp(&server.agent).await;
    let other = server.mcp(&server.agent2).await;
    ok(&agent.call("join_room", json!({"room": "review"})).await);
    ok(&other.call("join_room", json!({"room": "review"})).await);
    let since = ok(&other.call("read_messages", json!({"room": "review"})).await)["next_since"]
        .as_u64()
        .unwrap();
    let waiter = {
        let client = server.mcp(&server.agent2).await;
        tokio::spawn(async move {
            client
                .call(
                    "wait_for_message",
                    json!({"room": "review", "since": since, "timeout_seconds": 60, "mentions_only": true}),
                )
                .await
        })
    };
    // None of these is a mention of other-bot: another name, an address, its own post.
    for (client, text) in [
        (&agent, "no mention here"),
        (
            &agent,
            "@other-bot2 is someone else; mail other-bot@example.com",
        ),
        (&other, "I am @other-bot and I mention myself"),
    ] {
        ok(&client
            .call("post_message", json!({"room": "review", "text": text}))
            .await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "woken by a message that does not mention it"
    );
    let mention = ok(&agent
        .call(
            "post_message",
            json!({"room": "review", "text": "@Other-Bot, please review the diff."}),
        )
        .await);
    let got = ok(&waiter.await.unwrap());
    assert_eq!(got["timed_out"], false);
    let messages = got["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 1, "only the mention: {messages:?}");
    assert_eq!(messages[0]["id"], mention["id"]);
    assert_eq!(got["next_since"], mention["seq"]);
    // Reading on from next_since: nothing is left to wake it.
    let quiet = ok(&other
        .call(
            "wait_for_message",
            json!({"room": "review", "since": got["next_since"], "timeout_seconds": 1, "mentions_only": true}),
        )
        .await);
    assert_eq!(quiet["timed_out"], true);
    // Without mentions_only, the same wait from the start returns the first message.
    let all = ok(&other
        .call(
            "wait_for_message",
            json!({"room": "review", "since": since, "timeout_seconds": 1}),
        )
        .await);
    assert_eq!(all["messages"][0]["text"], "no mention here");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feedback_is_a_soft_gate_that_times_out_or_returns_the_answer() {
    let server = start().await;
    let agent = server.mcp(&server.agent).await;
    let started = Instant::now();
    let none = ok(&agent
        .call(
            "wait_for_feedback",
            json!({"room": "design", "question": "Blue or green?", "timeout_seconds": 2}),
        )
        .await);
    assert_eq!(none["answered"], false);
    assert!(none["message"].as_str().unwrap().contains("proceed"));
    assert!(started.elapsed() >= Duration::from_secs(2));

    let waiter = {
        let client = server.mcp(&server.agent).await;
        tokio::spawn(async move {
            client
                .call(
                    "wait_for_feedback",
                    json!({"room": "design", "question": "Ship on Friday?", "timeout_seconds": 60}),
                )
                .await
        })
    };
    // The first question timed out but stays open; wait for the second, answer it.
    let second = loop {
        let (_, body) = server
            .get("/api/v1/rooms/design/messages", &server.approver)
            .await;
        let open: Vec<_> = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["type"] == "question" && m["open"] == true)
            .cloned()
            .collect();
        if open.len() == 2 {
            break open[1]["id"].as_str().unwrap().to_string();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (status, _) = server
        .post(
            &format!("/api/v1/rooms/design/questions/{second}/answer"),
            &server.agent,
            json!({"text": "yes"}),
        )
        .await;
    assert_eq!(status, 403, "agents do not answer questions");
    let (status, answer) = server
        .post(
            &format!("/api/v1/rooms/design/questions/{second}/answer"),
            &server.approver,
            json!({"text": "No, Monday."}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let got = ok(&waiter.await.unwrap());
    assert_eq!(got["answered"], true);
    assert_eq!(got["answer"], "No, Monday.");
    assert_eq!(got["answered_by"], "alice");
    let (status, _) = server
        .post(
            &format!("/api/v1/rooms/design/questions/{second}/answer"),
            &server.approver,
            json!({"text": "again"}),
        )
        .await;
    assert_eq!(status, 400, "answered once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocker_waits_until_a_person_resolves_it() {
    let server = start().await;
    let agent = server.mcp(&server.agent).await;
    let refused = err(&agent
        .call(
            "post_message",
            json!({"room": "infra", "text": "stuck", "type": "blocker"}),
        )
        .await);
    assert!(refused.contains("report_blocker"), "{refused}");
    let blocker = ok(&agent.call("report_blocker", json!({"room": "infra", "description": "The VPN certificate expired; I need a new one."})).await);
    let id = blocker["blocker_id"].as_str().unwrap().to_string();
    assert!(
        blocker["message"]
            .as_str()
            .unwrap()
            .contains("wait_for_resolution")
    );
    // Still blocked after a short wait.
    let pending = ok(&agent
        .call(
            "wait_for_resolution",
            json!({"room": "infra", "blocker_id": id, "timeout_seconds": 1}),
        )
        .await);
    assert_eq!(pending["resolved"], false);
    let (_, members) = server
        .get("/api/v1/rooms/infra/members", &server.approver)
        .await;
    assert_eq!(members["members"][0]["status"], "blocked");
    let waiter = {
        let client = server.mcp(&server.agent).await;
        let id = id.clone();
        tokio::spawn(async move {
            client
                .call(
                    "wait_for_resolution",
                    json!({"room": "infra", "blocker_id": id, "timeout_seconds": 60}),
                )
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // An agent cannot resolve it; a person can, once.
    let (status, _) = server
        .post(
            &format!("/api/v1/rooms/infra/blockers/{id}/resolve"),
            &server.agent2,
            json!({"reply": "done"}),
        )
        .await;
    assert_eq!(status, 403);
    let (status, _) = server
        .post(
            &format!("/api/v1/rooms/infra/blockers/{id}/resolve"),
            &server.approver,
            json!({"reply": "New certificate is in the vault under vpn/2026."}),
        )
        .await;
    assert_eq!(status, 200);
    let got = ok(&waiter.await.unwrap());
    assert_eq!(got["resolved"], true);
    assert!(got["reply"].as_str().unwrap().contains("vault"));
    let (status, _) = server
        .post(
            &format!("/api/v1/rooms/infra/blockers/{id}/resolve"),
            &server.approver,
            json!({"reply": "again"}),
        )
        .await;
    assert_eq!(status, 400);
    let kinds = server.event_kinds().await;
    assert!(kinds.contains(&"blocker_resolved".to_string()));
    // Unblocked, the agent shows as working again.
    let (_, members) = server
        .get("/api/v1/rooms/infra/members", &server.approver)
        .await;
    assert_eq!(members["members"][0]["status"], "working");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_people_answering_at_once_close_a_gate_exactly_once() {
    let server = start().await;
    let agent = server.mcp(&server.agent).await;
    for round in 0..10 {
        let blocker = ok(&agent
            .call(
                "report_blocker",
                json!({"room": "race", "description": format!("blocked {round}")}),
            )
            .await);
        let id = blocker["blocker_id"].as_str().unwrap().to_string();
        let asked = ok(&agent
            .call(
                "post_message",
                json!({"room": "race", "text": format!("question {round}?"), "type": "question"}),
            )
            .await);
        let qid = asked["id"].as_str().unwrap().to_string();
        let resolve = format!("/api/v1/rooms/race/blockers/{id}/resolve");
        let answer = format!("/api/v1/rooms/race/questions/{qid}/answer");
        let (a, b, c, d) = tokio::join!(
            server.post(
                &resolve,
                &server.approver,
                json!({"reply": "fixed by alice"})
            ),
            server.post(
                &resolve,
                &server.approver2,
                json!({"reply": "fixed by bob"})
            ),
            server.post(
                &answer,
                &server.approver,
                json!({"text": "answer from alice"})
            ),
            server.post(
                &answer,
                &server.approver2,
                json!({"text": "answer from bob"})
            ),
        );
        let statuses = [a.0, b.0, c.0, d.0];
        assert_eq!(
            statuses.iter().filter(|s| **s == 200).count(),
            2,
            "one resolution and one answer win: {statuses:?}"
        );
        assert!(
            statuses.iter().all(|s| *s == 200 || *s == 400),
            "{statuses:?}"
        );
    }
    let (_, read) = server
        .get("/api/v1/rooms/race/messages?limit=1000", &server.approver)
        .await;
    let messages = read["messages"].as_array().unwrap();
    let replies = messages
        .iter()
        .filter(|m| m["type"] == "answer" || m["type"] == "resolution")
        .count();
    assert_eq!(replies, 20, "exactly one reply per gate");
    assert!(
        messages
            .iter()
            .filter(|m| m["type"] == "blocker" || m["type"] == "question")
            .all(|m| m["open"] == false)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_named_and_nothing_is_stored() {
    let server = start().await;
    let agent = server.mcp(&server.agent).await;
    let before = server.event_kinds().await.len();
    let unknown = err(&agent
        .call("read_messages", json!({"room": "nowhere"}))
        .await);
    assert!(unknown.starts_with("not_found"), "{unknown}");
    let big = err(&agent
        .call(
            "post_message",
            json!({"room": "ops", "text": "x".repeat(9000)}),
        )
        .await);
    assert!(big.contains("8192"), "{big}");
    let name = err(&agent
        .call("post_message", json!({"room": "has spaces", "text": "hi"}))
        .await);
    assert!(name.contains("room name"), "{name}");
    let kind = err(&agent
        .call(
            "post_message",
            json!({"room": "ops", "text": "hi", "type": "shout"}),
        )
        .await);
    assert!(kind.contains("shout"), "{kind}");
    let (status, _) = server
        .post(
            "/api/v1/rooms/ops/blockers/m1/resolve",
            &server.approver,
            json!({"reply": "x"}),
        )
        .await;
    assert_eq!(status, 404);
    assert_eq!(
        server.event_kinds().await.len(),
        before,
        "nothing was stored"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_show_in_their_room_and_admins_manage_rooms() {
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings {
        backup_dir: Some(dir.path().join("backups")),
        ..Settings::default()
    };
    // kick is a room admin tool over MCP: it comes with the operator tools.
    let config = HttpConfig {
        operator_tools: true,
        ..HttpConfig::default()
    };
    let server = start_full(config, settings).await;
    let agent = server.mcp(&server.agent).await;
    ok(&agent
        .call(
            "request_approval",
            json!({"action_description": "Scale the database", "room": "infra"}),
        )
        .await);
    ok(&agent
        .call(
            "wait_for_feedback",
            json!({"room": "infra", "question": "Now or tonight?", "timeout_seconds": 1}),
        )
        .await);
    ok(&agent
        .call(
            "report_blocker",
            json!({"room": "infra", "description": "Need quota"}),
        )
        .await);
    let (_, rooms) = server.get("/api/v1/rooms", &server.approver).await;
    let infra = rooms["rooms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "infra")
        .unwrap();
    assert_eq!(
        infra["attention"],
        json!({"approvals": 1, "questions": 1, "blockers": 1})
    );

    // Room admin through MCP (kick) and REST (rename, trash, restore, purge).
    let admin = server.mcp(&server.approver).await;
    assert!(admin.tool_names().await.contains(&"kick".to_string()));
    let kicked = ok(&admin
        .call(
            "kick",
            json!({"room": "infra", "member": "token:deploy-bot"}),
        )
        .await);
    assert!(kicked["members"].as_array().unwrap().is_empty());
    let (status, renamed) = server
        .post(
            "/api/v1/rooms/infra/rename",
            &server.approver,
            json!({"title": "Infrastructure"}),
        )
        .await;
    assert_eq!(
        (status, renamed["room"]["title"].as_str()),
        (200, Some("Infrastructure"))
    );
    let (status, _) = server
        .post("/api/v1/rooms/infra/purge", &server.approver, json!({}))
        .await;
    assert_eq!(status, 400, "only a trashed room is purged");
    let (status, _) = server
        .post("/api/v1/rooms/infra/delete", &server.agent, json!({}))
        .await;
    assert_eq!(status, 403, "agents do not administer rooms");
    let (status, _) = server
        .post("/api/v1/rooms/infra/delete", &server.approver, json!({}))
        .await;
    assert_eq!(status, 200);
    let refused = err(&agent
        .call("post_message", json!({"room": "infra", "text": "hello?"}))
        .await);
    assert!(refused.contains("trash"), "{refused}");
    let (status, _) = server
        .post("/api/v1/rooms/infra/restore", &server.approver, json!({}))
        .await;
    assert_eq!(status, 200);
    ok(&agent
        .call("post_message", json!({"room": "infra", "text": "back"}))
        .await);
    server
        .post("/api/v1/rooms/infra/delete", &server.approver, json!({}))
        .await;
    let (status, purged) = server
        .post("/api/v1/rooms/infra/purge", &server.approver, json!({}))
        .await;
    assert_eq!(status, 200, "{purged}");
    let backup = std::fs::read_to_string(purged["backup"].as_str().unwrap()).unwrap();
    assert!(
        backup.contains("Need quota") && backup.contains("back"),
        "the backup holds the texts"
    );
    let (_, after) = server
        .get("/api/v1/rooms/infra/messages", &server.approver)
        .await;
    assert!(
        after["messages"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["text"].is_null()),
        "texts erased"
    );
    let kinds = server.event_kinds().await;
    for k in [
        "room_created",
        "room_renamed",
        "room_deleted",
        "room_restored",
        "room_purged",
        "member_kicked",
        "message_posted",
    ] {
        assert!(kinds.contains(&k.to_string()), "{k} not logged");
    }
    // The log still verifies after the purge.
    let checkpoint = server.gate.log().integrate().await.unwrap().unwrap();
    let entries: Vec<Vec<u8>> = server
        .gate
        .store()
        .events_after(0, 100_000)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.bytes)
        .collect();
    let report = countersign_core::logcheck::verify_log(
        entries.iter().map(Vec::as_slice),
        &[checkpoint.note],
        &server.gate.jwks().await.unwrap(),
        "countersign/test",
    );
    assert!(report.valid(), "{:?}", report.problems);
}
