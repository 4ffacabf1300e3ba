//! The transparency log over the event sequence: integrating new entries into the Merkle
//! tree, signing checkpoints, serving proofs, and exporting evidence bundles.
//!
//! Entries are durable the moment their event commits (that is what every
//! acknowledgement waits for); integration then stores their Merkle nodes and signs a
//! checkpoint, promptly after, in whichever process gets there first. Because the event
//! sequence is gap-free and in commit order, there is exactly one log whatever the number
//! of processes: integration is a compare-and-swap on the integrated size.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use countersign_core::bundle::{self, BundleEntry, BundleInput, InclusionProof, Mode};
use countersign_core::checkpoint::Checkpoint;
use countersign_core::merkle::{self, CompactRange, Hash, NodeId};
use countersign_core::{Clock, EventKind};
use countersign_store::{ChangeFeed, Store, StoreError, StoredCheckpoint, StoredEvent};
use tokio_util::sync::CancellationToken;

use crate::error::GateError;
use crate::keyring::KeyRing;

/// How long new events may wait for a checkpoint: integration runs this soon after an
/// append (and batches whatever arrived meanwhile).
const SETTLE: Duration = Duration::from_millis(100);
const PAGE: usize = 10_000;

pub struct TransparencyLog {
    store: Arc<dyn Store>,
    keys: Arc<KeyRing>,
    clock: Arc<dyn Clock>,
    origin: String,
    /// One integration at a time in this process (others are fenced by the store).
    integrating: tokio::sync::Mutex<()>,
}

impl TransparencyLog {
    /// Opens the log, fixing its origin to `proposed` if it has none yet.
    pub async fn open(
        store: Arc<dyn Store>,
        keys: Arc<KeyRing>,
        clock: Arc<dyn Clock>,
        proposed: &str,
    ) -> Result<Self, GateError> {
        let origin = store.log_origin(proposed).await?;
        Ok(Self {
            store,
            keys,
            clock,
            origin,
            integrating: tokio::sync::Mutex::new(()),
        })
    }

    pub fn origin(&self) -> &str {
        &self.origin
    }

    async fn nodes(&self, ids: &[NodeId]) -> Result<BTreeMap<NodeId, Hash>, GateError> {
        let mut unique = ids.to_vec();
        unique.sort();
        unique.dedup();
        Ok(self.store.log_nodes(&unique).await?)
    }

    async fn root(&self, size: u64) -> Result<Hash, GateError> {
        let nodes = self.nodes(&merkle::root_nodes(size)).await?;
        merkle::root(size, &mut |id| nodes.get(&id).copied())
            .map_err(|e| GateError::Store(StoreError::Corrupt(e.to_string())))
    }

    /// Integrates every event stored when it is called (not yet in the tree) and signs a
    /// checkpoint of the new size. Returns the newest checkpoint.
    ///
    /// Events that arrive meanwhile wait for the next integration (the run loop's
    /// SETTLE after them): chasing them one by one under a steady stream signed a
    /// checkpoint every two or three entries.
    pub async fn integrate(&self) -> Result<Option<StoredCheckpoint>, GateError> {
        let _guard = self.integrating.lock().await;
        let target = self.store.last_event_seq().await?;
        loop {
            let from = self.store.integrated_size().await?;
            if target <= from {
                break;
            }
            let edge_ids = merkle::root_nodes(from);
            let edge = self.nodes(&edge_ids).await?;
            let hashes = edge_ids
                .iter()
                .filter_map(|id| edge.get(id).copied())
                .collect();
            let mut range = CompactRange::from_nodes(from, hashes)
                .map_err(|e| GateError::Store(StoreError::Corrupt(e.to_string())))?;
            // One page per round, so a large backlog never holds the write lock long.
            let limit = usize::try_from(target - from).map_or(PAGE, |n| n.min(PAGE));
            let page = self.store.follow_events(from, limit).await?.events;
            let mut created = Vec::new();
            for event in &page {
                if event.seq != range.size() + 1 {
                    return Err(GateError::Store(StoreError::Corrupt(format!(
                        "event {} follows {}: the event sequence has a gap",
                        event.seq,
                        range.size()
                    ))));
                }
                created.extend(range.append(merkle::leaf_hash(&event.bytes)));
            }
            let to = range.size();
            if to == from {
                break;
            }
            // The checkpoint goes in with the nodes: one commit per integration.
            let checkpoint = self.signed(to, range.root());
            self.store
                .integrate_signed(countersign_store::SignedIntegration {
                    from,
                    to,
                    nodes: &created,
                    checkpoint: &checkpoint,
                })
                .await?;
        }
        // A checkpoint for the integrated size, even if the process that integrated it
        // stopped before signing.
        let size = self.store.integrated_size().await?;
        let latest = self.store.checkpoint(None).await?;
        if size > 0 && latest.as_ref().is_none_or(|c| c.size < size) {
            let root = self.root(size).await?;
            self.sign(size, root).await?;
        }
        Ok(self.store.checkpoint(None).await?)
    }

