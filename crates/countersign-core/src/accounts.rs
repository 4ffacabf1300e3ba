//! Dashboard accounts and sessions: the people who decide from the dashboard (and, mapped
//! to them, from Slack and email). What a username, a display name and a password must
//! be, when an account locks after failed sign-ins, and when a session or an invitation
//! has expired. Pure: the server stores these, hashes passwords and makes the tokens.

use serde::{Deserialize, Serialize};

use crate::error::CoreError;
use crate::principal::{Principal, Role};
use crate::time::Timestamp;

/// The shortest password accepted.
pub const MIN_PASSWORD_CHARS: usize = 12;
/// Failed sign-ins in a row before an account locks.
pub const MAX_FAILURES: u32 = 5;
/// How long a locked account stays locked.
pub const LOCKOUT_SECONDS: u64 = 15 * 60;

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
}

impl User {
    /// A new account. Agents get tokens, never accounts.
    pub fn new(
        id: String,
        username: &str,
        display_name: Option<&str>,
        role: Role,
        password_hash: Option<String>,
        now: Timestamp,
    ) -> Result<Self, CoreError> {
        if !role.may_decide() {
            return Err(CoreError::Refused(format!(
                "{role}s do not get accounts: give them a token (countersign token create --role {role})"
            )));
        }
        let username = validate_username(username)?;
        let display_name = validate_display_name(display_name.unwrap_or(&username))?;
        Ok(Self {
            id,
            username,
            display_name,
            role,
            password_hash,
            disabled: false,
            failed_logins: 0,
            locked_until: None,
            created_at: now,
        })
    }

    pub fn principal(&self) -> Principal {
        Principal::user(&self.username, &self.display_name, self.role)
    }

    /// Has a password and is not disabled.
    pub fn is_active(&self) -> bool {
        self.password_hash.is_some() && !self.disabled
    }

    /// An active account whose role may decide.
    pub fn may_decide(&self) -> bool {
        self.is_active() && self.role.may_decide()
    }

    /// Until when the account is locked, if it is at `now`.
    pub fn locked_at(&self, now: Timestamp) -> Option<Timestamp> {
        self.locked_until.filter(|until| now < *until)
    }

    /// Counts a failed sign-in; the [`MAX_FAILURES`]th in a row locks the account for
    /// [`LOCKOUT_SECONDS`] and starts the count again.
    pub fn record_failure(&mut self, now: Timestamp) {
        self.failed_logins += 1;
        if self.failed_logins >= MAX_FAILURES {
            self.locked_until = Some(now.plus_seconds(LOCKOUT_SECONDS));
            self.failed_logins = 0;
        }
    }

    /// Forgets failures after a good sign-in; whether anything changed.
    pub fn clear_failures(&mut self) -> bool {
        let changed = self.failed_logins > 0 || self.locked_until.is_some();
        self.failed_logins = 0;
        self.locked_until = None;
        changed
    }
}

/// A signed-in browser.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    pub user_id: String,
    /// The CSRF token every state-changing dashboard call must echo.
    pub csrf: String,
    pub created_at: Timestamp,
    pub expires_at: Timestamp,
}

impl Session {
    pub fn new(user_id: &str, csrf: String, now: Timestamp, seconds: u64) -> Self {
        Self {
            user_id: user_id.to_string(),
            csrf,
            created_at: now,
            expires_at: now.plus_seconds(seconds),
        }
    }

