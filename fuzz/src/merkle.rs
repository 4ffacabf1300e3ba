//! Merkle proofs: `verify_inclusion` and `verify_consistency` with arbitrary sizes,
//! indices and paths (they must never panic, overflow or loop), the node arithmetic
//! (`decompose`, `inclusion_nodes`, `consistency_nodes`, `CompactRange::from_nodes`),
//! and soundness against a real tree.
//!
//! The soundness half builds a tree of up to 64 leaves, derives proofs with a reference
//! implementation of RFC 9162 written here (not the one under test), lets the input
//! mutate them (indices, sizes, dropped, repeated or swapped hashes, hashes taken from
//! anywhere in the tree) and checks: the true proofs verify; an inclusion proof that
//! verifies against the true root and size is for the true leaf at that index, with the
//! true path; a consistency proof that verifies against the true second root is for the
//! true first root.

use arbitrary::{Arbitrary, Unstructured};
use countersign_core::merkle::{
    self, CompactRange, Hash, decompose, empty_root, leaf_hash, node_hash,
};

#[derive(Debug, Arbitrary)]
enum Input {
    Inclusion {
        index: u64,
        size: u64,
        leaf: Hash,
        proof: Vec<Hash>,
        root: Hash,
    },
    Consistency {
        first: u64,
        second: u64,
        first_root: Hash,
        second_root: Hash,
        proof: Vec<Hash>,
    },
    Nodes {
        a: u64,
        b: u64,
        hashes: u8,
    },
    RealInclusion {
        leaves: u8,
        index: u8,
        size_delta: i8,
        leaf: Pick,
        edits: Vec<PathEdit>,
    },
    RealConsistency {
        leaves: u8,
        first: u8,
        first_root: Pick,
        edits: Vec<PathEdit>,
    },
}

/// A hash: the true one, or any node of the tree.
#[derive(Debug, Arbitrary)]
enum Pick {
    True,
    Node(u16),
    Raw(Hash),
}

#[derive(Debug, Arbitrary)]
enum PathEdit {
    Drop(u8),
    Insert(u8, Pick),
    Replace(u8, Pick),
    Swap(u8, u8),
    Truncate(u8),
}

pub fn run(data: &[u8]) {
    let Ok(input) = Input::arbitrary(&mut Unstructured::new(data)) else {
        return;
    };
    match input {
        Input::Inclusion {
            index,
            size,
            leaf,
            proof,
            root,
        } => {
            let _ = merkle::verify_inclusion(index, size, &leaf, &proof, &root);
        }
        Input::Consistency {
            first,
            second,
            first_root,
            second_root,
            proof,
        } => {
            let _ = merkle::verify_consistency(first, second, &first_root, &second_root, &proof);
        }
        Input::Nodes { a, b, hashes } => nodes(a, b, hashes),
        Input::RealInclusion {
            leaves,
            index,
            size_delta,
            leaf,
            edits,
        } => real_inclusion(leaves, index, size_delta, leaf, &edits),
        Input::RealConsistency {
            leaves,
            first,
            first_root,
            edits,
        } => real_consistency(leaves, first, first_root, &edits),
    }
}

fn nodes(a: u64, b: u64, hashes: u8) {
    let ranges = decompose(a, b);
    // The nodes are aligned perfect subtrees that tile [a, b) left to right.
    let mut at = a;
    for id in &ranges {
        assert!(id.level < 64);
        let width = 1u64 << id.level;
        assert_eq!(id.index.checked_mul(width), Some(at), "{a}..{b}: {ranges:?}");
        at = at.checked_add(width).expect("decompose overflowed");
    }
    assert_eq!(at, a.max(b), "{a}..{b}: {ranges:?}");
    let _ = merkle::inclusion_nodes(a, b);
    let _ = merkle::consistency_nodes(a, b);
    let edge = merkle::root_nodes(b);
    let given = vec![[7u8; 32]; usize::from(hashes)];
    let range = CompactRange::from_nodes(b, given);
    assert_eq!(range.is_ok(), edge.len() == usize::from(hashes));
    if let Ok(mut range) = range {
        if b < u64::MAX {
            range.append(leaf_hash(b"x"));
            assert_eq!(range.size(), b + 1);
        }
    }
}

/// A tree of `n` leaves; picks take the hash of any range of it.
struct Tree {
    leaves: Vec<Hash>,
}

impl Tree {
    fn new(n: usize) -> Self {
        let leaves: Vec<Hash> = (0..n).map(|i| leaf_hash(&(i as u64).to_be_bytes())).collect();
        Self { leaves }
    }

    fn pick(&self, pick: &Pick, truth: Hash) -> Hash {
        match pick {
            Pick::True => truth,
            Pick::Node(i) => {
                // The range [start, end) that `i` names, computed only when picked.
                let n = self.leaves.len();
                let i = usize::from(*i);
                let start = i % n;
                let end = start + 1 + (i / n) % (n - start);
                mth(&self.leaves[start..end])
            }
            Pick::Raw(h) => *h,
        }
    }

