//! The raw copies `migrate-data` makes: requests and tokens read back as given, with no
//! event, and carry on like any other.

use std::sync::Arc;

use countersign_core::{TokenRecord, Verdict};

use crate::{Created, RequestQuery, Store, StoreError};

use super::docs::assert_no_events;
use super::fixtures::*;

/// Imported requests and tokens read back exactly as given, write no event, cannot be
/// imported twice, and carry on like any other.
pub async fn imports_copy_rows_without_events(store: Arc<dyn Store>) {
    let bot = agent("deploy-bot");
    let created = new_request("req_done", &bot, 0, 3600, Some("key-done"));
    let decided = decide(
        &created.request,
        Verdict::Approved,
        &approver("alice"),
        5,
        "n1",
    );
    let pending = new_request("req_open", &bot, 1, 30, Some("key-open"));
    store.import_request(&decided.request).await.unwrap();
    store.import_request(&pending.request).await.unwrap();

    assert_eq!(
        store.get_request("req_done").await.unwrap(),
        Some(decided.request.clone())
    );
    assert_eq!(
        store.get_request("req_open").await.unwrap(),
        Some(pending.request.clone())
    );
    assert_eq!(
        store.list_requests(&RequestQuery::default()).await.unwrap(),
        vec![pending.request.clone(), decided.request.clone()]
    );
    assert_eq!(
        store.next_expiry().await.unwrap(),
        Some(pending.request.expires_at)
    );
    assert_eq!(
        ids(&store.due_for_expiry(at(1000), 10).await.unwrap()),
        ["req_open"]
    );
    // The requester's idempotency key came along.
    let retry = new_request("req_retry", &bot, 2, 3600, Some("key-open"));
    match store.create_request(&sealed(&retry)).await.unwrap() {
        Created::Existing(existing) => assert_eq!(existing, pending.request),
        Created::New(_) => panic!("the imported request holds the idempotency key"),
    }

    for again in [&decided.request, &created.request, &pending.request] {
        let err = store.import_request(again).await.unwrap_err();
        assert!(matches!(err, StoreError::Duplicate(_)), "{err}");
    }
    assert_eq!(
        store.get_request("req_done").await.unwrap(),
        Some(decided.request.clone())
    );

    let (active, _) = token("tok_live", "live", "hash-live", 3);
    let revoked = TokenRecord {
        revoked_at: Some(at(4)),
        ..token("tok_gone", "gone", "hash-gone", 2).0
    };
    store.import_token(&active).await.unwrap();
    store.import_token(&revoked).await.unwrap();
    assert_eq!(
        store.token_by_hash("hash-live").await.unwrap(),
        Some(active.clone())
    );
    assert_eq!(
        store.token_by_hash("hash-gone").await.unwrap(),
        Some(revoked.clone())
    );
    assert_eq!(
        store.list_tokens().await.unwrap(),
        vec![revoked.clone(), active.clone()]
    );
    let same_hash = TokenRecord {
        id: "tok_other".into(),
        ..active.clone()
    };
    for again in [&active, &revoked, &same_hash] {
        let err = store.import_token(again).await.unwrap_err();
        assert!(matches!(err, StoreError::Duplicate(_)), "{err}");
    }
    assert_eq!(store.list_tokens().await.unwrap().len(), 2);
    // Two tokens that shared a name before names were unique both come across, and the
    // name stays taken for new tokens.
    let twin = TokenRecord {
        id: "tok_twin".into(),
        hash: "hash-twin".into(),
        created_at: at(5),
        ..active.clone()
    };
    store.import_token(&twin).await.unwrap();
    assert_eq!(
        store.token_by_hash("hash-twin").await.unwrap(),
        Some(twin.clone())
    );
    let (renamed, event) = token("tok_new", "LIVE", "hash-new", 9);
    let err = store.create_token(&renamed, &event).await.unwrap_err();
    assert!(matches!(err, StoreError::Duplicate(_)), "{err}");
    assert_eq!(store.list_tokens().await.unwrap().len(), 3);
    assert_no_events(&store).await;

    // Imported rows carry on as usual: the pending request can be decided, from the
    // version it was imported at, and the token revoked.
    let approved = sealed(&decide(
        &pending.request,
        Verdict::Approved,
        &approver("bob"),
        6,
        "n2",
    ));
    store.apply(&approved).await.unwrap();
    assert_eq!(
        store.get_request("req_open").await.unwrap(),
        Some(approved.request.clone())
    );
    store
        .revoke_token("tok_live", at(7), &token_revoked(&active, 7))
        .await
        .unwrap();
    let err = store
        .revoke_token("tok_gone", at(8), &token_revoked(&revoked, 8))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Duplicate(_)),
        "already revoked: {err}"
    );
    assert_eq!(
        kinds(&all_events(&store).await),
        ["request_decided", "token_revoked"]
    );
}
