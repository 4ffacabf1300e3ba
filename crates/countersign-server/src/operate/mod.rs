//! Operating the processes countersign gates (approval-gate-mcp's process tools):
//! status, logs, restart and one-off commands of a `[[process]]`, here or over SSH; the
//! parameters it reads each cycle (`[params]`); read-only probes (`[[probe]]`).
//!
//! Reading (status, logs, the parameters, probes) is for approvers and admins. Changing
//! (restart, run_command, set_param, clear_param) is an approval request made by the
//! person who asks, bound to exactly what will run (the details name the host, the
//! directory, the command or the value before and after). Policies see it as the tool
//! (`Action::"restart_process"`) on `Server::"operate"`; otherwise another person
//! decides, as the requester may never approve their own request. Once approved, it is
//! claimed (`record_action`, single-use: a second claim fails) before it runs, and what
//! it gave (exit code and output, or the value before and after) is its outcome, so the
//! whole change is in the request's record and the transparency log.
//!
//! The surfaces (the CLI, the approval-gate MCP profile) are thin: they call
//! [`Operations`] as the authenticated person and shape the answer.

mod bind;
mod execute;
pub mod params;
pub mod probe;
pub mod process;
pub mod ssh;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use countersign_core::evidence::OutcomeStatus;
use countersign_core::{ApprovalRequest, NewRequest, Principal, Scope, Status};
use serde::Serialize;
use serde_json::Value;

use crate::error::GateError;
use crate::gate::{Gate, MAX_ATTEMPTS, Via, join_key};

pub use params::{Manifest, ParamsConfig, ParamsList};
pub use probe::{ProbeConfig, ProbeInfo, ProbeOutput};
pub use process::{ProcessConfig, ProcessStatus};
pub use ssh::{Bounds, SshHost, Target};

/// The server policies name for operations: `resource == Server::"operate"`.
pub const UPSTREAM: &str = "operate";
pub const RESTART: &str = "restart_process";
pub const RUN: &str = "run_command";
pub const SET_PARAM: &str = "set_param";
pub const CLEAR_PARAM: &str = "clear_param";
/// The most output kept in an outcome (a detail holds at most 16 KiB).
const OUTCOME_OUTPUT_BYTES: usize = 8 * 1024;
/// One wait for a decision, before it is renewed.
const WAIT_SLICE: Duration = Duration::from_secs(30);
/// How long asking again for an operation that was refused answers that refusal,
/// before it is a new request.
pub const REFUSAL_SHOWN: Duration = Duration::from_secs(10 * 60);
/// The claim's detail that names the instance that claimed an operation.
const CLAIMED_BY: &str = "executed_by";
/// The longest `run_timeout_seconds` the config accepts.
const MAX_RUN_BOUND: Duration = Duration::from_secs(3600);

/// How [`Operations::perform_detached`] waits for a decision.
pub struct DetachedHold {
    pub time: Duration,
    pub waiting: Box<dyn FnMut(&ApprovalRequest) + Send>,
    pub progress: Box<dyn FnMut(Duration) + Send>,
    pub cancel: tokio_util::sync::CancellationToken,
}

/// How [`Operations::perform`] waits for a decision.
pub struct Hold<'a> {
    /// How long, at most; the request stays open after.
    pub time: Duration,
    /// Told once, with the request, when a person must decide.
    pub waiting: &'a mut (dyn FnMut(&ApprovalRequest) + Send),
    /// Told how long it has waited so far, from time to time.
    pub progress: &'a mut (dyn FnMut(Duration) + Send),
    /// Stops the wait (not a run that started).
    pub cancel: &'a tokio_util::sync::CancellationToken,
}

/// What `[[process]]`, `[params]` and `[[probe]]` resolve to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OperateConfig {
    pub processes: Vec<ProcessConfig>,
    pub params: Option<ParamsConfig>,
    pub probes: Vec<ProbeConfig>,
}

impl OperateConfig {
    pub fn is_empty(&self) -> bool {
        self.processes.is_empty() && self.params.is_none() && self.probes.is_empty()
    }
}

/// A change an operator asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Operation {
    Restart {
        process: String,
    },
    Run {
        process: String,
        command: String,
    },
    /// `value` as given: coerced against the manifest before anything is asked.
    SetParam {
        name: String,
        value: Value,
    },
    /// One override, or all of them (`None`).
    ClearParam {
        name: Option<String>,
    },
}

