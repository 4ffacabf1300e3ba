//! Policies in the gate: the loaded set, each version logged before it decides anything,
//! evaluated when a request is made; a rule's decision signed like a person's
//! (`authorization_type: policy`), and a timeout turned into what a policy says
//! (`fallback`). The rules themselves are in countersign-policy; docs/policies.md is the
//! user's guide.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use countersign_core::{
    ApprovalRequest, AuthorizationType, Event, EventKind, Groups, PolicyHold, PolicyRef, Principal,
    Quorum, Timestamp, Transition, Verdict,
};
use countersign_policy::{Input, OnTimeout, Outcome, PolicyFile, PolicySet, RESOURCE};
use countersign_store::{Docs, RequestQuery, StoreError, collection, kinds};
use serde::{Deserialize, Serialize};

use super::Gate;
use crate::error::GateError;
use crate::ids::{new_nonce, new_salt};

/// The detail whose value names the tool a `request_approval` is about.
pub const TOOL_DETAIL: &str = countersign_core::arguments::TOOL_DETAIL;
/// The most requests counted for `context.agent` (a count beyond it reads as this).
const MAX_COUNTED: usize = 10_000;

/// `[policy]`: the files, and the zone `context.time` is in.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicySettings {
    pub files: Vec<PathBuf>,
    pub zone: chrono_tz::Tz,
}

/// A logged policy set version, by digest: inserted with its `policy_set_loaded` entry in
/// one transaction, so a version is logged once however many instances load it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct LoggedSet {
    pub files: Vec<String>,
}

collection!(pub(crate) PolicySetDocs: kinds::POLICY_SET => LoggedSet);

/// The set in force, swapped whole on reload, and what the files looked like when they
/// were last read (so that a change made right after a load, before the watcher first
/// looks, is not missed).
pub(crate) struct Policies {
    current: RwLock<Arc<PolicySet>>,
    read: std::sync::Mutex<Option<Stamp>>,
}

impl Default for Policies {
    fn default() -> Self {
        Self::new(PolicySet::empty())
    }
}

impl Policies {
    pub(crate) fn new(set: PolicySet) -> Self {
        Self {
            current: RwLock::new(Arc::new(set)),
            read: std::sync::Mutex::new(None),
        }
    }
    fn read_as(&self, stamp: Stamp) {
        *self.read.lock().unwrap_or_else(|p| p.into_inner()) = Some(stamp);
    }
    fn last_read(&self) -> Option<Stamp> {
        self.read.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
    fn get(&self) -> Arc<PolicySet> {
        self.current
            .read()
            .map(|s| s.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }
    fn set(&self, set: PolicySet) {
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        *current = Arc::new(set);
    }
}

/// Reads the policy files (named by their file names in ids and messages).
pub fn read_files(paths: &[PathBuf]) -> Result<Vec<PolicyFile>, String> {
    paths
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read the policy file {}: {e}", path.display()))?;
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| path.display().to_string());
            Ok(PolicyFile { name, text })
        })
        .collect()
}

/// Loads `files` into a set, refusing one whose `@approvers` name a group `[groups]`
/// lacks (a quorum nobody could meet): what `serve`, `policy validate` and `doctor` load.
pub fn load_set(files: Vec<PolicyFile>, groups: &Groups) -> Result<PolicySet, String> {
    let set = PolicySet::load(files).map_err(|e| e.to_string())?;
    for policy in set.policies() {
        for group in &policy.requirements.approvers {
            if !groups.exists(group) {
                let known: Vec<&str> = groups.names().collect();
                return Err(format!(
                    "policy {:?} ({}) requires approvers from group {group:?}, which [groups] does not define (known: {})",
                    policy.id,
                    policy.file,
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ));
            }
        }
    }
    Ok(set)
}

/// What a rule decided at once, and by which policy of which set (the set evaluated,
/// even if a reload has put another in force since).
pub(crate) struct Ruling {
    verdict: Verdict,
    policy: PolicyRef,
}

