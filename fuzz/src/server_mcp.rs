//! MCP over Streamable HTTP, through the real router (see `server`): arbitrary
//! JSON-RPC bodies POSTed to `/mcp` with a valid bearer token, in stateless mode as the
//! server runs (every request is handled on its own; no session).
//!
//! Input: a byte choosing the credential and headers, then the body. The placeholders
//! `REQ_P`, `REQ_A`, `REQ_U` and `REQ_R` in the body become the ids of a pending, an
//! approved, a used and a rejected request, so tool calls reach past "not found".
//! (`REQ_P` is not substituted in a body that mentions `wait_for_approval`, whose wait
//! on a pending request would legitimately last its whole timeout.)
//!
//! Invariants: no panic, an answer within `server::REQUEST_TIMEOUT`, no 5xx other
//! than 503, every JSON-RPC message in the answer is JSON, and no tool reports an
//! `internal` error (a store failure an input could cause).

use axum::body::Body;
use serde_json::Value;

use crate::server::{Kind, check_status, request, server};

pub fn run(data: &[u8]) {
    let Some((&choice, body)) = data.split_first() else {
        return;
    };
    let s = server();
    let token = match choice & 3 {
        0 | 1 => Some(s.agent.as_str()),
        2 => Some(s.approver.as_str()),
        _ => Some(s.admin.as_str()),
    };
    let mut body = body.to_vec();
    if let Ok(text) = std::str::from_utf8(&body) {
        let waits = mentions(text, "wait_for_approval");
        let mut text = text
            .replace("REQ_A", &s.id(Kind::Approved))
            .replace("REQ_U", &s.id(Kind::Used))
            .replace("REQ_R", &s.id(Kind::Rejected));
        if !waits {
            text = text.replace("REQ_P", &s.id(Kind::Pending));
        }
        body = text.into_bytes();
    }
    let mut builder = request("POST", "/mcp", token);
    if choice & 4 == 0 {
        builder = builder.header(http::header::CONTENT_TYPE, "application/json");
    }
    if choice & 8 == 0 {
        builder = builder.header(http::header::ACCEPT, "application/json, text/event-stream");
    }
    if choice & 16 == 0 {
        builder = builder.header("mcp-protocol-version", "2025-06-18");
    }
    let req = builder.body(Body::from(body)).unwrap();
    let (status, content_type, response) = s.send(req);
    check_status("POST /mcp", status, &response);
    let text = String::from_utf8_lossy(&response);
    let messages: Vec<&str> = if content_type.starts_with("text/event-stream") {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect()
    } else if content_type.starts_with("application/json") {
        vec![text.as_ref()]
    } else {
        Vec::new()
    };
    for message in messages {
        let value: Value = serde_json::from_str(message)
            .unwrap_or_else(|e| panic!("POST /mcp answered a message that is not JSON ({e}): {message}"));
        check_message(&value);
    }
    if status.is_success() {
        s.refresh();
    }
}

/// Whether `text`, read as JSON, has `needle` as a string anywhere (or, when it is
/// not JSON, contains it at all).
fn mentions(text: &str, needle: &str) -> bool {
    fn walk(v: &Value, needle: &str) -> bool {
        match v {
            Value::String(s) => s.contains(needle),
            Value::Array(a) => a.iter().any(|v| walk(v, needle)),
            Value::Object(o) => o.iter().any(|(k, v)| k.contains(needle) || walk(v, needle)),
            _ => false,
        }
    }
    match serde_json::from_str::<Value>(text) {
        Ok(v) => walk(&v, needle),
        Err(_) => text.contains(needle),
    }
}

fn check_message(message: &Value) {
    let result = &message["result"];
    if result["isError"] == true {
        for content in result["content"].as_array().into_iter().flatten() {
            let text = content["text"].as_str().unwrap_or("");
            assert!(
                !text.starts_with("internal"),
                "a tool failed with an internal error: {text}"
            );
        }
    }
}
