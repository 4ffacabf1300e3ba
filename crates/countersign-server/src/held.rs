//! A call held on its way to where it runs (an upstream MCP tool, a command, a coding
//! agent's tool): ask, wait for the decision, claim the approval for the one forward,
//! forward, record what came of it. The same flow serves the MCP gateway, the hooks and
//! the guarded exec, against a local gate ([`LocalGate`]) or a remote `serve` (the
//! binary's remote client), both behind [`Approvals`].
//!
//! At most once, and only after approval: the claim is `record_action`, durable and
//! single-use (a compare-and-swap on the request, so two gateways cannot both claim it),
//! and it is made before anything is sent. A forward whose answer never came (the
//! process stopped, the upstream's connection broke) is recorded as `unknown` and is
//! never sent again.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use countersign_core::Principal;
use countersign_core::evidence::OutcomeStatus;
use serde::{Deserialize, Serialize};

use crate::error::GateError;
use crate::gate::{Gate, Gated, GatewayCall};
use crate::views::ApprovalView;

/// How long one wait for a decision lasts before the flow reports progress and waits
/// again.
const WAIT_SLICE: Duration = Duration::from_secs(15);

/// What the gate said of a call, as a backend reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Ruling {
    /// Forward it; nothing was stored.
    Pass,
    /// The request that holds it. `claimed`: approved as it was asked and already
    /// claimed for this call's forward (the call's `claim_for`), in the same write.
    Held {
        request: Box<ApprovalView>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        claimed: bool,
    },
}

/// The longest a call may be held (a week).
pub const MAX_HOLD_SECONDS: u64 = 7 * 24 * 3600;

/// A held call on the wire (`POST /api/v1/gateway/calls`, docs/api.md): what a remote
/// gateway sends for [`Approvals::call`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallBody {
    pub upstream: String,
    pub tool: String,
    #[serde(default)]
    pub arguments: serde_json::Map<String, serde_json::Value>,
    /// The upstream is trusted and the tool says it only reads.
    #[serde(default)]
    pub read_only: bool,
    /// Retries within one session join one request.
    pub session: String,
    pub hold_seconds: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The instance that forwards the call, for an approval given at once to be
    /// claimed for it in the same write ([`Ruling::Held`]'s `claimed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_for: Option<String>,
}

impl CallBody {
    pub fn new(call: &GatewayCall) -> Self {
        Self {
            upstream: call.upstream.clone(),
            tool: call.tool.clone(),
            arguments: call.arguments.clone(),
            read_only: call.read_only,
            session: call.session.clone(),
            hold_seconds: call.hold.as_secs(),
            description: call.description.clone(),
            claim_for: call.claim_for.clone(),
        }
    }

    /// The call, once its fields are checked.
    pub fn into_call(self) -> Result<GatewayCall, GateError> {
        countersign_core::token::validate_token_name(&self.upstream)
            .map_err(|e| GateError::BadInput(format!("upstream: {e}")))?;
        for (field, value) in [("tool", &self.tool), ("session", &self.session)] {
            if value.is_empty() || value.len() > 200 || value.chars().any(char::is_control) {
                return Err(GateError::BadInput(format!(
                    "{field}: give 1 to 200 characters, no control characters"
                )));
            }
        }
        if let Some(instance) = &self.claim_for
            && (instance.is_empty() || instance.len() > 200)
        {
            return Err(GateError::BadInput(
                "claim_for: give 1 to 200 characters".into(),
            ));
        }
        if self.hold_seconds == 0 || self.hold_seconds > MAX_HOLD_SECONDS {
            return Err(GateError::BadInput(format!(
                "hold_seconds: give between 1 and {MAX_HOLD_SECONDS}"
            )));
        }
        Ok(GatewayCall {
            upstream: self.upstream,
            tool: self.tool,
            arguments: self.arguments,
            read_only: self.read_only,
            session: self.session,
            hold: Duration::from_secs(self.hold_seconds),
            description: self.description,
            claim_for: self.claim_for,
        })
    }
}

