//! The server's one domain error. It knows nothing of web protocols or JSON-RPC: each
//! boundary (the HTTP adapter's `error` module for REST and the dashboard, `mcp` for
//! tools, the CLI) maps its [`ErrorKind`] once. A store error means the store; failures of this process
//! (randomness, an HTTP client, password hashing, encoding) are [`GateError::Internal`].

use countersign_core::CoreError;
use countersign_core::error::{NotCounted, NotUsable};
use countersign_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error(transparent)]
    Core(#[from] CoreError),
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    BadInput(String),
    /// The request moved on since the caller looked at it (a batch decision names the
    /// version each request was selected at): nothing was decided.
    #[error("{0}")]
    Changed(String),
    /// Contended or busy: the same call may succeed when retried.
    #[error("{0}")]
    Unavailable(String),
    /// Too many calls of this kind from this caller: the same call succeeds after
    /// `retry_after_seconds`.
    #[error("{message}")]
    RateLimited {
        message: String,
        retry_after_seconds: u64,
    },
    #[error(transparent)]
    Store(StoreError),
    /// Something in this process failed (not the caller's input, not the store).
    #[error("{0}")]
    Internal(String),
    /// A remote `serve` answered with this error (the remote client): its kind and the
    /// message it chose to show.
    #[error("{message}")]
    Remote { kind: ErrorKind, message: String },
}

impl From<StoreError> for GateError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::NotFound {
                what: "request",
                id,
            } => GateError::NotFound(format!("request {id}")),
            other => GateError::Store(other),
        }
    }
}

/// What kind of failure an error is: the one thing a boundary maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    InvalidInput,
    AlreadyDecided,
    Expired,
    SelfApproval,
    /// This account already approved the request (a quorum counts an account once).
    AlreadyApproved,
    /// The request changed since it was selected (batch decisions): not decided.
    Changed,
    /// The request's quorum needs approvers from a group this account is not in.
    NotEligible,
    Forbidden,
    NotApproved,
    AlreadyUsed,
    ApprovalExpired,
    ActionMismatch,
    InvalidProof,
    IdempotencyMismatch,
    NotFound,
    Unauthenticated,
    Unavailable,
    RateLimited,
    Internal,
}

impl ErrorKind {
    /// A stable, machine-readable code for clients.
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::AlreadyDecided => "already_decided",
            ErrorKind::Expired => "expired",
            ErrorKind::SelfApproval => "self_approval",
            ErrorKind::AlreadyApproved => "already_approved",
            ErrorKind::Changed => "changed",
            ErrorKind::NotEligible => "not_eligible",
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::NotApproved => "not_approved",
            ErrorKind::AlreadyUsed => "already_used",
            ErrorKind::ApprovalExpired => "approval_expired",
            ErrorKind::ActionMismatch => "action_mismatch",
            ErrorKind::InvalidProof => "invalid_proof",
            ErrorKind::IdempotencyMismatch => "idempotency_mismatch",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Unauthenticated => "unauthenticated",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::RateLimited => "rate_limited",
            ErrorKind::Internal => "internal",
        }
    }

    /// The kind a code names (what a remote `serve` answered), if it names one.
    pub fn from_code(code: &str) -> Option<ErrorKind> {
        use ErrorKind::*;
        [
            InvalidInput,
            AlreadyDecided,
            Expired,
            SelfApproval,
            AlreadyApproved,
            Changed,
            NotEligible,
            Forbidden,
            NotApproved,
            AlreadyUsed,
            ApprovalExpired,
            ActionMismatch,
            InvalidProof,
            IdempotencyMismatch,
            NotFound,
            Unauthenticated,
            Unavailable,
            RateLimited,
            Internal,
        ]
        .into_iter()
        .find(|kind| kind.code() == code)
    }
}

