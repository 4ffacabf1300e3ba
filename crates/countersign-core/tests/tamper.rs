//! Tamper evidence as a measured figure: a seeded campaign of random single changes to a
//! realistic transparency log, its evidence bundles and its proofs, each checked with the
//! verifier an auditor would use. Every change must be detected.
//!
//! ```sh
//! cargo test -p countersign-core --test tamper -- --nocapture          # the summary table
//! TAMPER_SEED=0x1234 cargo test -p countersign-core --test tamper -- --nocapture
//! ```
//!
//! Everything is built in memory with the core API: 60 requests from three agents, decided
//! (approved or rejected), timed out, cancelled, used, with outcomes and reviews; two
//! autonomous decisions; token events; a key rotation halfway through, endorsed by the old
//! key (so checkpoints and decision proofs are signed by two keys). Each event is sealed with its own salt, the
//! tree is integrated with `merkle::CompactRange` and several checkpoints are signed.
//!
//! The campaign spans three categories:
//!
//! - **log**: the stored entries, checked with `logcheck::verify_log` against the signed
//!   checkpoints: a flipped bit, a deleted entry, two entries swapped, an entry inserted
//!   (a copy, or a freshly built valid one), an entry replaced by another valid one. The
//!   newest checkpoint covers the whole log, and insertions go before an existing entry:
//!   appending after the newest checkpoint is how a log grows, which only the next
//!   checkpoint (and a consistency proof to it) can commit to.
//! - **bundle**: evidence bundles, redacted and full, checked with `bundle::verify` both
//!   against their own `jwks.json` and against a pinned copy of the keys; a mutation counts
//!   as detected only when both refuse it. Changes are made to the *files* inside the ZIP
//!   (unpacked, changed, repacked exactly as the exporter packs them). Raw ZIP-container
//!   metadata (timestamps, permissions, compression, extra fields, file order, comments,
//!   directory entries) is deliberately not mutated: the manifest binds the files' names
//!   and contents, not the container, so a bundle re-zipped by any tool carries the same
//!   evidence and must still verify. Changing the container is not tampering with the
//!   evidence. Bundles are also cut short: an entry of the subject left out and the
//!   manifest rewritten, with the old signature, as an unsigned v1 bundle, or signed again
//!   with a key of one's own (refused by pinned keys; unpinned, reported as not pinned).
//! - **proof**: inclusion and consistency proofs (`merkle::verify_inclusion`,
//!   `merkle::verify_consistency`), checkpoint notes (`Checkpoint::verify`) and DSSE
//!   decision proofs (`proof::verify`).
//!
//! A mutation that changes nothing (two identical files swapped, the same bytes
//! written back) is skipped and not counted. Any undetected mutation is printed in full
//! (category, file, offset, bit) and fails the test.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::io::{Cursor, Read, Write};
use std::time::Instant;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::json;
use sha2::{Digest, Sha256};

use countersign_core::bundle::{self, BundleEntry, BundleInput, Manifest, ManifestFile, Mode};
use countersign_core::checkpoint::Checkpoint;
use countersign_core::event;
use countersign_core::evidence::{
    DecisionRecordInput, ModelInfo, OutcomeStatus, ReviewVerdict, Reviewer, decision_record,
};
use countersign_core::logcheck;
use countersign_core::merkle::{self, CompactRange, Hash, NodeId};
use countersign_core::proof::{self, Envelope, ProblemCode, VerifyOptions};
use countersign_core::{
    ApprovalRequest, Channel, DecisionInput, Event, EventKind, Jwks, Limits, LogEntry, NewRequest,
    Principal, Role, SealedEvent, Signer, Timestamp, Verdict,
};

/// The default seed; `TAMPER_SEED` (decimal or 0x-hex) replaces it.
const DEFAULT_SEED: u64 = 0x00c0_ffee_5eed_2026;
/// Mutations per category. The total is what the issue asks for: at least 10,000.
const LOG_MUTATIONS: usize = 800;
const BUNDLE_MUTATIONS: usize = 2_800;
const PROOF_MUTATIONS: usize = 6_600;
const ORIGIN: &str = "countersign/5eed7a3be11d";

// ---------------------------------------------------------------------------------------
// A small deterministic PRNG (SplitMix64): no dependency, the same sequence everywhere.

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0; the modulo bias is irrelevant here).
    fn below(&mut self, n: usize) -> usize {
        assert!(n > 0);
        (self.next_u64() % n as u64) as usize
    }

    fn coin(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }

    /// One bit of a byte, as a mask.
    fn bit(&mut self) -> u8 {
        1 << self.below(8)
    }

    /// Uniform in `0..n` but never `not` (n > 1).
    fn other_than(&mut self, not: usize, n: usize) -> usize {
        (not + 1 + self.below(n - 1)) % n
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn bytes32(&mut self) -> [u8; 32] {
        let mut out = [0u8; 32];
        for chunk in out.chunks_mut(8) {
            chunk.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        out
    }
}

fn seed() -> u64 {
    match std::env::var("TAMPER_SEED") {
        Ok(text) => {
            let text = text.trim();
            match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => text.parse(),
            }
            .unwrap_or_else(|e| panic!("TAMPER_SEED={text:?} is not a u64: {e}"))
        }
        Err(_) => DEFAULT_SEED,
    }
}

// ---------------------------------------------------------------------------------------
// Counting.

#[derive(Debug, Default, Clone)]
struct Row {
    category: &'static str,
    class: &'static str,
    attempted: u64,
    detected: u64,
    skipped: u64,
}

#[derive(Debug, Default)]
struct Tally {
    rows: Vec<Row>,
    /// Every undetected mutation, described in full.
    misses: Vec<String>,
}

impl Tally {
    fn row(&mut self, category: &'static str, class: &'static str) -> &mut Row {
        let at = match self
            .rows
            .iter()
            .position(|r| r.category == category && r.class == class)
        {
            Some(at) => at,
            None => {
                self.rows.push(Row {
                    category,
                    class,
                    ..Row::default()
                });
                self.rows.len() - 1
            }
        };
        &mut self.rows[at]
    }

    fn attempted(&self) -> u64 {
        self.rows.iter().map(|r| r.attempted).sum()
    }

    fn detected(&self) -> u64 {
        self.rows.iter().map(|r| r.detected).sum()
    }

    /// Records a mutation that changed something; `describe` runs only when undetected.
    fn record(
        &mut self,
        category: &'static str,
        class: &'static str,
        detected: bool,
        describe: impl FnOnce() -> String,
    ) {
        let row = self.row(category, class);
        row.attempted += 1;
        if detected {
            row.detected += 1;
        } else {
            let text = format!("UNDETECTED [{category}] {class}: {}", describe());
            self.misses.push(text);
        }
    }

    /// A mutation that turned out to change nothing: not counted.
    fn skip(&mut self, category: &'static str, class: &'static str) {
        self.row(category, class).skipped += 1;
    }

    fn merge(&mut self, other: Tally) {
        for r in other.rows {
            let row = self.row(r.category, r.class);
            row.attempted += r.attempted;
            row.detected += r.detected;
            row.skipped += r.skipped;
        }
        self.misses.extend(other.misses);
    }
}

