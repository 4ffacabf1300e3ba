//! Bearer tokens: created once, found by hash, listed oldest first, revoked once.

use std::sync::Arc;

use countersign_core::TokenRecord;

use crate::{Store, StoreError};

use super::fixtures::*;

/// Tokens: create, look up by hash, list oldest first, revoke once.
pub async fn tokens(store: Arc<dyn Store>) {
    assert!(store.list_tokens().await.unwrap().is_empty());
    // Created out of time order, so that listing must sort.
    let (second, second_event) = token("tok_b", "bob", "hash-b", 20);
    let (first, first_event) = token("tok_a", "alice", "hash-a", 10);
    store.create_token(&second, &second_event).await.unwrap();
    store.create_token(&first, &first_event).await.unwrap();

    assert_eq!(
        store.token_by_hash("hash-a").await.unwrap(),
        Some(first.clone())
    );
    assert_eq!(store.token_by_hash("hash-zzz").await.unwrap(), None);
    assert_eq!(
        store.list_tokens().await.unwrap(),
        vec![first.clone(), second.clone()]
    );

    let (same_hash, event) = token("tok_c", "carol", "hash-a", 30);
    let err = store.create_token(&same_hash, &event).await.unwrap_err();
    assert!(matches!(err, StoreError::Duplicate(_)), "{err}");
    let (same_id, event) = token("tok_a", "carol", "hash-c", 30);
    let err = store.create_token(&same_id, &event).await.unwrap_err();
    assert!(matches!(err, StoreError::Duplicate(_)), "{err}");
    assert_eq!(store.list_tokens().await.unwrap().len(), 2);

    let revoked = store
        .revoke_token("tok_a", at(40), &token_revoked(&first, 40))
        .await
        .unwrap();
    let expected = TokenRecord {
        revoked_at: Some(at(40)),
        ..first.clone()
    };
    assert_eq!(revoked, expected);
    assert!(!revoked.is_active());
    assert_eq!(
        store.token_by_hash("hash-a").await.unwrap(),
        Some(expected.clone())
    );

    let err = store
        .revoke_token("tok_a", at(50), &token_revoked(&first, 50))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Duplicate(_)), "{err}");
    assert!(err.to_string().contains("tok_a"), "{err}");
    assert_eq!(
        store.token_by_hash("hash-a").await.unwrap(),
        Some(expected.clone()),
        "the first revocation time stays"
    );

    let err = store
        .revoke_token("tok_zzz", at(50), &token_revoked(&first, 50))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::NotFound { what: "token", id } if id == "tok_zzz"),
        "{err}"
    );

    assert_eq!(
        store.list_tokens().await.unwrap(),
        vec![expected, second.clone()]
    );
    assert_eq!(
        kinds(&all_events(&store).await),
        ["token_created", "token_created", "token_revoked"]
    );
}