impl GateError {
    /// A failure of this process, with what was being done.
    pub fn internal(what: &str, err: impl std::fmt::Display) -> Self {
        GateError::Internal(format!("{what}: {err}"))
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            GateError::Core(core) => match core {
                CoreError::Invalid { .. } | CoreError::Refused(_) => ErrorKind::InvalidInput,
                CoreError::AlreadyDecided { .. } => ErrorKind::AlreadyDecided,
                CoreError::Expired { .. } => ErrorKind::Expired,
                CoreError::SelfApproval { .. } => ErrorKind::SelfApproval,
                CoreError::Forbidden(_) => ErrorKind::Forbidden,
                // Separation of duties in a quorum (core quorum.rs).
                CoreError::NotCounted(NotCounted::AlreadyApproved { .. }) => {
                    ErrorKind::AlreadyApproved
                }
                CoreError::NotCounted(NotCounted::NotEligible { .. }) => ErrorKind::NotEligible,
                CoreError::NotUsable(NotUsable::NotApproved { .. }) => ErrorKind::NotApproved,
                CoreError::NotUsable(NotUsable::AlreadyUsed { .. }) => ErrorKind::AlreadyUsed,
                CoreError::NotUsable(NotUsable::ValidityExpired { .. }) => {
                    ErrorKind::ApprovalExpired
                }
                CoreError::NotUsable(NotUsable::ActionMismatch { .. }) => ErrorKind::ActionMismatch,
                CoreError::NotUsable(NotUsable::InvalidProof { .. }) => ErrorKind::InvalidProof,
                CoreError::IdempotencyMismatch { .. } => ErrorKind::IdempotencyMismatch,
            },
            GateError::BadInput(_) => ErrorKind::InvalidInput,
            GateError::Changed(_) => ErrorKind::Changed,
            GateError::Forbidden(_) => ErrorKind::Forbidden,
            GateError::NotFound(_) | GateError::Store(StoreError::NotFound { .. }) => {
                ErrorKind::NotFound
            }
            GateError::Unauthenticated(_) => ErrorKind::Unauthenticated,
            GateError::Unavailable(_) | GateError::Store(StoreError::Unavailable(_)) => {
                ErrorKind::Unavailable
            }
            GateError::RateLimited { .. } => ErrorKind::RateLimited,
            GateError::Store(_) | GateError::Internal(_) => ErrorKind::Internal,
            GateError::Remote { kind, .. } => *kind,
        }
    }

    /// A stable, machine-readable code for clients.
    pub fn code(&self) -> &'static str {
        self.kind().code()
    }

    /// The message to show a client. Internal details stay in the server's log.
    pub fn public_message(&self) -> String {
        match self {
            GateError::Store(StoreError::Unavailable(_)) => {
                "the database is busy or unavailable; retry shortly".to_string()
            }
            GateError::Store(_) | GateError::Internal(_) => {
                "internal error; the server's log has the details".to_string()
            }
            other => other.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_details_stay_in_the_log() {
        let err = GateError::internal("randomness", "no entropy");
        assert_eq!(err.code(), "internal");
        assert!(!err.public_message().contains("entropy"));
        assert_eq!(err.to_string(), "randomness: no entropy");
        let busy = GateError::Store(StoreError::Unavailable("locked".into()));
        assert_eq!(busy.code(), "unavailable");
        assert!(!busy.public_message().contains("locked"));
        let missing: GateError = StoreError::NotFound {
            what: "request",
            id: "req_1".into(),
        }
        .into();
        assert_eq!(missing.code(), "not_found");
        assert_eq!(missing.to_string(), "request req_1 not found");
        let refused = GateError::Core(CoreError::Refused("room ops is in the trash".into()));
        assert_eq!(refused.code(), "invalid_input");
        assert_eq!(refused.public_message(), "room ops is in the trash");
    }

    #[test]
    fn every_code_names_its_kind() {
        for err in [
            GateError::BadInput("x".into()),
            GateError::Forbidden("x".into()),
            GateError::NotFound("x".into()),
            GateError::Internal("x".into()),
            GateError::RateLimited {
                message: "x".into(),
                retry_after_seconds: 1,
            },
        ] {
            assert_eq!(ErrorKind::from_code(err.code()), Some(err.kind()));
        }
        assert_eq!(
            ErrorKind::from_code("approval_expired"),
            Some(ErrorKind::ApprovalExpired)
        );
        assert_eq!(ErrorKind::from_code("nonsense"), None);
        let remote = GateError::Remote {
            kind: ErrorKind::Forbidden,
            message: "bot may not".into(),
        };
        assert_eq!(
            (remote.code(), remote.public_message().as_str()),
            ("forbidden", "bot may not")
        );
    }
}
