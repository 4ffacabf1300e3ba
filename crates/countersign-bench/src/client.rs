//! How the benchmarks talk to a server as agents and approvers do: the REST calls of
//! an approval's life, and an MCP client over Streamable HTTP.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{Peer, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

use crate::instances::Setup;

/// The REST calls a cycle makes.
#[derive(Clone)]
pub(crate) struct Api {
    http: reqwest::Client,
    agent: Arc<str>,
    approver: Arc<str>,
}

impl Api {
    pub(crate) fn new(setup: &Setup) -> anyhow::Result<Api> {
        Ok(Api {
            http: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(60))
                .build()?,
            agent: setup.agent.as_str().into(),
            approver: setup.approver.as_str().into(),
        })
    }

    /// The same calls on a client of their own, made for `count` connections held at
    /// once for up to 15 minutes (many waiters).
    pub(crate) fn for_many(&self, count: usize) -> anyhow::Result<Api> {
        Ok(Api {
            http: reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(900))
                .pool_max_idle_per_host(count + 64)
                .build()?,
            ..self.clone()
        })
    }

    /// Sends `request`; the response if it succeeded, else an error naming `what`.
    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        what: &str,
    ) -> anyhow::Result<reqwest::Response> {
        let resp = request.send().await?;
        if !resp.status().is_success() {
            bail!("{what} failed: {}", resp.text().await?);
        }
        Ok(resp)
    }

    /// Posts `body` to `url` with `token`; the response if it succeeded.
    async fn post(
        &self,
        url: String,
        token: &str,
        body: &Value,
        what: &str,
    ) -> anyhow::Result<reqwest::Response> {
        let request = self.http.post(url).bearer_auth(token).json(body);
        self.send(request, what).await
    }

    pub(crate) async fn create(&self, base: &str) -> anyhow::Result<String> {
        let body = json!({"action_description": "bench", "action_details": {"n": "1"}});
        let body = self.create_with(base, &body).await?;
        body["request_id"]
            .as_str()
            .map(str::to_string)
            .context("no request_id")
    }

    /// Creates a request from `body`; the server's answer.
    pub(crate) async fn create_with(&self, base: &str, body: &Value) -> anyhow::Result<Value> {
        let url = format!("{base}/api/v1/requests");
        Ok(self
            .post(url, &self.agent, body, "create")
            .await?
            .json()
            .await?)
    }

    pub(crate) async fn approve(&self, base: &str, id: &str) -> anyhow::Result<()> {
        let url = format!("{base}/api/v1/requests/{id}/decision");
        let body = json!({"decision": "approved"});
        self.post(url, &self.approver, &body, "decision").await?;
        Ok(())
    }

    /// A long poll of up to `timeout_seconds`; returns the request's status.
    pub(crate) async fn wait_up_to(
        &self,
        base: &str,
        id: &str,
        timeout_seconds: u64,
    ) -> anyhow::Result<String> {
        let request = self
            .http
            .get(format!(
                "{base}/api/v1/requests/{id}/wait?timeout_seconds={timeout_seconds}"
            ))
            .bearer_auth(&*self.agent);
        let body: Value = self.send(request, "wait").await?.json().await?;
        Ok(body["status"].as_str().unwrap_or("").to_string())
    }

    /// A long poll of up to 30 s; returns the request's status.
    pub(crate) async fn wait(&self, base: &str, id: &str) -> anyhow::Result<String> {
        self.wait_up_to(base, id, 30).await
    }

    pub(crate) async fn record_action(&self, base: &str, id: &str) -> anyhow::Result<()> {
        let url = format!("{base}/api/v1/requests/{id}/actions");
        let body = json!({"tool": "bench"});
        self.post(url, &self.agent, &body, "record_action").await?;
        Ok(())
    }
}

/// A tool call's arguments, from a JSON object.
pub(crate) fn args(value: Value) -> serde_json::Map<String, Value> {
    value.as_object().cloned().unwrap_or_default()
}

/// A tool result's structured content (null when it has none).
pub(crate) fn structured(result: &CallToolResult) -> &Value {
    result.structured_content.as_ref().unwrap_or(&Value::Null)
}

/// Asks for approval over MCP (`request_approval`); returns the new request's id.
pub(crate) async fn request_approval(
    peer: &Peer<RoleClient>,
    description: &str,
) -> anyhow::Result<String> {
    let created = peer
        .call_tool(
            CallToolRequestParams::new("request_approval").with_arguments(args(
                json!({"action_description": description, "action_details": {"n": "1"}}),
            )),
        )
        .await?;
    Ok(structured(&created)["request_id"]
        .as_str()
        .context("no request_id")?
        .to_string())
}

/// An MCP client over Streamable HTTP (rmcp's default client: a new connection per call).
pub(crate) async fn mcp_http(
    url: &str,
    token: &str,
) -> anyhow::Result<RunningService<RoleClient, ()>> {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url.to_string()).auth_header(token),
    );
    Ok(().serve(transport).await?)
}