    fn edit(&self, path: &mut Vec<Hash>, edits: &[PathEdit]) {
        for edit in edits.iter().take(4) {
            let n = path.len();
            match edit {
                PathEdit::Drop(i) if n > 0 => {
                    path.remove(usize::from(*i) % n);
                }
                PathEdit::Insert(i, p) => {
                    let h = self.pick(p, [0; 32]);
                    path.insert(usize::from(*i) % (n + 1), h);
                }
                PathEdit::Replace(i, p) if n > 0 => {
                    let at = usize::from(*i) % n;
                    path[at] = self.pick(p, path[at]);
                }
                PathEdit::Swap(a, b) if n > 0 => path.swap(usize::from(*a) % n, usize::from(*b) % n),
                PathEdit::Truncate(len) => path.truncate(usize::from(*len)),
                _ => {}
            }
        }
    }
}

/// RFC 9162 section 2.1.1: MTH.
fn mth(leaves: &[Hash]) -> Hash {
    match leaves.len() {
        0 => empty_root(),
        1 => leaves[0],
        n => {
            let k = split(n);
            node_hash(&mth(&leaves[..k]), &mth(&leaves[k..]))
        }
    }
}

/// The largest power of two smaller than `n` (n >= 2).
fn split(n: usize) -> usize {
    let mut k = 1;
    while k * 2 < n {
        k *= 2;
    }
    k
}

/// RFC 9162 section 2.1.3.1: PATH(m, D[n]).
fn path(m: usize, leaves: &[Hash]) -> Vec<Hash> {
    let n = leaves.len();
    if n <= 1 {
        return Vec::new();
    }
    let k = split(n);
    if m < k {
        let mut p = path(m, &leaves[..k]);
        p.push(mth(&leaves[k..]));
        p
    } else {
        let mut p = path(m - k, &leaves[k..]);
        p.push(mth(&leaves[..k]));
        p
    }
}

/// RFC 9162 section 2.1.4.1: PROOF(m, D[n]) = SUBPROOF(m, D[n], true).
fn subproof(m: usize, leaves: &[Hash], whole: bool) -> Vec<Hash> {
    let n = leaves.len();
    if m == n {
        return if whole { Vec::new() } else { vec![mth(leaves)] };
    }
    let k = split(n);
    if m <= k {
        let mut p = subproof(m, &leaves[..k], whole);
        p.push(mth(&leaves[k..]));
        p
    } else {
        let mut p = subproof(m - k, &leaves[k..], false);
        p.push(mth(&leaves[..k]));
        p
    }
}

fn real_inclusion(leaves: u8, index: u8, size_delta: i8, leaf: Pick, edits: &[PathEdit]) {
    let n = usize::from(leaves % 64) + 1;
    let tree = Tree::new(n);
    let root = mth(&tree.leaves);
    let i = usize::from(index) % n;
    let truth = path(i, &tree.leaves);
    merkle::verify_inclusion(i as u64, n as u64, &tree.leaves[i], &truth, &root)
        .unwrap_or_else(|e| panic!("the true proof of {i} in {n} fails: {e}"));

    // Any index (also past the end), any claimed size near n.
    let claimed_index = u64::from(index) % (n as u64 + 2);
    let claimed_size = (n as i64 + i64::from(size_delta % 4)).max(0) as u64;
    let truth_at = tree
        .leaves
        .get(claimed_index as usize)
        .copied()
        .unwrap_or([0; 32]);
    let claimed_leaf = tree.pick(&leaf, truth_at);
    let mut proof = if (claimed_index as usize) < n {
        path(claimed_index as usize, &tree.leaves)
    } else {
        truth.clone()
    };
    tree.edit(&mut proof, edits);
    let ok = merkle::verify_inclusion(claimed_index, claimed_size, &claimed_leaf, &proof, &root)
        .is_ok();
    if ok && claimed_size == n as u64 {
        let ci = claimed_index as usize;
        assert!(ci < n);
        assert_eq!(claimed_leaf, tree.leaves[ci], "a wrong leaf verified at {ci} of {n}");
        assert_eq!(proof, path(ci, &tree.leaves), "another path verified at {ci} of {n}");
    }
}

fn real_consistency(leaves: u8, first: u8, first_root: Pick, edits: &[PathEdit]) {
    let n = usize::from(leaves % 64) + 1;
    let tree = Tree::new(n);
    let root = mth(&tree.leaves);
    let m = usize::from(first) % n + 1;
    let true_first = mth(&tree.leaves[..m]);
    let truth = subproof(m, &tree.leaves, true);
    merkle::verify_consistency(m as u64, n as u64, &true_first, &root, &truth)
        .unwrap_or_else(|e| panic!("the true proof from {m} to {n} fails: {e}"));

    let claimed_first = tree.pick(&first_root, true_first);
    let mut proof = truth.clone();
    tree.edit(&mut proof, edits);
    if merkle::verify_consistency(m as u64, n as u64, &claimed_first, &root, &proof).is_ok() {
        assert_eq!(
            claimed_first, true_first,
            "a fork verified: another first root is consistent with the tree of {n} at {m}"
        );
    }
}
