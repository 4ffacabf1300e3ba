//! approval-gate-mcp's file contract, as a process that speaks no MCP sees it: it writes
//! `pending.json` (`{"proposals": [...]}`, any fields), reads and clears `approved.json`
//! (the same shape) on its next cycle, and appends its own records to `records.json` (a
//! JSON array). docs/bridge.md.
//!
//! Everything here is blocking file I/O on small files, run off the async workers. A
//! proposal is kept as the exact JSON text the process wrote, so what reaches
//! `approved.json` is byte for byte what it proposed (a `6.00` stays `6.00`, a big
//! integer stays exact). Every write replaces the file atomically (a temporary file in
//! the same directory, fsync, rename, fsync of the directory) and only if the file still
//! holds what was read: the process writes with no lock, and a rewrite from a stale read
//! would drop what it wrote meanwhile.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::value::RawValue;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// The three files and the lock, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    pub pending: PathBuf,
    pub approved: PathBuf,
    pub records: PathBuf,
    /// The sidecar file a cooperating process `flock`s around its own reads and writes
    /// (docs/bridge.md, "The lock"); countersign holds it while it rewrites a file.
    pub lock: PathBuf,
}

impl Paths {
    /// The seed's layout: the three files in one directory, the lock beside them.
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            pending: dir.join("pending.json"),
            approved: dir.join("approved.json"),
            records: dir.join("records.json"),
            lock: dir.join(LOCK_FILE_NAME),
        }
    }
}

/// The lock file's name beside `pending.json`, unless configured otherwise.
pub const LOCK_FILE_NAME: &str = "bridge.lock";

/// Why a file could not be used this time. Each is logged and retried at the next change:
/// nothing is written over a file that does not read.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error(
        "{path} is not valid JSON ({message}); it is left as it is and read again when it changes"
    )]
    Malformed { path: String, message: String },
    #[error("{path} is empty (a write in progress?); read again when it changes")]
    Empty { path: String },
    /// The file changed between the read and the write: the pass starts over.
    #[error("{path} changed while countersign was rewriting it; read again")]
    Changed { path: String },
}

fn io_error(path: &Path, source: io::Error) -> FileError {
    FileError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn malformed(path: &Path, message: impl Into<String>) -> FileError {
    FileError::Malformed {
        path: path.display().to_string(),
        message: message.into(),
    }
}

/// One proposal of `pending.json`: its text as written, its fields, and the key it is
/// known by.
#[derive(Debug, Clone)]
pub struct Proposal {
    /// Exactly as the process wrote it.
    pub raw: String,
    pub fields: Map<String, Value>,
    /// `id:<id>` when it has a string or number `id`, else `sha256:<hash>` of its
    /// canonical JSON: what makes a proposal the same one across reads.
    pub key: String,
}

impl Proposal {
    /// A proposal from its JSON text; `None` when it is not a JSON object.
    pub fn parse(raw: &str) -> Option<Self> {
        let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(raw) else {
            return None;
        };
        let key = proposal_key(&fields);
        Some(Self {
            raw: raw.to_string(),
            fields,
            key,
        })
    }

    /// The process's own id for it, as text.
    pub fn id(&self) -> Option<String> {
        id_text(self.fields.get("id"))
    }
}

/// An `id` field as text: a non-empty string as it is, a number as written.
pub fn id_text(id: Option<&Value>) -> Option<String> {
    match id {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    }
}

/// See [`Proposal::key`]. A long id is hashed too, so that a key always fits in an
/// idempotency key.
pub fn proposal_key(fields: &Map<String, Value>) -> String {
    match id_text(fields.get("id")) {
        Some(id) if id.len() <= 160 && !id.chars().any(char::is_control) => format!("id:{id}"),
        Some(id) => format!("id-sha256:{}", short_hash(id.as_bytes())),
        None => {
            let canonical = countersign_core::jcs::to_vec(fields).unwrap_or_default();
            format!("sha256:{}", short_hash(&canonical))
        }
    }
}

fn short_hash(bytes: &[u8]) -> String {
    hex::encode(&Sha256::digest(bytes)[..16])
}

/// A `{"proposals": [...]}` file as read: its bytes (the write compares against them),
/// its other top-level members (kept as they are), and its entries.
#[derive(Debug, Default)]
pub struct ProposalFile {
    /// `None`: the file did not exist.
    pub bytes: Option<Vec<u8>>,
    /// Top-level members other than `proposals`, as written.
    pub other: Members,
    /// Every entry of `proposals`, as written (objects or not).
    pub entries: Vec<Box<RawValue>>,
}

impl ProposalFile {
    /// The entries that are JSON objects, parsed; the others are left in the file and
    /// reported by the caller.
    pub fn proposals(&self) -> (Vec<Proposal>, usize) {
        let mut out = Vec::new();
        let mut not_objects = 0;
        for entry in &self.entries {
            match Proposal::parse(entry.get()) {
                Some(p) => out.push(p),
                None => not_objects += 1,
            }
        }
        (out, not_objects)
    }

    /// The file's text with `entries` as its proposals, the other members kept.
    pub fn render(&self, entries: &[Box<RawValue>]) -> Vec<u8> {
        let mut out = String::from("{\n  \"proposals\": [");
        for (i, entry) in entries.iter().enumerate() {
            out.push_str(if i == 0 { "\n    " } else { ",\n    " });
            out.push_str(entry.get());
        }
        out.push_str(if entries.is_empty() { "]" } else { "\n  ]" });
        for (key, value) in &self.other {
            out.push_str(",\n  ");
            out.push_str(&Value::String(key.clone()).to_string());
            out.push_str(": ");
            out.push_str(value.get());
        }
        out.push_str("\n}\n");
        out.into_bytes()
    }
}

/// How an empty file reads: `pending.json` empty is taken as a write in progress (the
/// process truncates, then writes), so its proposals are not taken for vanished;
/// `approved.json` empty holds nothing, as the seed's `read_json(...) or {"proposals": []}`
/// reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IfEmpty {
    Retry,
    NoProposals,
}

