//! An RFC 9162 Merkle tree: hashing, the nodes a proof needs, building proofs from stored
//! nodes, and verifying inclusion and consistency proofs.
//!
//! Leaf hash: SHA-256(0x00 || entry). Node hash: SHA-256(0x01 || left || right). The tree
//! of n leaves splits at the largest power of two below n. Stored nodes are the roots of
//! *perfect* subtrees: `NodeId { level, index }` covers leaves
//! `[index * 2^level, (index + 1) * 2^level)`; level 0 are the leaf hashes. Every range a
//! proof needs is a run of such nodes, so a store that keeps them answers any proof with
//! O(log n) reads.

use sha2::{Digest, Sha256};

pub type Hash = [u8; 32];

pub fn leaf_hash(entry: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update([0u8]);
    h.update(entry);
    h.finalize().into()
}

pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// The root of the empty tree: SHA-256 of nothing.
pub fn empty_root() -> Hash {
    Sha256::digest([]).into()
}

/// A perfect subtree: `level` is its height, `index` its position among subtrees of
/// that height.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId {
    pub level: u8,
    pub index: u64,
}

impl NodeId {
    pub fn new(level: u8, index: u64) -> Self {
        Self { level, index }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MerkleError {
    #[error("index {index} is not in a tree of {size} leaves")]
    IndexOutOfRange { index: u64, size: u64 },
    #[error("a consistency proof needs 0 < first <= second, got {first} and {second}")]
    BadSizes { first: u64, second: u64 },
    #[error("node {0:?} is missing from the store")]
    MissingNode(NodeId),
    #[error("the proof does not verify: {0}")]
    Invalid(String),
}

/// Splits `[start, end)` into maximal aligned perfect subtrees, left to right.
pub fn decompose(start: u64, end: u64) -> Vec<NodeId> {
    let mut nodes = Vec::new();
    let mut at = start;
    while at < end {
        let remaining = end - at;
        // The largest level whose subtree starts at `at` and fits before `end`.
        let mut level = if at == 0 { 63 } else { at.trailing_zeros() };
        while level > 0 && (1u64 << level) > remaining {
            level -= 1;
        }
        nodes.push(NodeId::new(level as u8, at >> level));
        at += 1u64 << level;
    }
    nodes
}

/// The nodes whose hashes make up the root of a tree of `size` leaves.
pub fn root_nodes(size: u64) -> Vec<NodeId> {
    decompose(0, size)
}

/// The ranges whose hashes form the inclusion proof of `index` in a tree of `size`,
/// in proof order (RFC 9162 PATH).
fn inclusion_ranges(index: u64, size: u64) -> Vec<(u64, u64)> {
    fn path(m: u64, start: u64, end: u64, out: &mut Vec<(u64, u64)>) {
        let n = end - start;
        if n <= 1 {
            return;
        }
        let k = largest_power_of_two_below(n);
        if m < k {
            path(m, start, start + k, out);
            out.push((start + k, end));
        } else {
            path(m - k, start + k, end, out);
            out.push((start, start + k));
        }
    }
    let mut out = Vec::new();
    path(index, 0, size, &mut out);
    out
}

/// The ranges whose hashes form the consistency proof from `first` to `second`
/// (RFC 9162 SUBPROOF).
fn consistency_ranges(first: u64, second: u64) -> Vec<(u64, u64)> {
    fn subproof(m: u64, start: u64, end: u64, whole: bool, out: &mut Vec<(u64, u64)>) {
        let n = end - start;
        if m == n {
            if !whole {
                out.push((start, end));
            }
            return;
        }
        let k = largest_power_of_two_below(n);
        if m <= k {
            subproof(m, start, start + k, whole, out);
            out.push((start + k, end));
        } else {
            subproof(m - k, start + k, end, false, out);
            out.push((start, start + k));
        }
    }
    let mut out = Vec::new();
    subproof(first, 0, second, true, &mut out);
    out
}

fn largest_power_of_two_below(n: u64) -> u64 {
    // n >= 2 here; the largest power of two strictly less than n.
    1u64 << (63 - (n - 1).leading_zeros())
}

/// Every stored node an inclusion proof needs.
pub fn inclusion_nodes(index: u64, size: u64) -> Result<Vec<NodeId>, MerkleError> {
    if index >= size {
        return Err(MerkleError::IndexOutOfRange { index, size });
    }
    Ok(inclusion_ranges(index, size)
        .into_iter()
        .flat_map(|(a, b)| decompose(a, b))
        .collect())
}

/// Every stored node a consistency proof needs.
pub fn consistency_nodes(first: u64, second: u64) -> Result<Vec<NodeId>, MerkleError> {
    check_sizes(first, second)?;
    if first == second {
        return Ok(Vec::new());
    }
    Ok(consistency_ranges(first, second)
        .into_iter()
        .flat_map(|(a, b)| decompose(a, b))
        .collect())
}

fn check_sizes(first: u64, second: u64) -> Result<(), MerkleError> {
    if first == 0 || first > second {
        return Err(MerkleError::BadSizes { first, second });
    }
    Ok(())
}

/// The hash of `[start, end)` from stored perfect-subtree nodes.
fn range_hash(
    start: u64,
    end: u64,
    get: &mut dyn FnMut(NodeId) -> Option<Hash>,
) -> Result<Hash, MerkleError> {
    let nodes = decompose(start, end);
    let mut acc: Option<Hash> = None;
    for id in nodes.into_iter().rev() {
        let h = get(id).ok_or(MerkleError::MissingNode(id))?;
        acc = Some(match acc {
            None => h,
            Some(right) => node_hash(&h, &right),
        });
    }
    Ok(acc.unwrap_or_else(empty_root))
}

/// The root of a tree of `size` leaves.
pub fn root(size: u64, get: &mut dyn FnMut(NodeId) -> Option<Hash>) -> Result<Hash, MerkleError> {
    range_hash(0, size, get)
}

pub fn inclusion_proof(
    index: u64,
    size: u64,
    get: &mut dyn FnMut(NodeId) -> Option<Hash>,
) -> Result<Vec<Hash>, MerkleError> {
    if index >= size {
        return Err(MerkleError::IndexOutOfRange { index, size });
    }
    inclusion_ranges(index, size)
        .into_iter()
        .map(|(a, b)| range_hash(a, b, get))
        .collect()
}

pub fn consistency_proof(
    first: u64,
    second: u64,
    get: &mut dyn FnMut(NodeId) -> Option<Hash>,
) -> Result<Vec<Hash>, MerkleError> {
    check_sizes(first, second)?;
    if first == second {
        return Ok(Vec::new());
    }
    consistency_ranges(first, second)
        .into_iter()
        .map(|(a, b)| range_hash(a, b, get))
        .collect()
}

/// The right edge of a growing tree: the perfect subtrees of `decompose(0, size)`.
/// Appending leaves yields every new perfect node, which is all a store must persist.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactRange {
    size: u64,
    nodes: Vec<(NodeId, Hash)>,
}

impl CompactRange {
    pub fn empty() -> Self {
        Self::default()
    }

