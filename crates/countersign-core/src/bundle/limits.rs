//! How much of an uploaded or offline archive is read: the bounds that make a zip bomb
//! a refusal instead of a gigabyte of memory, and the one reader that keeps to them.

use std::collections::BTreeMap;
use std::io::{Cursor, Read};

/// How much an archive may hold once read: a ZIP states its sizes itself, and a small
/// one can expand to gigabytes (a zip bomb), so reading stops at these bounds whatever
/// the archive claims. See docs/api.md ("Evidence") for how they were chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadLimits {
    /// Files in the archive.
    pub max_files: usize,
    /// The content of any one file, in bytes.
    pub max_file_bytes: u64,
    /// The content of all files together, in bytes.
    pub max_total_bytes: u64,
}

/// The largest file a real bundle has: the payload opening of a request made at the
/// request limits (`Limits::default()`: 100 details of 16 KiB with 256-byte keys and a
/// 4 KiB description, about 1.7 MiB), with room for JSON escaping.
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;
/// How many times its own size an uploaded archive may expand to. Bundles are written
/// uncompressed (`build`), so a real one expands to at most its own size; 4 also admits
/// a bundle re-zipped with deflate (its JSON of hashes and base64 compresses about 3
/// times) and nothing like a bomb (a 254 KB bomb expanded a thousandfold).
pub const UPLOAD_EXPANSION: u64 = 4;
/// A file costs at least 76 bytes of headers in a ZIP (30 local, 46 central), so an
/// upload of `n` bytes holds at most `n / 76` files; this caps it for any upload.
pub const MAX_UPLOAD_FILES: usize = 50_000;

impl ReadLimits {
    /// For a bundle on an auditor's own machine (`countersign log verify-bundle`): as
    /// large as a big room's history can make it, yet never unbounded.
    pub const OFFLINE: ReadLimits = ReadLimits {
        max_files: 1_000_000,
        max_file_bytes: 16 * MAX_FILE_BYTES,
        max_total_bytes: 256 * 1024 * 1024,
    };

    /// For a bundle of `archive_len` bytes uploaded to a server (REST
    /// `/evidence/verify`, MCP `verify_evidence`): at most [`UPLOAD_EXPANSION`] times
    /// its size in all, [`MAX_FILE_BYTES`] a file, [`MAX_UPLOAD_FILES`] files.
    pub fn upload(archive_len: usize) -> ReadLimits {
        let total = (archive_len as u64).saturating_mul(UPLOAD_EXPANSION);
        ReadLimits {
            max_files: MAX_UPLOAD_FILES,
            max_file_bytes: MAX_FILE_BYTES.min(total),
            max_total_bytes: total,
        }
    }
}

/// The archive's files by path, read within `limits`; the error says which bound or
/// which entry failed.
pub(super) fn read_archive(
    zip_bytes: &[u8],
    limits: &ReadLimits,
) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let mut archive = zip::ZipArchive::new(Cursor::new(zip_bytes))
        .map_err(|e| format!("not a readable ZIP archive: {e}"))?;
    if archive.len() > limits.max_files {
        return Err(format!(
            "the archive has {} files; a bundle checked here may have at most {}",
            archive.len(),
            limits.max_files
        ));
    }
    let mut files = BTreeMap::new();
    let mut total = 0u64;
    for i in 0..archive.len() {
        let mut file = archive
            .by_index(i)
            .map_err(|e| format!("archive entry {i} is unreadable: {e}"))?;
        if file.is_dir() {
            return Err(format!(
                "the archive has a directory entry ({}); bundles have none",
                file.name().map(|n| n.to_string()).unwrap_or_default()
            ));
        }
        let name = file
            .name()
            .map_err(|e| format!("archive entry {i} has an unreadable name: {e}"))?
            .to_string();
        // What the archive claims is checked first (cheap), then what reading yields,
        // since the claim may lie.
        let too_large = |size: u64, total: u64| {
            if size > limits.max_file_bytes {
                Some(format!(
                    "{name} expands to more than {} bytes; a file of a bundle checked here may have at most that",
                    limits.max_file_bytes
                ))
            } else if total > limits.max_total_bytes {
                Some(format!(
                    "the archive expands to more than {} bytes; a bundle checked here may hold at most that (bundles are written uncompressed)",
                    limits.max_total_bytes
                ))
            } else {
                None
            }
        };
        if let Some(refusal) = too_large(file.size(), total.saturating_add(file.size())) {
            return Err(refusal);
        }
        let room = limits
            .max_file_bytes
            .min(limits.max_total_bytes.saturating_sub(total));
        let mut bytes = Vec::new();
        (&mut file)
            .take(room.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|e| format!("{name} is unreadable: {e}"))?;
        let size = bytes.len() as u64;
        total = total.saturating_add(size);
        if let Some(refusal) = too_large(size, total) {
            return Err(refusal);
        }
        if files.insert(name.clone(), bytes).is_some() {
            return Err(format!("{name} appears twice in the archive"));
        }
    }
    Ok(files)
}
