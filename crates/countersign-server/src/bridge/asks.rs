//! The gate as a bridge asks it: in this process ([`LocalAsks`], what `serve` and a
//! local `countersign bridge` use), or, later, a remote `serve` over REST. Everything the
//! bridge does to a request goes through here, so both act alike.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use countersign_core::evidence::OutcomeStatus;
use countersign_core::{AuthMethod, CoreError, NewRequest, Principal, Role, Status};
use countersign_store::{RequestQuery, StoredEvent};
use tokio::sync::broadcast;

use crate::error::{ErrorKind, GateError};
use crate::gate::Gate;
use crate::views::ApprovalView;

/// What the gate said to a proposal.
#[derive(Debug, Clone)]
pub struct Proposed {
    pub request: ApprovalView,
    /// The request was made earlier for a proposal with the same key but other content;
    /// it stays bound to what it was asked for.
    pub differs: bool,
}

/// The gate, as a bridge uses it. Every call is as the bridge's own principal.
#[async_trait]
pub trait BridgeAsks: Send + Sync {
    /// Asks for approval of `new` (its idempotency key names the proposal): the request,
    /// new or the one asked before.
    async fn propose(&self, new: NewRequest) -> Result<Proposed, GateError>;
    /// The request's state now.
    async fn status(&self, id: &str) -> Result<ApprovalView, GateError>;
    /// Claims the approval for its one delivery to `approved.json` (`record_action`):
    /// durable and single-use, made before the file is written.
    async fn claim(&self, id: &str, details: BTreeMap<String, String>) -> Result<(), GateError>;
    /// Records what came of the delivered proposal (the process's record).
    async fn outcome(
        &self,
        id: &str,
        status: OutcomeStatus,
        summary: String,
        details: BTreeMap<String, String>,
    ) -> Result<(), GateError>;
    /// The bridge's requests a restart must pick up: pending, or approved with no
    /// outcome yet.
    async fn open_requests(&self) -> Result<Vec<ApprovalView>, GateError>;
    /// Resolves when a request `concerns` names (by id) may have changed (true), or
    /// after `timeout` (false). Changes to other requests do not wake the bridge.
    async fn changed(
        &self,
        timeout: Duration,
        concerns: &(dyn for<'a> Fn(&'a str) -> bool + Sync),
    ) -> bool;
}

/// Whether an error may pass if the same call is made again later (the store was busy,
/// the server unreachable); any other is the gate's final word.
pub fn transient(err: &GateError) -> bool {
    matches!(
        err.kind(),
        ErrorKind::Unavailable | ErrorKind::RateLimited | ErrorKind::Internal
    )
}

/// The principal a bridge `serve` runs acts as: the agent `bridge:<name>`. Its requests
/// are its own, so no approver is ever the requester, and policies and `[groups]` name it
/// like any agent.
pub fn principal(name: &str) -> Principal {
    Principal::new(
        format!("bridge:{name}"),
        name,
        Role::Agent,
        AuthMethod::LocalOsUser,
    )
}

/// The gate of this process.
pub struct LocalAsks {
    gate: Arc<Gate>,
    who: Principal,
    events: tokio::sync::Mutex<broadcast::Receiver<Arc<StoredEvent>>>,
}

impl LocalAsks {
    pub fn new(gate: Arc<Gate>, who: Principal) -> Self {
        let events = tokio::sync::Mutex::new(gate.feed().subscribe());
        Self { gate, who, events }
    }
}

/// The most requests of one state a restart picks up.
const OPEN_LIMIT: usize = 10_000;

#[async_trait]
impl BridgeAsks for LocalAsks {
    async fn propose(&self, new: NewRequest) -> Result<Proposed, GateError> {
        match self.gate.request_approval(&self.who, new).await {
            Ok(requested) => Ok(Proposed {
                request: ApprovalView::new(&requested.request),
                differs: false,
            }),
            Err(GateError::Core(CoreError::IdempotencyMismatch { request_id, .. })) => {
                let request = self.gate.get(&self.who, request_id.as_str()).await?;
                Ok(Proposed {
                    request: ApprovalView::new(&request),
                    differs: true,
                })
            }
            Err(err) => Err(err),
        }
    }

    async fn status(&self, id: &str) -> Result<ApprovalView, GateError> {
        Ok(ApprovalView::new(&self.gate.get(&self.who, id).await?))
    }

    async fn claim(&self, id: &str, details: BTreeMap<String, String>) -> Result<(), GateError> {
        self.gate
            .record_action(&self.who, id, "bridge".into(), details)
            .await
            .map(|_| ())
    }

    async fn outcome(
        &self,
        id: &str,
        status: OutcomeStatus,
        summary: String,
        details: BTreeMap<String, String>,
    ) -> Result<(), GateError> {
        self.gate
            .record_outcome(&self.who, id, status, Some(summary), details)
            .await
            .map(|_| ())
    }

    async fn open_requests(&self) -> Result<Vec<ApprovalView>, GateError> {
        let mut out = Vec::new();
        for status in [Status::Pending, Status::Approved] {
            let query = RequestQuery {
                status: Some(status),
                requested_by: Some(self.who.id.clone()),
                limit: OPEN_LIMIT,
            };
            for request in self.gate.store().list_requests(&query).await? {
                if request.outcome.is_none() {
                    out.push(ApprovalView::new(&request));
                }
            }
        }
        Ok(out)
    }

    async fn changed(
        &self,
        timeout: Duration,
        concerns: &(dyn for<'a> Fn(&'a str) -> bool + Sync),
    ) -> bool {
        let mut events = self.events.lock().await;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, events.recv()).await {
                Ok(Ok(event)) if !event.entry.subject.as_deref().is_some_and(concerns) => {}
                // Ours, or some were missed (which may have been ours).
                Ok(Ok(_)) | Ok(Err(broadcast::error::RecvError::Lagged(_))) => {
                    // One pass covers every change so far.
                    while let Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) =
                        events.try_recv()
                    {}
                    return true;
                }
                // The feed stopped (shutdown): nothing more will come.
                Ok(Err(broadcast::error::RecvError::Closed)) => {
                    drop(events);
                    tokio::time::sleep_until(deadline).await;
                    return false;
                }
                Err(_) => return false,
            }
        }
    }
}