    async fn sign(&self, size: u64, root: Hash) -> Result<(), GateError> {
        self.store.add_checkpoint(&self.signed(size, root)).await?;
        Ok(())
    }

    /// A checkpoint of the tree of `size` entries with `root`, signed now.
    fn signed(&self, size: u64, root: Hash) -> StoredCheckpoint {
        let note = Checkpoint {
            origin: self.origin.clone(),
            size,
            root,
        }
        .sign(&self.keys.signer());
        StoredCheckpoint {
            size,
            note,
            created_at: self.clock.now(),
        }
    }

    /// Integrates shortly after new events arrive, until `shutdown`. Also reloads the
    /// keys when another process rotates them.
    pub async fn run(self: Arc<Self>, feed: ChangeFeed, shutdown: CancellationToken) {
        let mut events = feed.subscribe();
        loop {
            if let Err(err) = self.integrate().await {
                tracing::warn!(%err, "log integration failed; retrying");
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                received = events.recv() => {
                    // Look at every event, including those that arrive while settling: a
                    // key rotation among them means signing with the new key from now on.
                    let mut rotated = match &received {
                        Ok(event) => event.entry.kind == EventKind::KeyRotated,
                        // Fell behind: a rotation may be among the missed events.
                        Err(_) => true,
                    };
                    // Let a burst of appends land, then integrate them together.
                    tokio::time::sleep(SETTLE).await;
                    loop {
                        match events.try_recv() {
                            Ok(event) => rotated |= event.entry.kind == EventKind::KeyRotated,
                            Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) => rotated = true,
                            Err(_) => break,
                        }
                    }
                    if rotated && let Err(err) = self.keys.reload() {
                        tracing::warn!(%err, "could not reload the rotated keys");
                    }
                }
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            }
        }
    }

    /// The checkpoint of `size`, or the newest.
    pub async fn checkpoint(&self, size: Option<u64>) -> Result<StoredCheckpoint, GateError> {
        if let Some(c) = self.store.checkpoint(size).await? {
            return Ok(c);
        }
        if size.is_none() {
            // Nothing signed yet: integrate now rather than make the caller wait.
            if let Some(c) = self.integrate().await? {
                return Ok(c);
            }
        }
        Err(GateError::NotFound(match size {
            Some(s) => format!("checkpoint of size {s}"),
            None => "checkpoint (the log is empty)".into(),
        }))
    }

    /// The entry at `index` (0-based).
    pub async fn entry(&self, index: u64) -> Result<StoredEvent, GateError> {
        self.store
            .events_after(index, 1)
            .await?
            .into_iter()
            .next()
            .filter(|e| e.index() == index)
            .ok_or_else(|| GateError::NotFound(format!("log entry {index}")))
    }

    /// Proves entry `index` is in the tree of `tree_size` (default: the newest
    /// checkpoint's size).
    pub async fn inclusion(
        &self,
        index: u64,
        tree_size: Option<u64>,
    ) -> Result<InclusionProof, GateError> {
        let size = match tree_size {
            Some(s) => s,
            None => self.checkpoint(None).await?.size,
        };
        self.check_integrated(size).await?;
        let ids =
            merkle::inclusion_nodes(index, size).map_err(|e| GateError::BadInput(e.to_string()))?;
        let nodes = self.nodes(&ids).await?;
        let path = merkle::inclusion_proof(index, size, &mut |id| nodes.get(&id).copied())
            .map_err(|e| GateError::Store(StoreError::Corrupt(e.to_string())))?;
        let leaf = self.store.log_nodes(&[NodeId::new(0, index)]).await?;
        let leaf = leaf
            .get(&NodeId::new(0, index))
            .copied()
            .ok_or_else(|| GateError::NotFound(format!("log entry {index}")))?;
        Ok(InclusionProof::new(index, size, &leaf, &path))
    }

    /// Proves the tree of `second` entries extends the tree of `first`.
    pub async fn consistency(&self, first: u64, second: u64) -> Result<Vec<Hash>, GateError> {
        self.check_integrated(second).await?;
        let ids = merkle::consistency_nodes(first, second)
            .map_err(|e| GateError::BadInput(e.to_string()))?;
        let nodes = self.nodes(&ids).await?;
        merkle::consistency_proof(first, second, &mut |id| nodes.get(&id).copied())
            .map_err(|e| GateError::Store(StoreError::Corrupt(e.to_string())))
    }

    async fn check_integrated(&self, size: u64) -> Result<(), GateError> {
        let integrated = self.store.integrated_size().await?;
        if size > integrated {
            return Err(GateError::BadInput(format!(
                "the log has {integrated} integrated entries; a tree of {size} does not exist yet"
            )));
        }
        Ok(())
    }

    /// An evidence bundle for `subject` against the newest checkpoint.
    pub async fn bundle(
        &self,
        subject: &str,
        mode: Mode,
        decisions: Vec<countersign_core::Envelope>,
    ) -> Result<Vec<u8>, GateError> {
        self.integrate().await?;
        let checkpoint = self.checkpoint(None).await?;
        let events: Vec<StoredEvent> = self
            .store
            .events_of_subject(subject)
            .await?
            .into_iter()
            .filter(|e| e.index() < checkpoint.size)
            .collect();
        if events.is_empty() {
            return Err(GateError::NotFound(format!("{subject} (no log entries)")));
        }
        let ids: Vec<NodeId> = events
            .iter()
            .map(|e| merkle::inclusion_nodes(e.index(), checkpoint.size))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| GateError::Store(StoreError::Corrupt(e.to_string())))?
            .concat();
        let nodes = self.nodes(&ids).await?;
        let mut payloads = match mode {
            Mode::Full => {
                let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
                self.store.payloads(&seqs).await?
            }
            Mode::Redacted => BTreeMap::new(),
        };
        // A decision proof belongs in the bundle only with its logged decision.
        let decisions = if events
            .iter()
            .any(|e| e.entry.kind == EventKind::RequestDecided)
        {
            decisions
        } else {
            Vec::new()
        };
        let mut entries = Vec::with_capacity(events.len());
        for event in events {
            let path = merkle::inclusion_proof(event.index(), checkpoint.size, &mut |id| {
                nodes.get(&id).copied()
            })
            .map_err(|e| GateError::Store(StoreError::Corrupt(e.to_string())))?;
            if mode == Mode::Full
                && event.entry.payload.is_some()
                && !payloads.contains_key(&event.seq)
            {
                return Err(GateError::BadInput(format!(
                    "the payload of log entry {} was erased; export a redacted bundle",
                    event.index()
                )));
            }
            entries.push(BundleEntry {
                index: event.index(),
                payload: payloads.remove(&event.seq),
                bytes: event.bytes,
                path,
            });
        }
        bundle::build(
            &BundleInput {
                subject: subject.to_string(),
                mode,
                log_origin: self.origin.clone(),
                checkpoint_note: checkpoint.note,
                tree_size: checkpoint.size,
                jwks: crate::keyring::published_jwks(&*self.store, &self.keys).await?,
                entries,
                decisions,
            },
            &self.keys.signer(),
        )
        .map_err(|e| GateError::internal("could not build the evidence bundle", e))
    }
}
