//! Calls the gate stands in the path of (the MCP gateway, the coding-agent hooks, the
//! guarded exec): each becomes a request whose details bind the call exactly, is decided
//! by the policies, a grant or a person, and may be forwarded once after its approval.
//! A read-only tool of a trusted upstream that no policy speaks of passes with no request.
//!
//! A retry of the same call (same caller, same session, same tool and arguments) joins
//! the request the first one made, for as long as the call's hold once it is closed
//! (`joining.rs`), so the same call made again later is a new request.

use std::time::Duration;

use countersign_core::arguments::call_details;
use countersign_core::evidence::OutcomeStatus;
use countersign_core::{ApprovalRequest, NewRequest, Principal, Status, Timestamp, Transition};

use super::Gate;
use super::joining::MAX_ATTEMPTS;
use crate::error::GateError;

/// How the instances of the gateways `serve` runs name themselves in their claims
/// (`serve:<gateway>:<random>`), apart from `proxy`, `hook` and `exec` processes.
pub const SERVED_INSTANCE_PREFIX: &str = "serve:";
/// How much longer than the call's hold its request lives: the holder withdraws it when
/// the hold ends (cancelled), and the store's expiry is only the backstop for a holder
/// that died.
const HOLD_GRACE_SECONDS: u64 = 30;

/// Where a call the gate holds goes: the upstream, and whether the call may pass unasked
/// (a trusted upstream says the tool only reads).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Via {
    pub upstream: String,
    pub read_only: bool,
    /// The instance that forwards the call: an approval given at once (a policy's) is
    /// claimed for it in the same write as the request and its decision, so the call
    /// goes out after one commit instead of two.
    pub claim_for: Option<String>,
}

/// A call held on its way to an upstream.
#[derive(Debug, Clone)]
pub struct GatewayCall {
    pub upstream: String,
    pub tool: String,
    pub arguments: serde_json::Map<String, serde_json::Value>,
    /// The upstream is trusted and the tool says it only reads (`readOnlyHint`).
    pub read_only: bool,
    /// The caller's session (an MCP session, a hook's session id): retries within it join.
    pub session: String,
    /// How long the call may wait for a decision; the request times out then.
    pub hold: Duration,
    /// A description for the approver; default "<tool> on <upstream>".
    pub description: Option<String>,
    /// The instance that will forward the call: when a policy approves it as it is
    /// asked, the approval is claimed for this instance in the same write
    /// ([`Gated::Held`]'s `claimed`), and the call may go out at once.
    pub claim_for: Option<String>,
}

/// What the gate says of a call.
#[derive(Debug, Clone)]
pub enum Gated {
    /// Forward it; nothing was stored.
    Pass,
    /// The request that holds it (new, or the one an earlier try made), in any state.
    /// `claimed`: approved as it was asked and claimed for the call's `claim_for` in
    /// the same write, so this call, and only this one, forwards it now.
    Held {
        request: Box<ApprovalRequest>,
        claimed: bool,
    },
}

impl Gate {
    /// Classifies `call` from `who`: pass, or the request that holds it (decided at once
    /// when a policy or a grant settles it).
    pub async fn gateway_call(
        &self,
        who: &Principal,
        call: &GatewayCall,
    ) -> Result<Gated, GateError> {
        gateway_only(who)?;
        let details = call_details(&call.upstream, &call.tool, &call.arguments);
        let via = Via {
            upstream: call.upstream.clone(),
            read_only: call.read_only,
            claim_for: call.claim_for.clone(),
        };
        let key = format!("gw:{}", join_key(who, call));
        let hold = call.hold.as_secs().max(1);
        let new = NewRequest {
            description: call
                .description
                .clone()
                .unwrap_or_else(|| format!("{} on {}", call.tool, call.upstream)),
            details,
            timeout_seconds: Some(hold + HOLD_GRACE_SECONDS),
            ..NewRequest::default()
        };
        let too_many = || GateError::RateLimited {
            message: format!(
                "this session has made the same call of {} {MAX_ATTEMPTS} times; start a new session",
                call.tool
            ),
            retry_after_seconds: 60,
        };
        Ok(
            match self
                .create_joining(who, new, &via, &key, call.hold, too_many)
                .await
                .map_err(too_large)?
            {
                None => Gated::Pass,
                Some(requested) => {
                    let claimed = !requested.existing
                        && call.claim_for.as_deref().is_some_and(|instance| {
                            requested
                                .request
                                .action_record
                                .as_ref()
                                .is_some_and(|action| {
                                    action.details.get("forwarded_by").map(String::as_str)
                                        == Some(instance)
                                })
                        });
                    Gated::Held {
                        request: Box::new(requested.request),
                        claimed,
                    }
                }
            },
        )
    }

