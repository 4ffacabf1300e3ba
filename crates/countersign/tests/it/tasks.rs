//! MCP tasks (SEP-2663; docs/api.md, "Tasks"): a client that declares the tasks
//! extension gets a task from `request_approval` at once and polls `tasks/get` until a
//! person decides; `tasks/cancel` withdraws the request. With rmcp's client over stdio
//! (`countersign mcp`) and over Streamable HTTP on `serve`, where two different `serve`
//! processes on one data directory answer the create and the polls (no task lives in a
//! process's memory).

use std::process::Stdio;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, ClientCapabilities, ClientConfig,
    GetTaskParams, Implementation, RequestMetaObject, TaskPayload, TaskStatus,
};
use rmcp::service::{Peer, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Value, json};

use crate::common::{self, Server, create_token};

/// A client that declares the tasks extension.
#[derive(Clone)]
struct TasksClient;

impl ClientHandler for TasksClient {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::builder().enable_tasks().build(),
            Implementation::new("countersign-tasks-test", "0"),
        )
    }
}

type Client = RunningService<RoleClient, TasksClient>;

/// The tasks extension, declared in a request's own `_meta` as a stateless (2026-07-28)
/// client does: a stateless `serve` keeps no session to remember `initialize` by.
fn declared() -> RequestMetaObject {
    let mut meta = RequestMetaObject::default();
    meta.set_client_capabilities(ClientCapabilities::builder().enable_tasks().build());
    meta
}

fn get(id: &str) -> GetTaskParams {
    let mut params = GetTaskParams::new(id.to_string());
    params.meta = Some(declared());
    params
}

async fn connect_http(url: &str, token: &str) -> Client {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url.to_string()).auth_header(token),
    );
    tokio::time::timeout(Duration::from_secs(20), TasksClient.serve(transport))
        .await
        .expect("MCP initialize timed out")
        .expect("MCP initialize failed")
}

/// `request_approval` as a task: the task's id (the request's).
async fn ask(peer: &Peer<RoleClient>, description: &str) -> String {
    let Value::Object(args) =
        json!({"action_description": description, "action_details": {"n": "1"}})
    else {
        unreachable!()
    };
    let mut params = CallToolRequestParams::new("request_approval").with_arguments(args);
    params.meta = Some(declared());
    let response = peer.call_tool_once(params).await.expect("request_approval");
    let CallToolResponse::Task(created) = response else {
        panic!("not a task: {response:?}")
    };
    assert_eq!(created.task.status, TaskStatus::Working);
    assert!(created.task.poll_interval_ms.is_some());
    created.task.task_id
}

/// Polls `tasks/get` until the task leaves `working`.
async fn settled(peer: &Peer<RoleClient>, id: &str) -> TaskPayload {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = peer.get_task(get(id)).await.expect("tasks/get");
        assert_eq!(got.task.task.task_id, id);
        if got.task.status() != TaskStatus::Working {
            return got.task.payload;
        }
        assert!(Instant::now() < deadline, "task {id} still working");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Approve, cancel and reject through one client; `server` is where a person decides.
async fn flows(peer: &Peer<RoleClient>, server: &Server, approver: &str, label: &str) {
    // Approved while the client polls: the result is check_approval's, with the proof.
    let id = ask(peer, &format!("{label}: rotate the signing key")).await;
    let first = peer.get_task(get(&id)).await.expect("tasks/get");
    assert_eq!(first.task.status(), TaskStatus::Working, "{label}");
    let (status, body) = server.decide(&id, approver, "approved").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let TaskPayload::Completed { result } = settled(peer, &id).await else {
        panic!("{label}: not completed")
    };
    let view = &result["structuredContent"];
    assert_eq!(view["request_id"], id.as_str(), "{result:?}");
    assert_eq!(view["status"], "approved");
    assert!(
        view["proof"].is_object(),
        "{label}: the proof comes with it"
    );

    // Cancelled by the client: the request is withdrawn for everyone.
    let id = ask(peer, &format!("{label}: wipe the cache")).await;
    let mut cancel = CancelTaskParams::new(id.clone());
    cancel.meta = Some(declared());
    peer.cancel_task(cancel).await.expect("tasks/cancel");
    assert!(
        matches!(settled(peer, &id).await, TaskPayload::Cancelled),
        "{label}"
    );
    let (_, view) = server
        .get(&format!("/api/v1/requests/{id}"), Some(approver))
        .await;
    assert_eq!(view["status"], "cancelled", "{label}: {view}");
    let (status, _) = server.decide(&id, approver, "approved").await;
    assert_ne!(
        status,
        StatusCode::OK,
        "{label}: a withdrawn request cannot be approved"
    );

    // Rejected: an answer, so the task completes with it.
    let id = ask(peer, &format!("{label}: drop the table")).await;
    let (status, body) = server.decide(&id, approver, "rejected").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let TaskPayload::Completed { result } = settled(peer, &id).await else {
        panic!("{label}: not completed")
    };
    assert_eq!(result["structuredContent"]["status"], "rejected");

    // Someone else's task does not exist for this client.
    let err = peer
        .get_task(get("req_000000000000000000000000000"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no task"), "{label}: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_approval_runs_as_a_task_over_stdio_and_across_instances_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let agent = create_token(data, "agent", "task-bot").await;
    let approver = create_token(data, "approver", "alice@example.com").await;
    let one = Server::start(data);
    let two = Server::start(data);

    // Streamable HTTP: the task is made on one serve and polled on the other.
    let maker = connect_http(&one.url("/mcp"), &agent).await;
    let poller = connect_http(&two.url("/mcp"), &agent).await;
    let id = ask(maker.peer(), "http: pay invoice 7").await;
    let (status, body) = one.decide(&id, &approver, "approved").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let TaskPayload::Completed { result } = settled(poller.peer(), &id).await else {
        panic!("not completed on the other instance")
    };
    assert_eq!(result["structuredContent"]["status"], "approved");
    flows(poller.peer(), &two, &approver, "http").await;

    // stdio: `countersign mcp` on the same data directory.
    let (transport, _stderr) = TokioChildProcess::builder(common::command(
        data,
        &["mcp", "--agent-name", "task-stdio"],
    ))
    .stderr(Stdio::inherit())
    .spawn()
    .expect("spawn countersign mcp");
    let stdio = tokio::time::timeout(Duration::from_secs(20), TasksClient.serve(transport))
        .await
        .expect("MCP handshake timed out")
        .expect("MCP handshake failed");
    flows(stdio.peer(), &one, &approver, "stdio").await;

    // A client that does not declare tasks gets the plain answer, as before.
    let plain = crate::approval_gate::over_http(&one.url("/mcp"), &agent).await;
    let asked = common::call(
        plain.peer(),
        "request_approval",
        json!({"action_description": "no tasks here"}),
    )
    .await
    .unwrap();
    assert_eq!(asked["status"], "pending");
}