/// What came of an operation that was carried out.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct Executed {
    pub status: OutcomeStatus,
    pub summary: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// For a parameter: its override before and after (`null`: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<Value>,
}

/// Where an operation stands once [`Operations::perform`] is done with it.
#[derive(Debug, Clone)]
pub enum Performed {
    /// Approved, claimed and carried out, once.
    Done {
        request: Box<ApprovalRequest>,
        executed: Executed,
    },
    /// Still waiting for a decision: asking again joins this request.
    Pending { request: Box<ApprovalRequest> },
    /// Not carried out, and why.
    Refused {
        request: Box<ApprovalRequest>,
        reason: String,
    },
}

/// An operation bound to what it will do: its request's description and details.
#[derive(Debug, Clone)]
struct Bound {
    tool: &'static str,
    description: String,
    details: BTreeMap<String, String>,
    op: Resolved,
}

#[derive(Debug, Clone)]
enum Resolved {
    Restart(usize),
    Run(usize, String),
    Set(String, Value),
    Clear(Option<String>),
}

/// The operations of this server's configuration, through its gate.
pub struct Operations {
    gate: Arc<Gate>,
    config: Arc<OperateConfig>,
    /// Parameter changes one at a time (each reads, changes and writes the file).
    params_lock: tokio::sync::Mutex<()>,
    /// Names this process in the claims it makes (`executed_by`).
    instance: String,
}

impl Operations {
    pub fn new(gate: Arc<Gate>, config: Arc<OperateConfig>, instance: impl Into<String>) -> Self {
        Self {
            gate,
            config,
            params_lock: tokio::sync::Mutex::new(()),
            instance: instance.into(),
        }
    }

    pub fn config(&self) -> &OperateConfig {
        &self.config
    }

    /// Whether the parameter tools are offered (a manifest is configured).
    pub fn has_params(&self) -> bool {
        self.config.params.is_some()
    }

    pub fn processes(&self) -> Vec<&str> {
        self.config
            .processes
            .iter()
            .map(|p| p.name.as_str())
            .collect()
    }

    /// `process_status`.
    pub async fn status(&self, who: &Principal, process: &str) -> Result<ProcessStatus, GateError> {
        person(who)?;
        self.process(process)?.1.status().await
    }

    /// `process_logs(lines)`.
    pub async fn logs(
        &self,
        who: &Principal,
        process: &str,
        lines: usize,
    ) -> Result<String, GateError> {
        person(who)?;
        self.process(process)?.1.logs(lines).await
    }

    /// `list_params`.
    pub async fn list_params(&self, who: &Principal) -> Result<ParamsList, GateError> {
        person(who)?;
        self.params()?.list().await
    }

    /// The probes configured.
    pub fn probes(&self, who: &Principal) -> Result<Vec<ProbeInfo>, GateError> {
        person(who)?;
        Ok(self.config.probes.iter().map(ProbeConfig::info).collect())
    }

