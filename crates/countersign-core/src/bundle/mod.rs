//! Evidence bundles: a ZIP an auditor verifies offline, with nothing but this module (or
//! an independent reimplementation of `docs/log-format.md`).
//!
//! ```text
//! manifest.json          format, subject, mode, log origin, tree size, entry indices,
//!                        and the SHA-256 and size of every other file
//! manifest.sig           the server's DSSE signature over manifest.json's exact bytes:
//!                        its statement that the entries are every entry of the subject
//!                        up to the tree size (format v2)
//! checkpoint.txt         the signed checkpoint every inclusion proof is against
//! jwks.json              the public keys (current and retired)
//! entries/<i>.json       the exact bytes of log entry i (the Merkle leaf)
//! proofs/<i>.json        {"index", "tree_size", "leaf_hash", "path"} for entry i
//! payloads/<i>.json      {"salt", "payload"} opening entry i's commitment (mode "full")
//! decisions/<n>.json     the signed decision proofs (DSSE envelopes), n = 1, 2, ...
//! ```
//!
//! Files are stored uncompressed, in that order, with a fixed timestamp, and the manifest
//! is RFC 8785 JSON, so one subject exported against one checkpoint is always the same
//! bytes (Ed25519 signatures are deterministic).
//!
//! The inclusion proofs show each entry is in the log; only the signed manifest shows
//! none was left out, so a bundle is valid only with a manifest signature by a trusted
//! key. A v1 bundle (no signature) is still read and checked, but never valid: it is
//! not proven complete.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Cursor, Write};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use zip::write::SimpleFileOptions;

use crate::checkpoint::Checkpoint;
use crate::event::{EventKind, LogEntry, PayloadOpening};
use crate::keys::Jwks;
use crate::merkle::{self, Hash};
use crate::proof::{self, Envelope, VerifyOptions};

pub const FORMAT: &str = "countersign.evidence/v2";
/// The unsigned format before v2: read, checked, and reported as not proven complete.
pub const FORMAT_V1: &str = "countersign.evidence/v1";
/// The DSSE payload type of `manifest.sig` (its payload: manifest.json's exact bytes).
pub const MANIFEST_PAYLOAD_TYPE: &str = "application/vnd.countersign.evidence-manifest+json";
const MANIFEST_SIG: &str = "manifest.sig";

mod limits;
use limits::read_archive;
pub use limits::{MAX_FILE_BYTES, MAX_UPLOAD_FILES, ReadLimits, UPLOAD_EXPANSION};

/// What a bundle discloses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Entries carry salted commitments; payload values are left out.
    Redacted,
    /// Payload values and salts are included, so every commitment can be opened.
    Full,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    pub subject: String,
    pub mode: Mode,
    pub log_origin: String,
    pub tree_size: u64,
    pub entries: Vec<u64>,
    pub files: Vec<ManifestFile>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestFile {
    pub path: String,
    pub sha256: String,
    pub size: u64,
}

/// An inclusion proof as stored in a bundle (and served by the API).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InclusionProof {
    pub index: u64,
    pub tree_size: u64,
    /// Standard base64 of the 32-byte leaf hash.
    pub leaf_hash: String,
    /// Standard base64 of each 32-byte path hash, leaf to root.
    pub path: Vec<String>,
}

impl InclusionProof {
    pub fn new(index: u64, tree_size: u64, leaf: &Hash, path: &[Hash]) -> Self {
        Self {
            index,
            tree_size,
            leaf_hash: STANDARD.encode(leaf),
            path: path.iter().map(|h| STANDARD.encode(h)).collect(),
        }
    }

    pub fn decode(&self) -> Option<(Hash, Vec<Hash>)> {
        let leaf = decode_hash(&self.leaf_hash)?;
        let path = self
            .path
            .iter()
            .map(|p| decode_hash(p))
            .collect::<Option<Vec<_>>>()?;
        Some((leaf, path))
    }
}

pub fn decode_hash(text: &str) -> Option<Hash> {
    STANDARD.decode(text).ok()?.try_into().ok()
}

/// One log entry of the subject, with its proof and (in full mode) its opening.
#[derive(Debug, Clone)]
pub struct BundleEntry {
    pub index: u64,
    pub bytes: Vec<u8>,
    pub path: Vec<Hash>,
    pub payload: Option<PayloadOpening>,
}

/// Everything a bundle is made of.
#[derive(Debug, Clone)]
pub struct BundleInput {
    pub subject: String,
    pub mode: Mode,
    pub log_origin: String,
    pub checkpoint_note: String,
    pub tree_size: u64,
    pub jwks: Jwks,
    pub entries: Vec<BundleEntry>,
    pub decisions: Vec<Envelope>,
}

#[derive(Debug, thiserror::Error)]
#[error("could not build the bundle: {0}")]
pub struct BundleError(String);

