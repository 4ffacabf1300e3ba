//! The gate: the one application service behind every way in (REST, the dashboard,
//! Slack, email links, MCP over HTTP and stdio, the CLI). It loads state from the store,
//! lets the domain (`countersign-core`) compute each transition, and applies it with a
//! compare-and-swap, so the rules live in one place. Accounts and rooms are services it
//! owns and calls down into; tokens and evidence are in the submodules.

mod batch;
mod builder;
mod evidence;
mod expiry;
mod gateway;
mod grants;
mod joining;
mod keys;
mod policy;
mod recipients;
mod settings;
mod tokens;
mod visibility;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use countersign_core::{
    ApprovalRequest, Channel, Clock, CoreError, Decider, DecisionAccounts, DecisionInput, Jwks,
    Limits, NewRequest, Principal, Status, Timestamp, Transition, Verdict,
};
use countersign_store::{CAS_TRIES, ChangeFeed, Created, RequestQuery, Store, StoreError};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::accounts::Accounts;
use crate::admission::{Held, Lane, PerHolder};
use crate::error::GateError;
use crate::ids::{new_id, new_nonce, new_salt};
use crate::keyring::KeyRing;
use crate::log::TransparencyLog;
use crate::rooms::Rooms;

pub use batch::{Batch, MAX_BATCH_DECISIONS};
pub use builder::{GateBuilder, Keys};
pub use evidence::{EvidenceTurn, Redeemed, ReviewerSettings};
pub use gateway::{Gated, GatewayCall, SERVED_INSTANCE_PREFIX, Via};
pub use grants::{DEFAULT_GRANT_SECONDS, GrantTerms};
pub(crate) use joining::{MAX_ATTEMPTS, join_key};
pub use keys::Trusted;
pub use policy::{
    PolicySettings, TOOL_DETAIL, load_set as load_policy_set, read_files as read_policy_files,
};
pub use recipients::Recipients;
pub use settings::{
    DEFAULT_MAX_SESSIONS_PER_ACCOUNT, DEFAULT_MAX_WAITS_PER_TOKEN, DEFAULT_SESSION_SECONDS,
    MAX_SESSION_SECONDS, Settings,
};
pub use tokens::NewToken;
pub use visibility::EntryShown;

/// How often a waiting call reports progress (MCP asks for at least every 10 s).
pub const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// The default and the longest time one wait call blocks (REST long poll, MCP
/// `wait_for_approval`, room waits): a client calls again to keep waiting.
pub const DEFAULT_WAIT_SECONDS: u64 = 45;
pub const MAX_WAIT_SECONDS: u64 = 300;

/// A wait of `given` seconds (or `default`), refused beyond [`MAX_WAIT_SECONDS`].
pub fn wait_time(given: Option<u64>, default: u64) -> Result<Duration, GateError> {
    let seconds = given.unwrap_or(default);
    if seconds > MAX_WAIT_SECONDS {
        return Err(GateError::BadInput(format!(
            "timeout_seconds is {seconds}; at most {MAX_WAIT_SECONDS} is allowed (call again to keep waiting)"
        )));
    }
    Ok(Duration::from_secs(seconds))
}

/// The outcome of `request_approval`.
#[derive(Debug, Clone)]
pub struct Requested {
    pub request: ApprovalRequest,
    /// True when an earlier request with the same idempotency key was returned.
    pub existing: bool,
}

pub struct Gate {
    store: Arc<dyn Store>,
    feed: ChangeFeed,
    keys: Arc<KeyRing>,
    clock: Arc<dyn Clock>,
    log: Arc<TransparencyLog>,
    accounts: Accounts,
    rooms: Rooms,
    settings: Settings,
    /// Cancelled when the process shuts down: waits return the current state at once.
    stopping: CancellationToken,
    /// Serializes one requester's new requests while a pending limit is checked.
    requester_locks: KeyedLocks,
    /// The policy set in force.
    policies: policy::Policies,
    /// Bounds on heavy or long-held work (evidence verification, waits).
    admission: Admission,
    /// What `/metrics` counts of this process's work.
    metrics: crate::metrics::Metrics,
}

