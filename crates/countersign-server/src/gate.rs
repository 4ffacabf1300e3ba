//! The gate: the one application service behind every way in (REST, MCP over HTTP and
//! stdio, the CLI). It loads state from the store, lets the domain compute each
//! transition, and applies it with a compare-and-swap, so the rules live in one place.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use countersign_core::bundle::{BundleReport, Mode};
use countersign_core::evidence::{
    DecisionRecordInput, OutcomeStatus, ReviewVerdict, Reviewer, decision_record,
};
use countersign_core::proof::{self, VerifyOptions};
use countersign_core::token::{format_token, hash_token, token_matches, validate_token_name};
use countersign_core::{
    Action, ApprovalRequest, Channel, Clock, CoreError, DecisionInput, Envelope, Event, EventKind,
    Jwks, Limits, NewRequest, Principal, Role, TokenRecord, Transition, Verdict, VerifyReport,
};
use countersign_store::{ChangeFeed, Created, RequestQuery, Store, StoreError};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::accounts::Accounts;
use crate::error::GateError;
use crate::keyring::KeyRing;
use crate::log::TransparencyLog;

/// How often a waiting call reports progress (MCP asks for at least every 10 s).
pub const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// How many times a transition is retried when the request changed for an unrelated
/// reason between read and write.
const CAS_RETRIES: usize = 5;

/// A principal allowed to decide requests. The only way to get one is from a principal
/// whose role may decide, so a decision path cannot be reached with an agent credential.
#[derive(Debug, Clone)]
pub struct Decider(Principal);

impl Decider {
    pub fn new(principal: Principal) -> Result<Self, GateError> {
        if principal.role.may_decide() {
            Ok(Self(principal))
        } else {
            Err(GateError::Forbidden(format!(
                "{} holds an agent credential; deciding requires an approver or admin token",
                principal.id
            )))
        }
    }

    pub fn principal(&self) -> &Principal {
        &self.0
    }
}

/// The outcome of `request_approval`.
#[derive(Debug, Clone)]
pub struct Requested {
    pub request: ApprovalRequest,
    /// True when an earlier request with the same idempotency key was returned.
    pub existing: bool,
}

/// What an operator decides about the gate's behaviour. `Settings::default()` states
/// each default once; the binary's config starts from it.
#[derive(Debug, Clone)]
pub struct Settings {
    pub limits: Limits,
    /// When set, `record_review` is available and records this reviewer.
    pub reviewer: Option<Reviewer>,
    /// Whether evidence bundles may include raw payloads (mode `full`).
    pub raw_payload_export: bool,
    /// Where purged rooms' backups are written.
    pub backup_dir: Option<std::path::PathBuf>,
    /// How long a dashboard session lasts, in seconds.
    pub session_seconds: u64,
}

/// How long a dashboard session lasts unless configured otherwise.
pub const DEFAULT_SESSION_SECONDS: u64 = 12 * 3600;

impl Default for Settings {
    fn default() -> Self {
        Self {
            limits: Limits::default(),
            reviewer: None,
            raw_payload_export: false,
            backup_dir: None,
            session_seconds: DEFAULT_SESSION_SECONDS,
        }
    }
}

pub struct Gate {
    store: Arc<dyn Store>,
    feed: ChangeFeed,
    keys: Arc<KeyRing>,
    clock: Arc<dyn Clock>,
    log: Arc<TransparencyLog>,
    accounts: Accounts,
    settings: Settings,
    limits: Limits,
    /// Cancelled when the process shuts down: waits return the current state at once.
    stopping: CancellationToken,
}

impl Gate {
    pub fn new(
        store: Arc<dyn Store>,
        feed: ChangeFeed,
        keys: Arc<KeyRing>,
        clock: Arc<dyn Clock>,
        log: Arc<TransparencyLog>,
        settings: Settings,
    ) -> Result<Self, GateError> {
        if settings.session_seconds == 0 {
            return Err(GateError::BadInput(
                "a dashboard session must last at least a second".into(),
            ));
        }
        Ok(Self {
            accounts: Accounts::new(store.clone(), clock.clone(), settings.session_seconds)?,
            store,
            feed,
            keys,
            clock,
            log,
            limits: settings.limits.clone(),
            settings,
            stopping: CancellationToken::new(),
        })
    }