// ---------------------------------------------------------------------------------------
// The log, its checkpoints, proofs and bundles, built in memory.

struct Fixture {
    /// The key that signs bundle manifests (the newest, as the server's would).
    signer: Signer,
    jwks: Jwks,
    sealed: Vec<SealedEvent>,
    nodes: HashMap<NodeId, Hash>,
    /// `roots[s]`: the root of the first `s` entries (`roots[0]`: the empty tree).
    roots: Vec<Hash>,
    /// Signed checkpoints, increasing sizes; the last one covers the whole log.
    checkpoints: Vec<(u64, String)>,
    /// Every decision proof, approvals and rejections.
    envelopes: Vec<Envelope>,
    bundles: Vec<BundleCase>,
}

struct BundleCase {
    name: String,
    mode: Mode,
    bytes: Vec<u8>,
    files: Files,
}

impl Fixture {
    fn size(&self) -> u64 {
        self.sealed.len() as u64
    }

    fn notes(&self) -> Vec<String> {
        self.checkpoints.iter().map(|(_, n)| n.clone()).collect()
    }

    fn inclusion_path(&self, index: u64, size: u64) -> Vec<Hash> {
        let mut get = |id: NodeId| self.nodes.get(&id).copied();
        merkle::inclusion_proof(index, size, &mut get).unwrap()
    }

    fn consistency_path(&self, first: u64, second: u64) -> Vec<Hash> {
        let mut get = |id: NodeId| self.nodes.get(&id).copied();
        merkle::consistency_proof(first, second, &mut get).unwrap()
    }
}

fn at(base: Timestamp, seconds: u64) -> Timestamp {
    base.plus_seconds(seconds)
}

fn details(pairs: &[(&str, String)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

fn build_fixture() -> Fixture {
    let limits = Limits::default();
    let t0 = Timestamp::parse("2026-11-30T08:00:00Z").unwrap();
    let old_key = Signer::from_seed([11; 32]);
    let new_key = Signer::from_seed([22; 32]);
    let rotation_at = at(t0, 60 + 45 * 30 + 7);
    let key_at = |when: Timestamp| {
        if when < rotation_at {
            &old_key
        } else {
            &new_key
        }
    };
    let agents = [
        Principal::from_token("deploy-bot", Role::Agent),
        Principal::from_token("billing-bot", Role::Agent),
        Principal::from_token("research-bot", Role::Agent),
    ];
    let approvers = [
        (Principal::from_token("alice", Role::Approver), Channel::Api),
        (Principal::local_user("bob", Role::Admin), Channel::Cli),
        (Principal::from_token("carol", Role::Approver), Channel::Mcp),
    ];
    let operator = Principal::local_user("operator", Role::Admin);
    let auditor = Principal::local_user("auditor", Role::Admin);
    let reviewer = Reviewer {
        id: "local:auditor".into(),
        display_name: "Audit team".into(),
    };

    let mut events: Vec<Event> = Vec::new();
    let mut envelopes: Vec<(String, Envelope)> = Vec::new();

    // Tokens issued before the day starts, one revoked in the middle of it.
    for (n, (name, role)) in [
        ("deploy-bot", "agent"),
        ("billing-bot", "agent"),
        ("research-bot", "agent"),
        ("alice", "approver"),
        ("carol", "approver"),
        ("ci-legacy", "agent"),
    ]
    .iter()
    .enumerate()
    {
        events.push(Event::system(
            EventKind::TokenCreated,
            at(t0, n as u64),
            Some(operator.id.clone()),
            json!({"token_id": format!("tok_{n:04}"), "name": name, "role": role}),
        ));
    }
    events.push(Event::system(
        EventKind::TokenRevoked,
        at(t0, 60 + 45 * 20 + 3),
        Some(operator.id.clone()),
        json!({"token_id": "tok_0005", "name": "ci-legacy"}),
    ));
    events.push(Event::system(
        EventKind::KeyRotated,
        rotation_at,
        Some(operator.id.clone()),
        json!({"old_kid": old_key.kid(), "new_kid": new_key.kid()}),
    ));
    // The rotation's endorsement: the old key vouching for the new one.
    events.push(
        countersign_core::anchor::Endorsement::sign(&new_key.jwk(), &old_key)
            .event(rotation_at, Some(operator.id.clone())),
    );

    let descriptions = [
        "Transfer GBP to a supplier",
        "Deploy the release candidate to production",
        "Delete the stale analytics bucket",
        "Refund a customer order",
        "Rotate the database credentials",
    ];
    for r in 0..60u64 {
        let created_at = at(t0, 60 + 45 * r);
        let agent = &agents[(r % 3) as usize];
        let (approver, channel) = &approvers[((r / 3) % 3) as usize];
        let scenario = r % 8;
        let new = NewRequest {
            description: format!("{} (#{r})", descriptions[(r % 5) as usize]),
            details: details(&[
                ("amount", format!("{}", 100 + 37 * r)),
                ("ticket", format!("OPS-{}", 1000 + r)),
            ]),
            recipient_email: (r % 5 == 0).then(|| "ops@example.com".to_string()),
            recipient_slack: (r % 7 == 0).then(|| "#approvals".to_string()),
            timeout_seconds: Some(if scenario == 3 { 300 } else { 3600 }),
            valid_for_seconds: Some(900),
            ..NewRequest::default()
        };
        let created =
            ApprovalRequest::create(format!("req_{r:04}"), new, agent, created_at, &limits)
                .unwrap();
        events.push(created.event.clone());
        let request = created.request;
        let decide = |verdict: Verdict, when: Timestamp| {
            let t = request
                .decide(
                    verdict,
                    DecisionInput {
                        comment: Some(format!("checked, #{r}")),
                        fields: details(&[("po_number", format!("PO-{r}"))]),
                    },
                    approver,
                    *channel,
                    when,
                    STANDARD.encode(format!("nonce-{r:04}")),
                    key_at(when),
                    &limits,
                )
                .unwrap();
            (t.request.proof.clone().unwrap(), t)
        };
        match scenario {
            0 | 1 | 5 => {
                let (proof, decided) = decide(Verdict::Approved, at(created_at, 30));
                envelopes.push((request.id.clone(), proof));
                events.push(decided.event.clone());
                if scenario == 5 {
                    continue;
                }
                let used = decided
                    .request
                    .record_action(
                        ["payments.transfer", "deploy.run"][(r % 2) as usize].into(),
                        details(&[("run_id", format!("run-{r}"))]),
                        agent,
                        at(created_at, 70),
                        &limits,
                    )
                    .unwrap();
                events.push(used.event.clone());
                let status = if scenario == 0 {
                    OutcomeStatus::Succeeded
                } else {
                    OutcomeStatus::Failed
                };
                let outcome = used
                    .request
                    .record_outcome(
                        status,
                        Some(format!("finished run-{r}")),
                        details(&[("exit_code", format!("{}", scenario))]),
                        agent,
                        at(created_at, 110),
                        &limits,
                    )
                    .unwrap();
                events.push(outcome.event.clone());
                if scenario == 0 {
                    let review = outcome
                        .request
                        .record_review(
                            &reviewer,
                            ReviewVerdict::Accepted,
                            Some("as approved".into()),
                            &auditor,
                            at(created_at, 400),
                            &limits,
                        )
                        .unwrap();
                    events.push(review.event.clone());
                }
            }
            2 | 7 => {
                let (proof, decided) = decide(Verdict::Rejected, at(created_at, 25));
                envelopes.push((request.id.clone(), proof));
                events.push(decided.event.clone());
                if scenario == 7 {
                    let review = decided
                        .request
                        .record_review(
                            &reviewer,
                            ReviewVerdict::Flagged,
                            Some("should have been escalated".into()),
                            &auditor,
                            at(created_at, 500),
                            &limits,
                        )
                        .unwrap();
                    events.push(review.event.clone());
                }
            }
            3 => events.push(request.time_out(at(created_at, 300)).unwrap().event),
            4 => events.push(request.cancel(agent, at(created_at, 20)).unwrap().event),
            _ => {} // 6: still pending
        }
    }
    for (n, related, model) in [
        (
            1u64,
            Some("req_0010".to_string()),
            Some(ModelInfo {
                provider: Some("anthropic".into()),
                name: Some("claude".into()),
                version: Some("4".into()),
            }),
        ),
        (2, None, None),
    ] {
        events.push(
            decision_record(
                &format!("dec_{n:04}"),
                DecisionRecordInput {
                    decision: format!("Refunded order {n} under the small-refunds policy"),
                    rationale: Some("below the threshold".into()),
                    model,
                    authority: details(&[("policy", "refunds-under-50".into())]),
                    details: details(&[("order", format!("ord-{n}"))]),
                    related_request: related,
                },
                &agents[1],
                at(t0, 60 + 45 * (10 + 30 * n) + 11),
                &limits,
            )
            .unwrap(),
        );
    }
    // Commit order: by time (stable, so a request's events stay in order).
    events.sort_by_key(|e| e.at);

    let sealed: Vec<SealedEvent> = events
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let salt: [u8; 32] =
                Sha256::digest(format!("countersign tamper salt {i}").as_bytes()).into();
            e.seal(salt)
        })
        .collect();
    let mut range = CompactRange::empty();
    let mut nodes = HashMap::new();
    let mut roots = vec![range.root()];
    for s in &sealed {
        for (id, h) in range.append(merkle::leaf_hash(&s.bytes)) {
            nodes.insert(id, h);
        }
        roots.push(range.root());
    }
    let n = sealed.len() as u64;
    let mut sizes = vec![1, 7, 32, 64, n / 2, n - 9, n];
    sizes.sort_unstable();
    sizes.dedup();
    let checkpoints: Vec<(u64, String)> = sizes
        .iter()
        .map(|&size| {
            let key = key_at(sealed[size as usize - 1].entry.at);
            let note = Checkpoint {
                origin: ORIGIN.into(),
                size,
                root: roots[size as usize],
            }
            .sign(key);
            (size, note)
        })
        .collect();
    let jwks = Jwks {
        keys: vec![old_key.jwk(), new_key.jwk()],
    };

    let mut fixture = Fixture {
        signer: new_key.clone(),
        jwks,
        sealed,
        nodes,
        roots,
        checkpoints,
        envelopes: envelopes.iter().map(|(_, e)| e.clone()).collect(),
        bundles: Vec::new(),
    };

    // One bundle per kind of history, in both modes, against the newest checkpoint, and
    // two against an older checkpoint signed by the retired key.
    let mut subjects: Vec<String> = (0..8).map(|r| format!("req_{r:04}")).collect();
    subjects.extend(["dec_0001".to_string(), "dec_0002".to_string()]);
    let newest = fixture.checkpoints.last().cloned().unwrap();
    let mut bundles = Vec::new();
    for subject in &subjects {
        for mode in [Mode::Redacted, Mode::Full] {
            bundles.push(make_bundle(&fixture, &envelopes, subject, mode, &newest));
        }
    }
    for (subject, mode) in [("req_0000", Mode::Full), ("req_0002", Mode::Redacted)] {
        let last = fixture
            .sealed
            .iter()
            .rposition(|s| s.entry.subject.as_deref() == Some(subject))
            .unwrap() as u64;
        let older = fixture
            .checkpoints
            .iter()
            .find(|(size, _)| *size > last)
            .cloned()
            .unwrap();
        assert!(older.0 < newest.0, "an older checkpoint covers {subject}");
        bundles.push(make_bundle(&fixture, &envelopes, subject, mode, &older));
    }
    fixture.bundles = bundles;
    fixture
}

