//! Dashboard accounts: people who decide, signing in with a password. Stored as
//! documents (`user`, `session`, `invite`); passwords hashed with Argon2id; sessions and
//! invitations are random tokens kept only as SHA-256 hashes. Agents have tokens, not
//! accounts, so no agent credential can sign in.

use std::sync::Arc;

use argon2::Argon2;
use argon2::password_hash::{PasswordHasher, PasswordVerifier};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use countersign_core::token::hash_token;
use countersign_core::{Clock, Event, EventKind, Principal, Role, Timestamp};
use countersign_store::{Doc, Store, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::error::GateError;
use crate::gate::new_salt;

const USER: &str = "user";
const SESSION: &str = "session";
const INVITE: &str = "invite";
/// Claims of the first-admin slot: of two setup links accepted at once (say on two
/// instances), exactly one creates the admin.
const SETUP_CLAIM: &str = "setup_claim";
/// Failed sign-ins before an account locks, and for how long.
const MAX_FAILURES: u32 = 5;
const LOCKOUT_SECONDS: u64 = 15 * 60;
pub const MIN_PASSWORD_CHARS: usize = 12;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    pub id: String,
    pub username: String,
    pub display_name: String,
    pub role: Role,
    /// Argon2id PHC string; `None` until the invitation is accepted.
    pub password_hash: Option<String>,
    pub disabled: bool,
    pub failed_logins: u32,
    pub locked_until: Option<Timestamp>,
    pub created_at: Timestamp,
    /// Stored version, for compare-and-swap updates.
    #[serde(skip)]
    pub version: u64,
}

impl User {
    pub fn principal(&self) -> Principal {
        Principal::user(&self.username, &self.display_name, self.role)
    }

    pub fn is_active(&self) -> bool {
        self.password_hash.is_some() && !self.disabled
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    pub user_id: String,
    /// The CSRF token every state-changing dashboard call must echo.
    pub csrf: String,
    pub created_at: Timestamp,
    pub expires_at: Timestamp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InvitePurpose {
    /// The first admin, created from the link `serve` prints.
    Setup,
    /// An account an admin created, waiting for its holder to set a password.
    Invite,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Invite {
    pub purpose: InvitePurpose,
    pub role: Role,
    /// The account it activates (invites); setup creates one.
    pub user_id: Option<String>,
    pub expires_at: Timestamp,
}

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
    /// A hash to verify against when the username is unknown, so that timing does not
    /// tell which usernames exist.
    decoy_hash: String,
}

fn random_token() -> Result<String, GateError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| GateError::Store(StoreError::Backend(format!("randomness: {e}"))))?;
    Ok(URL_SAFE_NO_PAD.encode(bytes))
}

fn short_id(prefix: &str) -> Result<String, GateError> {
    let mut bytes = [0u8; 10];
    getrandom::fill(&mut bytes)
        .map_err(|e| GateError::Store(StoreError::Backend(format!("randomness: {e}"))))?;
    Ok(format!("{prefix}_{}", hex::encode(bytes)))
}

fn hash_password(password: &str) -> Result<String, GateError> {
    Argon2::default()
        .hash_password(password.as_bytes())
        .map(|h| h.to_string())
        .map_err(|e| GateError::Store(StoreError::Backend(format!("password hashing: {e}"))))
}

