//! Structure-aware bundle tampering: the input is a list of edits (`arbitrary`) applied to
//! the files inside a valid bundle (bytes flipped, spliced or truncated, files removed,
//! renamed, copied or added, JSON members replaced, the manifest rewritten), optionally
//! with the manifest's hashes or file list fixed up to match, as a forger would.
//!
//! The oracle is what a bundle promises (docs/log-format.md, "Evidence bundles"): a
//! bundle that still verifies says nothing the original did not. Precisely, when the
//! tampered bundle is valid: its subject, origin and tree size are the original's; its
//! events are a non-empty prefix of the original's ("events after its last one may
//! exist"); its mode is the original's, or redacted (anyone may drop the openings); its
//! checkpoint says what the original's says; and every entry, proof, opening and
//! decision file it has is byte-for-byte the original's. Only `manifest.json`,
//! `jwks.json` (unpinned) and the signature lines of `checkpoint.txt` may differ.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use arbitrary::{Arbitrary, Unstructured};
use countersign_core::bundle::{self, BundleReport, Manifest, ManifestFile, Mode};
use countersign_core::checkpoint::Checkpoint;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::fixtures::{read_zip, sample_bundle, signer_jwks, write_zip};

/// At most this many edits per input.
const MAX_EDITS: usize = 6;

#[derive(Debug, Arbitrary)]
struct Input {
    full: bool,
    pinned: bool,
    fix: Fix,
    edits: Vec<Edit>,
}

#[derive(Debug, Arbitrary)]
enum Fix {
    /// The manifest is left as the edits left it.
    None,
    /// Every listed file's hash and size are recomputed.
    Hashes,
    /// The file list is rebuilt from the archive.
    Listing,
}

#[derive(Debug, Arbitrary)]
enum Edit {
    Flip { file: u8, pos: u16, bit: u8 },
    Splice { file: u8, pos: u16, delete: u8, insert: Vec<u8> },
    Truncate { file: u8, len: u16 },
    CopyContent { file: u8, from: u8 },
    Remove { file: u8 },
    Rename { file: u8, to: Name },
    Duplicate { file: u8, to: Name },
    Add { to: Name, bytes: Vec<u8> },
    Json { file: u8, node: u8, value: JsonValue },
    JsonFrom { file: u8, node: u8, from: u8, from_node: u8 },
    Manifest(ManifestEdit),
    Checkpoint(CheckpointEdit),
}

#[derive(Debug, Arbitrary)]
enum Name {
    Entry(u8),
    Proof(u8),
    Payload(u8),
    Decision(u8),
    Fixed(u8),
    Other(String),
}

impl Name {
    fn path(&self) -> String {
        match self {
            Name::Entry(i) => format!("entries/{i}.json"),
            Name::Proof(i) => format!("proofs/{i}.json"),
            Name::Payload(i) => format!("payloads/{i}.json"),
            Name::Decision(i) => format!("decisions/{i}.json"),
            Name::Fixed(i) => ["manifest.json", "checkpoint.txt", "jwks.json", "entries/", "../x"]
                [usize::from(*i) % 5]
                .to_string(),
            Name::Other(s) => s.clone(),
        }
    }
}

#[derive(Debug, Arbitrary)]
enum JsonValue {
    Null,
    Bool(bool),
    Int(i64),
    Unsigned(u64),
    Float(f64),
    Text(String),
    EmptyArray,
    EmptyObject,
}

impl JsonValue {
    fn value(&self) -> Value {
        match self {
            JsonValue::Null => Value::Null,
            JsonValue::Bool(b) => Value::Bool(*b),
            JsonValue::Int(i) => Value::from(*i),
            JsonValue::Unsigned(u) => Value::from(*u),
            JsonValue::Float(f) => serde_json::Number::from_f64(*f)
                .map(Value::Number)
                .unwrap_or(Value::Null),
            JsonValue::Text(s) => Value::String(s.clone()),
            JsonValue::EmptyArray => Value::Array(Vec::new()),
            JsonValue::EmptyObject => Value::Object(serde_json::Map::new()),
        }
    }
}