/// Reads a `{"proposals": [...]}` file. A missing file has no proposals.
pub fn read_proposals(path: &Path, if_empty: IfEmpty) -> Result<ProposalFile, FileError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(ProposalFile::default()),
        Err(err) => return Err(io_error(path, err)),
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return match if_empty {
            IfEmpty::Retry => Err(FileError::Empty {
                path: path.display().to_string(),
            }),
            IfEmpty::NoProposals => Ok(ProposalFile {
                bytes: Some(bytes),
                ..ProposalFile::default()
            }),
        };
    }
    let members: Members = parse_object(&bytes)
        .map_err(|e| malformed(path, e))?
        .ok_or_else(|| malformed(path, "expected an object {\"proposals\": [...]}"))?;
    let mut file = ProposalFile {
        bytes: None,
        other: Vec::new(),
        entries: Vec::new(),
    };
    let mut seen = false;
    for (key, value) in members {
        if key == "proposals" && !seen {
            seen = true;
            file.entries = serde_json::from_str(value.get())
                .map_err(|_| malformed(path, "\"proposals\" is not an array"))?;
        } else if key != "proposals" {
            file.other.push((key, value));
        }
    }
    file.bytes = Some(bytes);
    Ok(file)
}

/// A JSON object's members, each as written, in the order written.
type Members = Vec<(String, Box<RawValue>)>;

/// The members of a JSON object (`None`: valid JSON, not an object).
fn parse_object(bytes: &[u8]) -> Result<Option<Members>, String> {
    struct Visit;
    impl<'de> serde::de::Visitor<'de> for Visit {
        type Value = Option<Members>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON value")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some((k, v)) = map.next_entry::<String, Box<RawValue>>()? {
                out.push((k, v));
            }
            Ok(Some(out))
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
            Ok(None)
        }
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let members =
        serde::Deserializer::deserialize_any(&mut de, Visit).map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())?;
    Ok(members)
}

/// Reads `records.json`: the process's array of records (objects; anything else in it is
/// skipped). A missing or empty file has none.
pub fn read_records(path: &Path) -> Result<Vec<Map<String, Value>>, FileError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(io_error(path, err)),
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Vec::new());
    }
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Array(items)) => Ok(items
            .into_iter()
            .filter_map(|item| match item {
                Value::Object(map) => Some(map),
                _ => None,
            })
            .collect()),
        Ok(_) => Err(malformed(path, "expected an array of records")),
        Err(err) => Err(malformed(path, err.to_string())),
    }
}

/// Replaces `path` with `bytes` atomically ([`crate::atomic_file`]), provided it still
/// holds `expected` (`None`: it must not exist).
///
/// The comparison and the rename are two steps, so a process that writes without the
/// lock in between can still lose its write; the lock protocol closes that gap.
pub fn replace(path: &Path, bytes: &[u8], expected: Option<&[u8]>) -> Result<(), FileError> {
    let still = || match fs::read(path) {
        Ok(current) => Ok(expected == Some(current.as_slice())),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(expected.is_none()),
        Err(err) => Err(err),
    };
    match crate::atomic_file::replace_if(path, bytes, still) {
        Ok(true) => Ok(()),
        Ok(false) => Err(FileError::Changed {
            path: path.display().to_string(),
        }),
        Err(err) => Err(io_error(path, err)),
    }
}