/// One async lock per key (a requester), forgotten once nobody holds or waits for it.
#[derive(Default)]
pub(crate) struct KeyedLocks(
    std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
);

impl KeyedLocks {
    async fn lock(&self, key: &str) -> Result<tokio::sync::OwnedMutexGuard<()>, GateError> {
        let lock = {
            let mut locks = self
                .0
                .lock()
                .map_err(|_| GateError::Internal("the requester locks were poisoned".into()))?;
            locks.retain(|_, l| Arc::strong_count(l) > 1);
            locks.entry(key.to_string()).or_default().clone()
        };
        Ok(lock.lock_owned().await)
    }
}

/// Evidence verifications run at once: two, as the smallest deployment has two cores,
/// so a flood of uploads leaves the async workers (and everyone else's requests) alone.
const VERIFY_AT_ONCE: usize = 2;
/// Verifications waiting for a turn before further ones are told the server is busy;
/// each holds its upload (up to `max_body_bytes`) while it waits.
const VERIFY_QUEUE: usize = 8;
/// How long a verification waits for a turn.
const VERIFY_PATIENCE: Duration = Duration::from_secs(10);

impl Admission {
    fn new(settings: &Settings) -> Self {
        Self {
            verify: Lane::new(
                "evidence verifications",
                VERIFY_AT_ONCE,
                VERIFY_QUEUE,
                VERIFY_PATIENCE,
            ),
            waits: PerHolder::new("waits", settings.max_waits_per_token),
        }
    }
}

/// What the gate takes on at once; see [`crate::admission`].
pub(crate) struct Admission {
    /// Evidence verification: CPU and memory heavy, run off the async workers.
    pub(crate) verify: Lane,
    /// Open waits per credential.
    pub(crate) waits: PerHolder,
}

impl Gate {
    /// Assembles a gate over `store`, signing with `keys` (a directory, whose key is
    /// created on first use, or a loaded key ring): the one way the binary, the crash
    /// harness, the fuzz targets and the tests build one.
    pub fn builder(store: Arc<dyn Store>, keys: impl Into<Keys>) -> GateBuilder {
        GateBuilder::new(store, keys.into())
    }

    /// The dashboard's accounts and sessions.
    pub fn accounts(&self) -> &Accounts {
        &self.accounts
    }

    /// Rooms: messages, presence, questions and blockers.
    pub fn rooms(&self) -> &Rooms {
        &self.rooms
    }

