//! One-time email decision links: a random token bound to one request and to the
//! approver an address is mapped to, valid for a few minutes and used once. Issued when
//! an email is sent (`notify::email`), redeemed by the page the link opens
//! (`http::email_links`); only the token's SHA-256 is stored.

use countersign_core::token::hash_token;
use countersign_core::{
    ApprovalRequest, AuthMethod, Channel, Decider, DecisionInput, Timestamp, Verdict,
};
use countersign_store::{Docs, Stored, collection, kinds};
use serde::{Deserialize, Serialize};

use crate::error::GateError;
use crate::gate::Gate;
use crate::ids::{random_token, short_id};

/// What a decision token is bound to (stored without the token, under its hash).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LinkRecord {
    pub request_id: String,
    pub username: String,
    pub email: String,
    pub expires_at: Timestamp,
    pub created_at: Timestamp,
}

collection!(
    /// Tokens, `{request_id}/{random}`; keyed by the token's SHA-256.
    pub(crate) LinkDocs: kinds::EMAIL_TOKEN => LinkRecord
);

/// A one-time decision link.
pub struct TokenLink {
    pub url: String,
    pub expires_at: Timestamp,
}

/// Issues a one-time token for `username` to decide `request`, valid for `minutes` (and
/// never past the request's expiry); only its hash is kept.
pub async fn issue(
    gate: &Gate,
    minutes: u64,
    request: &ApprovalRequest,
    username: &str,
    email: &str,
    public_url: &str,
) -> Result<TokenLink, GateError> {
    let token = random_token()?;
    let now = gate.now();
    let expires_at = now
        .plus_seconds(minutes.max(1) * 60)
        .min(request.expires_at);
    let record = LinkRecord {
        request_id: request.id.clone(),
        username: username.to_string(),
        email: email.to_string(),
        expires_at,
        created_at: now,
    };
    let id = format!("{}/{}", request.id, short_id("link")?);
    Docs::<LinkDocs>::new(&**gate.store())
        .insert(&id, Some(hash_token(&token)), &record, now, None)
        .await?;
    Ok(TokenLink {
        url: format!(
            "{}/email/decide#t={token}",
            public_url.trim_end_matches('/')
        ),
        expires_at,
    })
}

/// Drops the tokens of a request that closed (they could no longer decide anything).
pub async fn forget(gate: &Gate, request_id: &str) -> Result<(), GateError> {
    Docs::<LinkDocs>::new(&**gate.store())
        .delete_prefix(&format!("{request_id}/"))
        .await?;
    Ok(())
}

fn invalid_link() -> GateError {
    GateError::Unauthenticated(
        "This link no longer works: it was already used, it expired, or its request is closed. Open the request in the dashboard instead.".into(),
    )
}

/// The token's record, if it exists and has not expired. Looking does not use it up.
pub async fn lookup(gate: &Gate, token: &str) -> Result<Stored<LinkRecord>, GateError> {
    if token.is_empty() || token.len() > 128 {
        return Err(invalid_link());
    }
    let links = Docs::<LinkDocs>::new(&**gate.store());
    let read = links
        .by_key(&hash_token(token))
        .await?
        .ok_or_else(invalid_link)?;
    if gate.now() >= read.body.expires_at {
        let _ = links.delete(&read.id).await;
        return Err(invalid_link());
    }
    Ok(read)
}

/// The account a token speaks for, if it may still decide.
pub async fn decider(gate: &Gate, record: &LinkRecord) -> Result<Decider, GateError> {
    gate.accounts()
        .decider(&record.username, AuthMethod::EmailToken)
        .await?
        .ok_or_else(|| {
            GateError::Forbidden(format!(
                "the account {} this address is mapped to cannot decide (disabled, not yet activated, or missing)",
                record.username
            ))
        })
}