    pub fn is_expired(&self, now: Timestamp) -> bool {
        now >= self.expires_at
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InvitePurpose {
    /// The first admin, created from the link `serve` prints.
    Setup,
    /// An account an admin created, waiting for its holder to set a password.
    Invite,
}

/// A one-time link to create the first admin or to activate an invited account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Invite {
    pub purpose: InvitePurpose,
    pub role: Role,
    /// The account it activates (invites); setup creates one.
    pub user_id: Option<String>,
    pub expires_at: Timestamp,
}

impl Invite {
    pub fn is_expired(&self, now: Timestamp) -> bool {
        now >= self.expires_at
    }
}

/// A username: what people type to sign in and what proofs name (`user:<username>`).
/// Compared without case: returned in lowercase.
pub fn validate_username(username: &str) -> Result<String, CoreError> {
    let name = username.trim().to_ascii_lowercase();
    let ok = (2..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'));
    if ok {
        Ok(name)
    } else {
        Err(CoreError::Refused(format!(
            "username {username:?} must be 2 to 64 letters, digits or - _ . @"
        )))
    }
}

pub fn validate_display_name(name: &str) -> Result<String, CoreError> {
    let name = name.trim();
    if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
        return Err(CoreError::Refused(
            "the name must be 1 to 128 printable characters".into(),
        ));
    }
    Ok(name.to_string())
}

pub fn validate_password(password: &str) -> Result<(), CoreError> {
    if password.chars().count() < MIN_PASSWORD_CHARS {
        return Err(CoreError::Refused(format!(
            "the password must have at least {MIN_PASSWORD_CHARS} characters"
        )));
    }
    if password.len() > 1024 {
        return Err(CoreError::Refused("the password is too long".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: u64) -> Timestamp {
        Timestamp::from_millis(1_800_000_000_000)
            .unwrap()
            .plus_seconds(seconds)
    }

    #[test]
    fn names_and_passwords_are_checked() {
        assert_eq!(
            validate_username(" Alice@Example.com ").unwrap(),
            "alice@example.com"
        );
        assert!(validate_username("a").is_err());
        assert!(validate_username("no spaces").is_err());
        assert!(validate_username(&"x".repeat(65)).is_err());
        assert_eq!(validate_display_name("  Alice ").unwrap(), "Alice");
        assert!(validate_display_name("   ").is_err());
        assert!(validate_display_name("bell\u{7}").is_err());
        assert!(validate_password("short").is_err());
        assert!(validate_password(&"p".repeat(MIN_PASSWORD_CHARS)).is_ok());
        assert!(validate_password(&"p".repeat(1025)).is_err());
    }

    #[test]
    fn agents_get_no_accounts() {
        let err = User::new("usr_1".into(), "bot", None, Role::Agent, None, at(0)).unwrap_err();
        assert!(
            err.to_string().contains("token create --role agent"),
            "{err}"
        );
        let err = User::new("usr_1".into(), "pay", None, Role::Executor, None, at(0)).unwrap_err();
        assert!(err.to_string().contains("--role executor"), "{err}");
        let user = User::new("usr_2".into(), "Alice", None, Role::Approver, None, at(0)).unwrap();
        assert_eq!(user.username, "alice");
        assert_eq!(user.display_name, "alice");
        assert!(!user.is_active(), "no password yet");
        assert_eq!(user.principal().id, "user:alice");
    }

    #[test]
    fn five_failures_lock_the_account_for_fifteen_minutes() {
        let mut user = User::new(
            "usr_1".into(),
            "alice",
            Some("Alice"),
            Role::Approver,
            Some("$argon2id$...".into()),
            at(0),
        )
        .unwrap();
        for _ in 0..MAX_FAILURES - 1 {
            user.record_failure(at(10));
        }
        assert_eq!(user.locked_at(at(10)), None);
        user.record_failure(at(10));
        let until = at(10 + LOCKOUT_SECONDS);
        assert_eq!(user.locked_at(at(11)), Some(until));
        assert_eq!(user.locked_at(until), None, "unlocked when the time is up");
        assert_eq!(user.failed_logins, 0, "the count starts again");
        assert!(user.clear_failures());
        assert!(!user.clear_failures(), "nothing left to clear");
    }

    #[test]
    fn sessions_and_invitations_expire() {
        let session = Session::new("usr_1", "csrf".into(), at(0), 60);
        assert!(!session.is_expired(at(59)));
        assert!(session.is_expired(at(60)));
        let invite = Invite {
            purpose: InvitePurpose::Setup,
            role: Role::Admin,
            user_id: None,
            expires_at: at(5),
        };
        assert!(!invite.is_expired(at(4)));
        assert!(invite.is_expired(at(5)));
    }
}