    /// Ends every wait in progress (each returns the request's current state, so its
    /// client can call again elsewhere) and makes new waits return at once.
    pub fn begin_shutdown(&self) {
        self.stopping.cancel();
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn feed(&self) -> &ChangeFeed {
        &self.feed
    }

    pub fn keys(&self) -> &KeyRing {
        &self.keys
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    pub fn log(&self) -> &Arc<TransparencyLog> {
        &self.log
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.metrics
    }

    pub fn limits(&self) -> &Limits {
        &self.settings.limits
    }

    /// Every key that may have signed here (this process's and every one published in
    /// the database), as served at `/.well-known/jwks.json`.
    pub async fn jwks(&self) -> Result<Jwks, GateError> {
        crate::keyring::published_jwks(&*self.store, &self.keys).await
    }

    /// Creates a pending request, or returns the earlier one for a retried idempotency key.
    pub async fn request_approval(
        &self,
        who: &Principal,
        new: NewRequest,
    ) -> Result<Requested, GateError> {
        self.request_approval_with(who, new, None).await
    }

    /// As [`Gate::request_approval`], with the quorum the request asks for (`approvals`,
    /// `approvers`), which `[limits] request_quorum` must allow; a policy may require more.
    pub async fn request_approval_with(
        &self,
        who: &Principal,
        new: NewRequest,
        quorum: Option<(u32, Option<String>)>,
    ) -> Result<Requested, GateError> {
        match self.create(who, new, quorum, None).await? {
            Some(requested) => Ok(requested),
            // Only a gateway call passes without a request.
            None => Err(GateError::Internal(
                "a request passed without being stored".into(),
            )),
        }
    }

    /// Creates the request (or finds the earlier one by its idempotency key); `None`
    /// when `via` (a call the gateway holds) may pass with no request at all: a
    /// read-only tool of a trusted upstream that no policy speaks of.
    pub(crate) async fn create(
        &self,
        who: &Principal,
        new: NewRequest,
        quorum: Option<(u32, Option<String>)>,
        via: Option<&Via>,
    ) -> Result<Option<Requested>, GateError> {
        let now = self.now();
        let mut transition =
            ApprovalRequest::create(new_id("req", now)?, new, who, now, self.limits())?;
        if let Some((approvals, group)) = quorum {
            if !self.settings.request_quorum {
                return Err(GateError::Forbidden(
                    "this server does not let a request ask for its own quorum (approvals, approvers); its policies decide who must approve".into(),
                ));
            }
            if let Some(group) = &group
                && !self.settings.groups.exists(group)
            {
                return Err(GateError::BadInput(format!(
                    "approvers: there is no group {group:?} in this server's [groups]"
                )));
            }
            transition
                .require_quorum(countersign_core::Quorum::new(approvals, group.as_deref())?)?;
        }
        if transition.request.room.is_some() && !who.may(countersign_core::Scope::Rooms) {
            return Err(GateError::Forbidden(format!(
                "{} may not post in rooms (it lacks the rooms scope): ask without room",
                who.id
            )));
        }
        if let Some(room) = &transition.request.room {
            self.rooms.check_may_post(who, room).await?;
        }
        self.check_recipients(&transition.request).await?;
        if let Some(via) = via
            && via.read_only
            && self.no_policy_speaks(who, &transition.request, via).await?
        {
            return Ok(None);
        }
        // Held until the request is written, so parallel requests from one requester
        // cannot all pass the limit at once.
        let _serialized = match self.settings.pending_per_agent {
            Some(_) => Some(self.requester_locks.lock(&who.id).await?),
            None => None,
        };
        self.check_pending_limit(who, &transition.request).await?;
        let ruling = self
            .apply_policies(who, &mut transition, via.map(|v| v.upstream.as_str()))
            .await?;
        let created = transition.seal(new_salt()?);
        let no_rule = ruling.is_none();
        let stored = match ruling {
            // A rule's decision is stored with the creation, in one write.
            Some(ruling) => {
                let decided = self.rule(&transition.request, ruling)?;
                let mut then = vec![decided.seal(new_salt()?)];
                if let Some(claim) =
                    via.and_then(|v| self.claim_at_once(who, &decided.request, v, now))
                {
                    then.push(claim?.seal(new_salt()?));
                }
                self.store.create_decided(&created, &then).await?
            }
            None => self.store.create_request(&created).await?,
        };
        // No policy decided: a standing grant may, once the request is stored (so a
        // retried idempotency key finds the earlier request and spends no use, and a
        // crash in between leaves a request for a person, never a use without one).
        let stored = match stored {
            Created::New(request) if no_rule => Created::New(self.granted(request).await?),
            other => other,
        };
        match stored {
            Created::New(request) => {
                self.feed.poke();
                self.metrics.created();
                // A rule's decision went in with the creation (one transaction); a
                // grant's is counted where it was applied.
                if !no_rule && request.status.is_final() {
                    self.metrics.closed(&request);
                }
                if let Some(room) = &request.room {
                    // Shown in its room too, so the people there see what waits.
                    self.rooms.post_approval(who, room, &request).await?;
                }
                Ok(Some(Requested {
                    request,
                    existing: false,
                }))
            }
            Created::Existing(request) => {
                if request.action_digest != transition.request.action_digest {
                    return Err(CoreError::IdempotencyMismatch {
                        key: request.idempotency_key.clone().unwrap_or_default(),
                        request_id: request.id,
                    }
                    .into());
                }
                Ok(Some(Requested {
                    request,
                    existing: true,
                }))
            }
        }
    }

    /// `request` (new, pending) approved by a live grant that covers it, or as it is.
    async fn granted(&self, request: ApprovalRequest) -> Result<ApprovalRequest, GateError> {
        let Some(decided) = self.approve_by_grant(&request).await? else {
            return Ok(request);
        };
        match self.store.apply(&decided.seal(new_salt()?)).await {
            Ok(()) => {
                self.metrics.closed(&decided.request);
                Ok(decided.request)
            }
            // Someone decided it in the moment between (the use is spent): theirs stands.
            Err(StoreError::VersionConflict { current }) => Ok(*current),
            Err(err) => Err(err.into()),
        }
    }

    /// Refuses a new request from `who` when it already has `pending_per_agent` pending
    /// (expired ones do not count; a retry of one of them by its idempotency key does
    /// not count twice). Within one process the check and the write are serialized per
    /// requester, so parallel calls cannot pass it together; across several instances
    /// each may admit one request beyond the limit at the same moment.
    async fn check_pending_limit(
        &self,
        who: &Principal,
        request: &ApprovalRequest,
    ) -> Result<(), GateError> {
        let Some(limit) = self.settings.pending_per_agent else {
            return Ok(());
        };
        let live = self.live_pending_of(who, limit.saturating_add(1)).await?;
        let retry = request.idempotency_key.is_some()
            && live
                .iter()
                .any(|r| r.idempotency_key == request.idempotency_key);
        if live.len() >= limit && !retry {
            return Err(GateError::RateLimited {
                message: format!(
                    "{} already has {} pending requests, the most one requester may have ([limits] pending_per_agent = {limit}): wait until some are decided, or cancel those no longer needed",
                    who.id,
                    live.len()
                ),
                retry_after_seconds: 60,
            });
        }
        Ok(())
    }

    /// The request as `who` may see it, timed out first if its expiry has passed.
    /// Agents (and anyone else who cannot decide) see only their own requests; to them,
    /// others' do not exist.
    pub async fn get(&self, who: &Principal, id: &str) -> Result<ApprovalRequest, GateError> {
        let request = self.load(id).await?;
        if !who.role.may_decide() && request.requested_by.id != who.id {
            return Err(GateError::NotFound(format!("request {id}")));
        }
        self.settle_expiry(request).await
    }

    async fn load(&self, id: &str) -> Result<ApprovalRequest, GateError> {
        self.store
            .get_request(id)
            .await?
            .ok_or_else(|| GateError::NotFound(format!("request {id}")))
    }

    /// Records the timeout of a pending request whose expiry has passed.
    async fn settle_expiry(&self, request: ApprovalRequest) -> Result<ApprovalRequest, GateError> {
        let now = self.now();
        if request.status.is_final() || !request.is_past_expiry(now) {
            return Ok(request);
        }
        // A policy may say what its requests' timeouts become.
        if let Some(decided) = self.fallback(&request).await? {
            return Ok(decided);
        }
        self.apply_or_winner(request.time_out(now)?).await
    }

    /// Applies `transition`; when someone else changed the request first (a person, an
    /// expiry, another instance), returns theirs, which is the truth.
    pub(crate) async fn apply_or_winner(
        &self,
        transition: Transition,
    ) -> Result<ApprovalRequest, GateError> {
        match self.store.apply(&transition.seal(new_salt()?)).await {
            Ok(()) => {
                self.feed.poke();
                // Only ever a pending request's closing (a timeout, a rule's fallback).
                if transition.request.status.is_final() {
                    self.metrics.closed(&transition.request);
                }
                Ok(transition.request)
            }
            Err(StoreError::VersionConflict { current }) => Ok(*current),
            Err(err) => Err(err.into()),
        }
    }

    /// `who`'s pending requests that have not expired (at most `limit` read).
    pub(crate) async fn live_pending_of(
        &self,
        who: &Principal,
        limit: usize,
    ) -> Result<Vec<ApprovalRequest>, GateError> {
        let now = self.now();
        let mut pending = self
            .store
            .list_requests(&RequestQuery {
                status: Some(Status::Pending),
                requested_by: Some(who.id.clone()),
                limit,
            })
            .await?;
        pending.retain(|r| !r.is_past_expiry(now));
        Ok(pending)
    }

    /// One open wait of `who`'s, held until dropped; refused when `who` has
    /// `max_waits_per_token` open already. Every wait (requests, rooms) holds one.
    pub fn hold_wait(&self, who: &Principal) -> Result<Held, GateError> {
        self.admission.waits.open(&who.id)
    }

    /// Waits until the request is decided (or times out, or is cancelled), or until
    /// `timeout` passes, calling `progress` with the time waited every [`PROGRESS_EVERY`].
    /// Woken by the change feed, not by a timer.
    pub async fn wait(
        &self,
        who: &Principal,
        id: &str,
        timeout: Duration,
        progress: &mut (dyn FnMut(Duration) + Send),
    ) -> Result<ApprovalRequest, GateError> {
        let _open = self.hold_wait(who)?;
        // Watch before reading, so a decision committed after the read is always seen.
        let mut watch = self.feed.watch(id);
        // The reads are boxed: a parked waiter then holds a pointer instead of room for a
        // read's state (4 KiB), which matters with thousands of agents waiting at once.
        let mut current = Box::pin(self.get(who, id)).await?;
        let start = Instant::now();
        let deadline = start + timeout;
        let mut next_progress = start + PROGRESS_EVERY;
        let mut woken = false;
        loop {
            if current.status.is_final() {
                if woken {
                    self.metrics.woke(&current, self.now());
                }
                return Ok(current);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(current);
            }
            let to_expiry = self.now().millis_until(current.expires_at).max(0);
            let expiry = now + Duration::from_millis(u64::try_from(to_expiry).unwrap_or(0));
            let wake = deadline.min(expiry).min(next_progress);
            tokio::select! {
                _ = watch.changed() => woken = true,
                _ = self.stopping.cancelled() => return Box::pin(self.get(who, id)).await,
                _ = tokio::time::sleep_until(wake) => {
                    if Instant::now() >= next_progress {
                        progress(start.elapsed());
                        next_progress += PROGRESS_EVERY;
                    }
                }
            }
            current = Box::pin(self.get(who, id)).await?;
        }
    }

    /// A human decision: the one path every surface (REST, dashboard, Slack, email link,
    /// MCP operator tools, CLI) decides through. First decision wins: a decider who loses
    /// a race gets `already_decided` naming who won.
    pub async fn decide(
        &self,
        decider: &Decider,
        id: &str,
        verdict: Verdict,
        input: DecisionInput,
        channel: Channel,
    ) -> Result<ApprovalRequest, GateError> {
        let signer = self.keys.signer();
        self.transition(id, |request, now| {
            self.person_decides(request, decider, verdict, &input, channel, now, &signer)
        })
        .await
    }

    /// `decider`'s decision of `request` at `now`, as the accounts its identities map to
    /// (signed when final; an approval short of a quorum is recorded).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn person_decides(
        &self,
        request: &ApprovalRequest,
        decider: &Decider,
        verdict: Verdict,
        input: &DecisionInput,
        channel: Channel,
        now: Timestamp,
        signer: &countersign_core::keys::Signer,
    ) -> Result<Transition, GateError> {
        let by = decider.principal();
        let accounts = self.accounts_for(request, by);
        Ok(request.decide_as(
            verdict,
            input.clone(),
            by,
            &accounts,
            channel,
            now,
            new_nonce()?,
            signer,
            self.limits(),
        )?)
    }

    /// The accounts `by` and the requester of `request` count as (`[tokens] accounts`,
    /// `[cli] accounts`), and whether `by` is in the group its quorum names.
    pub fn accounts_for(&self, request: &ApprovalRequest, by: &Principal) -> DecisionAccounts {
        DecisionAccounts::mapped(
            request,
            by,
            &self.settings.identities,
            &self.settings.groups,
        )
    }

    /// Decides as [`Gate::decide`], unless the request moved on since the decider saw
    /// version `expected` and is now closed: then says what closed it instead of a
    /// generic `already_decided` (a dashboard's stale page).
    pub async fn decide_seen(
        &self,
        decider: &Decider,
        id: &str,
        expected: Option<u64>,
        verdict: Verdict,
        input: DecisionInput,
        channel: Channel,
    ) -> Result<ApprovalRequest, GateError> {
        if let Some(expected) = expected {
            let current = self.get(decider.principal(), id).await?;
            if current.version != expected
                && let Some(err) = current.closed_error(self.now())
            {
                return Err(err.into());
            }
        }
        self.decide(decider, id, verdict, input, channel).await
    }

    /// Withdraws a pending request (its requester, or an approver).
    pub async fn cancel(&self, who: &Principal, id: &str) -> Result<ApprovalRequest, GateError> {
        // Agents may only touch their own requests.
        self.get(who, id).await?;
        self.transition(id, |request, now| Ok(request.cancel(who, now)?))
            .await
    }

    /// Records that the approved action is being carried out, consuming the approval.
    pub async fn record_action(
        &self,
        who: &Principal,
        id: &str,
        tool: String,
        details: BTreeMap<String, String>,
    ) -> Result<ApprovalRequest, GateError> {
        self.get(who, id).await?;
        self.transition(id, |request, now| {
            Ok(request.record_action(tool.clone(), details.clone(), who, now, self.limits())?)
        })
        .await
    }

    /// Reads, computes and applies a transition, retrying when the request changed in
    /// between; when it can no longer apply, the domain's error says why.
    async fn transition<F>(&self, id: &str, step: F) -> Result<ApprovalRequest, GateError>
    where
        F: Fn(&ApprovalRequest, Timestamp) -> Result<Transition, GateError>,
    {
        let mut request = self.settle_expiry(self.load(id).await?).await?;
        for _ in 0..CAS_TRIES {
            let transition = step(&request, self.now())?;
            match self.store.apply(&transition.seal(new_salt()?)).await {
                Ok(()) => {
                    self.feed.poke();
                    if !request.status.is_final() && transition.request.status.is_final() {
                        self.metrics.closed(&transition.request);
                    }
                    return Ok(transition.request);
                }
                Err(StoreError::VersionConflict { current }) => request = *current,
                Err(err) => return Err(err.into()),
            }
        }
        // Still contended: evaluate once more so the caller gets the domain's reason.
        step(&request, self.now())?;
        Err(GateError::Unavailable(format!(
            "request {id} kept changing; retry"
        )))
    }

    /// `who`'s own requests (of `status`, newest first, at most `limit`): what an agent
    /// may list of the requests, since it sees only its own (a remote bridge picks up
    /// its open requests so).
    pub async fn own_requests(
        &self,
        who: &Principal,
        status: Option<Status>,
        limit: usize,
    ) -> Result<Vec<ApprovalRequest>, GateError> {
        let query = RequestQuery {
            status,
            requested_by: Some(who.id.clone()),
            limit,
        };
        let mut requests = self.store.list_requests(&query).await?;
        if status == Some(Status::Pending) {
            let now = self.now();
            requests.retain(|r| !r.is_past_expiry(now));
        }
        Ok(requests)
    }

    pub async fn list(
        &self,
        _decider: &Decider,
        query: &RequestQuery,
    ) -> Result<Vec<ApprovalRequest>, GateError> {
        let mut requests = self.store.list_requests(query).await?;
        let now = self.now();
        // Present stale pending requests as what they are, even before the sweeper runs.
        if query.status == Some(Status::Pending) {
            requests.retain(|r| !r.is_past_expiry(now));
        }
        Ok(requests)
    }
}
