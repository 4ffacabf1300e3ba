//! The event log: gap-free numbers in commit order, exact bytes, events by subject, and
//! payload openings kept beside their entries (and erased without touching them).

use std::collections::BTreeMap;
use std::sync::Arc;

use countersign_core::{Event, EventKind, Limits, SealedEvent, Verdict};
use serde_json::json;
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use crate::{Created, Store, StoredEvent};

use super::fixtures::*;

/// Events are numbered 1, 2, 3… with no gap, even around failed writes, and keep their
/// exact bytes; `events_after` pages through them.
pub async fn events_are_gap_free_and_exact(store: Arc<dyn Store>) {
    assert_eq!(store.last_event_seq().await.unwrap(), 0);
    assert!(all_events(&store).await.is_empty());

    let bot = agent("deploy-bot");
    let alice = approver("alice");
    let mut expected: Vec<SealedEvent> = Vec::new();

    let a = sealed(&new_request("req_a", &bot, 0, 3600, None));
    create_sealed(&store, &a).await;
    expected.push(a.event.clone());

    // Each failure below sits between successes: a burned number would show as a gap.
    let clash = new_request("req_a", &bot, 1, 3600, None);
    assert!(store.create_request(&sealed(&clash)).await.is_err());

    let (tok, tok_event) = token("tok_1", "alice", "hash-1", 1);
    store.create_token(&tok, &tok_event).await.unwrap();
    expected.push(tok_event);

    let approved = sealed(&decide(&a.request, Verdict::Approved, &alice, 2, "n1"));
    store.apply(&approved).await.unwrap();
    expected.push(approved.event.clone());

    let stale = decide(&a.request, Verdict::Rejected, &alice, 3, "n2");
    assert!(store.apply(&sealed(&stale)).await.is_err());
    let (dup, dup_event) = token("tok_2", "bob", "hash-1", 3);
    assert!(store.create_token(&dup, &dup_event).await.is_err());
    assert!(
        store
            .revoke_token("tok_missing", at(3), &token_revoked(&dup, 3))
            .await
            .is_err()
    );

    let b = sealed(&new_request("req_b", &bot, 4, 3600, Some("k")));
    create_sealed(&store, &b).await;
    expected.push(b.event.clone());
    let b_retry = new_request("req_b2", &bot, 4, 3600, Some("k"));
    assert!(matches!(
        store.create_request(&sealed(&b_retry)).await.unwrap(),
        Created::Existing(_)
    ));

    let revoked = token_revoked(&tok, 5);
    store.revoke_token("tok_1", at(5), &revoked).await.unwrap();
    expected.push(revoked.clone());
    assert!(store.revoke_token("tok_1", at(6), &revoked).await.is_err());

    let recorded = recorded_decision("dec_1", &bot, 6);
    assert_eq!(store.append_event(&recorded).await.unwrap(), 6);
    expected.push(recorded);

    let cancelled = sealed(&b.request.cancel(&bot, at(7)).unwrap());
    store.apply(&cancelled).await.unwrap();
    expected.push(cancelled.event);

    let events = all_events(&store).await;
    assert_gap_free(&events);
    assert_eq!(events.len(), expected.len());
    for (stored, sealed) in events.iter().zip(&expected) {
        assert_stored_as(stored, sealed);
        assert_eq!(stored.index(), stored.seq - 1);
        // The entry read back is the one its bytes encode.
        assert_eq!(
            stored.entry.to_bytes(),
            stored.bytes,
            "event {}",
            stored.seq
        );
    }
    assert_eq!(store.last_event_seq().await.unwrap(), expected.len() as u64);

    // Paging two at a time yields the same events.
    let mut paged = Vec::new();
    let mut cursor = 0;
    loop {
        let page = store.events_after(cursor, 2).await.unwrap();
        assert!(page.len() <= 2);
        let Some(last) = page.last() else { break };
        cursor = last.seq;
        paged.extend(page);
    }
    assert_eq!(paged, events);
    assert_eq!(
        store.events_after(2, 1).await.unwrap(),
        vec![events[2].clone()]
    );
    assert!(
        store
            .events_after(events.len() as u64, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

/// A sealed event's payload opening is stored beside its entry and read back by
/// sequence number; it opens the commitment in the stored entry. Events without a
/// payload have none, and asking for unknown numbers is not an error.
pub async fn payloads_are_kept_beside_entries(store: Arc<dyn Store>) {
    assert!(store.payloads(&[1, 2, 3]).await.unwrap().is_empty());
    let bot = agent("deploy-bot");
    let alice = approver("alice");

    // Events with (P) and without (-) a payload, interleaved.
    let a = sealed(&new_request("req_a", &bot, 0, 3600, None)); // 1 P
    create_sealed(&store, &a).await;
    let (tok, tok_event) = token("tok_1", "alice", "hash-1", 1); // 2 -
    store.create_token(&tok, &tok_event).await.unwrap();
    let b = sealed(&new_request("req_b", &bot, 2, 3600, None)); // 3 P
    create_sealed(&store, &b).await;
    let approved = sealed(&decide(&a.request, Verdict::Approved, &alice, 3, "n1")); // 4 P
    store.apply(&approved).await.unwrap();
    let cancelled = sealed(&b.request.cancel(&bot, at(4)).unwrap()); // 5 -
    store.apply(&cancelled).await.unwrap();
    let recorded = recorded_decision("dec_1", &bot, 5); // 6 P
    assert_eq!(store.append_event(&recorded).await.unwrap(), 6);
    let used = sealed(
        &approved
            .request
            .record_action(
                "pay".into(),
                BTreeMap::from([("invoice".to_string(), "INV-9".to_string())]),
                &bot,
                at(6),
                &Limits::default(),
            )
            .unwrap(),
    ); // 7 P
    store.apply(&used).await.unwrap();

    let written = [
        &a.event,
        &tok_event,
        &b.event,
        &approved.event,
        &cancelled.event,
        &recorded,
        &used.event,
    ];
    assert!(
        [1, 3, 4, 6, 7]
            .iter()
            .all(|&seq| written[seq - 1].payload.is_some())
    );
    assert!(written[1].payload.is_none() && written[4].payload.is_none());

    let events = all_events(&store).await;
    assert_eq!(events.len(), written.len());
    let all_seqs: Vec<u64> = (1..=9).collect();
    let openings = store.payloads(&all_seqs).await.unwrap();
    assert_eq!(
        openings.keys().copied().collect::<Vec<_>>(),
        [1, 3, 4, 6, 7],
        "only the events with a payload have one"
    );
    for (stored, sealed) in events.iter().zip(written) {
        assert_stored_as(stored, sealed);
        match openings.get(&stored.seq) {
            Some(opening) => {
                assert_eq!(
                    Some(opening),
                    sealed.payload.as_ref(),
                    "opening {}",
                    stored.seq
                );
                assert!(stored.entry.payload.is_some());
                assert_eq!(
                    opening.commitment(),
                    stored.entry.payload,
                    "opening {} opens its stored entry's commitment",
                    stored.seq
                );
            }
            None => assert_eq!(stored.entry.payload, None, "event {}", stored.seq),
        }
    }
    // Openings are not interchangeable: each salt is fresh.
    assert_ne!(openings[&1].commitment(), events[2].entry.payload);

    // A subset, in any order, with repeats and unknown numbers.
    let some = store.payloads(&[7, 2, 4, 4, 100]).await.unwrap();
    assert_eq!(some.keys().copied().collect::<Vec<_>>(), [4, 7]);
    assert_eq!(some[&4], openings[&4]);
    assert!(store.payloads(&[]).await.unwrap().is_empty());
    assert!(store.payloads(&[2, 5]).await.unwrap().is_empty());
    // More numbers than one SQL statement may bind on some backends.
    // (The stored ones come last, so that a backend that splits the list must read
    // every part.)
    let many: Vec<u64> = (1..=70_000).rev().collect();
    assert_eq!(store.payloads(&many).await.unwrap(), openings);
}

/// `events_of_subject` returns exactly one subject's events, in order, however they
/// interleave with others'.
pub async fn events_of_subject_in_order(store: Arc<dyn Store>) {
    assert!(store.events_of_subject("req_a").await.unwrap().is_empty());
    let bot = agent("deploy-bot");
    let alice = approver("alice");

    let a = sealed(&new_request("req_a", &bot, 0, 3600, None)); // 1
    create_sealed(&store, &a).await;
    let b = sealed(&new_request("req_b", &bot, 1, 3600, None)); // 2
    create_sealed(&store, &b).await;
    // A subject that is a prefix of another must not match it.
    let a2 = sealed(&new_request("req_a2", &bot, 1, 3600, None)); // 3
    create_sealed(&store, &a2).await;
    let (tok, tok_event) = token("tok_1", "alice", "hash-1", 2); // 4, no subject
    store.create_token(&tok, &tok_event).await.unwrap();
    let b_decided = sealed(&decide(&b.request, Verdict::Rejected, &alice, 3, "n1")); // 5
    store.apply(&b_decided).await.unwrap();
    let a_decided = sealed(&decide(&a.request, Verdict::Approved, &alice, 4, "n2")); // 6
    store.apply(&a_decided).await.unwrap();
    let recorded = recorded_decision("dec_1", &bot, 5); // 7
    store.append_event(&recorded).await.unwrap();
    let a_used = sealed(
        &a_decided
            .request
            .record_action(
                "pay".into(),
                BTreeMap::new(),
                &bot,
                at(6),
                &Limits::default(),
            )
            .unwrap(),
    ); // 8
    store.apply(&a_used).await.unwrap();

    let check = |subject: &'static str, expected: Vec<(u64, SealedEvent)>| {
        let store = store.clone();
        async move {
            let events = store.events_of_subject(subject).await.unwrap();
            let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
            let want: Vec<u64> = expected.iter().map(|(seq, _)| *seq).collect();
            assert_eq!(seqs, want, "events of {subject}");
            for (stored, (_, sealed)) in events.iter().zip(&expected) {
                assert_stored_as(stored, sealed);
                assert_eq!(stored.entry.subject.as_deref(), Some(subject));
            }
        }
    };
    check(
        "req_a",
        vec![
            (1, a.event.clone()),
            (6, a_decided.event.clone()),
            (8, a_used.event.clone()),
        ],
    )
    .await;
    check(
        "req_b",
        vec![(2, b.event.clone()), (5, b_decided.event.clone())],
    )
    .await;
    check("req_a2", vec![(3, a2.event.clone())]).await;
    check("dec_1", vec![(7, recorded.clone())]).await;
    check("req_missing", vec![]).await;
    check("tok_1", vec![]).await;

    // Pages of one subject: after a seq, oldest first; before a seq, the newest ones,
    // still oldest first. Neither reads another subject's events.
    let seqs = |events: Vec<StoredEvent>| events.iter().map(|e| e.seq).collect::<Vec<_>>();
    let after = |after: u64, limit: usize| {
        let store = store.clone();
        async move {
            seqs(
                store
                    .events_of_subject_after("req_a", after, limit)
                    .await
                    .unwrap(),
            )
        }
    };
    assert_eq!(after(0, 10).await, [1, 6, 8]);
    assert_eq!(after(1, 10).await, [6, 8]);
    assert_eq!(after(1, 1).await, [6]);
    assert_eq!(after(8, 10).await, Vec::<u64>::new());
    let before = |before: u64, limit: usize| {
        let store = store.clone();
        async move {
            seqs(
                store
                    .events_of_subject_before("req_a", before, limit)
                    .await
                    .unwrap(),
            )
        }
    };
    assert_eq!(before(u64::MAX, 10).await, [1, 6, 8]);
    assert_eq!(before(u64::MAX, 2).await, [6, 8]);
    assert_eq!(before(8, 1).await, [6]);
    assert_eq!(before(1, 10).await, Vec::<u64>::new());
    assert!(
        store
            .events_of_subject_after("req_a2", 0, 10)
            .await
            .unwrap()
            .iter()
            .all(|e| e.entry.subject.as_deref() == Some("req_a2"))
    );
}

/// `append_event` numbers an event like any other write, returns its number, and the
/// event reads back at once; concurrent appends get distinct, gap-free numbers.
pub async fn append_event_returns_the_next_seq(store: Arc<dyn Store>) {
    let bot = agent("deploy-bot");
    let first = recorded_decision("dec_1", &bot, 0);
    assert_eq!(store.append_event(&first).await.unwrap(), 1);
    assert_eq!(store.last_event_seq().await.unwrap(), 1);
    let events = all_events(&store).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].seq, 1);
    assert_stored_as(&events[0], &first);
    assert_eq!(
        store.payloads(&[1]).await.unwrap().get(&1),
        first.payload.as_ref()
    );

    create_new(&store, &new_request("req_a", &bot, 1, 3600, None)).await;
    // An event with neither subject nor payload.
    let rotated = seal_event(&Event::system(
        EventKind::KeyRotated,
        at(2),
        None,
        json!({"kid": "key-2", "previous": "key-1"}),
    ));
    assert_eq!(store.append_event(&rotated).await.unwrap(), 3);
    let third = store.events_after(2, 10).await.unwrap();
    assert_eq!(third.len(), 1);
    assert_stored_as(&third[0], &rotated);
    assert!(store.payloads(&[3]).await.unwrap().is_empty());

    let barrier = Arc::new(Barrier::new(16));
    let mut tasks = JoinSet::new();
    for i in 0..16 {
        let store = store.clone();
        let barrier = barrier.clone();
        let event = recorded_decision(&format!("dec_c{i:02}"), &bot, 10 + i);
        tasks.spawn(async move {
            barrier.wait().await;
            let seq = store.append_event(&event).await.unwrap();
            (seq, event)
        });
    }
    let mut appended = tasks.join_all().await;
    appended.sort_by_key(|(seq, _)| *seq);
    let seqs: Vec<u64> = appended.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(seqs, (4..=19).collect::<Vec<_>>());
    let events = all_events(&store).await;
    assert_gap_free(&events);
    for (seq, event) in &appended {
        assert_stored_as(&events[usize::try_from(*seq).unwrap() - 1], event);
    }
}

/// Erasing payload openings removes the values (and salts) but not the entries: the
/// log hashes the same, and other events keep theirs.
pub async fn erased_payloads_leave_the_log_intact(store: Arc<dyn Store>) {
    fill_log(&*store, "req", 3).await;
    let events = all_events(&store).await;
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    let before = store.payloads(&seqs).await.unwrap();
    assert_eq!(before.len(), 3, "each request_created has a payload");
    assert_eq!(
        store
            .erase_payloads(&[seqs[0], seqs[2], 999])
            .await
            .unwrap(),
        2
    );
    let after = store.payloads(&seqs).await.unwrap();
    assert_eq!(after.keys().copied().collect::<Vec<_>>(), vec![seqs[1]]);
    let again = all_events(&store).await;
    assert_eq!(again, events, "entries are untouched");
    assert_eq!(store.erase_payloads(&[]).await.unwrap(), 0);
}
