//! What an operator decides about the gate: limits, reviewers, groups and accounts,
//! policies, sessions; each default stated once.

use countersign_core::Limits;

use super::{PolicySettings, Recipients, ReviewerSettings};

/// How long a dashboard session lasts unless configured otherwise.
pub const DEFAULT_SESSION_SECONDS: u64 = 12 * 3600;
/// The longest a dashboard session may be configured to last: 30 days.
pub const MAX_SESSION_SECONDS: u64 = 30 * 24 * 3600;

/// How many waits one credential may hold open at once unless configured otherwise:
/// enough for a fleet of agents sharing one token (the 10,000-waiter benchmark sets its
/// own), few enough that one token cannot hold every connection the server allows.
pub const DEFAULT_MAX_WAITS_PER_TOKEN: usize = 1_000;

/// Dashboard sessions per account unless configured otherwise: a person's browsers and
/// devices, with room to spare.
pub const DEFAULT_MAX_SESSIONS_PER_ACCOUNT: usize = 10;

/// What an operator decides about the gate's behaviour. `Settings::default()` states
/// each default once; the binary's config starts from it.
#[derive(Debug, Clone)]
pub struct Settings {
    pub limits: Limits,
    /// When set, `record_review` is available to this reviewer, and to no one else.
    pub reviewer: Option<ReviewerSettings>,
    /// Who a request may name as recipients besides the configured routes.
    pub recipients: Recipients,
    /// Whether evidence bundles may include raw payloads (mode `full`).
    pub raw_payload_export: bool,
    /// Where purged rooms' backups are written.
    pub backup_dir: Option<std::path::PathBuf>,
    /// How long a dashboard session lasts, in seconds.
    pub session_seconds: u64,
    /// How many waits (REST long polls, MCP `wait_for_approval`, room waits) one
    /// credential may have open at once.
    pub max_waits_per_token: usize,
    /// Named groups of principals (`[groups]`), which rooms may be restricted to and
    /// quorums may require their approvers from.
    pub groups: countersign_core::Groups,
    /// The dashboard account each token and OS user belongs to (`[tokens] accounts`,
    /// `[cli] accounts`): quorum and separation of duties count accounts.
    pub identities: countersign_core::Identities,
    /// How many room messages one principal may post per minute (0: no limit).
    pub room_messages_per_minute: u32,
    /// How many pending requests one requester may have at once (`None`: no limit).
    pub pending_per_agent: Option<usize>,
    /// Whether a request may ask for its own quorum (`approvals`, `approvers`): off by
    /// default, since naming a group also narrows who may approve.
    pub request_quorum: bool,
    /// `[policy]`: the Cedar policy files and the zone their `context.time` is in;
    /// `None`: no policies (one person decides every request).
    pub policy: Option<PolicySettings>,
    /// How many dashboard sessions one account may hold; signing in past it ends the
    /// account's oldest session.
    pub max_sessions_per_account: usize,
}

impl Settings {
    /// Checks the settings that have bounds; the message names the setting.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_waits_per_token == 0 {
            return Err("max_waits_per_token must be at least 1".into());
        }
        if !(1..=1000).contains(&self.max_sessions_per_account) {
            return Err("max_sessions_per_account must be between 1 and 1000".into());
        }
        if !(1..=MAX_SESSION_SECONDS).contains(&self.session_seconds) {
            return Err(format!(
                "a dashboard session must last between 1 second and {} hours",
                MAX_SESSION_SECONDS / 3600
            ));
        }
        Ok(())
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            limits: Limits::default(),
            reviewer: None,
            recipients: Recipients::default(),
            raw_payload_export: false,
            backup_dir: None,
            session_seconds: DEFAULT_SESSION_SECONDS,
            max_waits_per_token: DEFAULT_MAX_WAITS_PER_TOKEN,
            groups: countersign_core::Groups::default(),
            identities: countersign_core::Identities::default(),
            room_messages_per_minute: crate::rooms::DEFAULT_MESSAGES_PER_MINUTE,
            pending_per_agent: None,
            request_quorum: false,
            policy: None,
            max_sessions_per_account: DEFAULT_MAX_SESSIONS_PER_ACCOUNT,
        }
    }
}