#[derive(Debug, Arbitrary)]
enum ManifestEdit {
    Subject(String),
    SubjectOf(u8),
    Mode,
    TreeSize(u64),
    Origin(String),
    RemoveEntry(u8),
    AddEntry(u64),
    SwapEntries(u8, u8),
    DuplicateEntry(u8),
    RemoveListed(u8),
    ListTwice(u8),
}

#[derive(Debug, Arbitrary)]
enum CheckpointEdit {
    /// A cosignature line by a key the verifier does not know (C2SP allows these).
    Cosign { name: String, blob: Vec<u8> },
    /// The signature lines first repeated.
    RepeatSignature,
    /// Text appended anywhere.
    Insert { pos: u16, text: String },
}

struct Original {
    files: BTreeMap<String, Vec<u8>>,
    report: BundleReport,
    checkpoint: Checkpoint,
}

fn original(full: bool) -> &'static Original {
    static FULL: OnceLock<Original> = OnceLock::new();
    static REDACTED: OnceLock<Original> = OnceLock::new();
    let (cell, mode) = if full {
        (&FULL, Mode::Full)
    } else {
        (&REDACTED, Mode::Redacted)
    };
    cell.get_or_init(|| {
        let bytes = sample_bundle(mode);
        let report = bundle::verify(&bytes, None);
        assert!(report.valid, "the sample bundle does not verify: {report:?}");
        let files = read_zip(&bytes).unwrap();
        let note = String::from_utf8(files["checkpoint.txt"].clone()).unwrap();
        let checkpoint = Checkpoint::parse(&note).unwrap().0;
        Original {
            files,
            report,
            checkpoint,
        }
    })
}

pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(mut input) = Input::arbitrary(&mut u) else {
        return;
    };
    input.edits.truncate(MAX_EDITS);
    let base = original(input.full);
    let mut files = base.files.clone();
    for edit in &input.edits {
        apply(&mut files, edit);
    }
    fix_manifest(&mut files, &input.fix);
    let order = std::iter::once("manifest.json")
        .filter(|m| files.contains_key(*m))
        .chain(files.keys().map(String::as_str).filter(|n| *n != "manifest.json"));
    let Some(zip) = write_zip(order.map(|n| (n, files[n].as_slice()))) else {
        return;
    };
    let pinned = signer_jwks();
    let report = bundle::verify(&zip, input.pinned.then_some(&pinned));
    crate::bundle_verify::check(&report);
    // Untouched means byte for byte: a "fixed" manifest is rewritten, and then no longer
    // matches manifest.sig even when no edit changed anything it lists.
    if files == base.files {
        assert!(report.valid, "the untouched bundle no longer verifies: {report:?}");
    }
    if report.valid {
        check_says_nothing_new(base, &files, &report, input.pinned);
    }
}

fn check_says_nothing_new(
    base: &Original,
    files: &BTreeMap<String, Vec<u8>>,
    report: &BundleReport,
    pinned: bool,
) {
    let o = &base.report;
    assert_eq!(report.subject, o.subject, "subject changed");
    assert_eq!(report.log_origin, o.log_origin, "origin changed");
    assert_eq!(report.tree_size, o.tree_size, "tree size changed");
    assert!(
        report.mode == o.mode || report.mode == Some(Mode::Redacted),
        "mode changed from {:?} to {:?}",
        o.mode,
        report.mode
    );
    assert!(
        !report.events.is_empty() && o.events.starts_with(&report.events),
        "a tampered bundle verified with events {:?}; the original has {:?}",
        report.events,
        o.events
    );
    assert!(report.decisions <= o.decisions);
    for (name, bytes) in files {
        match name.as_str() {
            "manifest.json" => {}
            "jwks.json" if !pinned => {}
            "checkpoint.txt" => {
                let note = std::str::from_utf8(bytes).unwrap();
                let parsed = Checkpoint::parse(note).unwrap().0;
                assert_eq!(parsed, base.checkpoint, "the checkpoint says something else");
            }
            _ => assert_eq!(
                base.files.get(name),
                Some(bytes),
                "{name} was altered or added and the bundle still verifies"
            ),
        }
    }
}

fn pick(files: &BTreeMap<String, Vec<u8>>, i: u8) -> Option<String> {
    if files.is_empty() {
        return None;
    }
    files.keys().nth(usize::from(i) % files.len()).cloned()
}

