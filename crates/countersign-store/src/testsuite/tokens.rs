//! Bearer tokens: created once, found by hash, listed oldest first, revoked once.

use std::sync::Arc;

use countersign_core::{Role, Scope, Scopes, TokenRecord};

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

/// A token's expiry and scopes read back as written; its name is never given to
/// another token, whatever the case of its letters, even after it is revoked.
pub async fn token_names_expiry_and_scopes(store: Arc<dyn Store>) {
    let (plain, event) = token("tok_a", "Deploy-Bot", "hash-a", 10);
    store.create_token(&plain, &event).await.unwrap();
    let scoped = TokenRecord {
        role: Role::Executor,
        expires_at: Some(at(3600)),
        scopes: Some(Scopes::of([Scope::Redeem])),
        ..token("tok_b", "payments", "hash-b", 20).0
    };
    let (_, event) = token("tok_b", "payments", "hash-b", 20);
    store.create_token(&scoped, &event).await.unwrap();
    assert_eq!(
        store.token_by_hash("hash-b").await.unwrap(),
        Some(scoped.clone())
    );
    assert_eq!(
        store.list_tokens().await.unwrap(),
        vec![plain.clone(), scoped]
    );

    for name in ["Deploy-Bot", "deploy-bot", "DEPLOY-BOT"] {
        let (again, event) = token("tok_c", name, "hash-c", 30);
        let err = store.create_token(&again, &event).await.unwrap_err();
        assert!(matches!(err, StoreError::Duplicate(_)), "{err}");
        assert!(err.to_string().contains("tok_a"), "names the holder: {err}");
        assert!(err.to_string().contains("never reused"), "{err}");
    }
    store
        .revoke_token("tok_a", at(40), &token_revoked(&plain, 40))
        .await
        .unwrap();
    let (after_revoke, event) = token("tok_d", "deploy-bot", "hash-d", 50);
    let err = store.create_token(&after_revoke, &event).await.unwrap_err();
    assert!(matches!(err, StoreError::Duplicate(_)), "{err}");
    // A clash on the hash is still reported as one, even when the name clashes too.
    let (both, event) = token("tok_e", "deploy-bot", "hash-b", 60);
    let err = store.create_token(&both, &event).await.unwrap_err();
    assert!(err.to_string().contains("same hash (tok_b)"), "{err}");
    assert_eq!(store.list_tokens().await.unwrap().len(), 2);
    assert_eq!(
        kinds(&all_events(&store).await),
        ["token_created", "token_created", "token_revoked"],
        "a refused token writes no event"
    );
}

/// Tokens as a database of schema version 1 held them (before expiry, scopes and unique
/// names), two of them sharing a name: run in such a database before it is migrated.
pub const SCHEMA_1_TOKENS: &str =
    "INSERT INTO tokens (id, hash, name, role, created_at, revoked_at) VALUES
        ('tok_old', 'hash-old', 'bot', 'agent', 1000, NULL),
        ('tok_twin', 'hash-twin', 'Bot', 'approver', 2000, NULL),
        ('tok_gone', 'hash-gone', 'retired', 'agent', 3000, 4000)";

/// After the migration, on a store that held [`SCHEMA_1_TOKENS`]: every token keeps
/// working with no expiry and its role's scopes, the two that shared a name both
/// survive, and no new token may take a name any of them has.
pub async fn tokens_of_schema_1_keep_working(store: Arc<dyn Store>) {
    let tokens = store.list_tokens().await.unwrap();
    let ids: Vec<&str> = tokens.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["tok_old", "tok_twin", "tok_gone"]);
    assert!(
        tokens
            .iter()
            .all(|t| t.expires_at.is_none() && t.scopes.is_none())
    );
    let twin = store.token_by_hash("hash-twin").await.unwrap().unwrap();
    assert_eq!(twin.principal().scopes, Role::Approver.default_scopes());
    for (name, holder) in [("BOT", "tok_old"), ("Retired", "tok_gone")] {
        let (new, event) = token("tok_new", name, "hash-new", 5);
        let err = store.create_token(&new, &event).await.unwrap_err();
        assert!(
            matches!(&err, StoreError::Duplicate(m) if m.contains(holder)),
            "{err}"
        );
    }
    let (fresh, event) = token("tok_new", "fresh", "hash-new", 5);
    store.create_token(&fresh, &event).await.unwrap();
}
