//! The one place a domain error becomes an HTTP status, and countersign's error shape,
//! `{"error": {"code": ..., "message": ...}}`, for errors and for the extractors' own
//! rejections (bad JSON, a bad query or path, a body too large).

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use countersign_core::CoreError;
use serde::de::DeserializeOwned;

use crate::error::{ErrorKind, GateError};

/// The HTTP status of each kind of domain error.
pub fn status(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::InvalidInput | ErrorKind::InvalidProof => StatusCode::BAD_REQUEST,
        ErrorKind::AlreadyDecided
        | ErrorKind::Expired
        | ErrorKind::NotApproved
        | ErrorKind::AlreadyUsed
        | ErrorKind::ApprovalExpired
        | ErrorKind::ActionMismatch
        | ErrorKind::IdempotencyMismatch
        | ErrorKind::AlreadyApproved
        | ErrorKind::Changed => StatusCode::CONFLICT,
        ErrorKind::SelfApproval | ErrorKind::NotEligible | ErrorKind::Forbidden => {
            StatusCode::FORBIDDEN
        }
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::RateLimited => StatusCode::TOO_MANY_REQUESTS,
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// An error as a JSON response.
#[derive(Debug)]
pub struct ApiError(pub GateError);

impl From<GateError> for ApiError {
    fn from(err: GateError) -> Self {
        ApiError(err)
    }
}

impl From<CoreError> for ApiError {
    fn from(err: CoreError) -> Self {
        ApiError(err.into())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let err = self.0;
        let kind = err.kind();
        if kind == ErrorKind::Internal {
            tracing::error!(%err, "request failed");
        }
        let mut response = error_response(status(kind), kind.code(), err.public_message());
        if let GateError::RateLimited {
            retry_after_seconds,
            ..
        } = &err
            && let Ok(value) = http::HeaderValue::from_str(&retry_after_seconds.to_string())
        {
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, value);
        }
        response
    }
}

/// countersign's error shape with a status and a code of its own (an extractor's
/// rejection, a rate limit).
pub fn error_response(status: StatusCode, code: &str, message: String) -> Response {
    (
        status,
        Json(serde_json::json!({"error": {"code": code, "message": message}})),
    )
        .into_response()
}

/// `Json<T>` whose rejections say what was wrong in countersign's error shape.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = Response;
    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(value)) => Ok(ApiJson(value)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

fn json_rejection(rejection: JsonRejection) -> Response {
    let (status, code) = match &rejection {
        JsonRejection::MissingJsonContentType(_) => {
            (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
        }
        JsonRejection::BytesRejection(_) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large")
        }
        _ => (StatusCode::BAD_REQUEST, "invalid_input"),
    };
    let message = match status {
        StatusCode::PAYLOAD_TOO_LARGE => {
            "the request body is larger than max_body_bytes allows".to_string()
        }
        _ => rejection.body_text(),
    };
    error_response(status, code, message)
}

/// `Query<T>` with countersign's error shape.
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = Response;
    async fn from_request_parts(
        parts: &mut http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(value)) => Ok(ApiQuery(value)),
            Err(rejection) => Err(error_response(
                StatusCode::BAD_REQUEST,
                "invalid_input",
                rejection.body_text(),
            )),
        }
    }
}

/// `Path<T>` with countersign's error shape (a path segment that does not parse, e.g. a
/// log index that is not a number, is a JSON 400 like every other bad input).
pub struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = Response;
    async fn from_request_parts(
        parts: &mut http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(ApiPath(value)),
            Err(rejection) => Err(error_response(
                rejection.status(),
                "invalid_input",
                rejection.body_text(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_http_defaults_pass_their_own_bounds() {
        let mut config = super::super::HttpConfig::default();
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.public_url, "http://127.0.0.1:8787");
        config.max_body_bytes = super::super::MIN_BODY_BYTES - 1;
        assert!(config.validate().unwrap_err().contains("max_body_bytes"));
        let mut settings = crate::Settings::default();
        assert_eq!(settings.validate(), Ok(()));
        settings.session_seconds = 0;
        assert!(settings.validate().is_err());
        settings.session_seconds = crate::gate::MAX_SESSION_SECONDS + 1;
        assert!(settings.validate().is_err());
    }

    #[test]
    fn every_kind_has_the_status_clients_rely_on() {
        let cases = [
            (GateError::BadInput("x".into()), 400),
            (GateError::Unauthenticated("x".into()), 401),
            (GateError::Forbidden("x".into()), 403),
            (GateError::NotFound("x".into()), 404),
            (
                GateError::Core(CoreError::IdempotencyMismatch {
                    key: "k".into(),
                    request_id: "r".into(),
                }),
                409,
            ),
            (GateError::Unavailable("x".into()), 503),
            (GateError::internal("randomness", "x"), 500),
        ];
        for (err, code) in cases {
            assert_eq!(status(err.kind()).as_u16(), code, "{err:?}");
        }
    }
}