    /// The dashboard's accounts and sessions.
    pub fn accounts(&self) -> &Accounts {
        &self.accounts
    }

    /// Resolves when the process begins shutting down.
    pub(crate) async fn stopping(&self) {
        self.stopping.cancelled().await
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

    pub fn log(&self) -> &Arc<TransparencyLog> {
        &self.log
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Every key that may have signed here (this process's and every one published in
    /// the database), as served at `/.well-known/jwks.json`.
    pub async fn jwks(&self) -> Result<Jwks, GateError> {
        Ok(crate::keyring::published_jwks(&*self.store, &self.keys).await?)
    }

    /// Creates a pending request, or returns the earlier one for a retried idempotency key.
    pub async fn request_approval(
        &self,
        who: &Principal,
        new: NewRequest,
    ) -> Result<Requested, GateError> {
        let now = self.clock.now();
        let transition = ApprovalRequest::create(new_id("req", now)?, new, who, now, &self.limits)?;
        match self
            .store
            .create_request(&transition.seal(new_salt()?))
            .await?
        {
            Created::New(request) => {
                self.feed.poke();
                if let Some(room) = &request.room {
                    // Shown in its room too, so the people there see what waits.
                    self.post_approval(who, room, &request).await?;
                }
                Ok(Requested {
                    request,
                    existing: false,
                })
            }
            Created::Existing(request) => {
                if request.action_digest != transition.request.action_digest {
                    return Err(CoreError::IdempotencyMismatch {
                        key: request.idempotency_key.clone().unwrap_or_default(),
                        request_id: request.id,
                    }
                    .into());
                }
                Ok(Requested {
                    request,
                    existing: true,
                })
            }
        }
    }

    /// The request as `who` may see it, timed out first if its expiry has passed.
    /// Agents see only their own requests; to them, others' do not exist.
    pub async fn get(&self, who: &Principal, id: &str) -> Result<ApprovalRequest, GateError> {
        let request = self.load(id).await?;
        if who.role == Role::Agent && request.requested_by.id != who.id {
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
        let now = self.clock.now();
        if request.status.is_final() || !request.is_past_expiry(now) {
            return Ok(request);
        }
        let transition = request.time_out(now)?;
        match self.store.apply(&transition.seal(new_salt()?)).await {
            Ok(()) => {
                self.feed.poke();
                Ok(transition.request)
            }
            // Someone else decided or timed it out first; theirs is the truth.
            Err(StoreError::VersionConflict { current }) => Ok(*current),
            Err(err) => Err(err.into()),
        }
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
        // Watch before reading, so a decision committed after the read is always seen.
        let mut watch = self.feed.watch(id);
        // The reads are boxed: a parked waiter then holds a pointer instead of room for a
        // read's state (4 KiB), which matters with thousands of agents waiting at once.
        let mut current = Box::pin(self.get(who, id)).await?;
        let start = Instant::now();
        let deadline = start + timeout;
        let mut next_progress = start + PROGRESS_EVERY;
        loop {
            if current.status.is_final() {
                return Ok(current);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(current);
            }
            let to_expiry = self.clock.now().millis_until(current.expires_at).max(0);
            let expiry = now + Duration::from_millis(u64::try_from(to_expiry).unwrap_or(0));
            let wake = deadline.min(expiry).min(next_progress);
            tokio::select! {
                _ = watch.changed() => {}
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

    /// A human decision. First decision wins: a decider who loses a race gets
    /// `already_decided` naming who won.
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
            Ok(request.decide(
                verdict,
                input.clone(),
                decider.principal(),
                channel,
                now,
                new_nonce()?,
                &signer,
                &self.limits,
            )?)
        })
        .await
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
            Ok(request.record_action(tool.clone(), details.clone(), who, now, &self.limits)?)
        })
        .await
    }

    /// Reads, computes and applies a transition, retrying when the request changed in
    /// between; when it can no longer apply, the domain's error says why.
    async fn transition<F>(&self, id: &str, step: F) -> Result<ApprovalRequest, GateError>
    where
        F: Fn(&ApprovalRequest, countersign_core::Timestamp) -> Result<Transition, GateError>,
    {
        let mut request = self.settle_expiry(self.load(id).await?).await?;
        for _ in 0..CAS_RETRIES {
            let transition = step(&request, self.clock.now())?;
            match self.store.apply(&transition.seal(new_salt()?)).await {
                Ok(()) => {
                    self.feed.poke();
                    return Ok(transition.request);
                }
                Err(StoreError::VersionConflict { current }) => request = *current,
                Err(err) => return Err(err.into()),
            }
        }
        // Still contended: evaluate once more so the caller gets the domain's reason.
        step(&request, self.clock.now())?;
        Err(GateError::Store(StoreError::Unavailable(format!(
            "request {id} kept changing; retry"
        ))))
    }

    /// Verifies a proof against the published keys; when it names a request this
    /// server knows, also reports whether its approval was already used.
    pub async fn verify_proof(
        &self,
        envelope: &Envelope,
        action: Option<&Action>,
    ) -> Result<VerifyReport, GateError> {
        let statement = envelope.unverified_statement();
        let used = match &statement {
            Some(s) => self
                .store
                .get_request(&s.request_id)
                .await?
                .filter(|r| r.action_digest == s.action_digest)
                .and_then(|r| r.action_record)
                .map(|a| (a.recorded_at, a.tool)),
            None => None,
        };
        let options = VerifyOptions {
            now: Some(self.clock.now()),
            expected_action: action,
            used,
        };
        let mut report = proof::verify(envelope, &self.jwks().await?, &options);
        if report
            .reasons
            .iter()
            .any(|r| r.code == countersign_core::ProblemCode::UnknownKey)
        {
            // Another process may have rotated the key since we loaded it.
            if self.keys.reload().is_ok() {
                report = proof::verify(envelope, &self.jwks().await?, &options);
            }
        }
        Ok(report)
    }

    pub async fn list(
        &self,
        _decider: &Decider,
        query: &RequestQuery,
    ) -> Result<Vec<ApprovalRequest>, GateError> {
        let mut requests = self.store.list_requests(query).await?;
        let now = self.clock.now();
        // Present stale pending requests as what they are, even before the sweeper runs.
        if query.status == Some(countersign_core::Status::Pending) {
            requests.retain(|r| !r.is_past_expiry(now));
        }
        Ok(requests)
    }

    /// Times out every pending request whose expiry has passed; returns how many.
    pub async fn expire_due(&self) -> Result<usize, GateError> {
        let mut expired = 0;
        loop {
            let due = self.store.due_for_expiry(self.clock.now(), 256).await?;
            let batch = due.len();
            for request in due {
                if self.settle_expiry(request).await?.status == countersign_core::Status::TimedOut {
                    expired += 1;
                }
            }
            if batch < 256 {
                return Ok(expired);
            }
        }
    }

    /// Runs [`Gate::expire_due`] whenever the next expiry falls due (at least every
    /// second), until `shutdown`.
    pub async fn run_expiry(self: Arc<Self>, shutdown: tokio_util::sync::CancellationToken) {
        loop {
            let delay = match self.store.next_expiry().await {
                Ok(Some(at)) => self.clock.now().millis_until(at).clamp(0, 1000),
                Ok(None) => 1000,
                Err(err) => {
                    tracing::warn!(%err, "could not read the next expiry");
                    1000
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_millis(delay.unsigned_abs())) => {}
            }
            if let Err(err) = self.expire_due().await {
                tracing::warn!(%err, "expiry sweep failed; retrying");
            }
        }
    }

    /// Creates a token and returns it with its secret, which is shown once and never
    /// stored.
    pub async fn create_token(
        &self,
        name: &str,
        role: Role,
        actor: &Principal,
    ) -> Result<(TokenRecord, String), GateError> {
        validate_token_name(name).map_err(GateError::BadInput)?;
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret)
            .map_err(|e| GateError::Store(StoreError::Backend(format!("randomness: {e}"))))?;
        let token = format_token(secret);
        let now = self.clock.now();
        let record = TokenRecord {
            id: new_short_id("tok")?,
            name: name.to_string(),
            role,
            hash: hash_token(&token),
            created_at: now,
            revoked_at: None,
        };
        let event = Event::system(
            EventKind::TokenCreated,
            now,
            Some(actor.id.clone()),
            serde_json::json!({"token_id": record.id, "name": record.name, "role": role}),
        );
        self.store
            .create_token(&record, &event.seal(new_salt()?))
            .await?;
        self.feed.poke();
        Ok((record, token))
    }

    pub async fn list_tokens(&self) -> Result<Vec<TokenRecord>, GateError> {
        Ok(self.store.list_tokens().await?)
    }

    /// Revokes a token by id, or by name when exactly one active token has that name.
    pub async fn revoke_token(
        &self,
        id_or_name: &str,
        actor: &Principal,
    ) -> Result<TokenRecord, GateError> {
        let tokens = self.store.list_tokens().await?;
        let target = match tokens.iter().find(|t| t.id == id_or_name) {
            Some(t) => t.clone(),
            None => {
                let active: Vec<_> = tokens
                    .iter()
                    .filter(|t| t.name == id_or_name && t.is_active())
                    .collect();
                match active.as_slice() {
                    [one] => (*one).clone(),
                    [] => {
                        return Err(GateError::BadInput(format!(
                            "no token with id or active name {id_or_name:?}; `countersign token list` shows them"
                        )));
                    }
                    _ => {
                        return Err(GateError::BadInput(format!(
                            "{} active tokens are named {id_or_name:?}; revoke by id",
                            active.len()
                        )));
                    }
                }
            }
        };
        let now = self.clock.now();
        let event = Event::system(
            EventKind::TokenRevoked,
            now,
            Some(actor.id.clone()),
            serde_json::json!({"token_id": target.id, "name": target.name}),
        );
        let revoked = self
            .store
            .revoke_token(&target.id, now, &event.seal(new_salt()?))
            .await?;
        self.feed.poke();
        Ok(revoked)
    }

    /// The principal behind a bearer token. Unknown and revoked tokens are refused alike.
    pub async fn authenticate(&self, token: &str) -> Result<Principal, GateError> {
        let refused = || {
            GateError::Unauthenticated(
                "the bearer token is not valid (unknown or revoked)".to_string(),
            )
        };
        if !token.starts_with(countersign_core::token::TOKEN_PREFIX) || token.len() > 256 {
            return Err(refused());
        }
        let record = self
            .store
            .token_by_hash(&hash_token(token))
            .await?
            .ok_or_else(refused)?;
        if !record.is_active() || !token_matches(token, &record.hash) {
            return Err(refused());
        }
        Ok(record.principal())
    }

    /// Records what came of the approved action (once, by the requester, after
    /// `record_action`).
    pub async fn record_outcome(
        &self,
        who: &Principal,
        id: &str,
        status: OutcomeStatus,
        summary: Option<String>,
        details: BTreeMap<String, String>,
    ) -> Result<ApprovalRequest, GateError> {
        self.get(who, id).await?;
        self.transition(id, |request, now| {
            Ok(request.record_outcome(
                status,
                summary.clone(),
                details.clone(),
                who,
                now,
                &self.limits,
            )?)
        })
        .await
    }

    /// Records a review as the operator-configured reviewer. Off unless configured.
    pub async fn record_review(
        &self,
        who: &Principal,
        id: &str,
        verdict: ReviewVerdict,
        notes: Option<String>,
    ) -> Result<ApprovalRequest, GateError> {
        let reviewer = self.settings.reviewer.clone().ok_or_else(|| {
            GateError::Forbidden(
                "record_review is off on this server (an operator enables it with [review] in the config)".into(),
            )
        })?;
        self.get(who, id).await?;
        self.transition(id, |request, now| {
            Ok(request.record_review(&reviewer, verdict, notes.clone(), who, now, &self.limits)?)
        })
        .await
    }

    /// Records a decision an agent or system made on its own, under a new subject id;
    /// returns the id and the entry's log index.
    pub async fn record_decision(
        &self,
        who: &Principal,
        input: DecisionRecordInput,
    ) -> Result<(String, u64), GateError> {
        let now = self.clock.now();
        if let Some(related) = &input.related_request {
            self.get(who, related).await?;
        }
        let id = new_id("dec", now)?;
        let event = decision_record(&id, input, who, now, &self.limits)?;
        let seq = self.store.append_event(&event.seal(new_salt()?)).await?;
        self.feed.poke();
        Ok((id, seq - 1))
    }

    /// An evidence bundle for a request (`req_...`) or a recorded decision (`dec_...`).
    pub async fn evidence(
        &self,
        who: &Principal,
        subject: &str,
        mode: Mode,
    ) -> Result<Vec<u8>, GateError> {
        if mode == Mode::Full && !self.settings.raw_payload_export {
            return Err(GateError::Forbidden(
                "raw payload export is off on this server: export a redacted bundle, or an operator sets [evidence] raw_payload_export = true".into(),
            ));
        }
        let decisions = if subject.starts_with("dec_") {
            let events = self.store.events_of_subject(subject).await?;
            let first = events
                .first()
                .ok_or_else(|| GateError::NotFound(subject.to_string()))?;
            if who.role == Role::Agent && first.entry.actor.as_deref() != Some(who.id.as_str()) {
                return Err(GateError::NotFound(subject.to_string()));
            }
            Vec::new()
        } else {
            self.get(who, subject).await?.proof.into_iter().collect()
        };
        self.log.bundle(subject, mode, decisions).await
    }

    /// Starts signing with a new key (the old one stays published) and logs it.
    pub async fn rotate_key(&self, actor: &Principal) -> Result<(String, String), GateError> {
        let (old, new) = self
            .keys
            .rotate(self.clock.now())
            .map_err(|e| GateError::Store(StoreError::Backend(e.to_string())))?;
        crate::keyring::publish(&*self.store, &self.keys).await?;
        let event = Event::system(
            EventKind::KeyRotated,
            self.clock.now(),
            Some(actor.id.clone()),
            serde_json::json!({"old_kid": old, "new_kid": new}),
        );
        self.store.append_event(&event.seal(new_salt()?)).await?;
        self.feed.poke();
        Ok((old, new))
    }

    /// Verifies a bundle against this server's published keys.
    pub async fn verify_evidence(&self, zip: &[u8]) -> Result<BundleReport, GateError> {
        Ok(countersign_core::bundle::verify(
            zip,
            Some(&self.jwks().await?),
        ))
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }
}

fn random_bytes<const N: usize>() -> Result<[u8; N], GateError> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes)
        .map_err(|e| GateError::Store(StoreError::Backend(format!("randomness: {e}"))))?;
    Ok(bytes)
}

/// A fresh salt for an event's payload commitment.
pub(crate) fn new_salt() -> Result<[u8; 32], GateError> {
    random_bytes::<32>()
}

/// A fresh proof nonce: 16 random bytes, base64url.
fn new_nonce() -> Result<String, GateError> {
    Ok(URL_SAFE_NO_PAD.encode(random_bytes::<16>()?))
}

/// `prefix_` + a time-ordered UUIDv7 in hex: sortable, unique across processes.
fn new_id(prefix: &str, now: countersign_core::Timestamp) -> Result<String, GateError> {
    let random = random_bytes::<10>()?;
    let millis = u64::try_from(now.millis()).unwrap_or(0);
    let uuid = uuid::Builder::from_unix_timestamp_millis(millis, &random).into_uuid();
    Ok(format!("{prefix}_{}", uuid.simple()))
}

fn new_short_id(prefix: &str) -> Result<String, GateError> {
    Ok(format!("{prefix}_{}", hex::encode(random_bytes::<8>()?)))
}