fn apply(files: &mut BTreeMap<String, Vec<u8>>, edit: &Edit) {
    match edit {
        Edit::Flip { file, pos, bit } => {
            if let Some(name) = pick(files, *file) {
                let content = files.get_mut(&name).unwrap();
                if !content.is_empty() {
                    let at = usize::from(*pos) % content.len();
                    content[at] ^= 1 << (bit % 8);
                }
            }
        }
        Edit::Splice {
            file,
            pos,
            delete,
            insert,
        } => {
            if let Some(name) = pick(files, *file) {
                let content = files.get_mut(&name).unwrap();
                let at = usize::from(*pos) % (content.len() + 1);
                let end = (at + usize::from(*delete)).min(content.len());
                content.splice(at..end, insert.iter().copied());
            }
        }
        Edit::Truncate { file, len } => {
            if let Some(name) = pick(files, *file) {
                files.get_mut(&name).unwrap().truncate(usize::from(*len));
            }
        }
        Edit::CopyContent { file, from } => {
            if let (Some(to), Some(from)) = (pick(files, *file), pick(files, *from)) {
                let content = files[&from].clone();
                files.insert(to, content);
            }
        }
        Edit::Remove { file } => {
            if let Some(name) = pick(files, *file) {
                files.remove(&name);
            }
        }
        Edit::Rename { file, to } => {
            if let Some(name) = pick(files, *file) {
                let content = files.remove(&name).unwrap();
                files.insert(to.path(), content);
            }
        }
        Edit::Duplicate { file, to } => {
            if let Some(name) = pick(files, *file) {
                let content = files[&name].clone();
                files.insert(to.path(), content);
            }
        }
        Edit::Add { to, bytes } => {
            files.insert(to.path(), bytes.clone());
        }
        Edit::Json { file, node, value } => {
            if let Some(name) = pick(files, *file) {
                edit_json(files, &name, |v| {
                    if let Some(slot) = nth_node(v, usize::from(*node)) {
                        *slot = value.value();
                    }
                });
            }
        }
        Edit::JsonFrom {
            file,
            node,
            from,
            from_node,
        } => {
            let (Some(name), Some(source)) = (pick(files, *file), pick(files, *from)) else {
                return;
            };
            let Ok(mut source) = serde_json::from_slice::<Value>(&files[&source]) else {
                return;
            };
            let Some(replacement) = nth_node(&mut source, usize::from(*from_node)).cloned() else {
                return;
            };
            edit_json(files, &name, |v| {
                if let Some(slot) = nth_node(v, usize::from(*node)) {
                    *slot = replacement;
                }
            });
        }
        Edit::Manifest(edit) => edit_manifest(files, edit),
        Edit::Checkpoint(edit) => {
            let Some(note) = files
                .get("checkpoint.txt")
                .and_then(|b| String::from_utf8(b.clone()).ok())
            else {
                return;
            };
            let note = match edit {
                CheckpointEdit::Cosign { name, blob } => {
                    use base64::Engine;
                    let blob = base64::engine::general_purpose::STANDARD.encode(blob);
                    format!("{note}\u{2014} {name} {blob}\n")
                }
                CheckpointEdit::RepeatSignature => {
                    let Some((body, sigs)) = note.split_once("\n\n") else {
                        return;
                    };
                    format!("{body}\n\n{sigs}{sigs}")
                }
                CheckpointEdit::Insert { pos, text } => {
                    let mut at = usize::from(*pos) % (note.len() + 1);
                    while !note.is_char_boundary(at) {
                        at -= 1;
                    }
                    format!("{}{text}{}", &note[..at], &note[at..])
                }
            };
            files.insert("checkpoint.txt".into(), note.into_bytes());
        }
    }
}

/// Rewrites a JSON file canonically after `edit`; leaves non-JSON files alone.
fn edit_json(files: &mut BTreeMap<String, Vec<u8>>, name: &str, edit: impl FnOnce(&mut Value)) {
    let Ok(mut value) = serde_json::from_slice::<Value>(&files[name]) else {
        return;
    };
    edit(&mut value);
    if let Ok(bytes) = serde_json_canonicalizer::to_vec(&value) {
        files.insert(name.to_string(), bytes);
    }
}