fn make_bundle(
    fx: &Fixture,
    envelopes: &[(String, Envelope)],
    subject: &str,
    mode: Mode,
    (size, note): &(u64, String),
) -> BundleCase {
    let entries: Vec<BundleEntry> = fx
        .sealed
        .iter()
        .enumerate()
        .take(*size as usize)
        .filter(|(_, s)| s.entry.subject.as_deref() == Some(subject))
        .map(|(i, s)| BundleEntry {
            index: i as u64,
            bytes: s.bytes.clone(),
            path: fx.inclusion_path(i as u64, *size),
            payload: s.payload.clone(),
        })
        .collect();
    let bytes = bundle::build(
        &BundleInput {
            subject: subject.into(),
            mode,
            log_origin: ORIGIN.into(),
            checkpoint_note: note.clone(),
            tree_size: *size,
            jwks: fx.jwks.clone(),
            entries,
            decisions: envelopes
                .iter()
                .filter(|(s, _)| s == subject)
                .map(|(_, e)| e.clone())
                .collect(),
        },
        &fx.signer,
    )
    .unwrap();
    let files = Files::unpack(&bytes);
    BundleCase {
        name: format!("{subject} {mode:?} @{size}"),
        mode,
        bytes,
        files,
    }
}

// ---------------------------------------------------------------------------------------
// The files of a bundle, unpacked and repacked exactly as `bundle::build` packs them.

#[derive(Debug, Clone, PartialEq, Eq)]
struct Files(Vec<(String, Vec<u8>)>);

impl Files {
    fn unpack(zip_bytes: &[u8]) -> Self {
        let mut archive = zip::ZipArchive::new(Cursor::new(zip_bytes)).unwrap();
        let mut files = Vec::new();
        for i in 0..archive.len() {
            let mut file = archive.by_index(i).unwrap();
            let name = file.name().unwrap().to_string();
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes).unwrap();
            files.push((name, bytes));
        }
        Self(files)
    }

    fn repack(&self) -> Vec<u8> {
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .last_modified_time(zip::DateTime::default())
            .unix_permissions(0o644);
        let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
        for (path, bytes) in &self.0 {
            zip.start_file(path.as_str(), options).unwrap();
            zip.write_all(bytes).unwrap();
        }
        zip.finish().unwrap().into_inner()
    }

    fn paths(&self) -> Vec<String> {
        self.0.iter().map(|(p, _)| p.clone()).collect()
    }

    fn paths_under(&self, dir: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(p, _)| p.starts_with(dir))
            .map(|(p, _)| p.clone())
            .collect()
    }

    fn has(&self, path: &str) -> bool {
        self.0.iter().any(|(p, _)| p == path)
    }

    fn get(&self, path: &str) -> &[u8] {
        &self.0.iter().find(|(p, _)| p == path).unwrap().1
    }

    fn get_mut(&mut self, path: &str) -> &mut Vec<u8> {
        &mut self.0.iter_mut().find(|(p, _)| p == path).unwrap().1
    }

    fn remove(&mut self, path: &str) {
        self.0.retain(|(p, _)| p != path);
    }

    fn manifest(&self) -> Manifest {
        serde_json::from_slice(self.get("manifest.json")).unwrap()
    }

    fn set_manifest(&mut self, manifest: &Manifest) {
        *self.get_mut("manifest.json") = serde_json_canonicalizer::to_vec(manifest).unwrap();
    }

    /// Rewrites the manifest's SHA-256 and size of `path` to match its new content: the
    /// attack a forger with a text editor and `sha256sum` would make.
    fn fix_manifest(&mut self, path: &str) {
        let bytes = self.get(path).to_vec();
        let mut manifest = self.manifest();
        for f in &mut manifest.files {
            if f.path == path {
                f.sha256 = hex::encode(Sha256::digest(&bytes));
                f.size = bytes.len() as u64;
            }
        }
        self.set_manifest(&manifest);
    }
}