fn canonical<T: Serialize>(value: &T) -> Result<Vec<u8>, BundleError> {
    crate::jcs::to_vec(value).map_err(|e| BundleError(e.to_string()))
}

/// Builds the ZIP, its manifest signed by `signer` (the log's key). Deterministic: the
/// same input gives the same bytes.
pub fn build(input: &BundleInput, signer: &crate::Signer) -> Result<Vec<u8>, BundleError> {
    let mut files: Vec<(String, Vec<u8>)> = vec![
        (
            "checkpoint.txt".into(),
            input.checkpoint_note.as_bytes().to_vec(),
        ),
        ("jwks.json".into(), canonical(&input.jwks)?),
    ];
    let mut entries: Vec<&BundleEntry> = input.entries.iter().collect();
    entries.sort_by_key(|e| e.index);
    for e in &entries {
        files.push((format!("entries/{}.json", e.index), e.bytes.clone()));
    }
    for e in &entries {
        let proof = InclusionProof::new(
            e.index,
            input.tree_size,
            &merkle::leaf_hash(&e.bytes),
            &e.path,
        );
        files.push((format!("proofs/{}.json", e.index), canonical(&proof)?));
    }
    if input.mode == Mode::Full {
        for e in &entries {
            if let Some(opening) = &e.payload {
                files.push((format!("payloads/{}.json", e.index), canonical(opening)?));
            }
        }
    }
    for (n, envelope) in input.decisions.iter().enumerate() {
        files.push((format!("decisions/{}.json", n + 1), canonical(envelope)?));
    }
    let manifest = Manifest {
        format: FORMAT.into(),
        subject: input.subject.clone(),
        mode: input.mode,
        log_origin: input.log_origin.clone(),
        tree_size: input.tree_size,
        entries: entries.iter().map(|e| e.index).collect(),
        files: files
            .iter()
            .map(|(path, bytes)| ManifestFile {
                path: path.clone(),
                sha256: hex::encode(Sha256::digest(bytes)),
                size: bytes.len() as u64,
            })
            .collect(),
    };
    let options = SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .last_modified_time(zip::DateTime::default())
        .unix_permissions(0o644);
    let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let err = |e: &dyn std::fmt::Display| BundleError(e.to_string());
    let manifest_bytes = canonical(&manifest)?;
    let signature = Envelope::sign(MANIFEST_PAYLOAD_TYPE, &manifest_bytes, signer);
    zip.start_file("manifest.json", options)
        .map_err(|e| err(&e))?;
    zip.write_all(&manifest_bytes).map_err(|e| err(&e))?;
    zip.start_file(MANIFEST_SIG, options).map_err(|e| err(&e))?;
    zip.write_all(&canonical(&signature)?)
        .map_err(|e| err(&e))?;
    for (path, bytes) in &files {
        zip.start_file(path.as_str(), options)
            .map_err(|e| err(&e))?;
        zip.write_all(bytes).map_err(|e| err(&e))?;
    }
    Ok(zip.finish().map_err(|e| err(&e))?.into_inner())
}

/// The outcome of verifying a bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleReport {
    /// Everything checks out and the bundle is proven complete.
    pub valid: bool,
    /// The manifest is signed by a trusted key: the bundle holds every entry of its
    /// subject up to its tree size (false for v1 bundles, which are unsigned).
    #[serde(default)]
    pub complete: bool,
    /// The signatures were checked against keys the verifier pinned (its own copy, a
    /// server's, a data directory's); false when only the bundle's own jwks.json was
    /// there to check them against, which proves nothing about who made the bundle.
    #[serde(default)]
    pub keys_pinned: bool,
    /// The key that signed the manifest.
    #[serde(default)]
    pub manifest_signed_by: Option<String>,
    /// Every problem found; empty when valid.
    pub reasons: Vec<String>,
    pub subject: Option<String>,
    pub mode: Option<Mode>,
    pub log_origin: Option<String>,
    pub tree_size: Option<u64>,
    /// The verified entries' types, in log order.
    pub events: Vec<String>,
    pub decisions: usize,
}

/// Verifies a bundle offline: the manifest against the files (nothing extra, nothing
/// missing), the checkpoint's signature, every entry's inclusion proof against it, that
/// every entry is about the subject and none of the subject's versions in between is
/// missing, every payload opening (mode full), and every decision proof's signature and
/// its match with a logged decision. Signatures are checked against `pinned` when given
/// (an auditor's own copy of the keys), else against the bundle's JWKS.
pub fn verify(zip_bytes: &[u8], pinned: Option<&Jwks>) -> BundleReport {
    verify_within(zip_bytes, pinned, &ReadLimits::OFFLINE)
}