impl Gate {
    /// The policy set in force.
    pub fn policies(&self) -> Arc<PolicySet> {
        self.policies.get()
    }

    /// The policy set in force and when its version was first logged (`None` when it is
    /// not in the log, as for no policies at all): a request made since then, that no
    /// policy held or decided, is one no policy in it matched.
    pub async fn policies_since(&self) -> Result<(Arc<PolicySet>, Option<Timestamp>), GateError> {
        let set = self.policies();
        if set.is_empty() {
            return Ok((set, None));
        }
        let logged = Docs::<PolicySetDocs>::new(&*self.store)
            .get(set.digest())
            .await?;
        Ok((set, logged.map(|doc| doc.updated_at)))
    }

    /// Reads and loads the configured files, logs the version if it is new, and puts it
    /// in force. A set that does not load leaves the one in force as it is; the error
    /// says why (for the log and `doctor`).
    pub async fn reload_policies(&self) -> Result<Arc<PolicySet>, GateError> {
        let Some(settings) = &self.settings.policy else {
            return Ok(self.policies());
        };
        // Taken before reading: a change made after it is seen by the next look.
        self.policies.read_as(stamp(&settings.files));
        let files = read_files(&settings.files).map_err(GateError::BadInput)?;
        let set = load_set(files, &self.settings.groups).map_err(GateError::BadInput)?;
        self.log_policy_set(&set).await?;
        if set.digest() != self.policies().digest() {
            tracing::info!(
                policy_set = set.digest(),
                policies = set.policies().len(),
                "policies in force"
            );
        }
        self.policies.set(set);
        Ok(self.policies())
    }

    /// Logs `set` (`policy_set_loaded`) unless this version is in the log already.
    async fn log_policy_set(&self, set: &PolicySet) -> Result<(), GateError> {
        let docs = Docs::<PolicySetDocs>::new(&*self.store);
        if docs.get(set.digest()).await?.is_some() {
            return Ok(());
        }
        let names: Vec<String> = set.files().iter().map(|f| f.name.clone()).collect();
        let event = Event {
            kind: EventKind::PolicySetLoaded,
            at: self.now(),
            actor: None,
            subject: None,
            data: match serde_json::json!({"policy_set": set.digest(), "files": names}) {
                serde_json::Value::Object(map) => map,
                _ => serde_json::Map::new(),
            },
            payload: Some(serde_json::json!({"files": set.files()})),
        };
        let body = LoggedSet { files: names };
        match docs
            .insert(
                set.digest(),
                None,
                &body,
                self.now(),
                Some(&event.seal(new_salt()?)),
            )
            .await
        {
            Ok(()) => {
                self.feed.poke();
                Ok(())
            }
            // Another instance logged it in between.
            Err(StoreError::Duplicate(_)) => Ok(()),
            Err(err) => Err(err.into()),
        }
    }

    /// The policies in force evaluated for `request` from `who`; `via` names the
    /// upstream when the gateway holds the call (the tool is then certain). `None` when
    /// no policy is loaded.
    pub(crate) async fn evaluate_policies(
        &self,
        who: &Principal,
        request: &ApprovalRequest,
        via: Option<&str>,
    ) -> Result<Option<(Arc<PolicySet>, countersign_policy::Evaluation)>, GateError> {
        let set = self.policies();
        if set.is_empty() {
            return Ok(None);
        }
        let (pending, recent) = if set.reads_agent_counts() {
            self.agent_counts(who).await?
        } else {
            (0, 0)
        };
        let agent = who.id.split_once(':').map_or(who.id.as_str(), |(_, n)| n);
        let groups = self.settings.groups.of(&who.id);
        let zone = self
            .settings
            .policy
            .as_ref()
            .map_or(chrono_tz::UTC, |p| p.zone);
        let evaluation = set.evaluate(&Input {
            agent,
            groups: &groups,
            tool: request.action.details.get(TOOL_DETAIL).map(String::as_str),
            resource: via.unwrap_or(RESOURCE),
            gateway: via.is_some(),
            description: &request.action.description,
            details: &request.action.details,
            room: request.room.as_deref(),
            now: request.requested_at.datetime(),
            zone,
            pending,
            recent,
        });
        Ok(Some((set, evaluation)))
    }

