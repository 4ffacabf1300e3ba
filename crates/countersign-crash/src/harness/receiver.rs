//! The webhook receiver the server notifies: it checks each post's signature, records
//! what arrived under which webhook-id and when, and refuses some posts once so that
//! retries are exercised.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use countersign_core::{Clock, SystemClock};
use serde_json::Value;

use super::{SECRET, lock};

/// Everything that arrived, as the checks read it.
#[derive(Default)]
pub(crate) struct Received {
    /// webhook-id → the first body received, and how many times it came.
    by_id: HashMap<String, (Bytes, u64)>,
    /// log index → every webhook-id that carried it.
    pub(crate) by_index: BTreeMap<u64, BTreeSet<String>>,
    /// webhook-id → (type, request id) as its body says.
    pub(crate) meta: HashMap<String, (String, Option<String>)>,
    refused_once: HashSet<String>,
    /// log index → when its webhook first arrived (Unix milliseconds).
    pub(crate) first_at: HashMap<u64, i64>,
    pub(crate) posts: u64,
    pub(crate) redeliveries: u64,
    pub(crate) refused: u64,
    pub(crate) problems: Vec<String>,
}

pub(crate) type Receiver = Arc<Mutex<Received>>;

/// One post: its signature checked, then recorded, or refused once on purpose.
async fn receive(State(received): State<Receiver>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let (id, timestamp, signature) = (
        header("webhook-id"),
        header("webhook-timestamp"),
        header("webhook-signature"),
    );
    let mut r = lock(&received);
    r.posts += 1;
    let expected = timestamp
        .parse::<i64>()
        .ok()
        .and_then(|ts| countersign_server::notify::webhook::signature(SECRET, &id, ts, &body).ok());
    if expected.as_deref() != Some(signature.as_str()) {
        r.problems
            .push(format!("webhook {id:?} has a bad signature {signature:?}"));
        return StatusCode::BAD_REQUEST;
    }
    if let Some((first, count)) = r.by_id.get_mut(&id) {
        *count += 1;
        let same = *first == body;
        r.redeliveries += 1;
        if !same {
            r.problems.push(format!(
                "webhook {id} was redelivered with a different body"
            ));
        }
        return StatusCode::NO_CONTENT;
    }
    // Refuse one in 40 new messages once, so retries (same id, same bytes) are exercised.
    let refuse = id
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
        % 40
        == 0;
    if refuse && r.refused_once.insert(id.clone()) {
        r.refused += 1;
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let Some(index) = parsed["data"]["log_index"].as_u64() else {
        r.problems
            .push(format!("webhook {id} has no data.log_index: {parsed}"));
        return StatusCode::BAD_REQUEST;
    };
    let kind = parsed["type"].as_str().unwrap_or_default().to_string();
    let subject = parsed["data"]["request_id"].as_str().map(str::to_string);
    r.by_index.entry(index).or_default().insert(id.clone());
    r.first_at
        .entry(index)
        .or_insert_with(|| SystemClock.now().millis());
    r.meta.insert(id.clone(), (kind, subject));
    r.by_id.insert(id, (body, 1));
    StatusCode::NO_CONTENT
}

/// Serves the receiver on a free loopback port; returns its URL.
pub(crate) async fn start_receiver() -> anyhow::Result<(String, Receiver)> {
    let received: Receiver = Arc::default();
    let app = axum::Router::new()
        .route("/hook", axum::routing::post(receive))
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((format!("http://{addr}/hook"), received))
}
