//! Files replaced whole: a reader sees the old file or the new one, never a part, and the
//! new one survives a crash once the replacement returns. The new text goes to a
//! temporary file in the same directory (with the old file's permissions), is flushed to
//! disk, renamed over the file, and the directory is flushed so that the rename itself is
//! durable. The bridge's files and the process operations' parameter overrides are
//! written this way; `countersign backup` flushes its directory the same way.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Replaces `path` with `bytes` if `still()`, asked once the new text is on disk and
/// right before the rename, says so; `Ok(false)` (nothing replaced) if it does not.
pub fn replace_if(
    path: &Path,
    bytes: &[u8],
    still: impl FnOnce() -> io::Result<bool>,
) -> io::Result<bool> {
    let dir = parent(path);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut random = [0u8; 6];
    getrandom::fill(&mut random).map_err(|e| io::Error::other(e.to_string()))?;
    let tmp = dir.join(format!(".{name}.countersign-{}.tmp", hex::encode(random)));
    let replaced: io::Result<bool> = (|| {
        let mut file = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        if let Ok(meta) = fs::metadata(path) {
            file.set_permissions(meta.permissions())?;
        }
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        if !still()? {
            return Ok(false);
        }
        fs::rename(&tmp, path)?;
        Ok(true)
    })();
    if !matches!(replaced, Ok(true)) {
        let _ = fs::remove_file(&tmp);
    }
    if replaced? {
        sync_dir(&dir)?;
        return Ok(true);
    }
    Ok(false)
}

/// Replaces `path` with `bytes`, whatever it holds.
pub fn replace(path: &Path, bytes: &[u8]) -> io::Result<()> {
    replace_if(path, bytes, || Ok(true)).map(|_| ())
}

/// Flushes `dir`, so that a file created, renamed or removed in it stays so after a crash.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The directory `path` is in (`.` for a bare file name).
pub fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_replacement_keeps_the_permissions_and_leaves_no_temporary_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.json");
        replace(&path, b"1").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        replace(&path, b"2").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"2");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o640
        );
        assert!(!replace_if(&path, b"3", || Ok(false)).unwrap());
        assert_eq!(fs::read(&path).unwrap(), b"2");
        assert!(replace_if(&path, b"4", || Err(io::Error::other("no"))).is_err());
        assert_eq!(fs::read(&path).unwrap(), b"2");
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "a temporary file was left"
        );
    }
}