/// Argon2 is deliberately slow: run it off the async workers.
async fn hash_password_blocking(password: &str) -> Result<String, GateError> {
    let password = password.to_string();
    tokio::task::spawn_blocking(move || hash_password(&password))
        .await
        .map_err(|e| GateError::Store(StoreError::Backend(format!("password hashing: {e}"))))?
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

fn to_doc<T: Serialize>(
    kind: &str,
    id: &str,
    version: u64,
    key: Option<String>,
    body: &T,
    at: Timestamp,
) -> Result<Doc, GateError> {
    Ok(Doc {
        kind: kind.to_string(),
        id: id.to_string(),
        version,
        key,
        body: serde_json::to_value(body)
            .map_err(|e| GateError::Store(StoreError::Backend(format!("encode {kind}: {e}"))))?,
        updated_at: at,
    })
}

fn from_doc<T: for<'de> Deserialize<'de>>(doc: &Doc) -> Result<T, GateError> {
    serde_json::from_value(doc.body.clone())
        .map_err(|e| GateError::Store(StoreError::Corrupt(format!("{} {}: {e}", doc.kind, doc.id))))
}

fn user_of(doc: &Doc) -> Result<User, GateError> {
    let mut user: User = from_doc(doc)?;
    user.version = doc.version;
    Ok(user)
}

/// A username: what people type to sign in and what proofs name (`user:<username>`).
pub fn validate_username(username: &str) -> Result<String, GateError> {
    let name = username.trim().to_ascii_lowercase();
    let ok = (2..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'));
    if ok {
        Ok(name)
    } else {
        Err(GateError::BadInput(format!(
            "username {username:?} must be 2 to 64 letters, digits or - _ . @"
        )))
    }
}

fn validate_display_name(name: &str) -> Result<String, GateError> {
    let name = name.trim();
    if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
        return Err(GateError::BadInput(
            "the name must be 1 to 128 printable characters".into(),
        ));
    }
    Ok(name.to_string())
}

fn validate_password(password: &str) -> Result<(), GateError> {
    if password.chars().count() < MIN_PASSWORD_CHARS {
        return Err(GateError::BadInput(format!(
            "the password must have at least {MIN_PASSWORD_CHARS} characters"
        )));
    }
    if password.len() > 1024 {
        return Err(GateError::BadInput("the password is too long".into()));
    }
    Ok(())
}

impl Accounts {
    pub fn new(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        session_seconds: u64,
    ) -> Result<Self, GateError> {
        Ok(Self {
            store,
            clock,
            session_seconds,
            decoy_hash: hash_password(&random_token()?)?,
        })
    }

    pub fn session_seconds(&self) -> u64 {
        self.session_seconds
    }

    async fn event(
        &self,
        kind: EventKind,
        actor: Option<&str>,
        user: &User,
    ) -> Result<countersign_core::SealedEvent, GateError> {
        let event = Event {
            kind,
            at: self.clock.now(),
            actor: actor.map(str::to_string),
            subject: None,
            data: match json!({"user_id": user.id, "username": user.username, "role": user.role}) {
                serde_json::Value::Object(map) => map,
                _ => serde_json::Map::new(),
            },
            payload: None,
        };
        Ok(event.seal(new_salt()?))
    }

    pub async fn users(&self) -> Result<Vec<User>, GateError> {
        self.store
            .doc_list(USER, "", 10_000)
            .await?
            .iter()
            .map(user_of)
            .collect()
    }

    pub async fn user(&self, id: &str) -> Result<Option<User>, GateError> {
        self.store
            .doc_get(USER, id)
            .await?
            .as_ref()
            .map(user_of)
            .transpose()
    }

    pub async fn user_by_name(&self, username: &str) -> Result<Option<User>, GateError> {
        let name = username.trim().to_ascii_lowercase();
        self.store
            .doc_by_key(USER, &name)
            .await?
            .as_ref()
            .map(user_of)
            .transpose()
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
        let doc = to_doc(
            INVITE,
            &short_id("inv")?,
            1,
            Some(hash_token(&token)),
            &invite,
            now,
        )?;
        self.store.doc_insert(&doc, None).await?;
        Ok(token)
    }

    /// A one-time link token to create the first admin.
    pub async fn setup_token(&self, valid_seconds: u64) -> Result<String, GateError> {
        self.new_invite(InvitePurpose::Setup, Role::Admin, None, valid_seconds)
            .await
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
        if role == Role::Agent {
            return Err(GateError::BadInput(
                "agents do not get accounts: give them a token (countersign token create --role agent)".into(),
            ));
        }
        let username = validate_username(username)?;
        let display_name = validate_display_name(display_name.unwrap_or(&username))?;
        let now = self.clock.now();
        let user = User {
            id: short_id("usr")?,
            username: username.clone(),
            display_name,
            role,
            password_hash: None,
            disabled: false,
            failed_logins: 0,
            locked_until: None,
            created_at: now,
            version: 1,
        };
        let event = self
            .event(EventKind::UserCreated, Some(&actor.id), &user)
            .await?;
        let doc = to_doc(USER, &user.id, 1, Some(username.clone()), &user, now)?;
        self.store
            .doc_insert(&doc, Some(&event))
            .await
            .map_err(|e| match e {
                StoreError::Duplicate(_) => {
                    GateError::BadInput(format!("the username {username} is taken"))
                }
                other => other.into(),
            })?;
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
        let doc = self
            .store
            .doc_by_key(INVITE, &hash_token(token))
            .await?
            .ok_or_else(refused)?;
        let invite: Invite = from_doc(&doc)?;
        let now = self.clock.now();
        // Consume first: a second use of the same link finds nothing.
        if !self.store.doc_delete(INVITE, &doc.id).await? {
            return Err(refused());
        }
        if now >= invite.expires_at {
            return Err(refused());
        }
        let password_hash = Some(hash_password_blocking(password).await?);
        match (invite.purpose, invite.user_id) {
            (InvitePurpose::Setup, _) => {
                let username = validate_username(username.unwrap_or_default())?;
                let display_name = validate_display_name(display_name.unwrap_or(&username))?;
                // A setup link is for the first admin only. Every instance started before
                // there is one prints a link of its own; once any of them (or `countersign
                // user add`) has made an admin, the others are dead.
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
                // Two links accepted at once both see no admin: the claim decides. Its id
                // counts the admins ever made, so a later setup (the only admin disabled)
                // claims afresh.
                let admins_ever = users.iter().filter(|u| u.role == Role::Admin).count();
                let claim_id = format!("first-admin-{admins_ever}");
                let claim = to_doc(SETUP_CLAIM, &claim_id, 1, None, &username, now)?;
                match self.store.doc_insert(&claim, None).await {
                    Ok(()) => {}
                    Err(StoreError::Duplicate(_)) => return Err(already()),
                    Err(other) => return Err(other.into()),
                }
                let user = User {
                    id: short_id("usr")?,
                    username: username.clone(),
                    display_name,
                    role: Role::Admin,
                    password_hash,
                    disabled: false,
                    failed_logins: 0,
                    locked_until: None,
                    created_at: now,
                    version: 1,
                };
                let event = self
                    .event(EventKind::UserCreated, Some(&user.principal().id), &user)
                    .await?;
                let doc = to_doc(USER, &user.id, 1, Some(username.clone()), &user, now)?;
                if let Err(err) = self.store.doc_insert(&doc, Some(&event)).await {
                    // Free the slot for another try (best effort: if this fails too, the
                    // CLI's `user add --role admin` still works).
                    let _ = self.store.doc_delete(SETUP_CLAIM, &claim_id).await;
                    return Err(match err {
                        StoreError::Duplicate(_) => {
                            GateError::BadInput(format!("the username {username} is taken"))
                        }
                        other => other.into(),
                    });
                }
                Ok(user)
            }
            (InvitePurpose::Invite, Some(user_id)) => {
                let mut user = self.user(&user_id).await?.ok_or_else(refused)?;
                if user.disabled {
                    return Err(refused());
                }
                if let Some(name) = display_name.filter(|n| !n.trim().is_empty()) {
                    user.display_name = validate_display_name(name)?;
                }
                user.password_hash = password_hash;
                let event = self
                    .event(EventKind::UserActivated, Some(&user.principal().id), &user)
                    .await?;
                self.save(&mut user, Some(&event)).await?;
                Ok(user)
            }
            (InvitePurpose::Invite, None) => Err(refused()),
        }
    }

    async fn save(
        &self,
        user: &mut User,
        event: Option<&countersign_core::SealedEvent>,
    ) -> Result<(), GateError> {
        user.version += 1;
        let doc = to_doc(
            USER,
            &user.id,
            user.version,
            Some(user.username.clone()),
            user,
            self.clock.now(),
        )?;
        self.store.doc_update(&doc, event).await?;
        Ok(())
    }

    /// Checks a username and password; on success opens a session.
    pub async fn sign_in(&self, username: &str, password: &str) -> Result<SignIn, GateError> {
        let generic = "wrong username or password".to_string();
        let Some(mut user) = self.user_by_name(username).await? else {
            // Spend the same time as a real check.
            verify_blocking(password, &self.decoy_hash).await;
            return Ok(SignIn::Refused(generic));
        };
        let now = self.clock.now();
        if let Some(until) = user.locked_until
            && now < until
        {
            return Ok(SignIn::Refused(format!(
                "too many failed sign-ins: this account is locked until {until}"
            )));
        }
        let verified = match &user.password_hash {
            Some(hash) => verify_blocking(password, hash).await,
            None => {
                verify_blocking(password, &self.decoy_hash).await;
                false
            }
        };
        if !verified || user.disabled {
            if verified {
                return Ok(SignIn::Refused("this account is disabled".into()));
            }
            user.failed_logins += 1;
            if user.failed_logins >= MAX_FAILURES {
                user.locked_until = Some(now.plus_seconds(LOCKOUT_SECONDS));
                user.failed_logins = 0;
            }
            // A lost race with another attempt only loses a count; never fail the answer.
            let _ = self.save(&mut user, None).await;
            return Ok(SignIn::Refused(generic));
        }
        if user.failed_logins > 0 || user.locked_until.is_some() {
            user.failed_logins = 0;
            user.locked_until = None;
            let _ = self.save(&mut user, None).await;
        }
        let token = random_token()?;
        let session = Session {
            user_id: user.id.clone(),
            csrf: random_token()?,
            created_at: now,
            expires_at: now.plus_seconds(self.session_seconds),
        };
        let id = format!("{}/{}", user.id, &hash_token(&token)[..16]);
        let doc = to_doc(SESSION, &id, 1, Some(hash_token(&token)), &session, now)?;
        self.store.doc_insert(&doc, None).await?;
        Ok(SignIn::Ok {
            user,
            session_token: token,
        })
    }

    /// The account and session behind a session token, if both are still valid.
    pub async fn session(&self, token: &str) -> Result<Option<(User, Session)>, GateError> {
        if token.is_empty() || token.len() > 128 {
            return Ok(None);
        }
        let Some(doc) = self.store.doc_by_key(SESSION, &hash_token(token)).await? else {
            return Ok(None);
        };
        let session: Session = from_doc(&doc)?;
        if self.clock.now() >= session.expires_at {
            let _ = self.store.doc_delete(SESSION, &doc.id).await;
            return Ok(None);
        }
        match self.user(&session.user_id).await? {
            Some(user) if user.is_active() => Ok(Some((user, session))),
            _ => Ok(None),
        }
    }

    pub async fn sign_out(&self, token: &str) -> Result<(), GateError> {
        if let Some(doc) = self.store.doc_by_key(SESSION, &hash_token(token)).await? {
            self.store.doc_delete(SESSION, &doc.id).await?;
        }
        Ok(())
    }

    /// Ends every session of the account.
    pub async fn sign_out_everywhere(&self, user_id: &str) -> Result<u64, GateError> {
        Ok(self
            .store
            .doc_delete_prefix(SESSION, &format!("{user_id}/"))
            .await?)
    }

    /// Disables an account and ends its sessions.
    pub async fn disable(&self, user_id: &str, actor: &Principal) -> Result<User, GateError> {
        let mut user = self
            .user(user_id)
            .await?
            .ok_or_else(|| GateError::NotFound(format!("account {user_id}")))?;
        if user.disabled {
            return Ok(user);
        }
        user.disabled = true;
        let event = self
            .event(EventKind::UserDisabled, Some(&actor.id), &user)
            .await?;
        self.save(&mut user, Some(&event)).await?;
        self.sign_out_everywhere(&user.id).await?;
        Ok(user)
    }
}