fn manifest_line(path: &str, bytes: &[u8]) -> ManifestFile {
    ManifestFile {
        path: path.into(),
        sha256: hex::encode(Sha256::digest(bytes)),
        size: bytes.len() as u64,
    }
}

/// The index in `entries/<i>.json` (or proofs/, payloads/).
fn index_of(path: &str) -> u64 {
    let name = path.rsplit('/').next().unwrap();
    name.trim_end_matches(".json").parse().unwrap()
}

/// The byte ranges (quotes excluded) of the member names in a JSON text.
fn member_names(json: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < json.len() {
        if json[i] != b'"' {
            i += 1;
            continue;
        }
        let start = i + 1;
        let mut end = start;
        while end < json.len() && json[end] != b'"' {
            end += if json[end] == b'\\' { 2 } else { 1 };
        }
        let mut next = end + 1;
        while next < json.len() && json[next].is_ascii_whitespace() {
            next += 1;
        }
        if next < json.len() && json[next] == b':' && end > start {
            out.push((start, end));
        }
        i = end + 1;
    }
    out
}

/// Flips `bit` of byte `offset`; describes it.
fn flip(bytes: &mut [u8], offset: usize, bit: u8) -> String {
    let before = bytes[offset];
    bytes[offset] ^= bit;
    format!(
        "byte {offset} bit {bit:#04x} ({:?} -> {:?})",
        before as char, bytes[offset] as char
    )
}

// ---------------------------------------------------------------------------------------
// Category 1: the stored log.

/// A valid, canonical entry that differs from `base`: what a forger with write access to
/// the store could put in its place.
fn fabricate(rng: &mut Rng, base: &LogEntry) -> Vec<u8> {
    let mut entry = base.clone();
    match rng.below(5) {
        0 => {
            entry.at =
                Timestamp::from_millis(base.at.millis() + 1 + rng.below(60_000) as i64).unwrap()
        }
        1 => {
            entry.payload = Some(event::commitment(
                &rng.bytes32(),
                &json!({"comment": "approved, no concerns"}),
            ))
        }
        2 => entry.actor = Some(format!("token:intruder-{}", rng.below(100))),
        3 => entry.subject = Some(format!("req_{:04}", rng.below(60))),
        _ => {
            let version = 1 + rng.below(6) as u64;
            entry.data.insert("version".into(), json!(version));
        }
    }
    let bytes = entry.to_bytes();
    if bytes == base.to_bytes() {
        entry.at = Timestamp::from_millis(base.at.millis() + 1).unwrap();
        return entry.to_bytes();
    }
    bytes
}

fn log_campaign(fx: &Fixture, rng: &mut Rng, quota: usize) -> Tally {
    const CAT: &str = "log";
    let mut tally = Tally::default();
    let notes = fx.notes();
    let original: Vec<&[u8]> = fx.sealed.iter().map(|s| s.bytes.as_slice()).collect();
    let n = original.len();
    let mut done = 0;
    while done < quota {
        let mut log: Vec<Cow<'_, [u8]>> = original.iter().map(|b| Cow::Borrowed(*b)).collect();
        let (class, what): (&'static str, String) = match rng.below(7) {
            0 => {
                let i = rng.below(n);
                let mut bytes = original[i].to_vec();
                let offset = rng.below(bytes.len());
                let how = flip(&mut bytes, offset, rng.bit());
                log[i] = Cow::Owned(bytes);
                ("flip a bit in an entry", format!("entry {i}: {how}"))
            }
            1 => {
                let i = rng.below(n);
                log.remove(i);
                ("delete an entry", format!("entry {i}"))
            }
            2 => {
                let i = rng.below(n - 1);
                log.swap(i, i + 1);
                (
                    "swap two adjacent entries",
                    format!("entries {i} and {}", i + 1),
                )
            }
            3 => {
                let i = rng.below(n);
                let j = rng.other_than(i, n);
                log.swap(i, j);
                ("swap two random entries", format!("entries {i} and {j}"))
            }
            4 => {
                // Inserted before an existing entry. Appending after the newest checkpoint is
                // how a log grows, not tampering: no checkpoint commits to it yet, and the
                // next one (with a consistency proof) pins it.
                let (src, pos) = (rng.below(n), rng.below(n));
                log.insert(pos, Cow::Borrowed(original[src]));
                (
                    "insert a copy of an entry",
                    format!("copy of entry {src} inserted at {pos}"),
                )
            }
            5 => {
                let (src, pos) = (rng.below(n), rng.below(n));
                let bytes = fabricate(rng, &fx.sealed[src].entry);
                log.insert(pos, Cow::Owned(bytes));
                (
                    "insert a fabricated valid entry",
                    format!("variant of entry {src} inserted at {pos}"),
                )
            }
            _ => {
                let i = rng.below(n);
                let (bytes, from) = if rng.coin() {
                    (
                        fabricate(rng, &fx.sealed[i].entry),
                        "an altered valid copy".to_string(),
                    )
                } else {
                    let j = rng.other_than(i, n);
                    (original[j].to_vec(), format!("entry {j}"))
                };
                log[i] = Cow::Owned(bytes);
                (
                    "replace an entry with another valid one",
                    format!("entry {i} replaced by {from}"),
                )
            }
        };
        if log.len() == n && log.iter().zip(&original).all(|(a, b)| a.as_ref() == *b) {
            tally.skip(CAT, class);
            continue;
        }
        let report = logcheck::verify_log(log.iter().map(|b| b.as_ref()), &notes, &fx.jwks, ORIGIN);
        tally.record(CAT, class, !report.valid(), || {
            format!(
                "{what}; verify_log found nothing ({} entries)",
                report.entries
            )
        });
        done += 1;
    }
    tally
}

// ---------------------------------------------------------------------------------------
// Category 2: evidence bundles.

