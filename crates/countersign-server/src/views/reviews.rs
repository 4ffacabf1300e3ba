//! What `record_review` answers: the review as recorded.

use countersign_core::ApprovalRequest;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::enum_str;

/// A review as recorded.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ReviewView {
    /// The reviewer every review shows (the operator's configuration).
    pub reviewer_id: String,
    pub reviewer_name: String,
    /// accepted or flagged.
    pub verdict: String,
    pub notes: Option<String>,
    /// The authenticated principal that recorded it.
    pub recorded_by: String,
    pub recorded_at: String,
}

/// `record_review`'s result: the review as recorded.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ReviewOutput {
    pub request_id: String,
    /// The request's status (pending requests cannot be reviewed).
    pub status: String,
    pub review: ReviewView,
    pub message: String,
}

impl ReviewOutput {
    /// The review `by` just recorded on `request`.
    pub fn new(request: &ApprovalRequest, by: &str) -> Self {
        let review = request.reviews.iter().rev().find(|r| r.recorded_by == by);
        Self {
            request_id: request.id.clone(),
            status: request.status.to_string(),
            review: ReviewView {
                reviewer_id: review.map(|r| r.reviewer.id.clone()).unwrap_or_default(),
                reviewer_name: review
                    .map(|r| r.reviewer.display_name.clone())
                    .unwrap_or_default(),
                verdict: review.map(|r| enum_str(&r.verdict)).unwrap_or_default(),
                notes: review.and_then(|r| r.notes.clone()),
                recorded_by: by.to_string(),
                recorded_at: review
                    .map(|r| r.recorded_at.to_string())
                    .unwrap_or_default(),
            },
            message: "Recorded in the transparency log. A reviewer reviews a request once.".into(),
        }
    }
}
