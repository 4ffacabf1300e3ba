//! Dashboard accounts: people who decide, signing in with a password. The rules
//! (usernames, lockouts, expiry) are `countersign_core::accounts`; this service stores
//! accounts, sessions and invitations as typed documents, hashes passwords with
//! Argon2id, and keeps session and invitation tokens only as SHA-256 hashes. Agents have
//! tokens, not accounts, so no agent credential can sign in.

use std::sync::Arc;

use argon2::Argon2;
use argon2::password_hash::{PasswordHasher, PasswordVerifier};
use countersign_core::accounts::{
    Invite, InvitePurpose, Session, User, validate_display_name, validate_password,
    validate_username,
};
use countersign_core::token::hash_token;
use countersign_core::{Clock, Event, EventKind, Principal, Role, SealedEvent};
use countersign_store::{Docs, Step, Store, StoreError, Stored, collection, kinds};
use serde_json::json;

use crate::error::GateError;
use crate::ids::{new_salt, random_token, short_id};

pub use countersign_core::accounts::MIN_PASSWORD_CHARS;

/// How long an invitation link works.
pub const INVITE_SECONDS: u64 = 24 * 3600;

collection!(
    /// Accounts, by id; keyed by username.
    pub UserDocs: kinds::USER => User
);

collection!(
    /// Sessions, `{user_id}/{hash prefix}`; keyed by the session token's hash.
    SessionDocs: kinds::SESSION => Session
);

collection!(
    /// Setup and invitation links, keyed by the link token's hash.
    InviteDocs: kinds::INVITE => Invite
);

collection!(
    /// Claims of the first-admin slot: of two setup links accepted at once (say on two
    /// instances), exactly one creates the admin. The body is the claiming username.
    SetupClaimDocs: kinds::SETUP_CLAIM => String
);

/// The id of the one setup link [`Accounts::setup_link_once`] keeps.
const SETUP_LINK_ID: &str = "setup";

/// What [`Accounts::setup_link_once`] found or made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetupLink {
    /// A new link's token.
    New(String),
    /// A link printed before still works until then (its token is not stored, only
    /// its hash, so it cannot be shown again).
    Pending {
        expires_at: countersign_core::Timestamp,
    },
}

/// What every refused sign-in says (see [`Accounts::sign_in`]).
pub const SIGN_IN_REFUSED: &str = "wrong username or password, or too many failed sign-ins (an account locks for 15 minutes after 5 in a row)";

/// What a sign-in attempt came to.
#[derive(Debug)]
pub enum SignIn {
    Ok { user: User, session_token: String },
    Refused(String),
}

pub struct Accounts {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    /// How long a session lasts.
    session_seconds: u64,
    /// Sessions one account may hold; signing in past it ends the oldest.
    max_sessions: usize,
    /// A hash to verify against when the username is unknown, so that timing does not
    /// tell which usernames exist.
    decoy_hash: String,
}

fn hash_password(password: &str) -> Result<String, GateError> {
    Argon2::default()
        .hash_password(password.as_bytes())
        .map(|h| h.to_string())
        .map_err(|e| GateError::internal("password hashing", e))
}

/// Argon2 is deliberately slow: run it off the async workers.
async fn hash_password_blocking(password: &str) -> Result<String, GateError> {
    let password = password.to_string();
    tokio::task::spawn_blocking(move || hash_password(&password))
        .await
        .map_err(|e| GateError::internal("password hashing", e))?
}

async fn verify_blocking(password: &str, hash: &str) -> bool {
    let (password, hash) = (password.to_string(), hash.to_string());
    tokio::task::spawn_blocking(move || {
        Argon2::default()
            .verify_password(password.as_bytes(), hash.as_str())
            .is_ok()
    })
    .await
    .unwrap_or(false)
}

fn taken(username: &str) -> impl Fn(StoreError) -> GateError + '_ {
    move |e| match e {
        StoreError::Duplicate(_) => {
            GateError::BadInput(format!("the username {username} is taken"))
        }
        other => other.into(),
    }
}