/// A file that does not belong in `case`, with a name and content chosen to look like it
/// might: another subject's entry and proof, a second copy of a decision proof, an
/// opening where none belongs, or plain junk.
fn extra_file(rng: &mut Rng, fx: &Fixture, case: &BundleCase) -> (String, Vec<u8>) {
    let manifest = case.files.manifest();
    loop {
        let (path, bytes) = match rng.below(5) {
            0 => {
                let j = rng.below(manifest.tree_size as usize) as u64;
                (
                    format!("entries/{j}.json"),
                    fx.sealed[j as usize].bytes.clone(),
                )
            }
            1 => {
                let j = rng.below(manifest.tree_size as usize) as u64;
                let path = fx.inclusion_path(j, manifest.tree_size);
                let proof = bundle::InclusionProof::new(
                    j,
                    manifest.tree_size,
                    &merkle::leaf_hash(&fx.sealed[j as usize].bytes),
                    &path,
                );
                (
                    format!("proofs/{j}.json"),
                    serde_json_canonicalizer::to_vec(&proof).unwrap(),
                )
            }
            2 => {
                let n = case.files.paths_under("decisions/").len() + 1;
                let envelope = rng.pick(&fx.envelopes);
                (
                    format!("decisions/{n}.json"),
                    serde_json_canonicalizer::to_vec(envelope).unwrap(),
                )
            }
            3 => {
                // The genuine opening of one of the bundle's entries (disclosure added to a
                // redacted bundle), or of another entry in place of a missing one.
                let i = *rng.pick(&manifest.entries);
                let openings: Vec<_> = fx
                    .sealed
                    .iter()
                    .filter_map(|s| s.payload.as_ref())
                    .collect();
                let opening = fx.sealed[i as usize]
                    .payload
                    .as_ref()
                    .unwrap_or_else(|| *rng.pick(&openings));
                (
                    format!("payloads/{i}.json"),
                    serde_json_canonicalizer::to_vec(opening).unwrap(),
                )
            }
            _ => {
                let name = *rng.pick(&[
                    "notes.txt",
                    "README",
                    "entries/extra.json",
                    "manifest.json.sig",
                ]);
                let len = 1 + rng.below(64);
                (
                    name.to_string(),
                    (0..len).map(|_| b' ' + rng.below(95) as u8).collect(),
                )
            }
        };
        if !case.files.has(&path) {
            return (path, bytes);
        }
    }
}

/// Applies one random change to `files`; returns its class and description, or `None`
/// when the chosen change does not apply to this bundle.
fn mutate_bundle(
    rng: &mut Rng,
    fx: &Fixture,
    case: &BundleCase,
    files: &mut Files,
) -> Option<(&'static str, String)> {
    let all = files.paths();
    let content: Vec<String> = all
        .iter()
        .filter(|p| *p != "manifest.json")
        .cloned()
        .collect();
    Some(match rng.below(16) {
        0 => {
            let path = rng.pick(&all).clone();
            let bytes = files.get_mut(&path);
            let offset = rng.below(bytes.len());
            let how = flip(bytes, offset, rng.bit());
            (
                "flip a bit in a file, manifest as is",
                format!("{path}: {how}"),
            )
        }
        1 => {
            let path = rng.pick(&content).clone();
            let bytes = files.get_mut(&path);
            let offset = rng.below(bytes.len());
            let how = flip(bytes, offset, rng.bit());
            files.fix_manifest(&path);
            (
                "flip a bit in a file, manifest fixed",
                format!("{path}: {how}"),
            )
        }
        2 => {
            let path = rng.pick(&all).clone();
            files.remove(&path);
            ("delete a file, manifest as is", path)
        }
        3 => {
            let path = rng.pick(&content).clone();
            files.remove(&path);
            let mut manifest = files.manifest();
            manifest.files.retain(|f| f.path != path);
            files.set_manifest(&manifest);
            ("delete a file and its manifest line", path)
        }
        4 => {
            let (path, bytes) = extra_file(rng, fx, case);
            files.0.push((path.clone(), bytes));
            ("insert an unlisted file", path)
        }
        5 => {
            let (path, bytes) = extra_file(rng, fx, case);
            let mut manifest = files.manifest();
            manifest.files.push(manifest_line(&path, &bytes));
            files.set_manifest(&manifest);
            files.0.push((path.clone(), bytes));
            ("insert a file and list it", path)
        }
        6 | 7 => {
            let fix = rng.coin();
            let kinds: Vec<Vec<String>> = ["entries/", "proofs/", "payloads/", "decisions/"]
                .iter()
                .map(|k| files.paths_under(k))
                .filter(|v| v.len() >= 2)
                .collect();
            if kinds.is_empty() {
                return None;
            }
            let kind = rng.pick(&kinds);
            let a = rng.below(kind.len());
            let b = rng.other_than(a, kind.len());
            let (pa, pb) = (kind[a].clone(), kind[b].clone());
            let ca = files.get(&pa).to_vec();
            let cb = files.get(&pb).to_vec();
            *files.get_mut(&pa) = cb;
            *files.get_mut(&pb) = ca;
            if fix {
                files.fix_manifest(&pa);
                files.fix_manifest(&pb);
                (
                    "swap two files of a kind, manifest fixed",
                    format!("{pa} <-> {pb}"),
                )
            } else {
                (
                    "swap two files of a kind, manifest as is",
                    format!("{pa} <-> {pb}"),
                )
            }
        }
        8 => {
            // Reorder: entries/a.json and entries/b.json trade names, and the manifest's
            // lines follow them, so every listed hash still matches its file. Optionally
            // the proofs and openings move with their entries.
            let entries = files.paths_under("entries/");
            if entries.len() < 2 {
                return None;
            }
            let a = rng.below(entries.len());
            let b = rng.other_than(a, entries.len());
            let (ia, ib) = (index_of(&entries[a]), index_of(&entries[b]));
            let dirs: &[&str] = if rng.coin() {
                &["entries"]
            } else {
                &["entries", "proofs", "payloads"]
            };
            let mut manifest = files.manifest();
            for dir in dirs {
                let (pa, pb) = (format!("{dir}/{ia}.json"), format!("{dir}/{ib}.json"));
                let rename = |p: &str| {
                    if p == pa {
                        pb.clone()
                    } else if p == pb {
                        pa.clone()
                    } else {
                        p.to_string()
                    }
                };
                for (p, _) in &mut files.0 {
                    *p = rename(p);
                }
                for f in &mut manifest.files {
                    f.path = rename(&f.path);
                }
            }
            files.set_manifest(&manifest);
            (
                "reorder entries by renaming them",
                format!("entries {ia} <-> {ib}, moving {dirs:?}"),
            )
        }
        9 | 10 => {
            let payloads = files.paths_under("payloads/");
            if case.mode != Mode::Full || payloads.is_empty() {
                return None;
            }
            let path = rng.pick(&payloads).clone();
            let bytes = files.get_mut(&path);
            let offset = rng.below(bytes.len());
            let how = flip(bytes, offset, rng.bit());
            files.fix_manifest(&path);
            (
                "flip a bit in a payload opening, manifest fixed",
                format!("{path}: {how}"),
            )
        }
        13..=15 => {
            // Leave out one entry of the subject (the first, one in the middle or the
            // last) with its proof and opening, and rewrite the manifest to list what is
            // left; then keep the old signature, drop it and call the bundle v1, or sign
            // the new manifest with a key of one's own (added to jwks.json).
            let entries = files.manifest().entries;
            if entries.len() < 2 {
                return None;
            }
            let (where_, n) = match rng.below(3) {
                0 => ("the first", 0),
                1 => ("a middle", entries.len() / 2),
                _ => ("the last", entries.len() - 1),
            };
            let index = entries[n];
            let mut manifest = files.manifest();
            for dir in ["entries", "proofs", "payloads"] {
                let path = format!("{dir}/{index}.json");
                if files.has(&path) {
                    files.remove(&path);
                }
                manifest.files.retain(|f| f.path != path);
            }
            manifest.entries.retain(|i| *i != index);
            let signature = match rng.below(3) {
                0 => "the signature kept",
                1 => {
                    manifest.format = bundle::FORMAT_V1.into();
                    files.remove("manifest.sig");
                    "downgraded to v1 without its signature"
                }
                _ => {
                    let foreign = Signer::from_seed(rng.bytes32());
                    let mut jwks: Jwks = serde_json::from_slice(files.get("jwks.json")).unwrap();
                    jwks.keys.push(foreign.jwk());
                    *files.get_mut("jwks.json") = serde_json_canonicalizer::to_vec(&jwks).unwrap();
                    for f in &mut manifest.files {
                        if f.path == "jwks.json" {
                            *f = manifest_line("jwks.json", files.get("jwks.json"));
                        }
                    }
                    let bytes = serde_json_canonicalizer::to_vec(&manifest).unwrap();
                    let sig = Envelope::sign(bundle::MANIFEST_PAYLOAD_TYPE, &bytes, &foreign);
                    *files.get_mut("manifest.sig") =
                        serde_json_canonicalizer::to_vec(&sig).unwrap();
                    FOREIGN_SIGNATURE
                }
            };
            files.set_manifest(&manifest);
            (
                "leave out an entry of the subject, manifest rewritten",
                format!("{where_} entry ({index}), {signature}"),
            )
        }
        11 => {
            let payloads = files.paths_under("payloads/");
            if case.mode != Mode::Full || payloads.is_empty() {
                return None;
            }
            let path = rng.pick(&payloads).clone();
            let bytes = files.get_mut(&path);
            let text = String::from_utf8_lossy(bytes).to_string();
            let start = text.rfind("\"salt\":\"").unwrap() + "\"salt\":\"".len();
            let offset = start + rng.below(64);
            let how = flip(bytes, offset, rng.bit());
            files.fix_manifest(&path);
            (
                "flip a bit in an opening's salt, manifest fixed",
                format!("{path}: {how}"),
            )
        }
        _ => {
            let json: Vec<String> = all
                .iter()
                .filter(|p| p.ends_with(".json"))
                .cloned()
                .collect();
            let path = rng.pick(&json).clone();
            let names = member_names(files.get(&path));
            let (start, end) = *rng.pick(&names);
            let bytes = files.get_mut(&path);
            let name = String::from_utf8_lossy(&bytes[start..end]).to_string();
            let offset = start + rng.below(end - start);
            let how = flip(bytes, offset, rng.bit());
            if path != "manifest.json" {
                files.fix_manifest(&path);
            }
            (
                "flip a bit in a JSON member name, manifest fixed",
                format!("{path}: member {name:?}, {how}"),
            )
        }
    })
}