    /// Whether no policy in force matches `request` held `via` the gateway (so a
    /// read-only call of a trusted upstream may pass). A policy that matches, even one
    /// that permits, makes it a request: what a policy decides is logged.
    pub(crate) async fn no_policy_speaks(
        &self,
        who: &Principal,
        request: &ApprovalRequest,
        via: &Via,
    ) -> Result<bool, GateError> {
        Ok(
            match self
                .evaluate_policies(who, request, Some(&via.upstream))
                .await?
            {
                None => true,
                Some((_, evaluation)) => {
                    matches!(evaluation.outcome, countersign_policy::Outcome::NoMatch)
                        && evaluation.errors.is_empty()
                }
            },
        )
    }

    /// Claims the approved `request` for its one forward (`record_action`, which a
    /// second claim, here or on another instance, cannot pass): the intent, durable
    /// before the call is sent. `instance` names the process that forwards it.
    pub async fn claim_forward(
        &self,
        who: &Principal,
        request: &ApprovalRequest,
        instance: &str,
    ) -> Result<ApprovalRequest, GateError> {
        gateway_only(who)?;
        let (tool, details) = forward_claim(request, instance);
        self.record_action(who, request.id.as_str(), tool, details)
            .await
    }

    /// The claim of a call's approval given at once (a policy's, as the request is
    /// made), for the instance `via` names as the one that forwards it: written with the
    /// request and its decision. `None` when it is not approved or `via` names none.
    pub(super) fn claim_at_once(
        &self,
        who: &Principal,
        request: &ApprovalRequest,
        via: &Via,
        now: Timestamp,
    ) -> Option<Result<Transition, GateError>> {
        let instance = via.claim_for.as_deref()?;
        if request.status != Status::Approved {
            return None;
        }
        let (tool, details) = forward_claim(request, instance);
        Some(
            request
                .record_action(tool, details, who, now, self.limits())
                .map_err(GateError::from),
        )
    }

    /// Records `unknown` as the outcome of `who`'s forwards to `upstream` that were
    /// claimed more than `older_than` ago and have no outcome: the gateway that claimed
    /// them stopped (a live one gives up on an upstream after its forward timeout and
    /// records the outcome itself). They are never sent again. Returns how many.
    pub async fn sweep_unknown(
        &self,
        who: &Principal,
        upstream: &str,
        older_than: Duration,
    ) -> Result<usize, GateError> {
        gateway_only(who)?;
        self.sweep(Some(who.id.clone()), older_than, |request, claimed_by| {
            // A gateway `serve` runs sweeps its own forwards (sweep_served).
            let ours = !claimed_by.starts_with(SERVED_INSTANCE_PREFIX)
                && request
                    .action
                    .details
                    .get(countersign_core::arguments::UPSTREAM_DETAIL)
                    .is_some_and(|u| u == upstream);
            ours.then(|| who.clone())
        })
        .await
    }

    /// The same for the gateways this server runs (`/mcp/gateway/<name>`): every agent's
    /// forwards claimed by an instance whose name starts with `instance_prefix`
    /// (`serve:<gateway>:`: that
    /// gateway on this or another `serve` of the same database), claimed more than
    /// `older_than` ago (longer than a live instance waits for an upstream) with no
    /// outcome. The outcome is recorded for the agent, as the gateway records it.
    pub async fn sweep_served(
        &self,
        instance_prefix: &str,
        older_than: Duration,
    ) -> Result<usize, GateError> {
        self.sweep(None, older_than, |request, claimed_by| {
            if !claimed_by.starts_with(instance_prefix) {
                return None;
            }
            let requester = &request.requested_by;
            Principal::new(
                requester.id.clone(),
                &requester.display_name,
                countersign_core::Role::Agent,
                requester.auth_method,
            )
            .through_served_gateway()
            .ok()
        })
        .await
    }

    /// Records `unknown` for the approved requests (of `requested_by`, or anyone's) whose
    /// forward was claimed more than `older_than` ago and has no outcome, where `ours`
    /// (given the request and who claimed it) names whom to record it as.
    async fn sweep(
        &self,
        requested_by: Option<String>,
        older_than: Duration,
        ours: impl Fn(&ApprovalRequest, &str) -> Option<Principal>,
    ) -> Result<usize, GateError> {
        self.sweep_where(requested_by, "forwarded_by", |request, claimed_by| {
            let recorder = ours(request, claimed_by)?;
            let upstream = request
                .action
                .details
                .get(countersign_core::arguments::UPSTREAM_DETAIL)
                .map_or("the upstream", String::as_str);
            Some(Swept {
                recorder,
                older_than,
                summary: format!(
                    "no outcome: {claimed_by} stopped before {upstream} answered; whether the call ran is unknown, and it was not sent again"
                ),
            })
        })
        .await
    }

