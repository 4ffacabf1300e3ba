//! Verifying a whole log from its entries: the recomputed tree must produce every signed
//! checkpoint's root. Used by `countersign log verify` and by auditors holding a copy of
//! the entries.

use std::collections::{BTreeMap, BTreeSet};

use crate::checkpoint::Checkpoint;
use crate::event::LogEntry;
use crate::keys::Jwks;
use crate::merkle::{self, CompactRange, Hash};

/// The outcome of recomputing a log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogReport {
    pub entries: u64,
    pub checkpoints: usize,
    pub problems: Vec<String>,
    /// The recomputed root at every checkpointed size.
    pub roots: BTreeMap<u64, Hash>,
}

impl LogReport {
    pub fn valid(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Recomputes the tree entry by entry (so a log of any length streams through) and, at
/// the end, checks each signed checkpoint: signed by a key in the JWKS under the origin,
/// of a size the entries reach, with the root they produce.
pub struct LogVerifier {
    report: LogReport,
    checkpoints: Vec<Checkpoint>,
    wanted: BTreeSet<u64>,
    range: CompactRange,
}

impl LogVerifier {
    pub fn new(checkpoints: &[String], jwks: &Jwks, origin: &str) -> Self {
        let mut report = LogReport::default();
        let mut parsed = Vec::new();
        for note in checkpoints {
            match Checkpoint::verify(note, jwks, Some(origin)) {
                Ok(c) => parsed.push(c),
                Err(e) => report.problems.push(format!("checkpoint: {e}")),
            }
        }
        Self {
            wanted: parsed.iter().map(|c| c.size).collect(),
            checkpoints: parsed,
            report,
            range: CompactRange::empty(),
        }
    }

    /// The next entry's exact bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        match serde_json::from_slice::<LogEntry>(bytes) {
            Ok(entry) if entry.to_bytes() == bytes => {}
            Ok(_) => self.report.problems.push(format!(
                "entry {} is not in canonical form",
                self.range.size()
            )),
            Err(e) => self.report.problems.push(format!(
                "entry {} is not a log entry: {e}",
                self.range.size()
            )),
        }
        self.range.append(merkle::leaf_hash(bytes));
        if self.wanted.contains(&self.range.size()) {
            self.report
                .roots
                .insert(self.range.size(), self.range.root());
        }
    }

    pub fn finish(mut self) -> LogReport {
        self.report.entries = self.range.size();
        self.report.checkpoints = self.checkpoints.len();
        for c in &self.checkpoints {
            match self.report.roots.get(&c.size) {
                Some(root) if *root == c.root => {}
                Some(_) => self.report.problems.push(format!(
                    "the checkpoint of size {} has a root the entries do not produce: an entry was altered, removed, reordered or inserted",
                    c.size
                )),
                None => self.report.problems.push(format!(
                    "the checkpoint of size {} is beyond the {} entries: entries were removed",
                    c.size, self.report.entries
                )),
            }
        }
        self.report
    }
}

/// [`LogVerifier`] over entries already in memory.
pub fn verify_log<'a>(
    entries: impl IntoIterator<Item = &'a [u8]>,
    checkpoints: &[String],
    jwks: &Jwks,
    origin: &str,
) -> LogReport {
    let mut verifier = LogVerifier::new(checkpoints, jwks, origin);
    for bytes in entries {
        verifier.push(bytes);
    }
    verifier.finish()
}