    /// Rebuilds the range of a tree of `size` leaves from its `root_nodes(size)` hashes.
    pub fn from_nodes(size: u64, hashes: Vec<Hash>) -> Result<Self, MerkleError> {
        let ids = root_nodes(size);
        if ids.len() != hashes.len() {
            return Err(MerkleError::Invalid(format!(
                "a tree of {size} leaves has {} edge nodes, got {}",
                ids.len(),
                hashes.len()
            )));
        }
        Ok(Self {
            size,
            nodes: ids.into_iter().zip(hashes).collect(),
        })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Appends one leaf hash; returns the nodes it completed (the leaf itself first).
    pub fn append(&mut self, leaf: Hash) -> Vec<(NodeId, Hash)> {
        let mut created = vec![(NodeId::new(0, self.size), leaf)];
        let mut current = (NodeId::new(0, self.size), leaf);
        while let Some(&(left_id, left)) = self.nodes.last() {
            if left_id.level != current.0.level {
                break;
            }
            self.nodes.pop();
            let parent = (
                NodeId::new(left_id.level + 1, left_id.index / 2),
                node_hash(&left, &current.1),
            );
            created.push(parent);
            current = parent;
        }
        self.nodes.push(current);
        self.size += 1;
        created
    }

    pub fn root(&self) -> Hash {
        let mut acc: Option<Hash> = None;
        for (_, h) in self.nodes.iter().rev() {
            acc = Some(match acc {
                None => *h,
                Some(right) => node_hash(h, &right),
            });
        }
        acc.unwrap_or_else(empty_root)
    }
}

/// Verifies that `leaf` is at `index` in the tree of `size` leaves with `root`
/// (RFC 9162 section 2.1.3.2).
pub fn verify_inclusion(
    index: u64,
    size: u64,
    leaf: &Hash,
    proof: &[Hash],
    root: &Hash,
) -> Result<(), MerkleError> {
    if index >= size {
        return Err(MerkleError::IndexOutOfRange { index, size });
    }
    let (mut f, mut s) = (index, size - 1);
    let mut r = *leaf;
    for p in proof {
        if s == 0 {
            return Err(MerkleError::Invalid(
                "the inclusion proof is too long".into(),
            ));
        }
        if f & 1 == 1 || f == s {
            r = node_hash(p, &r);
            if f & 1 == 0 {
                while f & 1 == 0 && f != 0 {
                    f >>= 1;
                    s >>= 1;
                }
            }
        } else {
            r = node_hash(&r, p);
        }
        f >>= 1;
        s >>= 1;
    }
    if s != 0 {
        return Err(MerkleError::Invalid(
            "the inclusion proof is too short".into(),
        ));
    }
    if r != *root {
        return Err(MerkleError::Invalid(
            "the inclusion proof leads to a different root".into(),
        ));
    }
    Ok(())
}

/// Verifies that the tree of `second` leaves with `second_root` extends the tree of
/// `first` leaves with `first_root` (RFC 9162 section 2.1.4.2).
pub fn verify_consistency(
    first: u64,
    second: u64,
    first_root: &Hash,
    second_root: &Hash,
    proof: &[Hash],
) -> Result<(), MerkleError> {
    check_sizes(first, second)?;
    if first == second {
        if !proof.is_empty() {
            return Err(MerkleError::Invalid(
                "equal sizes need an empty consistency proof".into(),
            ));
        }
        if first_root != second_root {
            return Err(MerkleError::Invalid(
                "equal sizes but different roots: the log forked".into(),
            ));
        }
        return Ok(());
    }
    if proof.is_empty() {
        return Err(MerkleError::Invalid(
            "the consistency proof is empty".into(),
        ));
    }
    let mut path: Vec<Hash> = Vec::with_capacity(proof.len() + 1);
    if first.is_power_of_two() {
        path.push(*first_root);
    }
    path.extend_from_slice(proof);
    let (mut f, mut s) = (first - 1, second - 1);
    while f & 1 == 1 {
        f >>= 1;
        s >>= 1;
    }
    let mut fr = path[0];
    let mut sr = path[0];
    for c in &path[1..] {
        if s == 0 {
            return Err(MerkleError::Invalid(
                "the consistency proof is too long".into(),
            ));
        }
        if f & 1 == 1 || f == s {
            fr = node_hash(c, &fr);
            sr = node_hash(c, &sr);
            if f & 1 == 0 {
                while f & 1 == 0 && f != 0 {
                    f >>= 1;
                    s >>= 1;
                }
            }
        } else {
            sr = node_hash(&sr, c);
        }
        f >>= 1;
        s >>= 1;
    }
    if s != 0 {
        return Err(MerkleError::Invalid(
            "the consistency proof is too short".into(),
        ));
    }
    if fr != *first_root {
        return Err(MerkleError::Invalid(
            "the proof does not lead to the first root".into(),
        ));
    }
    if sr != *second_root {
        return Err(MerkleError::Invalid(
            "the proof does not lead to the second root".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::Path;

    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use serde::Deserialize;

    use super::*;

    /// RFC 9162's reference definition, computed directly from the leaves.
    fn mth(leaves: &[Hash]) -> Hash {
        match leaves.len() {
            0 => empty_root(),
            1 => leaves[0],
            n => {
                let k = largest_power_of_two_below(n as u64) as usize;
                node_hash(&mth(&leaves[..k]), &mth(&leaves[k..]))
            }
        }
    }

    fn tree(n: u64) -> (Vec<Hash>, HashMap<NodeId, Hash>) {
        let leaves: Vec<Hash> = (0..n)
            .map(|i| leaf_hash(format!("entry {i}").as_bytes()))
            .collect();
        let mut range = CompactRange::empty();
        let mut nodes = HashMap::new();
        for leaf in &leaves {
            for (id, h) in range.append(*leaf) {
                nodes.insert(id, h);
            }
        }
        assert_eq!(range.root(), mth(&leaves));
        (leaves, nodes)
    }

    #[test]
    fn roots_and_proofs_from_stored_nodes_match_the_rfc_definition() {
        for n in 1..=70u64 {
            let (leaves, nodes) = tree(n);
            let mut get = |id: NodeId| nodes.get(&id).copied();
            let r = root(n, &mut get).unwrap();
            assert_eq!(r, mth(&leaves), "root of {n}");
            for i in 0..n {
                let proof = inclusion_proof(i, n, &mut get).unwrap();
                verify_inclusion(i, n, &leaves[i as usize], &proof, &r).unwrap();
                assert!(
                    inclusion_nodes(i, n)
                        .unwrap()
                        .iter()
                        .all(|id| nodes.contains_key(id))
                );
                // The wrong leaf, index or size fails.
                assert!(verify_inclusion(i, n, &leaf_hash(b"other"), &proof, &r).is_err());
                if n > 1 {
                    assert!(
                        verify_inclusion((i + 1) % n, n, &leaves[i as usize], &proof, &r).is_err()
                    );
                }
            }
            for m in 1..=n {
                let proof = consistency_proof(m, n, &mut get).unwrap();
                let first = mth(&leaves[..m as usize]);
                verify_consistency(m, n, &first, &r, &proof).unwrap();
                if m < n {
                    assert!(verify_consistency(m, n, &leaf_hash(b"x"), &r, &proof).is_err());
                    let mut truncated = proof.clone();
                    truncated.pop();
                    assert!(verify_consistency(m, n, &first, &r, &truncated).is_err());
                    let mut extended = proof.clone();
                    extended.push(first);
                    assert!(verify_consistency(m, n, &first, &r, &extended).is_err());
                }
            }
        }
    }

    #[test]
    fn compact_range_rebuilds_from_edge_nodes() {
        let (leaves, nodes) = tree(37);
        let edge: Vec<Hash> = root_nodes(37).iter().map(|id| nodes[id]).collect();
        let mut range = CompactRange::from_nodes(37, edge).unwrap();
        assert_eq!(range.root(), mth(&leaves));
        let next = leaf_hash(b"next");
        range.append(next);
        let mut all = leaves.clone();
        all.push(next);
        assert_eq!(range.root(), mth(&all));
        assert!(CompactRange::from_nodes(37, vec![]).is_err());
    }

    #[test]
    fn decompose_covers_ranges_with_aligned_perfect_subtrees() {
        assert_eq!(decompose(0, 8), vec![NodeId::new(3, 0)]);
        assert_eq!(
            decompose(0, 7),
            vec![NodeId::new(2, 0), NodeId::new(1, 2), NodeId::new(0, 6)]
        );
        assert_eq!(decompose(4, 7), vec![NodeId::new(1, 2), NodeId::new(0, 6)]);
        assert!(decompose(3, 3).is_empty());
    }

    fn decode(s: &str) -> Vec<u8> {
        STANDARD.decode(s).unwrap_or_default()
    }

    fn hash32(bytes: Vec<u8>) -> Option<Hash> {
        bytes.try_into().ok()
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct InclusionVector {
        leaf_idx: u64,
        tree_size: u64,
        root: String,
        leaf_hash: String,
        proof: Option<Vec<String>>,
        want_err: bool,
        desc: String,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct ConsistencyVector {
        size1: u64,
        size2: u64,
        root1: String,
        root2: String,
        proof: Option<Vec<String>>,
        want_err: bool,
        desc: String,
    }

    fn vector_files(dir: &str) -> Vec<std::path::PathBuf> {
        let base = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/merkle")
            .join(dir);
        let mut files = Vec::new();
        let mut stack = vec![base];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "json") {
                    files.push(p);
                }
            }
        }
        files.sort();
        files
    }

    /// transparency-dev/merkle's public inclusion vectors, including the cases a
    /// verifier must reject.
    #[test]
    fn transparency_dev_inclusion_vectors() {
        let files = vector_files("inclusion");
        assert!(files.len() >= 90, "{}", files.len());
        for file in files {
            let v: InclusionVector =
                serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
            let proof: Option<Vec<Hash>> = v
                .proof
                .unwrap_or_default()
                .iter()
                .map(|p| hash32(decode(p)))
                .collect();
            let result = match (proof, hash32(decode(&v.leaf_hash)), hash32(decode(&v.root))) {
                (Some(proof), Some(leaf), Some(root)) => {
                    verify_inclusion(v.leaf_idx, v.tree_size, &leaf, &proof, &root).is_ok()
                }
                _ => false,
            };
            assert_eq!(result, !v.want_err, "{} ({})", file.display(), v.desc);
        }
    }

    #[test]
    fn transparency_dev_consistency_vectors() {
        let files = vector_files("consistency");
        assert!(files.len() >= 90, "{}", files.len());
        for file in files {
            let v: ConsistencyVector =
                serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
            let proof: Option<Vec<Hash>> = v
                .proof
                .unwrap_or_default()
                .iter()
                .map(|p| hash32(decode(p)))
                .collect();
            // A few cases use placeholder roots that are not 32 bytes ("don't care"); only
            // their equality matters, which hashing them preserves.
            let as_root = |s: &str| {
                let bytes = decode(s);
                hash32(bytes.clone()).unwrap_or_else(|| Sha256::digest(&bytes).into())
            };
            let result = match proof {
                Some(proof) => verify_consistency(
                    v.size1,
                    v.size2,
                    &as_root(&v.root1),
                    &as_root(&v.root2),
                    &proof,
                )
                .is_ok(),
                None => false,
            };
            assert_eq!(result, !v.want_err, "{} ({})", file.display(), v.desc);
        }
    }
}