/// Marks the mutations signed with a key the bundle brings along.
const FOREIGN_SIGNATURE: &str = "signed again with a foreign key added to jwks.json";

fn bundle_campaign(fx: &Fixture, rng: &mut Rng, quota: usize) -> Tally {
    const CAT: &str = "bundle";
    let mut tally = Tally::default();
    let mut done = 0;
    while done < quota {
        let case = rng.pick(&fx.bundles);
        let mut files = case.files.clone();
        let Some((class, what)) = mutate_bundle(rng, fx, case, &mut files) else {
            continue;
        };
        if files == case.files {
            tally.skip(CAT, class);
            continue;
        }
        let bytes = files.repack();
        let own = bundle::verify(&bytes, None);
        let pinned = bundle::verify(&bytes, Some(&fx.jwks));
        // A bundle signed with a key it brings along agrees with its own jwks.json: only
        // pinned keys can refuse it, and unpinned, the verifier says the keys are not
        // pinned (`keys_pinned: false`) rather than plainly valid.
        let own_refuses = !own.valid || (what.contains(FOREIGN_SIGNATURE) && !own.keys_pinned);
        tally.record(CAT, class, own_refuses && !pinned.valid, || {
            format!(
                "bundle {}: {what}; valid with its own keys: {}, with pinned keys: {} ({:?})",
                case.name,
                own.valid,
                pinned.valid,
                if own.valid {
                    &pinned.reasons
                } else {
                    &own.reasons
                }
            )
        });
        done += 1;
    }
    tally
}

// ---------------------------------------------------------------------------------------
// Category 3: proofs.

/// Changes a proof's path: flip a bit, drop, add or swap hashes. `None` when the path is
/// too short for the change.
fn mutate_path(
    rng: &mut Rng,
    fx: &Fixture,
    path: &mut Vec<Hash>,
    kind: usize,
) -> Option<(&'static str, String)> {
    Some(match kind {
        0 => {
            if path.is_empty() {
                return None;
            }
            let i = rng.below(path.len());
            let (byte, bit) = (rng.below(32), rng.bit());
            path[i][byte] ^= bit;
            (
                "flip a bit in a path hash",
                format!("hash {i}, byte {byte}, bit {bit:#04x}"),
            )
        }
        1 => {
            if path.is_empty() {
                return None;
            }
            let i = rng.below(path.len());
            path.remove(i);
            ("drop a path hash", format!("hash {i}"))
        }
        2 => {
            let i = rng.below(path.len() + 1);
            let (hash, what) = match rng.below(3) {
                0 => (rng.bytes32(), "random"),
                1 if !path.is_empty() => (*rng.pick(path), "a copy of another path hash"),
                _ => {
                    let ids: Vec<&NodeId> = fx.nodes.keys().collect();
                    let id = rng.pick(&ids);
                    (fx.nodes[*id], "a genuine tree node")
                }
            };
            path.insert(i, hash);
            ("add a path hash", format!("{what} at {i}"))
        }
        _ => {
            if path.len() < 2 {
                return None;
            }
            let i = rng.below(path.len());
            let j = rng.other_than(i, path.len());
            path.swap(i, j);
            ("swap two path hashes", format!("hashes {i} and {j}"))
        }
    })
}

/// ±1, or +1 at 0.
fn nudge(rng: &mut Rng, value: u64) -> u64 {
    if value > 0 && rng.coin() {
        value - 1
    } else {
        value + 1
    }
}