impl Accounts {
    pub fn new(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        session_seconds: u64,
        max_sessions: usize,
    ) -> Result<Self, GateError> {
        Ok(Self {
            store,
            clock,
            session_seconds,
            max_sessions,
            decoy_hash: hash_password(&random_token()?)?,
        })
    }

    pub fn session_seconds(&self) -> u64 {
        self.session_seconds
    }

    fn users_docs(&self) -> Docs<'_, UserDocs> {
        Docs::new(&*self.store)
    }

    fn event(&self, kind: EventKind, actor: &str, user: &User) -> Result<SealedEvent, GateError> {
        let event = Event::system(
            kind,
            self.clock.now(),
            Some(actor.to_string()),
            json!({"user_id": user.id, "username": user.username, "role": user.role}),
        );
        Ok(event.seal(new_salt()?))
    }

    pub async fn users(&self) -> Result<Vec<User>, GateError> {
        Ok(self
            .users_docs()
            .list("", 10_000)
            .await?
            .into_iter()
            .map(|d| d.body)
            .collect())
    }

    pub async fn user(&self, id: &str) -> Result<Option<User>, GateError> {
        Ok(self.users_docs().get(id).await?.map(|d| d.body))
    }

    pub async fn user_by_name(&self, username: &str) -> Result<Option<User>, GateError> {
        let name = username.trim().to_ascii_lowercase();
        Ok(self.users_docs().by_key(&name).await?.map(|d| d.body))
    }

    /// An active account that may decide, by username (what Slack and email approvers
    /// are mapped to), authenticated as `how`.
    pub async fn decider(
        &self,
        username: &str,
        how: countersign_core::AuthMethod,
    ) -> Result<Option<countersign_core::Decider>, GateError> {
        Ok(self
            .user_by_name(username)
            .await?
            .filter(User::may_decide)
            .and_then(|u| countersign_core::Decider::new(u.principal().authenticated_by(how)).ok()))
    }

    /// Whether an active admin account exists (if not, `serve` offers a setup link).
    pub async fn has_admin(&self) -> Result<bool, GateError> {
        Ok(self
            .users()
            .await?
            .iter()
            .any(|u| u.role == Role::Admin && u.is_active()))
    }

    async fn new_invite(
        &self,
        purpose: InvitePurpose,
        role: Role,
        user_id: Option<String>,
        valid_seconds: u64,
    ) -> Result<String, GateError> {
        let token = random_token()?;
        let now = self.clock.now();
        let invite = Invite {
            purpose,
            role,
            user_id,
            expires_at: now.plus_seconds(valid_seconds),
        };
        Docs::<InviteDocs>::new(&*self.store)
            .insert(
                &short_id("inv")?,
                Some(hash_token(&token)),
                &invite,
                now,
                None,
            )
            .await?;
        Ok(token)
    }

    /// A one-time link token to create the first admin.
    pub async fn setup_token(&self, valid_seconds: u64) -> Result<String, GateError> {
        self.new_invite(InvitePurpose::Setup, Role::Admin, None, valid_seconds)
            .await
    }

    /// The first-admin setup link `serve` prints when there is no admin yet: a new one
    /// only if none is pending, so that restarting the server does not leave a trail of
    /// working links behind. The link is stored under one fixed id, so two instances
    /// starting at once mint one between them.
    pub async fn setup_link_once(&self, valid_seconds: u64) -> Result<SetupLink, GateError> {
        let invites = Docs::<InviteDocs>::new(&*self.store);
        let now = self.clock.now();
        if let Some(pending) = invites.get(SETUP_LINK_ID).await? {
            if !pending.body.is_expired(now) {
                return Ok(SetupLink::Pending {
                    expires_at: pending.body.expires_at,
                });
            }
            invites.delete(SETUP_LINK_ID).await?;
        }
        let token = random_token()?;
        let invite = Invite {
            purpose: InvitePurpose::Setup,
            role: Role::Admin,
            user_id: None,
            expires_at: now.plus_seconds(valid_seconds),
        };
        match invites
            .insert(SETUP_LINK_ID, Some(hash_token(&token)), &invite, now, None)
            .await
        {
            Ok(()) => Ok(SetupLink::New(token)),
            // Another instance minted it a moment ago.
            Err(StoreError::Duplicate(_)) => Ok(SetupLink::Pending {
                expires_at: invites
                    .get(SETUP_LINK_ID)
                    .await?
                    .map_or(invite.expires_at, |d| d.body.expires_at),
            }),
            Err(err) => Err(err.into()),
        }
    }

    /// Creates an account waiting for its holder, and the one-time token that activates it.
    pub async fn invite(
        &self,
        username: &str,
        display_name: Option<&str>,
        role: Role,
        actor: &Principal,
        valid_seconds: u64,
    ) -> Result<(User, String), GateError> {
        let now = self.clock.now();
        let user = User::new(short_id("usr")?, username, display_name, role, None, now)?;
        let event = self.event(EventKind::UserCreated, &actor.id, &user)?;
        self.users_docs()
            .insert(
                &user.id,
                Some(user.username.clone()),
                &user,
                now,
                Some(&event),
            )
            .await
            .map_err(taken(&user.username))?;
        let token = self
            .new_invite(
                InvitePurpose::Invite,
                role,
                Some(user.id.clone()),
                valid_seconds,
            )
            .await?;
        Ok((user, token))
    }

    /// Accepts a setup or invitation token: sets the password (and, for setup, creates
    /// the admin). The token works once.
    pub async fn accept(
        &self,
        token: &str,
        username: Option<&str>,
        display_name: Option<&str>,
        password: &str,
    ) -> Result<User, GateError> {
        validate_password(password)?;
        let refused = || {
            GateError::Unauthenticated(
                "this link is not valid (used, expired or mistyped); ask for a new one".into(),
            )
        };
        let invites = Docs::<InviteDocs>::new(&*self.store);
        let read = invites
            .by_key(&hash_token(token))
            .await?
            .ok_or_else(refused)?;
        let now = self.clock.now();
        // Consume first: a second use of the same link finds nothing.
        if !invites.delete(&read.id).await? || read.body.is_expired(now) {
            return Err(refused());
        }
        let password_hash = Some(hash_password_blocking(password).await?);
        match (read.body.purpose, read.body.user_id) {
            (InvitePurpose::Setup, _) => {
                self.first_admin(username, display_name, password_hash)
                    .await
            }
            (InvitePurpose::Invite, Some(user_id)) => {
                let mut stored = self.users_docs().get(&user_id).await?.ok_or_else(refused)?;
                if stored.body.disabled {
                    return Err(refused());
                }
                let user = &mut stored.body;
                if let Some(name) = display_name.filter(|n| !n.trim().is_empty()) {
                    user.display_name = validate_display_name(name)?;
                }
                user.password_hash = password_hash;
                let event = self.event(EventKind::UserActivated, &user.principal().id, user)?;
                self.save(&stored, Some(&event)).await?;
                Ok(stored.body)
            }
            (InvitePurpose::Invite, None) => Err(refused()),
        }
    }

    /// A setup link is for the first admin only. Every instance started before there is
    /// one prints a link of its own; once any of them (or `countersign user add`) has
    /// made an admin, the others are dead.
    async fn first_admin(
        &self,
        username: Option<&str>,
        display_name: Option<&str>,
        password_hash: Option<String>,
    ) -> Result<User, GateError> {
        let now = self.clock.now();
        let username = validate_username(username.unwrap_or_default())?;
        let already = || {
            GateError::Unauthenticated(
                "an admin account already exists, so this setup link no longer works; \
                 ask an admin to invite you"
                    .into(),
            )
        };
        let users = self.users().await?;
        if users.iter().any(|u| u.role == Role::Admin && u.is_active()) {
            return Err(already());
        }
        // Two links accepted at once both see no admin: the claim decides. Its id counts
        // the admins ever made, so a later setup (the only admin disabled) claims afresh.
        let admins_ever = users.iter().filter(|u| u.role == Role::Admin).count();
        let claim_id = format!("first-admin-{admins_ever}");
        let claims = Docs::<SetupClaimDocs>::new(&*self.store);
        match claims.insert(&claim_id, None, &username, now, None).await {
            Ok(()) => {}
            Err(StoreError::Duplicate(_)) => return Err(already()),
            Err(other) => return Err(other.into()),
        }
        let user = User::new(
            short_id("usr")?,
            &username,
            display_name,
            Role::Admin,
            password_hash,
            now,
        )?;
        let event = self.event(EventKind::UserCreated, &user.principal().id, &user)?;
        if let Err(err) = self
            .users_docs()
            .insert(
                &user.id,
                Some(user.username.clone()),
                &user,
                now,
                Some(&event),
            )
            .await
        {
            // Free the slot for another try (best effort: if this fails too, the CLI's
            // `user add --role admin` still works).
            let _ = claims.delete(&claim_id).await;
            return Err(taken(&user.username)(err));
        }
        Ok(user)
    }

    /// Writes the account read as `read` with its changed body.
    async fn save(
        &self,
        read: &Stored<User>,
        event: Option<&SealedEvent>,
    ) -> Result<(), GateError> {
        self.users_docs()
            .update_keyed(
                read,
                Some(read.body.username.clone()),
                &read.body,
                self.clock.now(),
                event,
            )
            .await?;
        Ok(())
    }

    /// Checks a username and password; on success opens a session. Every refusal but
    /// "disabled" (which needs the right password) is [`SIGN_IN_REFUSED`] after the same
    /// work, so answers tell nothing about which usernames exist or are locked.
    pub async fn sign_in(&self, username: &str, password: &str) -> Result<SignIn, GateError> {
        let refused = || SignIn::Refused(SIGN_IN_REFUSED.to_string());
        let name = username.trim().to_ascii_lowercase();
        let Some(stored) = self.users_docs().by_key(&name).await? else {
            // Spend the same time as a real check.
            verify_blocking(password, &self.decoy_hash).await;
            return Ok(refused());
        };
        let now = self.clock.now();
        if stored.body.locked_at(now).is_some() {
            verify_blocking(password, &self.decoy_hash).await;
            return Ok(refused());
        }
        let verified = match &stored.body.password_hash {
            Some(hash) => verify_blocking(password, hash).await,
            None => {
                verify_blocking(password, &self.decoy_hash).await;
                false
            }
        };
        if verified && stored.body.disabled {
            return Ok(SignIn::Refused("this account is disabled".into()));
        }
        if !verified {
            self.count_failure(&stored.id, now).await;
            return Ok(refused());
        }
        // The failures of attempts made at the same time may have locked the account
        // since it was read: clear the count only if it is still unlocked, in the same
        // compare-and-swap.
        let unlocked = self
            .users_docs()
            .modify(&stored.id, now, |current| -> Result<_, GateError> {
                let Some(current) = current else {
                    return Ok(Step::Done(None));
                };
                if current.body.locked_at(now).is_some() {
                    return Ok(Step::Done(None));
                }
                let mut body = current.body.clone();
                if !body.clear_failures() {
                    return Ok(Step::Done(Some(body)));
                }
                Ok(Step::Write {
                    then: Some(body.clone()),
                    body,
                    event: None,
                })
            })
            .await?;
        let Some(user) = unlocked else {
            return Ok(refused());
        };
        let token = random_token()?;
        let session = Session::new(&user.id, random_token()?, now, self.session_seconds);
        let hash = hash_token(&token);
        let id = format!("{}/{}", user.id, &hash[..16]);
        Docs::<SessionDocs>::new(&*self.store)
            .insert(&id, Some(hash), &session, now, None)
            .await?;
        self.evict_oldest_sessions(&user.id).await;
        Ok(SignIn::Ok {
            user,
            session_token: token,
        })
    }

    /// Ends the account's oldest sessions beyond `max_sessions` (the new one is kept:
    /// signing in on another device is never refused for sessions left open elsewhere).
    async fn evict_oldest_sessions(&self, user_id: &str) {
        let sessions = Docs::<SessionDocs>::new(&*self.store);
        // Past the cap by a few at most, so a page a little larger than it reads all.
        let listed = match sessions
            .list(
                &format!("{user_id}/"),
                self.max_sessions.saturating_mul(2) + 16,
            )
            .await
        {
            Ok(listed) => listed,
            Err(err) => {
                tracing::warn!(%err, "could not list the sessions of {user_id}");
                return;
            }
        };
        if listed.len() <= self.max_sessions {
            return;
        }
        let mut by_age: Vec<_> = listed
            .iter()
            .map(|s| (s.body.created_at, s.id.clone()))
            .collect();
        by_age.sort();
        for (_, id) in by_age.iter().take(listed.len() - self.max_sessions) {
            if let Err(err) = sessions.delete(id).await {
                tracing::warn!(%err, "could not end the old session {id}");
            }
        }
    }

    /// Counts a failed sign-in with a compare-and-swap, read again when attempts race,
    /// so that every failure counts (parallel wrong passwords lock the account as surely
    /// as sequential ones). A locked account counts no more until it unlocks.
    async fn count_failure(&self, id: &str, now: countersign_core::Timestamp) {
        let counted = self
            .users_docs()
            .modify(id, now, |current| -> Result<_, GateError> {
                let Some(current) = current else {
                    return Ok(Step::Done(()));
                };
                if current.body.locked_at(now).is_some() {
                    return Ok(Step::Done(()));
                }
                let mut body = current.body.clone();
                body.record_failure(now);
                Ok(Step::Write {
                    body,
                    event: None,
                    then: (),
                })
            })
            .await;
        if let Err(err) = counted {
            // The answer is a refusal either way; the log says a count was lost.
            tracing::warn!(%err, "could not count a failed sign-in of {id}");
        }
    }

    /// The account and session behind a session token, if both are still valid.
    pub async fn session(&self, token: &str) -> Result<Option<(User, Session)>, GateError> {
        if token.is_empty() || token.len() > 128 {
            return Ok(None);
        }
        let sessions = Docs::<SessionDocs>::new(&*self.store);
        let Some(read) = sessions.by_key(&hash_token(token)).await? else {
            return Ok(None);
        };
        if read.body.is_expired(self.clock.now()) {
            let _ = sessions.delete(&read.id).await;
            return Ok(None);
        }
        match self.user(&read.body.user_id).await? {
            Some(user) if user.is_active() => Ok(Some((user, read.body))),
            _ => Ok(None),
        }
    }

    pub async fn sign_out(&self, token: &str) -> Result<(), GateError> {
        let sessions = Docs::<SessionDocs>::new(&*self.store);
        if let Some(read) = sessions.by_key(&hash_token(token)).await? {
            sessions.delete(&read.id).await?;
        }
        Ok(())
    }

    /// Ends every session of the account.
    pub async fn sign_out_everywhere(&self, user_id: &str) -> Result<u64, GateError> {
        Ok(Docs::<SessionDocs>::new(&*self.store)
            .delete_prefix(&format!("{user_id}/"))
            .await?)
    }

    /// Disables an account and ends its sessions.
    pub async fn disable(&self, user_id: &str, actor: &Principal) -> Result<User, GateError> {
        let mut stored = self
            .users_docs()
            .get(user_id)
            .await?
            .ok_or_else(|| GateError::NotFound(format!("account {user_id}")))?;
        if stored.body.disabled {
            return Ok(stored.body);
        }
        stored.body.disabled = true;
        let event = self.event(EventKind::UserDisabled, &actor.id, &stored.body)?;
        self.save(&stored, Some(&event)).await?;
        self.sign_out_everywhere(&stored.body.id).await?;
        Ok(stored.body)
    }
}