    /// Evaluates the new request in `transition`: a forbid or a permit returns the
    /// ruling to apply once it is stored; requirements shorten its wait and say what a
    /// timeout becomes (the created event is rebuilt to record them).
    pub(crate) async fn apply_policies(
        &self,
        who: &Principal,
        transition: &mut Transition,
        via: Option<&str>,
    ) -> Result<Option<Ruling>, GateError> {
        let Some((set, evaluation)) = self
            .evaluate_policies(who, &transition.request, via)
            .await?
        else {
            return Ok(None);
        };
        let request = &transition.request;
        for error in &evaluation.errors {
            tracing::warn!(request = %request.id, %error, "a policy could not be evaluated; a person decides");
        }
        let by = |id: String| PolicyRef {
            id,
            policy_set: set.digest().to_string(),
        };
        let ruling = match evaluation.outcome {
            Outcome::Reject { policy } => Some(Ruling {
                verdict: Verdict::Rejected,
                policy: by(policy),
            }),
            // Reply fields only a person can give: a person decides.
            Outcome::Approve { policy } if request.requested_fields.is_empty() => Some(Ruling {
                verdict: Verdict::Approved,
                policy: by(policy),
            }),
            Outcome::Approve { .. } | Outcome::NoMatch => None,
            Outcome::Person {
                policies,
                requirements,
            } => {
                if let Some(groups) = requirements.conflicting_groups() {
                    // No approver can be asked to come from two groups: refused, signed,
                    // naming the policies (fail closed rather than pick one of them).
                    tracing::warn!(
                        request = %request.id,
                        groups = %groups.join(", "),
                        "matching policies require approvers from different groups; the request is refused"
                    );
                    return Ok(Some(Ruling {
                        verdict: Verdict::Rejected,
                        policy: by(policies.join(",")),
                    }));
                }
                let request = &mut transition.request;
                if let Some(hours) = requirements.timeout_hours {
                    let seconds = (hours * 3600.0).round() as u64;
                    let by_policy = request.requested_at.plus_seconds(seconds.max(1));
                    if by_policy < request.expires_at {
                        request.expires_at = by_policy;
                    }
                }
                request.policy = Some(PolicyHold {
                    policy_set: set.digest().to_string(),
                    policies,
                    on_timeout: requirements.on_timeout.map(|t| match t {
                        OnTimeout::Approve => Verdict::Approved,
                        OnTimeout::Reject => Verdict::Rejected,
                    }),
                });
                transition.event = Event::created(&transition.request);
                if requirements.approvals.is_some() || !requirements.approvers.is_empty() {
                    let quorum = Quorum::new(
                        requirements.approvals.unwrap_or(1),
                        requirements.approvers.first().map(String::as_str),
                    )?;
                    transition.require_quorum(quorum)?;
                }
                None
            }
        };
        Ok(ruling)
    }

    /// The decision a ruling makes of the new `request`, signed, to store with its
    /// creation in one write.
    pub(crate) fn rule(
        &self,
        request: &ApprovalRequest,
        ruling: Ruling,
    ) -> Result<Transition, GateError> {
        self.signed_by_rule(
            request,
            ruling.verdict,
            AuthorizationType::Policy,
            ruling.policy,
            request.requested_at,
        )
    }