    /// Runs the probe `name`.
    pub async fn probe(&self, who: &Principal, name: &str) -> Result<ProbeOutput, GateError> {
        person(who)?;
        let probe = self
            .config
            .probes
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| {
                GateError::NotFound(format!(
                    "probe {name:?} (configured: {})",
                    names(self.config.probes.iter().map(|p| p.name.as_str()))
                ))
            })?;
        probe.run().await
    }

    /// Asks for `op` as `who` (or finds the request an earlier ask of the same
    /// operation in the same `session` made and that still stands), without waiting.
    /// Invalid input (an unknown process, a value the manifest refuses) is refused
    /// before anything is asked.
    pub async fn ask(
        &self,
        who: &Principal,
        op: &Operation,
        session: &str,
    ) -> Result<ApprovalRequest, GateError> {
        let bound = self.bind(who, op).await?;
        self.request(who, &bound, session).await
    }

    /// Asks for `op` as `who`, waits up to `hold.time` for the decision, and once
    /// approved claims the approval and carries the operation out, once, recording what
    /// came of it. A cancelled wait answers `Pending` (the request stays open); once the
    /// claim is made the operation runs to its end whatever the caller does, so that
    /// its outcome is recorded.
    pub async fn perform(
        &self,
        who: &Principal,
        op: &Operation,
        session: &str,
        hold: Hold<'_>,
    ) -> Result<Performed, GateError> {
        let Hold {
            time,
            waiting,
            progress,
            cancel,
        } = hold;
        let bound = self.bind(who, op).await?;
        let mut request = self.request(who, &bound, session).await?;
        let started = tokio::time::Instant::now();
        let deadline = started + time;
        if request.status == Status::Pending {
            waiting(&request);
        }
        while request.status == Status::Pending {
            let now = tokio::time::Instant::now();
            if now >= deadline || cancel.is_cancelled() {
                return Ok(Performed::Pending {
                    request: Box::new(request),
                });
            }
            let slice = WAIT_SLICE.min(deadline - now);
            let before = now - started;
            let mut report = |waited: Duration| progress(before + waited);
            let wait = self.gate.wait(who, request.id.as_str(), slice, &mut report);
            request = tokio::select! {
                waited = wait => waited?,
                () = cancel.cancelled() => {
                    return Ok(Performed::Pending { request: Box::new(request) });
                }
            };
        }
        self.settle(who, &bound, request).await
    }

    /// [`perform`](Self::perform) in a task of its own, for callers whose future may be
    /// dropped (an HTTP request whose client went away): dropping this future only
    /// stops the wait (the request stays open); a run already claimed goes on to its
    /// end and its outcome is recorded.
    pub async fn perform_detached(
        self: Arc<Self>,
        who: Principal,
        op: Operation,
        session: &'static str,
        hold: DetachedHold,
    ) -> Result<Performed, GateError> {
        let cancel = hold.cancel.child_token();
        let _stop_waiting_when_dropped = cancel.clone().drop_guard();
        let task = tokio::spawn(async move {
            let DetachedHold {
                time,
                mut waiting,
                mut progress,
                ..
            } = hold;
            let hold = Hold {
                time,
                waiting: &mut *waiting,
                progress: &mut *progress,
                cancel: &cancel,
            };
            self.perform(&who, &op, session, hold).await
        });
        task.await
            .map_err(|e| GateError::Internal(format!("an operation's task failed: {e}")))?
    }

    /// Records `unknown` as the outcome of the operations claimed (by any instance)
    /// longer ago than they can run, plus `margin`, that have none: whoever claimed
    /// them stopped before it could record what they did. They are never run again
    /// (the claim is single-use); the record says the result is unknown. Returns how
    /// many were recorded.
    pub async fn sweep(&self, margin: Duration) -> Result<usize, GateError> {
        self.gate
            .sweep_claims(CLAIMED_BY, |request| {
                let details = &request.action.details;
                if details.get("upstream").map(String::as_str) != Some(UPSTREAM) {
                    return None;
                }
                let tool = details.get("tool").map_or("", String::as_str);
                let bound = self.run_bound(tool, details.get("process").map(String::as_str))?;
                Some(bound + margin)
            })
            .await
    }

    /// The longest an operation of `tool` (on `process`) runs once claimed, or `None`
    /// for a tool that is not an operation.
    fn run_bound(&self, tool: &str, process: Option<&str>) -> Option<Duration> {
        match tool {
            RESTART => Some(process::RESTART_BOUND),
            RUN => Some(
                process
                    .and_then(|name| self.config.processes.iter().find(|p| p.name == name))
                    // A process no longer configured: the longest a command may take.
                    .map_or(MAX_RUN_BOUND, |p| p.run.timeout),
            ),
            // Read, then write: each bounded.
            SET_PARAM | CLEAR_PARAM => Some(params::REMOTE_BOUND * 2),
            _ => None,
        }
    }

    /// Carries out the approved `request` of `bound` once, or says why not.
    async fn settle(
        &self,
        who: &Principal,
        bound: &Bound,
        request: ApprovalRequest,
    ) -> Result<Performed, GateError> {
        let id = request.id.to_string();
        let refused = |request: ApprovalRequest, reason: String| {
            Ok(Performed::Refused {
                request: Box::new(request),
                reason,
            })
        };
        match request.status {
            Status::Approved => {}
            Status::Rejected => {
                let comment = request
                    .decision
                    .as_ref()
                    .and_then(|d| d.comment.clone())
                    .map(|c| format!(": {c}"))
                    .unwrap_or_default();
                return refused(
                    request,
                    format!("request {id} was rejected{comment}; nothing was run"),
                );
            }
            other => {
                return refused(
                    request,
                    format!("request {id} is {}; nothing was run", other.as_str()),
                );
            }
        }
        if request.action.details != bound.details {
            return refused(
                request,
                format!("request {id} approved another operation than this one; nothing was run"),
            );
        }
        if let Some(outcome) = &request.outcome {
            let status = outcome.status;
            return refused(
                request,
                format!(
                    "request {id} was already carried out once (outcome: {status:?}); it is not run again"
                ),
            );
        }
        if request.used().is_some() {
            return refused(
                request,
                format!(
                    "request {id} was already claimed and its outcome is not known; it is not run again"
                ),
            );
        }
        // The claim: durable and single-use before anything runs.
        let claim = [(CLAIMED_BY.to_string(), self.instance.clone())].into();
        if let Err(err) = self
            .gate
            .record_action(who, &id, bound.tool.to_string(), claim)
            .await
        {
            return refused(
                request,
                format!(
                    "request {id} is approved but could not be claimed: {}",
                    err.public_message()
                ),
            );
        }
        let executed = self.execute(&bound.op).await;
        let mut details = BTreeMap::new();
        if let Some(code) = executed.exit_code {
            details.insert("exit_code".into(), code.to_string());
        }
        if let Some(output) = &executed.output {
            details.insert("output".into(), output.clone());
        }
        if let Some(before) = &executed.before {
            details.insert("before".into(), before.to_string());
        }
        if let Some(after) = &executed.after {
            details.insert("after".into(), after.to_string());
        }
        let request = self
            .gate
            .record_outcome(
                who,
                &id,
                executed.status,
                Some(executed.summary.clone()),
                details,
            )
            .await?;
        Ok(Performed::Done {
            request: Box::new(request),
            executed,
        })
    }

    /// Creates the request for `bound`, or joins the one an earlier ask made.
    async fn request(
        &self,
        who: &Principal,
        bound: &Bound,
        session: &str,
    ) -> Result<ApprovalRequest, GateError> {
        let details = countersign_core::jcs::to_vec(&bound.details).unwrap_or_default();
        let key = format!(
            "op:{}",
            join_key(&[who.id.as_bytes(), session.as_bytes(), &details])
        );
        let via = Via {
            upstream: UPSTREAM.into(),
            read_only: false,
            // Claimed when it runs, by whichever instance runs it.
            claim_for: None,
        };
        let new = NewRequest {
            description: bound.description.clone(),
            details: bound.details.clone(),
            ..NewRequest::default()
        };
        let too_many = || GateError::RateLimited {
            message: format!(
                "this operation was asked for {MAX_ATTEMPTS} times in one session; start a new one"
            ),
            retry_after_seconds: 60,
        };
        self.gate
            .create_joining(who, new, &via, &key, REFUSAL_SHOWN, too_many)
            .await?
            .map(|requested| requested.request)
            .ok_or_else(|| GateError::Internal("an operation passed without a request".into()))
    }

    fn process(&self, name: &str) -> Result<(usize, &ProcessConfig), GateError> {
        self.config
            .processes
            .iter()
            .enumerate()
            .find(|(_, p)| p.name == name)
            .ok_or_else(|| {
                GateError::NotFound(format!(
                    "process {name:?} (configured: {})",
                    names(self.config.processes.iter().map(|p| p.name.as_str()))
                ))
            })
    }

    fn params(&self) -> Result<&ParamsConfig, GateError> {
        self.config.params.as_ref().ok_or_else(|| {
            GateError::NotFound("parameters: no [params] schema is configured".into())
        })
    }
}

/// Operations are for people who may decide (approvers, admins), never agents or
/// executors: an agent asks for changes through its own requests.
fn person(who: &Principal) -> Result<(), GateError> {
    if who.role.may_decide() {
        Ok(())
    } else {
        Err(GateError::Forbidden(format!(
            "{} holds an {} credential; process operations, parameters and probes are for approvers and admins",
            who.id, who.role
        )))
    }
}

fn failed(err: GateError) -> Executed {
    Executed {
        status: OutcomeStatus::Failed,
        summary: err.public_message(),
        exit_code: None,
        output: None,
        before: None,
        after: None,
    }
}

/// An override for a message: its JSON, or "unset".
fn show(value: &Value) -> String {
    if value.is_null() {
        "unset".into()
    } else {
        value.to_string()
    }
}

fn names<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let all: Vec<&str> = names.collect();
    if all.is_empty() {
        "none".into()
    } else {
        all.join(", ")
    }
}

/// The first `max` bytes of `text`, at a character boundary, marked when cut.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n[... cut at {max} bytes]", &text[..end])
}