/// Consumes a token and decides as the approver it is bound to (channel `email`,
/// authenticated by `email_token`).
pub async fn decide(
    gate: &Gate,
    token: &str,
    verdict: Verdict,
    input: DecisionInput,
) -> Result<ApprovalRequest, GateError> {
    let read = lookup(gate, token).await?;
    // Consume first: of two concurrent uses, one finds nothing to delete.
    if !Docs::<LinkDocs>::new(&**gate.store())
        .delete(&read.id)
        .await?
    {
        return Err(invalid_link());
    }
    let decider = decider(gate, &read.body).await?;
    gate.decide(
        &decider,
        &read.body.request_id,
        verdict,
        input,
        Channel::Email,
    )
    .await
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use countersign_core::{Clock, FixedClock, NewRequest, Principal, Role, Status};
    use countersign_store::Store;

    use super::*;

    async fn gate(dir: &std::path::Path, clock: Arc<FixedClock>) -> Arc<Gate> {
        let store: Arc<dyn Store> =
            Arc::new(countersign_sqlite::SqliteStore::open(&dir.join("countersign.db")).unwrap());
        Gate::builder(store, dir.join("keys"))
            .clock(clock)
            .log_origin("test/email")
            .build()
            .await
            .unwrap()
    }

    /// A token works once, for the approver it names, and not after it expires.
    #[tokio::test]
    async fn decision_tokens_are_single_use_bound_and_short_lived() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(FixedClock::new(
            Timestamp::parse("2026-11-29T12:00:00Z").unwrap(),
        ));
        let gate = gate(dir.path(), clock.clone()).await;
        let admin = Principal::local_user("root", Role::Admin);
        let (_, invite) = gate
            .accounts()
            .invite("alice", Some("Alice"), Role::Approver, &admin, 3600)
            .await
            .unwrap();
        gate.accounts()
            .accept(&invite, None, None, "correct horse battery")
            .await
            .unwrap();
        let agent = Principal::from_token("deploy-bot", Role::Agent);
        let ask = |what: &str| NewRequest {
            description: what.to_string(),
            timeout_seconds: Some(7200),
            ..NewRequest::default()
        };
        let first = gate
            .request_approval(&agent, ask("first"))
            .await
            .unwrap()
            .request;
        let second = gate
            .request_approval(&agent, ask("second"))
            .await
            .unwrap()
            .request;
        let url = "http://127.0.0.1:8787";
        let now = clock.now();
        let link = issue(&gate, 30, &first, "alice", "alice@example.com", url)
            .await
            .unwrap();
        assert!(
            link.url
                .starts_with("http://127.0.0.1:8787/email/decide#t=")
        );
        assert_eq!(link.expires_at, now.plus_seconds(1800));
        let token = link.url.split_once("#t=").unwrap().1.to_string();
        // Only the hash is stored.
        let stored = gate
            .store()
            .doc_list(kinds::EMAIL_TOKEN, "", 10)
            .await
            .unwrap();
        assert_eq!(stored.len(), 1);
        assert!(!stored[0].body.to_string().contains(&token));
        assert_eq!(stored[0].key.as_deref(), Some(hash_token(&token).as_str()));

        // Looking does not use it up.
        lookup(&gate, &token).await.unwrap();
        lookup(&gate, &token).await.unwrap();
        let decided = decide(&gate, &token, Verdict::Approved, DecisionInput::default())
            .await
            .unwrap();
        let approver = &decided.decision.as_ref().unwrap().approvers[0];
        assert_eq!(approver.id, "user:alice");
        assert_eq!(approver.channel, Channel::Email);
        assert_eq!(approver.auth_method, AuthMethod::EmailToken);
        // Once.
        let again = decide(&gate, &token, Verdict::Rejected, DecisionInput::default())
            .await
            .unwrap_err();
        assert_eq!(again.code(), "unauthenticated", "{again}");

        // Not after it expires.
        let link = issue(&gate, 30, &second, "alice", "alice@example.com", url)
            .await
            .unwrap();
        let token = link.url.split_once("#t=").unwrap().1.to_string();
        clock.advance_seconds(30 * 60);
        let late = decide(&gate, &token, Verdict::Approved, DecisionInput::default())
            .await
            .unwrap_err();
        assert_eq!(late.code(), "unauthenticated", "{late}");
        let second = gate.get(&agent, &second.id).await.unwrap();
        assert_eq!(second.status, Status::Pending);
        assert!(
            decide(&gate, "", Verdict::Approved, DecisionInput::default())
                .await
                .is_err()
        );
    }

    /// A link never outlives its request.
    #[tokio::test]
    async fn a_link_expires_with_its_request() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(FixedClock::new(
            Timestamp::parse("2026-11-29T12:00:00Z").unwrap(),
        ));
        let gate = gate(dir.path(), clock.clone()).await;
        let agent = Principal::from_token("deploy-bot", Role::Agent);
        let request = gate
            .request_approval(
                &agent,
                NewRequest {
                    description: "soon over".into(),
                    timeout_seconds: Some(600),
                    ..NewRequest::default()
                },
            )
            .await
            .unwrap()
            .request;
        let link = issue(
            &gate,
            30,
            &request,
            "alice",
            "alice@example.com",
            "http://x",
        )
        .await
        .unwrap();
        assert_eq!(link.expires_at, request.expires_at);
        forget(&gate, &request.id).await.unwrap();
        let token = link.url.split_once("#t=").unwrap().1;
        assert_eq!(
            lookup(&gate, token).await.unwrap_err().code(),
            "unauthenticated"
        );
    }
}
