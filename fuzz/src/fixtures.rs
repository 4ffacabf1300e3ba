//! Fixed keys, times and a valid evidence bundle, built deterministically so that the
//! committed seeds (examples/make_seeds.rs) verify against the harnesses' keys.

use std::collections::{BTreeMap, HashMap};
use std::io::{Cursor, Read, Write};
use std::sync::OnceLock;

use countersign_core::bundle::{self, BundleEntry, BundleInput, Mode};
use countersign_core::checkpoint::Checkpoint;
use countersign_core::merkle::{self, CompactRange, NodeId};
use countersign_core::{
    ApprovalRequest, Channel, DecisionInput, Event, EventKind, Jwk, Jwks, Limits, NewRequest,
    Principal, Role, Signer, Timestamp, Verdict,
};

pub const ORIGIN: &str = "countersign/fuzz";

/// The key every harness trusts.
pub fn signer() -> Signer {
    Signer::from_seed([42; 32])
}

/// A key the harnesses also publish, which signs nothing.
pub fn other_signer() -> Signer {
    Signer::from_seed([9; 32])
}

/// The published keys: the signer, another valid key, and a malformed one (which every
/// verifier must skip, not trip over).
pub fn jwks() -> &'static Jwks {
    static JWKS: OnceLock<Jwks> = OnceLock::new();
    JWKS.get_or_init(|| Jwks {
        keys: vec![
            other_signer().jwk(),
            Jwk {
                kty: "OKP".into(),
                crv: "X25519".into(),
                x: "AAAA".into(),
                kid: "bad".into(),
                alg: None,
                use_: None,
            },
            signer().jwk(),
        ],
    })
}

/// Only the signer, as countersign publishes it (for bundles, whose checks are strict).
pub fn signer_jwks() -> Jwks {
    Jwks {
        keys: vec![signer().jwk()],
    }
}

pub fn t0() -> Timestamp {
    Timestamp::parse("2026-11-29T12:00:00Z").unwrap()
}

pub fn agent() -> Principal {
    Principal::from_token("deploy-bot", Role::Agent)
}

pub fn approver() -> Principal {
    Principal::from_token("alice", Role::Approver)
}

pub fn limits() -> &'static Limits {
    static LIMITS: OnceLock<Limits> = OnceLock::new();
    LIMITS.get_or_init(Limits::default)
}

pub fn new_request() -> NewRequest {
    NewRequest {
        description: "Transfer GBP 12,450 to Globex Corp".into(),
        details: BTreeMap::from([
            ("amount".to_string(), "12450".to_string()),
            ("currency".to_string(), "GBP".to_string()),
        ]),
        timeout_seconds: Some(3600),
        valid_for_seconds: Some(600),
        requested_fields: vec!["po_number".into()],
        ..NewRequest::default()
    }
}

/// A pending request that asks for a `po_number` field.
pub fn pending(id: &str) -> ApprovalRequest {
    ApprovalRequest::create(id.into(), new_request(), &agent(), t0(), limits())
        .unwrap()
        .request
}

pub fn decide(request: &ApprovalRequest, verdict: Verdict) -> countersign_core::Transition {
    request
        .decide(
            verdict,
            DecisionInput {
                comment: Some("ok".into()),
                fields: BTreeMap::from([("po_number".to_string(), "PO-7".to_string())]),
            },
            &approver(),
            Channel::Api,
            t0(),
            "bm9uY2U".into(),
            &signer(),
            limits(),
        )
        .unwrap()
}

/// A valid bundle for `req_1` out of a log of five entries where another request's
/// events and a token event are interleaved (entries 0, 2 and 4 are the subject's).
pub fn sample_bundle(mode: Mode) -> Vec<u8> {
    let first = pending("req_1");
    let other = ApprovalRequest::create("req_2".into(), new_request(), &agent(), t0(), limits())
        .unwrap();
    let decided = decide(&first, Verdict::Approved);
    let used = decided
        .request
        .record_action("pay".into(), BTreeMap::new(), &agent(), t0(), limits())
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
        origin: ORIGIN.into(),
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
    bundle::build(&BundleInput {
        subject: "req_1".into(),
        mode,
        log_origin: ORIGIN.into(),
        checkpoint_note: checkpoint.sign(&signer()),
        tree_size: size,
        jwks: signer_jwks(),
        entries,
        decisions: vec![decided.request.proof.clone().unwrap()],
    }, &signer())
    .unwrap()
}

/// The files of a ZIP (by name), for the harnesses that edit bundles; `None` when
/// the archive does not read.
pub fn read_zip(bytes: &[u8]) -> Option<BTreeMap<String, Vec<u8>>> {
    let mut archive = zip::ZipArchive::new(Cursor::new(bytes)).ok()?;
    let mut files = BTreeMap::new();
    for i in 0..archive.len() {
        let mut file = archive.by_index(i).ok()?;
        let name = file.name().ok()?.to_string();
        let mut content = Vec::new();
        file.read_to_end(&mut content).ok()?;
        files.insert(name, content);
    }
    Some(files)
}

/// Writes `files` as a ZIP, in the order given, stored uncompressed; `None` when the
/// zip crate refuses a name (that is the writer's limit, not countersign's).
pub fn write_zip<'a>(files: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Option<Vec<u8>> {
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .last_modified_time(zip::DateTime::default());
    let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
    for (name, bytes) in files {
        zip.start_file(name, options).ok()?;
        zip.write_all(bytes).ok()?;
    }
    Some(zip.finish().ok()?.into_inner())
}