/// The `n`th node of `value` in pre-order (0 is `value` itself), wrapping around.
fn nth_node(value: &mut Value, n: usize) -> Option<&mut Value> {
    fn count(v: &Value) -> usize {
        1 + match v {
            Value::Array(a) => a.iter().map(count).sum(),
            Value::Object(o) => o.values().map(count).sum(),
            _ => 0,
        }
    }
    fn walk<'a>(v: &'a mut Value, n: &mut usize) -> Option<&'a mut Value> {
        if *n == 0 {
            return Some(v);
        }
        *n -= 1;
        match v {
            Value::Array(a) => a.iter_mut().find_map(|c| walk_inner(c, n)),
            Value::Object(o) => o.values_mut().find_map(|c| walk_inner(c, n)),
            _ => None,
        }
    }
    // A helper so `find_map` can thread the counter through siblings.
    fn walk_inner<'a>(v: &'a mut Value, n: &mut usize) -> Option<&'a mut Value> {
        let size = count(v);
        if *n >= size {
            *n -= size;
            return None;
        }
        walk(v, n)
    }
    let total = count(value);
    let mut n = n % total;
    walk(value, &mut n)
}

fn edit_manifest(files: &mut BTreeMap<String, Vec<u8>>, edit: &ManifestEdit) {
    let Some(mut manifest) = files
        .get("manifest.json")
        .and_then(|b| serde_json::from_slice::<Manifest>(b).ok())
    else {
        return;
    };
    let n = manifest.entries.len();
    match edit {
        ManifestEdit::Subject(s) => manifest.subject = s.clone(),
        ManifestEdit::SubjectOf(i) => manifest.subject = format!("req_{i}"),
        ManifestEdit::Mode => {
            manifest.mode = match manifest.mode {
                Mode::Full => Mode::Redacted,
                Mode::Redacted => Mode::Full,
            }
        }
        ManifestEdit::TreeSize(s) => manifest.tree_size = *s,
        ManifestEdit::Origin(s) => manifest.log_origin = s.clone(),
        ManifestEdit::RemoveEntry(i) if n > 0 => {
            manifest.entries.remove(usize::from(*i) % n);
        }
        ManifestEdit::AddEntry(i) => manifest.entries.push(*i),
        ManifestEdit::SwapEntries(a, b) if n > 0 => {
            manifest.entries.swap(usize::from(*a) % n, usize::from(*b) % n)
        }
        ManifestEdit::DuplicateEntry(i) if n > 0 => {
            let e = manifest.entries[usize::from(*i) % n];
            manifest.entries.push(e);
        }
        ManifestEdit::RemoveListed(i) if !manifest.files.is_empty() => {
            let at = usize::from(*i) % manifest.files.len();
            manifest.files.remove(at);
        }
        ManifestEdit::ListTwice(i) if !manifest.files.is_empty() => {
            let at = usize::from(*i) % manifest.files.len();
            let f = manifest.files[at].clone();
            manifest.files.push(f);
        }
        _ => {}
    }
    write_manifest(files, &manifest);
}

fn write_manifest(files: &mut BTreeMap<String, Vec<u8>>, manifest: &Manifest) {
    if let Ok(bytes) = serde_json_canonicalizer::to_vec(manifest) {
        files.insert("manifest.json".into(), bytes);
    }
}

fn listing(name: &str, bytes: &[u8]) -> ManifestFile {
    ManifestFile {
        path: name.to_string(),
        sha256: hex::encode(Sha256::digest(bytes)),
        size: bytes.len() as u64,
    }
}

fn fix_manifest(files: &mut BTreeMap<String, Vec<u8>>, fix: &Fix) {
    let Some(mut manifest) = files
        .get("manifest.json")
        .and_then(|b| serde_json::from_slice::<Manifest>(b).ok())
    else {
        return;
    };
    match fix {
        Fix::None => return,
        Fix::Hashes => {
            for f in &mut manifest.files {
                if let Some(bytes) = files.get(&f.path) {
                    *f = listing(&f.path, bytes);
                }
            }
        }
        Fix::Listing => {
            manifest.files = files
                .iter()
                .filter(|(name, _)| *name != "manifest.json" && *name != "manifest.sig")
                .map(|(name, bytes)| listing(name, bytes))
                .collect();
        }
    }
    write_manifest(files, &manifest);
}