/// [`verify`], reading no more of the archive than `limits` allow: an archive beyond
/// them is refused with a reason that says which bound it passed.
pub fn verify_within(zip_bytes: &[u8], pinned: Option<&Jwks>, limits: &ReadLimits) -> BundleReport {
    let mut report = BundleReport {
        valid: false,
        complete: false,
        keys_pinned: pinned.is_some(),
        manifest_signed_by: None,
        reasons: Vec::new(),
        subject: None,
        mode: None,
        log_origin: None,
        tree_size: None,
        events: Vec::new(),
        decisions: 0,
    };
    match check(zip_bytes, pinned, limits, &mut report) {
        Ok(()) => {}
        Err(fatal) => report.reasons.push(fatal),
    }
    report.valid = report.reasons.is_empty() && report.complete;
    report
}

fn check(
    zip_bytes: &[u8],
    pinned: Option<&Jwks>,
    limits: &ReadLimits,
    report: &mut BundleReport,
) -> Result<(), String> {
    let files = read_archive(zip_bytes, limits)?;
    let manifest_bytes = files
        .get("manifest.json")
        .ok_or("manifest.json is missing")?;
    let manifest: Manifest = serde_json::from_slice(manifest_bytes)
        .map_err(|e| format!("manifest.json is not a bundle manifest: {e}"))?;
    let signed = match manifest.format.as_str() {
        FORMAT => true,
        FORMAT_V1 => false,
        other => return Err(format!("unknown bundle format {other:?}")),
    };
    report.subject = Some(manifest.subject.clone());
    report.mode = Some(manifest.mode);
    report.log_origin = Some(manifest.log_origin.clone());
    report.tree_size = Some(manifest.tree_size);
    let reasons = &mut report.reasons;

    // 1. The manifest and the files agree exactly.
    let listed: BTreeMap<&str, &ManifestFile> = manifest
        .files
        .iter()
        .map(|f| (f.path.as_str(), f))
        .collect();
    if listed.len() != manifest.files.len() {
        reasons.push("the manifest lists a file twice".into());
    }
    for (path, bytes) in &files {
        if path == "manifest.json" || (signed && path == MANIFEST_SIG) {
            continue;
        }
        match listed.get(path.as_str()) {
            None => reasons.push(format!("{path} is in the archive but not in the manifest")),
            Some(f) => {
                if hex::encode(Sha256::digest(bytes)) != f.sha256 || bytes.len() as u64 != f.size {
                    reasons.push(format!("{path} does not match its SHA-256 in the manifest"));
                }
            }
        }
    }
    for path in listed.keys() {
        if !files.contains_key(*path) {
            reasons.push(format!(
                "{path} is in the manifest but missing from the archive"
            ));
        }
    }
    let expected: BTreeSet<String> = expected_paths(&manifest, &files);
    for path in listed.keys() {
        if !expected.contains(*path) {
            reasons.push(format!(
                "{path} is not a file a {} bundle has",
                manifest.format
            ));
        }
    }

    // Every JSON file is in the canonical form the exporter writes, so no byte of the
    // bundle can change without changing what it says.
    if canonical(&manifest).ok().as_deref() != Some(manifest_bytes.as_slice()) {
        reasons.push("manifest.json is not in canonical form".into());
    }
    for (path, bytes) in &files {
        let json =
            path.ends_with(".json") && path != "manifest.json" && !path.starts_with("entries/");
        if json {
            let reencoded = serde_json::from_slice::<serde_json::Value>(bytes)
                .ok()
                .and_then(|v| canonical(&v).ok());
            if reencoded.as_deref() != Some(bytes.as_slice()) {
                reasons.push(format!("{path} is not in canonical form"));
            }
        }
    }

    // 2. Keys and the checkpoint.
    let bundled_jwks: Option<Jwks> = files.get("jwks.json").and_then(|b| parse_exact(b));
    match &bundled_jwks {
        None => reasons.push("jwks.json is missing or not exactly a JWKS".into()),
        Some(jwks) => {
            for key in &jwks.keys {
                if let Err(problem) = check_published_key(key) {
                    reasons.push(format!("jwks.json: {problem}"));
                }
            }
        }
    }
    let jwks = match (pinned, &bundled_jwks) {
        (Some(p), _) => p.clone(),
        (None, Some(b)) => b.clone(),
        (None, None) => return Ok(()),
    };
    // The manifest's signature: the server's statement that the bundle is complete.
    if signed {
        match files.get(MANIFEST_SIG) {
            None => reasons.push(format!(
                "{MANIFEST_SIG} is missing: nothing shows the bundle holds every entry of its subject"
            )),
            Some(bytes) => match check_manifest_signature(bytes, manifest_bytes, &jwks) {
                Ok(kid) => {
                    report.complete = true;
                    report.manifest_signed_by = Some(kid);
                }
                Err(problem) => reasons.push(format!("{MANIFEST_SIG}: {problem}")),
            },
        }
    } else {
        reasons.push(format!(
            "the bundle is {FORMAT_V1}, whose manifest is not signed: it is not proven complete (an entry of its subject may have been left out); export it again for a signed {FORMAT} bundle"
        ));
    }
    let reasons = &mut report.reasons;
    let note = files
        .get("checkpoint.txt")
        .and_then(|b| String::from_utf8(b.clone()).ok())
        .ok_or("checkpoint.txt is missing or not text")?;
    let checkpoint = match Checkpoint::verify(&note, &jwks, Some(&manifest.log_origin)) {
        Ok(c) => c,
        Err(e) => {
            reasons.push(format!("checkpoint: {e}"));
            return Ok(());
        }
    };
    if checkpoint.size != manifest.tree_size {
        reasons.push(format!(
            "the checkpoint is for {} entries but the manifest says {}",
            checkpoint.size, manifest.tree_size
        ));
    }

    // 3. Every entry: in the log under the checkpoint, about the subject.
    let mut entries: Vec<(u64, LogEntry)> = Vec::new();
    for index in &manifest.entries {
        let Some(bytes) = files.get(&format!("entries/{index}.json")) else {
            reasons.push(format!("entries/{index}.json is listed but missing"));
            continue;
        };
        let leaf = merkle::leaf_hash(bytes);
        match files
            .get(&format!("proofs/{index}.json"))
            .and_then(|b| parse_exact::<InclusionProof>(b))
        {
            None => reasons.push(format!("proofs/{index}.json is missing or malformed")),
            Some(proof) => match proof.decode() {
                Some((proof_leaf, path))
                    if proof.index == *index && proof.tree_size == checkpoint.size && proof_leaf == leaf =>
                {
                    if let Err(e) = merkle::verify_inclusion(*index, checkpoint.size, &leaf, &path, &checkpoint.root) {
                        reasons.push(format!("entry {index} is not in the checkpointed log: {e}"));
                    }
                }
                _ => reasons.push(format!(
                    "proofs/{index}.json does not describe entries/{index}.json under this checkpoint"
                )),
            },
        }
        match serde_json::from_slice::<LogEntry>(bytes) {
            Ok(entry) if entry.to_bytes() == *bytes => {
                if entry.subject.as_deref() != Some(manifest.subject.as_str()) {
                    reasons.push(format!(
                        "entry {index} is about {:?}, not {}",
                        entry.subject, manifest.subject
                    ));
                }
                entries.push((*index, entry));
            }
            Ok(_) => reasons.push(format!("entry {index} is not in canonical form")),
            Err(e) => reasons.push(format!("entry {index} is not a log entry: {e}")),
        }
    }
    if manifest.entries.windows(2).any(|w| w[0] >= w[1]) {
        reasons.push("the manifest's entries are not in increasing order".into());
    }
    entries.sort_by_key(|(i, _)| *i);
    report.events = entries
        .iter()
        .map(|(_, e)| e.kind.as_str().to_string())
        .collect();
    if entries.is_empty() {
        reasons.push("the bundle has no entries".into());
    }

    // 4. No version of the subject is left out between the first and the last.
    let versions: Vec<Option<u64>> = entries.iter().map(|(_, e)| e.version()).collect();
    for (n, v) in versions.iter().enumerate() {
        if *v != Some(n as u64 + 1) {
            reasons.push(format!(
                "entry {} records version {:?} where version {} was expected: an event of the subject is missing or repeated",
                entries[n].0,
                v,
                n + 1
            ));
            break;
        }
    }

    // 5. Payload openings.
    for (index, entry) in &entries {
        let path = format!("payloads/{index}.json");
        match (manifest.mode, &entry.payload, files.get(&path)) {
            (Mode::Full, Some(commitment), Some(bytes)) => {
                match parse_exact::<PayloadOpening>(bytes) {
                    Some(opening) if opening.commitment().as_ref() == Some(commitment) => {}
                    Some(_) => {
                        reasons.push(format!("{path} does not open entry {index}'s commitment"))
                    }
                    None => reasons.push(format!("{path} is not exactly a payload opening")),
                }
            }
            (Mode::Full, Some(_), None) => reasons.push(format!("{path} is missing (mode full)")),
            (_, None, Some(_)) => reasons.push(format!(
                "{path} opens nothing: entry {index} has no payload"
            )),
            (Mode::Redacted, _, Some(_)) => {
                reasons.push(format!("{path} is present in a redacted bundle"))
            }
            _ => {}
        }
    }

    // 6. Decision proofs: each verifies and matches a logged decision, one for one.
    let mut logged: Vec<&LogEntry> = entries
        .iter()
        .map(|(_, e)| e)
        .filter(|e| e.kind == EventKind::RequestDecided)
        .collect();
    let mut n = 1;
    while let Some(bytes) = files.get(&format!("decisions/{n}.json")) {
        report.decisions += 1;
        let path = format!("decisions/{n}.json");
        n += 1;
        let Some(envelope) = parse_exact::<Envelope>(bytes) else {
            reasons.push(format!("{path} is not exactly a DSSE envelope"));
            continue;
        };
        let verdict = proof::verify(&envelope, &jwks, &VerifyOptions::default());
        let Some(statement) = verdict.statement else {
            reasons.push(format!("{path}: {}", first_reason(&verdict.reasons)));
            continue;
        };
        let signature_problems: Vec<_> = verdict
            .reasons
            .iter()
            .filter(|r| r.code != proof::ProblemCode::NotApproved)
            .collect();
        if let Some(p) = signature_problems.first() {
            reasons.push(format!("{path}: {}", p.message));
        }
        if statement.request_id != manifest.subject {
            reasons.push(format!(
                "{path} is for {}, not {}",
                statement.request_id, manifest.subject
            ));
        }
        let matching = logged.iter().position(|e| {
            e.data.get("nonce").and_then(|v| v.as_str()) == Some(statement.nonce.as_str())
                && e.data.get("decision").and_then(|v| v.as_str())
                    == Some(statement.decision.as_str())
                && e.data.get("action_digest").and_then(|v| v.as_str())
                    == Some(statement.action_digest.as_str())
        });
        match matching {
            Some(i) => {
                logged.remove(i);
            }
            None => reasons.push(format!("{path} matches no decision in the log entries")),
        }
    }
    for e in logged {
        reasons.push(format!(
            "the decision logged at {} has no decision proof in the bundle",
            e.at
        ));
    }
    Ok(())
}