fn proof_campaign(fx: &Fixture, rng: &mut Rng, quota: usize) -> Tally {
    const CAT: &str = "proof";
    let mut tally = Tally::default();
    let n = fx.size();
    let root_of = |size: u64| fx.roots.get(size as usize).copied();
    let mut done = 0;
    while done < quota {
        match rng.below(4) {
            0 => {
                // An inclusion proof, checked against the signed root of the size it claims:
                // an auditor takes size and root from one checkpoint. (`verify_inclusion`
                // alone does not bind the size: the size only steers the path's directions,
                // so most proofs also verify with size ± 1 against the root of the true
                // size. The root of the claimed size is what binds it.) Sizes stay below
                // the log's so that size + 1 has a root too.
                let size = 1 + rng.below(n as usize - 1) as u64;
                let index = rng.below(size as usize) as u64;
                let leaf = merkle::leaf_hash(&fx.sealed[index as usize].bytes);
                let original = fx.inclusion_path(index, size);
                let (mut i2, mut s2, mut leaf2, mut path) = (index, size, leaf, original.clone());
                let kind = rng.below(7);
                let Some((class, what)) = (match kind {
                    0..=3 => mutate_path(rng, fx, &mut path, kind),
                    4 => {
                        let (byte, bit) = (rng.below(32), rng.bit());
                        leaf2[byte] ^= bit;
                        Some((
                            "flip a bit in the leaf hash",
                            format!("byte {byte}, bit {bit:#04x}"),
                        ))
                    }
                    5 => {
                        i2 = nudge(rng, index);
                        Some(("change the index by 1", format!("index {index} -> {i2}")))
                    }
                    _ => {
                        s2 = nudge(rng, size);
                        Some(("change the tree size by 1", format!("size {size} -> {s2}")))
                    }
                }) else {
                    continue;
                };
                let class = inclusion_class(class);
                if (i2, s2, leaf2, &path) == (index, size, leaf, &original) {
                    tally.skip(CAT, class);
                    continue;
                }
                let valid = root_of(s2).is_some_and(|root| {
                    merkle::verify_inclusion(i2, s2, &leaf2, &path, &root).is_ok()
                });
                tally.record(CAT, class, !valid, || {
                    format!("inclusion of {index} in {size}: {what}")
                });
            }
            1 => {
                let first = 1 + rng.below(n as usize - 2) as u64;
                let second = first + 1 + rng.below((n - 1 - first) as usize) as u64;
                let original = fx.consistency_path(first, second);
                let (mut f2, mut s2, mut path) = (first, second, original.clone());
                let kind = rng.below(6);
                let Some((class, what)) = (match kind {
                    0..=3 => mutate_path(rng, fx, &mut path, kind),
                    4 => {
                        f2 = nudge(rng, first);
                        Some((
                            "change the first size by 1",
                            format!("first {first} -> {f2}"),
                        ))
                    }
                    _ => {
                        s2 = nudge(rng, second);
                        Some((
                            "change the second size by 1",
                            format!("second {second} -> {s2}"),
                        ))
                    }
                }) else {
                    continue;
                };
                let class = consistency_class(class);
                if (f2, s2, &path) == (first, second, &original) {
                    tally.skip(CAT, class);
                    continue;
                }
                let valid = match (root_of(f2), root_of(s2)) {
                    (Some(r1), Some(r2)) => {
                        merkle::verify_consistency(f2, s2, &r1, &r2, &path).is_ok()
                    }
                    _ => false,
                };
                tally.record(CAT, class, !valid, || {
                    format!("consistency {first} -> {second}: {what}")
                });
            }
            2 => {
                let k = rng.below(fx.checkpoints.len());
                let (size, note) = &fx.checkpoints[k];
                let (class, altered, what): (&'static str, Vec<u8>, String) = match rng.below(4) {
                    0 => {
                        let mut bytes = note.as_bytes().to_vec();
                        let offset = rng.below(bytes.len());
                        let how = flip(&mut bytes, offset, rng.bit());
                        let class = if std::str::from_utf8(&bytes).is_ok() {
                            "checkpoint: flip a bit in the note"
                        } else {
                            "checkpoint: flip a bit in the note (not UTF-8: refused as text)"
                        };
                        (class, bytes, how)
                    }
                    1 => {
                        let other = match rng.below(3) {
                            0 => size + 1,
                            1 => size - 1,
                            _ => fx.checkpoints[rng.other_than(k, fx.checkpoints.len())].0,
                        };
                        let text =
                            note.replacen(&format!("\n{size}\n"), &format!("\n{other}\n"), 1);
                        (
                            "checkpoint: change the size line",
                            text.into_bytes(),
                            format!("{size} -> {other}"),
                        )
                    }
                    2 => {
                        let other = (size + rng.below(n as usize - 1) as u64) % n + 1;
                        let root = STANDARD.encode(fx.roots[*size as usize]);
                        let text =
                            note.replacen(&root, &STANDARD.encode(fx.roots[other as usize]), 1);
                        (
                            "checkpoint: another size's genuine root",
                            text.into_bytes(),
                            format!("root of {size} -> root of {other}"),
                        )
                    }
                    _ => {
                        let j = rng.other_than(k, fx.checkpoints.len());
                        let body = note.split_once("\n\n").unwrap().0;
                        let sigs = fx.checkpoints[j].1.split_once("\n\n").unwrap().1;
                        (
                            "checkpoint: another checkpoint's signature",
                            format!("{body}\n\n{sigs}").into_bytes(),
                            format!("body of {size}, signature of {}", fx.checkpoints[j].0),
                        )
                    }
                };
                if altered == note.as_bytes() {
                    tally.skip(CAT, class);
                    continue;
                }
                let valid = std::str::from_utf8(&altered)
                    .is_ok_and(|text| Checkpoint::verify(text, &fx.jwks, Some(ORIGIN)).is_ok());
                tally.record(CAT, class, !valid, || {
                    format!(
                        "checkpoint of size {size}: {what}\n{}",
                        String::from_utf8_lossy(&altered)
                    )
                });
            }
            _ => {
                let k = rng.below(fx.envelopes.len());
                let original = &fx.envelopes[k];
                let mut env = original.clone();
                let (class, what) = match rng.below(4) {
                    0 | 1 => {
                        let mut body = STANDARD.decode(&env.payload).unwrap();
                        let offset = rng.below(body.len());
                        let how = flip(&mut body, offset, rng.bit());
                        env.payload = STANDARD.encode(&body);
                        ("decision proof: flip a bit in the payload", how)
                    }
                    2 => {
                        let mut sig = STANDARD.decode(&env.signatures[0].sig).unwrap();
                        let offset = rng.below(sig.len());
                        let how = flip(&mut sig, offset, rng.bit());
                        env.signatures[0].sig = STANDARD.encode(&sig);
                        ("decision proof: flip a bit in the signature", how)
                    }
                    _ => {
                        let mut kid = env.signatures[0].keyid.clone().into_bytes();
                        let offset = rng.below(kid.len());
                        let how = flip(&mut kid, offset, rng.bit());
                        let Ok(kid) = String::from_utf8(kid) else {
                            continue;
                        };
                        env.signatures[0].keyid = kid;
                        ("decision proof: flip a bit in the key id", how)
                    }
                };
                if env == *original {
                    tally.skip(CAT, class);
                    continue;
                }
                let report = proof::verify(&env, &fx.jwks, &VerifyOptions::default());
                let detected = report.statement.is_none()
                    || report
                        .reasons
                        .iter()
                        .any(|p| p.code != ProblemCode::NotApproved);
                tally.record(CAT, class, detected, || {
                    format!("decision proof {k}: {what}; report {:?}", report.reasons)
                });
            }
        }
        done += 1;
    }
    tally
}