    /// Records `unknown` for the approved requests whose action was claimed with the
    /// detail `claim_key` (naming who claimed it) longer ago than `bound` says for that
    /// request (`None`: not one to sweep), and that have no outcome: whoever claimed it
    /// stopped before it recorded one. Recorded as the requester, who alone records
    /// outcomes. Returns how many.
    pub async fn sweep_claims(
        &self,
        claim_key: &str,
        bound: impl Fn(&ApprovalRequest) -> Option<Duration>,
    ) -> Result<usize, GateError> {
        self.sweep_where(None, claim_key, |request, claimed_by| {
            let older_than = bound(request)?;
            let requester = &request.requested_by;
            // The requester's own identity: only it may record the outcome, and it is
            // a person (operations are asked by approvers and admins).
            let recorder = Principal::new(
                requester.id.clone(),
                &requester.display_name,
                countersign_core::Role::Approver,
                requester.auth_method,
            );
            Some(Swept {
                recorder,
                older_than,
                summary: format!(
                    "no outcome: {claimed_by} claimed it and stopped before recording what it did; whether it ran is unknown, and it was not run again"
                ),
            })
        })
        .await
    }

    async fn sweep_where(
        &self,
        requested_by: Option<String>,
        claim_key: &str,
        ours: impl Fn(&ApprovalRequest, &str) -> Option<Swept>,
    ) -> Result<usize, GateError> {
        let query = countersign_store::RequestQuery {
            status: Some(Status::Approved),
            requested_by,
            limit: 1000,
        };
        let now = self.now();
        let mut swept = 0;
        for request in self.store.list_requests(&query).await? {
            let Some(action) = &request.action_record else {
                continue;
            };
            let Some(claimed_by) = action.details.get(claim_key) else {
                continue;
            };
            if request.outcome.is_some() {
                continue;
            }
            let Some(Swept {
                recorder,
                older_than,
                summary,
            }) = ours(&request, claimed_by)
            else {
                continue;
            };
            let cutoff = i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
            if now.millis().saturating_sub(action.recorded_at.millis()) < cutoff {
                continue;
            }
            match self
                .record_outcome(
                    &recorder,
                    request.id.as_str(),
                    OutcomeStatus::Unknown,
                    Some(summary),
                    Default::default(),
                )
                .await
            {
                Ok(_) => swept += 1,
                // Recorded meanwhile (the run finished after all): it stands.
                Err(err) => tracing::debug!(request = %request.id, %err, "not swept"),
            }
        }
        Ok(swept)
    }

    /// Records what the forward of a claimed request gave.
    pub async fn forwarded(
        &self,
        who: &Principal,
        id: &str,
        status: OutcomeStatus,
        summary: String,
    ) -> Result<ApprovalRequest, GateError> {
        gateway_only(who)?;
        self.record_outcome(who, id, status, Some(summary), Default::default())
            .await
    }
}

/// Only a credential given the `gateway` scope speaks for a gateway: the calls it
/// classifies are taken as passing through it (policies see `context.gateway`; a
/// trusted upstream's read-only tool may pass unasked). An agent's own token is refused.
fn gateway_only(who: &Principal) -> Result<(), GateError> {
    if who.may(countersign_core::Scope::Gateway) {
        Ok(())
    } else {
        Err(GateError::Forbidden(format!(
            "{} may not speak for a gateway: that needs a token created with the gateway scope (countersign token create NAME --scopes request,gateway)",
            who.id
        )))
    }
}

/// What the claim of `request`'s forward by `instance` records: the tool the call is
/// for, and who forwards it.
fn forward_claim(
    request: &ApprovalRequest,
    instance: &str,
) -> (String, std::collections::BTreeMap<String, String>) {
    let tool = request
        .action
        .details
        .get(countersign_core::arguments::TOOL_DETAIL)
        .cloned()
        .unwrap_or_else(|| "gateway".into());
    let details = [("forwarded_by".to_string(), instance.to_string())].into();
    (tool, details)
}

/// What a sweep records for one request, and after how long.
struct Swept {
    recorder: Principal,
    older_than: Duration,
    summary: String,
}

/// The call's key among `who`'s requests: a hash of the session, the upstream, the tool,
/// the canonical arguments and the description (the same call described otherwise is
/// another request, never an idempotency mismatch).
fn join_key(who: &Principal, call: &GatewayCall) -> String {
    let arguments =
        countersign_core::jcs::to_vec(&call.arguments).unwrap_or_else(|_| b"{}".to_vec());
    super::joining::join_key(&[
        who.id.as_bytes(),
        call.session.as_bytes(),
        call.upstream.as_bytes(),
        call.tool.as_bytes(),
        &arguments,
        call.description.as_deref().unwrap_or("").as_bytes(),
    ])
}

/// A call whose arguments exceed what a request may hold cannot be bound, so it cannot
/// be approved: say so in those words.
fn too_large(err: GateError) -> GateError {
    match err {
        GateError::Core(countersign_core::CoreError::Invalid { field, message })
            if field == "details" =>
        {
            GateError::BadInput(format!(
                "the call's arguments cannot be bound into a request ({message}); this call cannot be approved through the gateway"
            ))
        }
        other => other,
    }
}