/// `POST /api/v1/gateway/calls/{id}/claim`: [`Approvals::claim`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimBody {
    pub instance: String,
}

/// `POST /api/v1/gateway/calls/{id}/outcome`: [`Approvals::outcome`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForwardedBody {
    pub status: OutcomeStatus,
    pub summary: String,
}

/// `POST /api/v1/gateway/sweep`: [`Approvals::sweep`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepBody {
    pub upstream: String,
    pub older_than_seconds: u64,
}

/// What a sweep answers: how many forwards it recorded as unknown.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Swept {
    pub swept: usize,
}

/// The gate, local or remote, as the held-call flow uses it.
#[async_trait]
pub trait Approvals: Send + Sync {
    /// Classifies the call: pass, or the request that holds it (new or joined).
    async fn call(&self, call: &GatewayCall) -> Result<Ruling, GateError>;
    /// Waits up to `timeout` for the request to be decided; its state then.
    async fn wait(&self, id: &str, timeout: Duration) -> Result<ApprovalView, GateError>;
    /// Withdraws the request (the caller gave up).
    async fn cancel(&self, id: &str) -> Result<(), GateError>;
    /// Claims the approval for the one forward (`instance` names this process).
    async fn claim(&self, id: &str, instance: &str) -> Result<(), GateError>;
    /// Records `unknown` for this caller's forwards to `upstream` claimed more than
    /// `older_than` ago that have no outcome (their gateway stopped); how many.
    async fn sweep(&self, upstream: &str, older_than: Duration) -> Result<usize, GateError>;
    /// Records what the forward gave.
    async fn outcome(
        &self,
        id: &str,
        status: OutcomeStatus,
        summary: String,
    ) -> Result<(), GateError>;
}

/// The gate of a local data directory, acting as `who`.
pub struct LocalGate {
    pub gate: Arc<Gate>,
    pub who: Principal,
}

#[async_trait]
impl Approvals for LocalGate {
    async fn call(&self, call: &GatewayCall) -> Result<Ruling, GateError> {
        Ok(match self.gate.gateway_call(&self.who, call).await? {
            Gated::Pass => Ruling::Pass,
            Gated::Held { request, claimed } => Ruling::Held {
                request: Box::new(ApprovalView::new(&request)),
                claimed,
            },
        })
    }

    async fn wait(&self, id: &str, timeout: Duration) -> Result<ApprovalView, GateError> {
        let request = self.gate.wait(&self.who, id, timeout, &mut |_| {}).await?;
        Ok(ApprovalView::new(&request))
    }

    async fn cancel(&self, id: &str) -> Result<(), GateError> {
        self.gate.cancel(&self.who, id).await.map(|_| ())
    }

    async fn claim(&self, id: &str, instance: &str) -> Result<(), GateError> {
        let request = self.gate.get(&self.who, id).await?;
        self.gate
            .claim_forward(&self.who, &request, instance)
            .await
            .map(|_| ())
    }

    async fn sweep(&self, upstream: &str, older_than: Duration) -> Result<usize, GateError> {
        self.gate
            .sweep_unknown(&self.who, upstream, older_than)
            .await
    }

    async fn outcome(
        &self,
        id: &str,
        status: OutcomeStatus,
        summary: String,
    ) -> Result<(), GateError> {
        self.gate
            .forwarded(&self.who, id, status, summary)
            .await
            .map(|_| ())
    }
}

/// Where a held call stands once the flow is done with asking.
#[derive(Debug, Clone)]
pub enum Verdict {
    /// Forward it now: it passed (no request), or it is approved and claimed (`request`).
    Forward { request: Option<String> },
    /// Do not forward; the reason, for the agent.
    Refused { reason: String },
}

