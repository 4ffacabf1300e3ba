//! The transparency log's storage: its origin, the Merkle nodes that integration
//! stores, and the signed checkpoints.

use std::collections::BTreeSet;
use std::sync::Arc;

use countersign_core::merkle::{self, CompactRange, Hash, NodeId};
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use crate::{Store, StoreError, StoredCheckpoint};

use super::fixtures::*;

/// The first origin ever proposed is the log's origin for good.
pub async fn log_origin_first_wins(store: Arc<dyn Store>) {
    assert_eq!(
        store.log_origin("gate.example.com/log").await.unwrap(),
        "gate.example.com/log"
    );
    assert_eq!(
        store.log_origin("gate.example.com/log").await.unwrap(),
        "gate.example.com/log"
    );
    assert_eq!(
        store.log_origin("other.example.net/log").await.unwrap(),
        "gate.example.com/log",
        "a later proposal gets the first back"
    );
    // Writing events does not disturb it.
    fill_log(&*store, "req", 2).await;
    assert_eq!(
        store.log_origin("third.example.org").await.unwrap(),
        "gate.example.com/log"
    );
}

/// Processes that start together and each propose an origin all end up with the same
/// one.
pub async fn concurrent_log_origins_agree(store: Arc<dyn Store>) {
    let barrier = Arc::new(Barrier::new(8));
    let mut tasks = JoinSet::new();
    for i in 0..8 {
        let store = store.clone();
        let barrier = barrier.clone();
        tasks.spawn(async move {
            barrier.wait().await;
            store.log_origin(&format!("origin-{i}")).await.unwrap()
        });
    }
    let origins: BTreeSet<String> = tasks.join_all().await.into_iter().collect();
    assert_eq!(
        origins.len(),
        1,
        "every proposer learns the one origin: {origins:?}"
    );
    let origin = origins.into_iter().next().unwrap();
    assert!((0..8).any(|i| origin == format!("origin-{i}")), "{origin}");
    assert_eq!(store.log_origin("late").await.unwrap(), origin);
}

/// Integration stores the Merkle nodes of new entries and moves the integrated size,
/// as a compare-and-swap; roots and inclusion proofs built from stored nodes verify.
pub async fn integration_stores_the_tree(store: Arc<dyn Store>) {
    assert_eq!(store.integrated_size().await.unwrap(), 0);
    assert!(store.log_nodes(&[]).await.unwrap().is_empty());
    let missing = store.log_nodes(&[NodeId::new(0, 0)]).await.unwrap_err();
    assert!(matches!(missing, StoreError::NotFound { .. }), "{missing}");

    let n = 13;
    fill_log(&*store, "req", n as usize).await;
    let mut range = CompactRange::empty();
    let nodes = grow(&mut range, &leaves(&*store, 0, n).await);
    let root = range.root();
    assert!(store.integrate(0, n, &nodes).await.unwrap());
    assert_eq!(store.integrated_size().await.unwrap(), n);
    assert_tree(&*store, n, &root).await;

    // Integrating the same range again loses, and writes nothing: not the altered
    // hashes, not the extra node.
    let extra = NodeId::new(0, n + 40);
    let mut bogus: Vec<(NodeId, Hash)> = nodes.iter().map(|(id, _)| (*id, [0xee; 32])).collect();
    bogus.push((extra, [0xee; 32]));
    assert!(!store.integrate(0, n, &bogus).await.unwrap());
    assert!(!store.integrate(0, n + 3, &bogus).await.unwrap());
    assert_eq!(store.integrated_size().await.unwrap(), n);
    assert_tree(&*store, n, &root).await;
    let err = store.log_nodes(&[extra]).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound { .. }), "{err}");

    // Nodes that were never stored are an error, not a short answer: past the end, too
    // high, or mixed in with nodes that exist.
    for ids in [
        vec![NodeId::new(0, n)],
        vec![NodeId::new(4, 0)],
        vec![NodeId::new(0, 0), NodeId::new(2, 3)],
    ] {
        let err = store.log_nodes(&ids).await.unwrap_err();
        assert!(matches!(err, StoreError::NotFound { .. }), "{ids:?}: {err}");
    }
    // Asking for a node twice is fine.
    let twice = read_nodes(&*store, &[NodeId::new(3, 0), NodeId::new(3, 0)]).await;
    assert_eq!(twice.len(), 1);

    // A size beyond the stored events is refused, and so is rewriting a node that
    // exists: the tree is append-only.
    assert!(
        store.integrate(n, n + 5, &[]).await.is_err(),
        "beyond the events"
    );
    fill_log(&*store, "one-more", 1).await;
    let clash = [
        (NodeId::new(0, 0), [0xaa; 32]),
        (NodeId::new(0, n), [0xbb; 32]),
    ];
    let err = store.integrate(n, n + 1, &clash).await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
    assert_eq!(store.integrated_size().await.unwrap(), n, "nothing moved");
    assert_tree(&*store, n, &root).await;
    let err = store.log_nodes(&[NodeId::new(0, n)]).await.unwrap_err();
    assert!(
        matches!(err, StoreError::NotFound { .. }),
        "the refused batch wrote nothing: {err}"
    );

    // More entries integrate from where the last integration ended; an integrator that
    // still believes the old size loses.
    let m = 21;
    fill_log(&*store, "more", (m - n - 1) as usize).await;
    let first_range = range.clone();
    let more = grow(&mut range, &leaves(&*store, n, m).await);
    let second_root = range.root();
    assert!(!store.integrate(0, m, &more).await.unwrap(), "stale from");
    assert!(store.integrate(n, m, &more).await.unwrap());
    assert!(!store.integrate(n, m, &more).await.unwrap(), "twice");
    assert_eq!(store.integrated_size().await.unwrap(), m);
    assert_tree(&*store, m, &second_root).await;
    // The smaller tree is still answerable, and the two are consistent.
    assert_tree(&*store, n, &first_range.root()).await;
    let ids = merkle::consistency_nodes(n, m).unwrap();
    let stored = read_nodes(&*store, &ids).await;
    let proof = merkle::consistency_proof(n, m, &mut |id| stored.get(&id).copied()).unwrap();
    merkle::verify_consistency(n, m, &first_range.root(), &second_root, &proof).unwrap();
}