    /// What a policy says a timeout becomes, for a request past its expiry; `None` when
    /// none says (the request then times out).
    pub(crate) async fn fallback(
        &self,
        request: &ApprovalRequest,
    ) -> Result<Option<ApprovalRequest>, GateError> {
        let Some(hold) = &request.policy else {
            return Ok(None);
        };
        let Some(verdict) = hold.on_timeout else {
            return Ok(None);
        };
        let policy = PolicyRef {
            id: hold.policies.join(","),
            policy_set: hold.policy_set.clone(),
        };
        self.rule_on(
            request.clone(),
            verdict,
            AuthorizationType::Fallback,
            policy,
        )
        .await
        .map(Some)
    }

    async fn rule_on(
        &self,
        request: ApprovalRequest,
        verdict: Verdict,
        kind: AuthorizationType,
        policy: PolicyRef,
    ) -> Result<ApprovalRequest, GateError> {
        let transition = self.signed_by_rule(&request, verdict, kind, policy, self.now())?;
        // A person (or another instance) may have got there first.
        self.apply_or_winner(transition).await
    }

    /// A rule's decision of `request` at `at`, signed with this instance's key.
    fn signed_by_rule(
        &self,
        request: &ApprovalRequest,
        verdict: Verdict,
        kind: AuthorizationType,
        policy: PolicyRef,
        at: Timestamp,
    ) -> Result<Transition, GateError> {
        let signer = self.keys.signer();
        Ok(request.decide_by_rule(verdict, kind, policy, at, new_nonce()?, &signer)?)
    }

    /// The agent's requests pending now and made in the last hour.
    async fn agent_counts(&self, who: &Principal) -> Result<(u64, u64), GateError> {
        let now = self.now();
        let pending = self.live_pending_of(who, MAX_COUNTED).await?.len();
        let hour_ago = now.datetime() - chrono::Duration::hours(1);
        let recent = self
            .store
            .list_requests(&RequestQuery {
                status: None,
                requested_by: Some(who.id.clone()),
                limit: MAX_COUNTED,
            })
            .await?
            .iter()
            .filter(|r| r.requested_at.datetime() >= hour_ago)
            .count();
        Ok((pending as u64, recent as u64))
    }
}

/// How often `serve` looks at the policy files for a change.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// What the files look like (size and modification time of each), to notice a change.
type Stamp = Vec<Option<(u64, std::time::SystemTime)>>;

fn stamp(paths: &[PathBuf]) -> Stamp {
    paths
        .iter()
        .map(|p| {
            std::fs::metadata(p)
                .ok()
                .and_then(|m| Some((m.len(), m.modified().ok()?)))
        })
        .collect()
}

impl Gate {
    /// Reloads the policies on SIGHUP and when a file changes, until `shutdown`. A set
    /// that does not load keeps the one in force, and the log says why.
    pub async fn watch_policies(self: Arc<Self>, shutdown: tokio_util::sync::CancellationToken) {
        let Some(settings) = self.settings.policy.clone() else {
            return;
        };
        #[cfg(unix)]
        let mut hangup =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        loop {
            #[cfg(unix)]
            let hup = async {
                match hangup.as_mut() {
                    Some(h) => {
                        h.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            #[cfg(not(unix))]
            let hup = std::future::pending::<()>();
            let why = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = hup => "SIGHUP",
                _ = tokio::time::sleep(WATCH_EVERY) => {
                    // Against the files as last read (at start or the last reload), so
                    // a change between the start and this watcher's first look counts.
                    if self.policies.last_read().as_ref() == Some(&stamp(&settings.files)) {
                        continue;
                    }
                    "a policy file changed"
                }
            };
            let before = self.policies().digest().to_string();
            match self.reload_policies().await {
                Ok(set) if set.digest() != before => {}
                Ok(_) => tracing::info!("{why}: the policies are unchanged"),
                Err(err) => tracing::warn!(
                    %err,
                    policy_set = before,
                    "{why}: the policies did not load; the set in force stays"
                ),
            }
        }
    }
}
