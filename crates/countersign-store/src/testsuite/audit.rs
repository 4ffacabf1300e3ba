//! The audit's reads: request rows by id in pages and payload openings by range, both
//! as stored; and the audit over them agreeing with an untouched store, then naming rows
//! that no entry backs.

use std::sync::Arc;

use countersign_core::Verdict;

use crate::Store;
use crate::audit;

use super::fixtures::*;

pub async fn audit_reads_rows_as_stored_and_holds_them_to_the_log(store: Arc<dyn Store>) {
    assert!(store.requests_after("", 10).await.unwrap().is_empty());
    assert!(store.payloads_between(1, 100).await.unwrap().is_empty());
    let bot = agent("deploy-bot");
    let alice = approver("alice");
    let mut requests = Vec::new();
    for (n, id) in ["req_c", "req_a", "req_b"].into_iter().enumerate() {
        let created = sealed(&new_request(id, &bot, n as i64, 3600, Some(id)));
        requests.push(create_sealed(&store, &created).await);
    }
    let (tok, tok_event) = token("tok_1", "alice", "hash-1", 5);
    store.create_token(&tok, &tok_event).await.unwrap();
    let approved = sealed(&decide(&requests[1], Verdict::Approved, &alice, 6, "n1"));
    store.apply(&approved).await.unwrap();

    // By id, after the one given, at most `limit`, with their columns.
    let ids = |rows: &[crate::RawRequest]| rows.iter().map(|r| r.id.clone()).collect::<Vec<_>>();
    let first = store.requests_after("", 2).await.unwrap();
    assert_eq!(ids(&first), ["req_a", "req_b"]);
    let rest = store.requests_after("req_b", 2).await.unwrap();
    assert_eq!(ids(&rest), ["req_c"]);
    let a = &first[0];
    assert_eq!(
        (
            a.version,
            a.status.as_str(),
            a.requested_by.as_str(),
            a.idempotency_key.as_deref()
        ),
        (2, "approved", "token:deploy-bot", Some("req_a"))
    );
    let body: countersign_core::ApprovalRequest = serde_json::from_str(&a.body).unwrap();
    assert_eq!(body, approved.request);
    assert_eq!(a.requested_at, approved.request.requested_at.millis());
    assert_eq!(a.expires_at, approved.request.expires_at.millis());

    // Openings by range: 1-3 are the creations, 4 the token (none), 5 the decision.
    let seqs = |from, to| {
        let store = store.clone();
        async move {
            store
                .payloads_between(from, to)
                .await
                .unwrap()
                .iter()
                .map(|p| p.seq)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(seqs(1, 5).await, [1, 2, 3, 5]);
    assert_eq!(seqs(2, 4).await, [2, 3]);
    assert_eq!(seqs(6, 9).await, Vec::<u64>::new());
    let five = store.payloads_between(5, 5).await.unwrap();
    let opening = approved.event.payload.clone().unwrap();
    assert_eq!(five[0].salt, opening.salt);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&five[0].payload).unwrap(),
        opening.payload
    );

    // Untouched, the rows agree with the log.
    let report = audit::run(&*store).await.unwrap();
    assert_eq!(report.differences, Vec::new());
    assert_eq!((report.entries, report.rows), (5, 4));

    // Rows copied in with no event behind them are named.
    let mut stray = requests[0].clone();
    stray.id = "req_z".into();
    stray.idempotency_key = None;
    store.import_request(&stray).await.unwrap();
    let (other, _) = token("tok_2", "mallory", "hash-2", 7);
    store.import_token(&other).await.unwrap();
    let found: Vec<String> = audit::run(&*store)
        .await
        .unwrap()
        .differences
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        found,
        [
            "requests req_z: the log has no request_created entry for it",
            "tokens tok_2: the log has no token_created entry for it",
        ]
    );
}
