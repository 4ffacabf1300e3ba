//! The server's one error type, and its mapping to HTTP status codes and stable codes.
//! Each boundary (REST, MCP, CLI) maps it once.

use countersign_core::CoreError;
use countersign_core::error::NotUsable;
use countersign_store::StoreError;
use http::StatusCode;

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
    #[error(transparent)]
    Store(StoreError),
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

impl GateError {
    /// A stable, machine-readable code for clients.
    pub fn code(&self) -> &'static str {
        match self {
            GateError::Core(CoreError::Invalid { .. }) | GateError::BadInput(_) => "invalid_input",
            GateError::Core(CoreError::AlreadyDecided { .. }) => "already_decided",
            GateError::Core(CoreError::Expired { .. }) => "expired",
            GateError::Core(CoreError::SelfApproval { .. }) => "self_approval",
            GateError::Core(CoreError::Forbidden(_)) | GateError::Forbidden(_) => "forbidden",
            GateError::Core(CoreError::NotUsable(NotUsable::NotApproved { .. })) => "not_approved",
            GateError::Core(CoreError::NotUsable(NotUsable::AlreadyUsed { .. })) => "already_used",
            GateError::Core(CoreError::NotUsable(NotUsable::ValidityExpired { .. })) => {
                "approval_expired"
            }
            GateError::Core(CoreError::IdempotencyMismatch { .. }) => "idempotency_mismatch",
            GateError::NotFound(_) | GateError::Store(StoreError::NotFound { .. }) => "not_found",
            GateError::Unauthenticated(_) => "unauthenticated",
            GateError::Store(StoreError::Unavailable(_)) => "unavailable",
            GateError::Store(_) => "internal",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self.code() {
            "invalid_input" => StatusCode::BAD_REQUEST,
            "already_decided"
            | "expired"
            | "not_approved"
            | "already_used"
            | "approval_expired"
            | "idempotency_mismatch" => StatusCode::CONFLICT,
            "self_approval" | "forbidden" => StatusCode::FORBIDDEN,
            "not_found" => StatusCode::NOT_FOUND,
            "unauthenticated" => StatusCode::UNAUTHORIZED,
            "unavailable" => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The message to show a client. Internal details stay in the server's log.
    pub fn public_message(&self) -> String {
        match self {
            GateError::Store(StoreError::Unavailable(_)) => {
                "the database is busy or unavailable; retry shortly".to_string()
            }
            GateError::Store(_) => "internal error; the server's log has the details".to_string(),
            other => other.to_string(),
        }
    }
}