/// Asks for `call`, waits for the decision (calling `progress` with the seconds waited
/// and a word on what it waits for), and claims an approval for the forward.
/// `cancelled` resolving withdraws the request. A call not decided within its hold is
/// refused and its request withdrawn (cancelled), and the agent is told so.
pub async fn ask(
    gate: &dyn Approvals,
    call: &GatewayCall,
    instance: &str,
    progress: &mut (dyn FnMut(f64, &str) + Send),
    cancelled: impl std::future::Future<Output = ()> + Send,
) -> Result<Verdict, GateError> {
    let call = GatewayCall {
        claim_for: Some(instance.to_string()),
        ..call.clone()
    };
    let mut request = match gate.call(&call).await? {
        Ruling::Pass => return Ok(Verdict::Forward { request: None }),
        // Approved by a policy as it was asked, and claimed for this forward with it.
        Ruling::Held {
            request,
            claimed: true,
        } => {
            return Ok(Verdict::Forward {
                request: Some(request.request_id),
            });
        }
        Ruling::Held { request, .. } => *request,
    };
    let start = tokio::time::Instant::now();
    let deadline = start + call.hold;
    tokio::pin!(cancelled);
    while request.status == "pending" {
        let now = tokio::time::Instant::now();
        if now >= deadline {
            break;
        }
        progress(
            start.elapsed().as_secs_f64(),
            &format!(
                "held for approval: request {} ({})",
                request.request_id, request.message
            ),
        );
        let slice = WAIT_SLICE.min(deadline - now);
        tokio::select! {
            waited = gate.wait(&request.request_id, slice) => request = waited?,
            () = &mut cancelled => {
                let _ = gate.cancel(&request.request_id).await;
                return Ok(Verdict::Refused {
                    reason: format!("the call was cancelled; request {} is withdrawn", request.request_id),
                });
            }
        }
    }
    settle(gate, &request, instance).await
}

/// What the decided (or still pending) `request` means for the call.
async fn settle(
    gate: &dyn Approvals,
    request: &ApprovalView,
    instance: &str,
) -> Result<Verdict, GateError> {
    let id = &request.request_id;
    let refused = |reason: String| Ok(Verdict::Refused { reason });
    match request.status.as_str() {
        "approved" => {
            if let Some(outcome) = &request.outcome {
                return refused(format!(
                    "request {id} was already forwarded once (outcome: {}); it is not sent again",
                    outcome.status
                ));
            }
            if request.used.is_some() {
                return refused(format!(
                    "request {id} was already forwarded and its outcome is not known; it is not sent again"
                ));
            }
            match gate.claim(id, instance).await {
                Ok(()) => Ok(Verdict::Forward {
                    request: Some(id.clone()),
                }),
                Err(err) => refused(format!(
                    "request {id} is approved but could not be used: {}",
                    err.public_message()
                )),
            }
        }
        "rejected" => {
            let decision = request.decision.as_ref();
            let by = decision
                .map(|d| {
                    d.approvers
                        .iter()
                        .map(|a| a.id.clone())
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .filter(|s| !s.is_empty())
                .or_else(|| {
                    decision
                        .and_then(|d| d.policy.as_ref())
                        .map(|p| format!("policy {}", p.id))
                })
                .unwrap_or_else(|| "the gate".into());
            let reason = decision
                .and_then(|d| d.comment.clone())
                .map(|c| format!(": {c}"))
                .unwrap_or_default();
            refused(format!("rejected by {by}{reason} (request {id})"))
        }
        "pending" => {
            // The hold ended: withdraw the request, so that no later approval of it
            // stands for a call nobody waits for.
            let _ = gate.cancel(id).await;
            refused(format!(
                "not approved in time; request {id} is withdrawn and the call was not made"
            ))
        }
        "timed_out" => refused(format!(
            "not approved in time; request {id} timed out and the call was not made"
        )),
        "cancelled" => refused(format!("request {id} was cancelled; the call was not made")),
        other => refused(format!("request {id} is {other}; the call was not made")),
    }
}