/// What tells a file changed without reading it: its size, modification time and inode.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stamp(Option<(u64, i64, i64, u64)>);

pub fn stamp(path: &Path) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    Stamp(
        fs::metadata(path)
            .ok()
            .map(|m| (m.len(), m.mtime(), m.mtime_nsec(), m.ino())),
    )
}

/// The lock file, held (`flock`, exclusive) until dropped.
#[derive(Debug)]
pub struct Locked(#[allow(dead_code)] File);

/// Takes the lock on `path` (created if missing), waiting up to `patience` for a process
/// that holds it. `Ok(None)`: still held by someone else after that long.
pub fn lock(path: &Path, patience: Duration) -> Result<Option<Locked>, FileError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| io_error(path, e))?;
    let deadline = std::time::Instant::now() + patience;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(Some(Locked(file))),
            Err(fs::TryLockError::WouldBlock) => {
                if std::time::Instant::now() >= deadline {
                    return Ok(None);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(fs::TryLockError::Error(err)) => return Err(io_error(path, err)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposals_keep_their_text_and_are_known_by_id_or_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pending.json");
        fs::write(
            &path,
            r#"{"proposals": [{"id": "job-1042", "cost": 6.00, "big": 123456789012345678901234567890},
                {"label": "no id"}, 7, {"id": 12}], "note": "kept"}"#,
        )
        .unwrap();
        let file = read_proposals(&path, IfEmpty::Retry).unwrap();
        let (proposals, not_objects) = file.proposals();
        assert_eq!(not_objects, 1);
        assert_eq!(proposals[0].key, "id:job-1042");
        assert!(proposals[0].raw.contains("6.00") && proposals[0].raw.contains("901234567890"));
        assert!(
            proposals[1].key.starts_with("sha256:"),
            "{}",
            proposals[1].key
        );
        assert_eq!(proposals[2].key, "id:12");
        // The same content, however written, is the same proposal.
        let again = Proposal::parse(r#"{ "label" : "no id" }"#).unwrap();
        assert_eq!(again.key, proposals[1].key);

        let kept: Vec<_> = file.entries[1..].to_vec();
        let text = String::from_utf8(file.render(&kept)).unwrap();
        let reread: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(reread["note"], "kept");
        assert_eq!(reread["proposals"].as_array().unwrap().len(), 3);
        assert!(!text.contains("job-1042"));
        let empty = String::from_utf8(file.render(&[])).unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&empty).unwrap()["proposals"],
            serde_json::json!([])
        );
    }

    #[test]
    fn unreadable_files_say_why_and_missing_ones_are_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pending.json");
        assert!(
            read_proposals(&path, IfEmpty::Retry)
                .unwrap()
                .entries
                .is_empty()
        );
        for (text, expected) in [
            ("{\"proposals\": [", "not valid JSON"),
            ("[1, 2]", "expected an object"),
            ("{\"proposals\": {}}", "not an array"),
            ("{} trailing", "not valid JSON"),
        ] {
            fs::write(&path, text).unwrap();
            let err = read_proposals(&path, IfEmpty::Retry).unwrap_err();
            assert!(err.to_string().contains(expected), "{text}: {err}");
        }
        fs::write(&path, "  \n").unwrap();
        assert!(matches!(
            read_proposals(&path, IfEmpty::Retry),
            Err(FileError::Empty { .. })
        ));
        assert!(
            read_proposals(&path, IfEmpty::NoProposals)
                .unwrap()
                .entries
                .is_empty()
        );
        let records = dir.path().join("records.json");
        fs::write(&records, r#"[{"id": "a"}, 3]"#).unwrap();
        assert_eq!(read_records(&records).unwrap().len(), 1);
        fs::write(&records, r#"{"id": "a"}"#).unwrap();
        assert!(read_records(&records).is_err());
    }

    #[test]
    fn a_replace_happens_only_over_what_was_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("approved.json");
        replace(&path, b"one", None).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"one");
        assert!(matches!(
            replace(&path, b"two", None),
            Err(FileError::Changed { .. })
        ));
        assert!(matches!(
            replace(&path, b"two", Some(b"other")),
            Err(FileError::Changed { .. })
        ));
        replace(&path, b"two", Some(b"one")).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        let leftovers: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "no temporary file left behind");
    }

    #[test]
    fn the_lock_is_exclusive_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOCK_FILE_NAME);
        let held = lock(&path, Duration::ZERO).unwrap().unwrap();
        assert!(lock(&path, Duration::from_millis(30)).unwrap().is_none());
        drop(held);
        assert!(lock(&path, Duration::ZERO).unwrap().is_some());
    }
}