use crate::anchor::check_published_key;

/// Checks `manifest.sig`: exactly a DSSE envelope of the manifest's exact bytes, signed
/// by a key of `jwks`. Returns the signing key's id.
fn check_manifest_signature(sig: &[u8], manifest: &[u8], jwks: &Jwks) -> Result<String, String> {
    let envelope: Envelope =
        parse_exact(sig).ok_or("not exactly a DSSE envelope in canonical form")?;
    if envelope.payload_type != MANIFEST_PAYLOAD_TYPE {
        return Err(format!(
            "payloadType is {:?}, expected {MANIFEST_PAYLOAD_TYPE:?}",
            envelope.payload_type
        ));
    }
    if STANDARD.decode(&envelope.payload).ok().as_deref() != Some(manifest) {
        return Err("it signs another manifest than manifest.json".into());
    }
    let message = proof::pae(MANIFEST_PAYLOAD_TYPE, manifest);
    for signature in &envelope.signatures {
        let Some(key) = jwks.find(&signature.keyid) else {
            continue;
        };
        let (Ok(public), Some(sig)) = (
            key.verifying_key(),
            STANDARD
                .decode(&signature.sig)
                .ok()
                .and_then(|b| <[u8; 64]>::try_from(b).ok()),
        ) else {
            continue;
        };
        if public
            .verify_strict(&message, &ed25519_dalek::Signature::from_bytes(&sig))
            .is_ok()
        {
            return Ok(key.kid.clone());
        }
    }
    Err("no signature by a trusted key: the bundle is not proven complete".into())
}