/// Several integrators racing over the same entries: exactly one moves the size.
pub async fn concurrent_integrators_one_wins(store: Arc<dyn Store>) {
    let n = 9;
    fill_log(&*store, "req", n as usize).await;
    let mut range = CompactRange::empty();
    let nodes = Arc::new(grow(&mut range, &leaves(&*store, 0, n).await));

    let barrier = Arc::new(Barrier::new(8));
    let mut tasks = JoinSet::new();
    for _ in 0..8 {
        let store = store.clone();
        let barrier = barrier.clone();
        let nodes = nodes.clone();
        tasks.spawn(async move {
            barrier.wait().await;
            store.integrate(0, n, &nodes).await.unwrap()
        });
    }
    let won = tasks.join_all().await;
    assert_eq!(
        won.iter().filter(|w| **w).count(),
        1,
        "exactly one integrator wins: {won:?}"
    );
    assert_eq!(store.integrated_size().await.unwrap(), n);
    assert_tree(&*store, n, &range.root()).await;
}

/// An integration and the checkpoint of its tree are stored together: a winner stores
/// both, a loser (stale `from`) neither, and a refused integration (beyond the events)
/// no checkpoint.
pub async fn integration_with_its_checkpoint_is_one_write(store: Arc<dyn Store>) {
    let n = 6;
    fill_log(&*store, "req", n as usize).await;
    let mut range = CompactRange::empty();
    let nodes = grow(&mut range, &leaves(&*store, 0, n).await);
    let signed = |size: u64, note: &str| StoredCheckpoint {
        size,
        note: format!("gate.example.com/log\n{size}\n{note}\n\n— gate.example.com sig\n"),
        created_at: at(40),
    };
    let six = signed(n, "cm9vdC02");
    assert!(
        store
            .integrate_signed(signed_at(0, n, &nodes, &six))
            .await
            .unwrap()
    );
    assert_eq!(store.integrated_size().await.unwrap(), n);
    assert_eq!(store.checkpoint(None).await.unwrap(), Some(six.clone()));
    assert_tree(&*store, n, &range.root()).await;

    // A stale integrator loses and its checkpoint is not stored.
    let stale = signed(n, "c3RhbGU=");
    assert!(
        !store
            .integrate_signed(signed_at(0, n, &nodes, &stale))
            .await
            .unwrap()
    );
    assert_eq!(store.checkpoint(Some(n)).await.unwrap(), Some(six.clone()));

    // Beyond the stored events: refused, and no checkpoint of that size appears.
    let beyond = signed(n + 4, "YmV5b25k");
    assert!(
        store
            .integrate_signed(signed_at(n, n + 4, &[], &beyond))
            .await
            .is_err()
    );
    assert_eq!(store.checkpoint(Some(n + 4)).await.unwrap(), None);
    assert_eq!(store.checkpoint(None).await.unwrap(), Some(six));
}

fn signed_at<'a>(
    from: u64,
    to: u64,
    nodes: &'a [(NodeId, Hash)],
    checkpoint: &'a StoredCheckpoint,
) -> crate::SignedIntegration<'a> {
    crate::SignedIntegration {
        from,
        to,
        nodes,
        checkpoint,
    }
}

/// One checkpoint per size, the first kept; the largest is the latest.
pub async fn checkpoints_one_per_size(store: Arc<dyn Store>) {
    assert_eq!(store.checkpoint(None).await.unwrap(), None);
    assert_eq!(store.checkpoint(Some(1)).await.unwrap(), None);
    assert!(store.checkpoints().await.unwrap().is_empty());

    let checkpoint = |size: u64, note: &str, seconds: i64| StoredCheckpoint {
        size,
        note: format!("gate.example.com/log\n{size}\n{note}\n\n— gate.example.com sig\n"),
        created_at: at(seconds),
    };
    let three = checkpoint(3, "cm9vdC0z", 10);
    let one = checkpoint(1, "cm9vdC0x", 20);
    let seven = checkpoint(7, "cm9vdC03", 30);
    // Added out of size order, so that reading must sort.
    for c in [&three, &one, &seven] {
        store.add_checkpoint(c).await.unwrap();
    }
    assert_eq!(
        store.checkpoints().await.unwrap(),
        vec![one.clone(), three.clone(), seven.clone()]
    );
    assert_eq!(store.checkpoint(None).await.unwrap(), Some(seven.clone()));
    assert_eq!(
        store.checkpoint(Some(3)).await.unwrap(),
        Some(three.clone())
    );
    assert_eq!(store.checkpoint(Some(1)).await.unwrap(), Some(one.clone()));
    assert_eq!(store.checkpoint(Some(4)).await.unwrap(), None);
    assert_eq!(store.checkpoint(Some(8)).await.unwrap(), None);

    // A second checkpoint of a size is ignored: the first signed note stays.
    store
        .add_checkpoint(&checkpoint(3, "b3RoZXI=", 40))
        .await
        .unwrap();
    assert_eq!(
        store.checkpoint(Some(3)).await.unwrap(),
        Some(three.clone())
    );
    assert_eq!(
        store.checkpoints().await.unwrap(),
        vec![one, three, seven.clone()]
    );
    assert_eq!(store.checkpoint(None).await.unwrap(), Some(seven));
}
