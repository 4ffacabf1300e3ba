//! The server loop (`countersign_server::serve`): HTTP/1.1 and HTTP/2 with prior
//! knowledge on one port, however the first bytes of a connection arrive.

use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::support::start;

#[tokio::test]
async fn http2_with_prior_knowledge_is_served() {
    let server = start().await;
    let client = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let health = client.get(server.url("/healthz")).send().await.unwrap();
    assert_eq!(health.version(), reqwest::Version::HTTP_2);
    assert_eq!(health.status(), 200);

    // The API over the same HTTP/2 connection: create, decide, see the decision.
    let created = client
        .post(server.url("/api/v1/requests"))
        .bearer_auth(&server.agent)
        .json(&json!({"action_description": "Pay invoice INV-9", "action_details": {"amount": "9.00"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.version(), reqwest::Version::HTTP_2);
    assert_eq!(created.status(), 201);
    let id = created.json::<serde_json::Value>().await.unwrap()["request_id"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, _) = server.decide(&server.approver, &id, "approve").await;
    assert_eq!(status, 200);
    let waited = client
        .get(server.url(&format!("/api/v1/requests/{id}/wait?timeout_seconds=5")))
        .bearer_auth(&server.agent)
        .send()
        .await
        .unwrap();
    assert_eq!(waited.status(), 200);
    let view: serde_json::Value = waited.json().await.unwrap();
    assert_eq!(view["status"], "approved", "{view}");
}

#[tokio::test]
async fn first_bytes_arriving_one_at_a_time_are_still_understood() {
    let server = start().await;
    let addr = server.base.trim_start_matches("http://").to_string();

    // A client that connects and leaves without a word changes nothing for the others.
    drop(TcpStream::connect(&addr).await.unwrap());

    // HTTP/1.1 with its method split after the first byte.
    let mut http1 = TcpStream::connect(&addr).await.unwrap();
    http1.write_all(b"G").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    http1
        .write_all(b"ET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), http1.read_to_end(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    // HTTP/2's connection preface split after its first byte: the server answers with its
    // SETTINGS frame (type 0x4 on stream 0), so it took the connection for HTTP/2.
    let mut http2 = TcpStream::connect(&addr).await.unwrap();
    http2.write_all(b"P").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    http2
        .write_all(b"RI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    // The client's own (empty) SETTINGS frame.
    http2.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
    let mut frame = [0u8; 9];
    tokio::time::timeout(Duration::from_secs(10), http2.read_exact(&mut frame))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(frame[3], 0x4, "the first frame is not SETTINGS: {frame:?}");
    assert_eq!(&frame[5..9], &[0, 0, 0, 0], "SETTINGS not on stream 0");

    // A request that starts with three bytes of HTTP/1 in one piece goes straight to
    // HTTP/1.1.
    let health = reqwest::get(server.url("/healthz")).await.unwrap();
    assert_eq!(health.version(), reqwest::Version::HTTP_11);
    assert_eq!(health.status(), 200);
}