/// Parses a bundle file as `T` only if `T` written back canonically is exactly the
/// file: an unknown or renamed member, a default filled in, or any other spelling that
/// parses to the same value is refused.
fn parse_exact<T: serde::de::DeserializeOwned + Serialize>(bytes: &[u8]) -> Option<T> {
    let value: T = serde_json::from_slice(bytes).ok()?;
    (canonical(&value).ok()?.as_slice() == bytes).then_some(value)
}

fn first_reason(problems: &[proof::Problem]) -> String {
    problems
        .first()
        .map(|p| p.message.clone())
        .unwrap_or_else(|| "invalid".into())
}

/// The paths a bundle with this manifest may contain.
fn expected_paths(manifest: &Manifest, files: &BTreeMap<String, Vec<u8>>) -> BTreeSet<String> {
    let mut paths: BTreeSet<String> = ["checkpoint.txt", "jwks.json"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for i in &manifest.entries {
        paths.insert(format!("entries/{i}.json"));
        paths.insert(format!("proofs/{i}.json"));
        if manifest.mode == Mode::Full {
            paths.insert(format!("payloads/{i}.json"));
        }
    }
    let decisions = files.keys().filter(|p| p.starts_with("decisions/")).count();
    for n in 1..=decisions {
        paths.insert(format!("decisions/{n}.json"));
    }
    paths
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::merkle::{CompactRange, NodeId};
    use crate::testutil::*;
    use crate::{Event, EventKind, Limits, Verdict};

    /// A log with two requests' events interleaved and a bundle for the first one.
    pub(crate) fn sample(mode: Mode) -> Vec<u8> {
        sample_by(mode, &signer())
    }

    /// The same, made entirely with `key`: the checkpoint, the proof, the manifest.
    pub(crate) fn sample_by(mode: Mode, key: &crate::Signer) -> Vec<u8> {
        let limits = Limits::default();
        let first = pending();
        let other =
            crate::ApprovalRequest::create("req_2".into(), new_request(), &agent(), t0(), &limits)
                .unwrap();
        let mut decided = decide(&first, Verdict::Approved, t0());
        if key.kid() != signer().kid()
            && let Some(statement) = decided
                .request
                .proof
                .as_ref()
                .and_then(|p| p.unverified_statement())
        {
            decided.request.proof = Some(Envelope::sign_statement(&statement, key));
        }
        let used = decided
            .request
            .record_action("pay".into(), Default::default(), &agent(), t0(), &limits)
            .unwrap();
        let events: Vec<Event> = vec![
            Event::created(&first),
            other.event.clone(),
            decided.event.clone(),
            Event::system(
                EventKind::TokenCreated,
                t0(),
                None,
                serde_json::json!({"token_id": "t"}),
            ),
            used.event.clone(),
        ];
        let sealed: Vec<_> = events
            .iter()
            .enumerate()
            .map(|(i, e)| e.seal([i as u8; 32]))
            .collect();
        let mut range = CompactRange::empty();
        let mut nodes = HashMap::new();
        for s in &sealed {
            for (id, h) in range.append(merkle::leaf_hash(&s.bytes)) {
                nodes.insert(id, h);
            }
        }
        let size = sealed.len() as u64;
        let checkpoint = Checkpoint {
            origin: "countersign/test".into(),
            size,
            root: range.root(),
        };
        let mut get = |id: NodeId| nodes.get(&id).copied();
        let entries = [0u64, 2, 4]
            .iter()
            .map(|&i| BundleEntry {
                index: i,
                bytes: sealed[i as usize].bytes.clone(),
                path: merkle::inclusion_proof(i, size, &mut get).unwrap(),
                payload: sealed[i as usize].payload.clone(),
            })
            .collect();
        build(
            &BundleInput {
                subject: "req_1".into(),
                mode,
                log_origin: "countersign/test".into(),
                checkpoint_note: checkpoint.sign(key),
                tree_size: size,
                jwks: Jwks {
                    keys: vec![key.jwk()],
                },
                entries,
                decisions: vec![decided.request.proof.clone().unwrap()],
            },
            key,
        )
        .unwrap()
    }

    #[test]
    fn a_built_bundle_verifies_and_is_deterministic() {
        for mode in [Mode::Redacted, Mode::Full] {
            let bytes = sample(mode);
            assert_eq!(bytes, sample(mode), "same input, same bytes");
            let report = verify(&bytes, None);
            assert!(report.valid, "{mode:?}: {:?}", report.reasons);
            assert_eq!(
                report.events,
                vec!["request_created", "request_decided", "action_recorded"]
            );
            assert_eq!(report.decisions, 1);
            assert_eq!(report.subject.as_deref(), Some("req_1"));
        }
        let redacted = String::from_utf8_lossy(&sample(Mode::Redacted)).to_string();
        assert!(
            !redacted.contains("\"amount\""),
            "payload values stay out of entries"
        );
    }

    #[test]
    fn pinned_keys_override_the_bundled_ones() {
        let bytes = sample(Mode::Redacted);
        let other = Jwks {
            keys: vec![crate::Signer::from_seed([9; 32]).jwk()],
        };
        let report = verify(&bytes, Some(&other));
        assert!(!report.valid);
        assert!(
            report.reasons.iter().any(|r| r.contains("checkpoint")),
            "{:?}",
            report.reasons
        );
    }

    /// Rewrites one file of a bundle (keeping or fixing the manifest hash).
    fn rewrite(
        bytes: &[u8],
        path: &str,
        edit: impl Fn(&mut Vec<u8>),
        fix_manifest: bool,
    ) -> Vec<u8> {
        let mut files = read_archive(bytes, &ReadLimits::OFFLINE).unwrap();
        let mut manifest: Manifest = serde_json::from_slice(&files["manifest.json"]).unwrap();
        let content = files.get_mut(path).unwrap();
        edit(content);
        if fix_manifest {
            for f in &mut manifest.files {
                if f.path == path {
                    f.sha256 = hex::encode(Sha256::digest(&*content));
                    f.size = content.len() as u64;
                }
            }
        }
        files.insert("manifest.json".into(), canonical(&manifest).unwrap());
        repack(&files)
    }

    pub(crate) fn repack(files: &BTreeMap<String, Vec<u8>>) -> Vec<u8> {
        let options =
            SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
        let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
        for (path, bytes) in files {
            zip.start_file(path.as_str(), options).unwrap();
            zip.write_all(bytes).unwrap();
        }
        zip.finish().unwrap().into_inner()
    }

    #[test]
    fn altered_extra_and_missing_files_are_named() {
        let bytes = sample(Mode::Full);
        let flip = |b: &mut Vec<u8>| {
            let i = b.len() / 2;
            b[i] ^= 1;
        };
        for path in [
            "entries/2.json",
            "proofs/4.json",
            "payloads/0.json",
            "decisions/1.json",
            "checkpoint.txt",
            "jwks.json",
        ] {
            let stale = rewrite(&bytes, path, flip, false);
            let report = verify(&stale, None);
            assert!(
                report
                    .reasons
                    .iter()
                    .any(|r| r.contains(path) && r.contains("SHA-256")),
                "{path}: {:?}",
                report.reasons
            );
            let consistent = rewrite(&bytes, path, flip, true);
            assert!(
                !verify(&consistent, None).valid,
                "{path} altered with a fixed manifest still verified"
            );
        }
        let mut files = read_archive(&bytes, &ReadLimits::OFFLINE).unwrap();
        files.insert("extra.txt".into(), b"hi".to_vec());
        let report = verify(&repack(&files), None);
        assert!(
            report.reasons.iter().any(|r| r.contains("extra.txt")),
            "{:?}",
            report.reasons
        );
        let mut files = read_archive(&bytes, &ReadLimits::OFFLINE).unwrap();
        files.remove("entries/2.json");
        let report = verify(&repack(&files), None);
        assert!(
            report
                .reasons
                .iter()
                .any(|r| r.contains("entries/2.json") && r.contains("missing")),
            "{:?}",
            report.reasons
        );
    }

    #[test]
    fn leaving_out_an_event_of_the_subject_is_detected() {
        let bytes = sample(Mode::Redacted);
        let mut files = read_archive(&bytes, &ReadLimits::OFFLINE).unwrap();
        let mut manifest: Manifest = serde_json::from_slice(&files["manifest.json"]).unwrap();
        files.remove("entries/2.json");
        files.remove("proofs/2.json");
        files.remove("decisions/1.json");
        manifest.entries.retain(|i| *i != 2);
        manifest.files.retain(|f| {
            f.path != "entries/2.json" && f.path != "proofs/2.json" && f.path != "decisions/1.json"
        });
        files.insert("manifest.json".into(), canonical(&manifest).unwrap());
        let report = verify(&repack(&files), None);
        assert!(
            report
                .reasons
                .iter()
                .any(|r| r.contains("missing or repeated")),
            "{:?}",
            report.reasons
        );
    }

    /// The bundle with entry `index` and its files left out, and the manifest rewritten
    /// to list what is left (its signature cannot be rewritten without the key).
    fn cut(bytes: &[u8], index: u64) -> Vec<u8> {
        let mut files = read_archive(bytes, &ReadLimits::OFFLINE).unwrap();
        let mut manifest: Manifest = serde_json::from_slice(&files["manifest.json"]).unwrap();
        let mut gone = vec![
            format!("entries/{index}.json"),
            format!("proofs/{index}.json"),
        ];
        if index == 2 {
            gone.push("decisions/1.json".into());
        }
        for path in &gone {
            files.remove(path);
        }
        manifest.entries.retain(|i| *i != index);
        manifest.files.retain(|f| !gone.contains(&f.path));
        files.insert("manifest.json".into(), canonical(&manifest).unwrap());
        repack(&files)
    }

    #[test]
    fn a_bundle_cut_at_the_start_middle_or_end_is_not_complete() {
        let bytes = sample(Mode::Redacted);
        let pinned = Jwks {
            keys: vec![signer().jwk()],
        };
        for index in [0, 2, 4] {
            for keys in [None, Some(&pinned)] {
                let report = verify(&cut(&bytes, index), keys);
                assert!(!report.valid && !report.complete, "cut {index}: {report:?}");
                assert!(
                    report
                        .reasons
                        .iter()
                        .any(|r| r.contains("manifest.sig") && r.contains("another manifest")),
                    "cut {index}: {:?}",
                    report.reasons
                );
            }
        }
        // Signed again by another key: complete under that key only, never under the
        // pinned one.
        let other = crate::Signer::from_seed([9; 32]);
        let mut files = read_archive(&cut(&bytes, 4), &ReadLimits::OFFLINE).unwrap();
        let resigned = Envelope::sign(MANIFEST_PAYLOAD_TYPE, &files["manifest.json"], &other);
        files.insert(MANIFEST_SIG.into(), canonical(&resigned).unwrap());
        let report = verify(&repack(&files), Some(&pinned));
        assert!(!report.valid && !report.complete, "{report:?}");
        assert!(
            report
                .reasons
                .iter()
                .any(|r| r.contains("no signature by a trusted key")),
            "{:?}",
            report.reasons
        );
        // Without the signature at all.
        let mut files = read_archive(&cut(&bytes, 4), &ReadLimits::OFFLINE).unwrap();
        files.remove(MANIFEST_SIG);
        let report = verify(&repack(&files), None);
        assert!(
            !report.valid
                && report
                    .reasons
                    .iter()
                    .any(|r| r.contains("manifest.sig is missing")),
            "{:?}",
            report.reasons
        );
    }

    #[test]
    fn a_complete_bundle_reports_its_signer_and_whether_keys_were_pinned() {
        let bytes = sample(Mode::Redacted);
        let report = verify(&bytes, None);
        assert!(
            report.valid && report.complete && !report.keys_pinned,
            "{report:?}"
        );
        assert_eq!(report.manifest_signed_by.as_deref(), Some(signer().kid()));
        let pinned = Jwks {
            keys: vec![signer().jwk()],
        };
        let report = verify(&bytes, Some(&pinned));
        assert!(report.valid && report.keys_pinned, "{report:?}");
    }

    #[test]
    fn a_bundle_made_with_a_foreign_key_is_valid_only_unpinned() {
        let foreign = crate::Signer::from_seed([9; 32]);
        let bytes = sample_by(Mode::Redacted, &foreign);
        let unpinned = verify(&bytes, None);
        assert!(unpinned.valid && !unpinned.keys_pinned, "{unpinned:?}");
        let pinned = verify(
            &bytes,
            Some(&Jwks {
                keys: vec![signer().jwk()],
            }),
        );
        assert!(!pinned.valid && !pinned.complete, "{pinned:?}");
    }

    #[test]
    fn a_v1_bundle_is_read_but_not_proven_complete() {
        let bytes = sample(Mode::Redacted);
        let mut files = read_archive(&bytes, &ReadLimits::OFFLINE).unwrap();
        let mut manifest: Manifest = serde_json::from_slice(&files["manifest.json"]).unwrap();
        manifest.format = FORMAT_V1.into();
        files.remove(MANIFEST_SIG);
        files.insert("manifest.json".into(), canonical(&manifest).unwrap());
        let report = verify(&repack(&files), None);
        assert!(!report.valid && !report.complete, "{report:?}");
        assert_eq!(report.reasons.len(), 1, "{:?}", report.reasons);
        assert!(report.reasons[0].contains("not proven complete"));
        assert_eq!(
            report.events,
            vec!["request_created", "request_decided", "action_recorded"]
        );
    }

    /// One file of `size` zeros, deflated: a few KB that expand to `size` bytes.
    pub(crate) fn bomb(size: usize) -> Vec<u8> {
        let options =
            SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
        zip.start_file("manifest.json", options).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        for _ in 0..size / chunk.len() {
            zip.write_all(&chunk).unwrap();
        }
        zip.finish().unwrap().into_inner()
    }

    #[test]
    fn a_zip_bomb_is_refused_before_it_expands() {
        let bomb = bomb(64 * 1024 * 1024);
        assert!(bomb.len() < 200 * 1024, "{} bytes", bomb.len());
        let report = verify_within(&bomb, None, &ReadLimits::upload(bomb.len()));
        assert!(!report.valid);
        assert_eq!(report.reasons.len(), 1, "{:?}", report.reasons);
        assert!(
            report.reasons[0].contains("manifest.json expands to more than"),
            "{:?}",
            report.reasons
        );
        // Past the total: many files that are each small enough.
        let mut files = BTreeMap::new();
        for i in 0..3 {
            files.insert(format!("entries/{i}.json"), vec![b' '; 1000]);
        }
        let stored = repack(&files);
        let tight = ReadLimits {
            max_files: 10,
            max_file_bytes: 1000,
            max_total_bytes: 2500,
        };
        let report = verify_within(&stored, None, &tight);
        assert!(
            report.reasons[0].contains("the archive expands to more than 2500 bytes"),
            "{:?}",
            report.reasons
        );
        let few = ReadLimits {
            max_files: 2,
            ..tight
        };
        let report = verify_within(&stored, None, &few);
        assert!(
            report.reasons[0].contains("has 3 files; a bundle checked here may have at most 2"),
            "{:?}",
            report.reasons
        );
    }

    #[test]
    fn real_bundles_pass_the_upload_limits() {
        for mode in [Mode::Redacted, Mode::Full] {
            let bytes = sample(mode);
            let report = verify_within(&bytes, None, &ReadLimits::upload(bytes.len()));
            assert!(report.valid, "{mode:?}: {:?}", report.reasons);
        }
        // Re-zipped with deflate, a real bundle still fits.
        let bytes = sample(Mode::Full);
        let files = read_archive(&bytes, &ReadLimits::OFFLINE).unwrap();
        let options =
            SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
        for (path, content) in &files {
            zip.start_file(path.as_str(), options).unwrap();
            zip.write_all(content).unwrap();
        }
        let deflated = zip.finish().unwrap().into_inner();
        assert!(deflated.len() < bytes.len());
        let report = verify_within(&deflated, None, &ReadLimits::upload(deflated.len()));
        assert!(report.valid, "{:?}", report.reasons);
    }

    #[test]
    fn garbage_is_refused_not_panicked_on() {
        assert!(!verify(b"not a zip", None).valid);
        assert!(!verify(&[], None).valid);
        let mut files = BTreeMap::new();
        files.insert("manifest.json".to_string(), b"{}".to_vec());
        assert!(!verify(&repack(&files), None).valid);
    }
}