fn inclusion_class(class: &'static str) -> &'static str {
    match class {
        "flip a bit in a path hash" => "inclusion: flip a bit in a path hash",
        "drop a path hash" => "inclusion: drop a path hash",
        "add a path hash" => "inclusion: add a path hash",
        "swap two path hashes" => "inclusion: swap two path hashes",
        "flip a bit in the leaf hash" => "inclusion: flip a bit in the leaf hash",
        "change the index by 1" => "inclusion: change the index by 1",
        "change the tree size by 1" => "inclusion: change the tree size by 1",
        other => panic!("no inclusion class {other:?}"),
    }
}

fn consistency_class(class: &'static str) -> &'static str {
    match class {
        "flip a bit in a path hash" => "consistency: flip a bit in a path hash",
        "drop a path hash" => "consistency: drop a path hash",
        "add a path hash" => "consistency: add a path hash",
        "swap two path hashes" => "consistency: swap two path hashes",
        "change the first size by 1" => "consistency: change the first size by 1",
        "change the second size by 1" => "consistency: change the second size by 1",
        other => panic!("no consistency class {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------

/// The unaltered fixture verifies everywhere: otherwise "detected" would mean nothing.
fn check_baseline(fx: &Fixture) {
    let report = logcheck::verify_log(
        fx.sealed.iter().map(|s| s.bytes.as_slice()),
        &fx.notes(),
        &fx.jwks,
        ORIGIN,
    );
    assert!(report.valid(), "{:?}", report.problems);
    assert_eq!(report.checkpoints, fx.checkpoints.len());
    for case in &fx.bundles {
        for pinned in [None, Some(&fx.jwks)] {
            let report = bundle::verify(&case.bytes, pinned);
            assert!(report.valid, "{}: {:?}", case.name, report.reasons);
        }
        assert_eq!(
            case.files.repack(),
            case.bytes,
            "{}: repacking reproduces the exporter's bytes",
            case.name
        );
    }
    for env in &fx.envelopes {
        let report = proof::verify(env, &fx.jwks, &VerifyOptions::default());
        assert!(
            report.statement.is_some()
                && report
                    .reasons
                    .iter()
                    .all(|p| p.code == ProblemCode::NotApproved),
            "{:?}",
            report.reasons
        );
    }
    let n = fx.size();
    for (size, note) in &fx.checkpoints {
        let c = Checkpoint::verify(note, &fx.jwks, Some(ORIGIN)).unwrap();
        assert_eq!((c.size, c.root), (*size, fx.roots[*size as usize]));
        if *size < n {
            let path = fx.consistency_path(*size, n);
            merkle::verify_consistency(*size, n, &c.root, &fx.roots[n as usize], &path).unwrap();
        }
    }
}

/// A share of one category's campaign, with its own generator.
type Campaign = fn(&Fixture, &mut Rng, usize) -> Tally;

/// Runs the campaigns as small jobs on every core (two here). Each job has its own
/// generator derived from the seed, and results are merged in job order, so the outcome
/// does not depend on scheduling. Returns the merged tally and each category's CPU time.
fn run_campaigns(fx: &Fixture, seed: u64) -> (Tally, String) {
    const CHUNKS: usize = 4;
    let categories: [(&str, Campaign, usize); 3] = [
        ("log", log_campaign, LOG_MUTATIONS),
        ("bundle", bundle_campaign, BUNDLE_MUTATIONS),
        ("proof", proof_campaign, PROOF_MUTATIONS),
    ];
    let mut jobs: Vec<(usize, Campaign, usize, u64)> = Vec::new();
    for (c, (_, run, quota)) in categories.iter().enumerate() {
        for chunk in 0..CHUNKS {
            let share = quota / CHUNKS + usize::from(chunk < quota % CHUNKS);
            let job_seed =
                seed ^ ((c as u64 + 1) << 56) ^ (chunk as u64 + 1).wrapping_mul(0x9e37_79b9);
            jobs.push((c, *run, share, job_seed));
        }
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: std::sync::Mutex<Vec<Option<(Tally, f64)>>> =
        std::sync::Mutex::new((0..jobs.len()).map(|_| None).collect());
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let j = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&(_, run, share, job_seed)) = jobs.get(j) else {
                        break;
                    };
                    let started = Instant::now();
                    let tally = run(fx, &mut Rng::new(job_seed), share);
                    results.lock().unwrap()[j] = Some((tally, started.elapsed().as_secs_f64()));
                }
            });
        }
    });
    let mut tally = Tally::default();
    let mut seconds = [0f64; 3];
    for ((c, ..), result) in jobs.iter().zip(results.into_inner().unwrap()) {
        let (t, secs) = result.unwrap();
        seconds[*c] += secs;
        tally.merge(t);
    }
    let times = categories
        .iter()
        .zip(seconds)
        .map(|((name, _, quota), secs)| format!("{name} {quota} in {secs:.1} s"))
        .collect::<Vec<_>>()
        .join(", ");
    (tally, times)
}

#[test]
fn every_single_change_to_log_bundles_and_proofs_is_detected() {
    let seed = seed();
    println!("tamper: seed {seed:#x} (set TAMPER_SEED to replay or vary it)");
    let started = Instant::now();
    let fx = build_fixture();
    check_baseline(&fx);
    let kinds = fx.sealed.iter().fold(BTreeMap::new(), |mut m, s| {
        *m.entry(s.entry.kind.as_str()).or_insert(0) += 1;
        m
    });
    println!(
        "tamper: log of {} entries {kinds:?}, {} checkpoints (sizes {:?}), {} bundles, {} decision proofs; built in {:.2} s",
        fx.size(),
        fx.checkpoints.len(),
        fx.checkpoints.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        fx.bundles.len(),
        fx.envelopes.len(),
        started.elapsed().as_secs_f64()
    );

    // Two threads (the machine has two cores); each category has its own generator, so the
    // result does not depend on scheduling.
    let campaign = Instant::now();
    let (tally, times) = run_campaigns(&fx, seed);
    let elapsed = campaign.elapsed().as_secs_f64();

    for miss in &tally.misses {
        println!("{miss}");
    }
    println!();
    println!(
        "{:<8} {:<64} {:>9} {:>9} {:>8}",
        "category", "mutation", "attempted", "detected", "no-ops"
    );
    for r in &tally.rows {
        println!(
            "{:<8} {:<64} {:>9} {:>9} {:>8}",
            r.category, r.class, r.attempted, r.detected, r.skipped
        );
    }
    let (total, detected) = (tally.attempted(), tally.detected());
    println!(
        "tamper: {total} mutations, {detected} detected ({:.2}%), seed {seed:#x}, in {elapsed:.1} s (time per category: {times})",
        100.0 * detected as f64 / total as f64
    );
    assert!(total >= 10_000, "only {total} mutations were made");
    if !tally.misses.is_empty() {
        let classes: Vec<String> = tally
            .rows
            .iter()
            .filter(|r| r.detected < r.attempted)
            .map(|r| {
                format!(
                    "[{}] {}: {} of {} undetected",
                    r.category,
                    r.class,
                    r.attempted - r.detected,
                    r.attempted
                )
            })
            .collect();
        panic!(
            "TAMPER EVIDENCE GAP: {} of {total} mutations were NOT detected (seed {seed:#x}); each is listed above with its file, offset and bit.\n{}",
            total - detected,
            classes.join("\n")
        );
    }
}
