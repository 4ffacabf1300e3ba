//! `countersign backup FILE` and `countersign restore FILE`: an online, consistent copy of
//! an installation on the embedded SQLite database (its database and its signing keys),
//! taken while `serve` runs, and its restore into an empty data directory, checked
//! against its own log before it is declared good (docs/deployment.md, "Backup and
//! restore").
//!
//! The file is a ZIP archive: `manifest.json` (what it holds, with a SHA-256 of each
//! file), `countersign.db` (SQLite's backup API: one snapshot, taken without stopping the
//! writers) and `keys/...` (the signing keys: the archive is secret, written 0600). The
//! config file and the policy files are not in it: they are the operator's text, kept
//! where the operator keeps them (in version control, typically).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use countersign_server::atomic_file;

use crate::config::{Config, Database};

/// What `manifest.json` says a backup is.
const FORMAT: &str = "countersign-backup";
const FORMAT_VERSION: u32 = 1;
const MANIFEST: &str = "manifest.json";
const DATABASE: &str = "countersign.db";
const KEYS: &str = "keys/";

#[derive(Debug, Args)]
pub struct BackupArgs {
    /// The archive to write (a new file; it holds the signing keys: keep it secret).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The archive `countersign backup` wrote.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
}

#[derive(Debug, Serialize, Deserialize)]
struct Manifest {
    format: String,
    version: u32,
    created_at: String,
    countersign_version: String,
    database: DatabaseEntry,
    keys: Vec<FileEntry>,
}

#[derive(Debug, Serialize, Deserialize)]
struct DatabaseEntry {
    sha256: String,
    bytes: u64,
    schema_version: i64,
    events: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct FileEntry {
    /// Relative to the keys directory, `/`-separated.
    name: String,
    sha256: String,
}

/// `countersign backup FILE`.
pub async fn backup(config: &Config, args: &BackupArgs) -> anyhow::Result<ExitCode> {
    let db = sqlite_path(config, "backup")?;
    if !db.exists() {
        bail!("no database at {}: nothing to back up", db.display());
    }
    let target = args.file.clone();
    if target.exists() {
        bail!(
            "{} exists already: give a new file (a backup never overwrites one)",
            target.display()
        );
    }
    let keys_dir = config.keys_dir();
    let summary = tokio::task::spawn_blocking(move || write_backup(&db, &keys_dir, &target))
        .await
        .context("the backup stopped")??;
    println!("{summary}");
    Ok(ExitCode::SUCCESS)
}

fn write_backup(db: &Path, keys_dir: &Path, target: &Path) -> anyhow::Result<String> {
    let dir = atomic_file::parent(target);
    let scratch = tempfile::Builder::new()
        .prefix(".countersign-backup-")
        .tempdir_in(&dir)
        .with_context(|| format!("could not write in {}", dir.display()))?;
    let snapshot = scratch.path().join(DATABASE);
    let copied = countersign_sqlite::backup::backup_to(db, &snapshot)
        .with_context(|| format!("could not copy {}", db.display()))?;
    let keys = key_files(keys_dir)?;
    if !keys.iter().any(|(name, _)| name == "signing-key.json") {
        bail!(
            "no signing key in {}: a backup without it could not sign again",
            keys_dir.display()
        );
    }
    let manifest = Manifest {
        format: FORMAT.into(),
        version: FORMAT_VERSION,
        created_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        countersign_version: env!("CARGO_PKG_VERSION").into(),
        database: DatabaseEntry {
            sha256: sha256_file(&snapshot)?,
            bytes: fs::metadata(&snapshot)?.len(),
            schema_version: copied.schema_version,
            events: copied.events,
        },
        keys: keys
            .iter()
            .map(|(name, path)| {
                Ok(FileEntry {
                    name: name.clone(),
                    sha256: sha256_file(path)?,
                })
            })
            .collect::<anyhow::Result<_>>()?,
    };

    let partial = scratch.path().join("backup.zip");
    let file = secret_file(&partial)?;
    let mut zip = zip::ZipWriter::new(file);
    let stored = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .unix_permissions(0o600);
    let packed = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .unix_permissions(0o600)
        .large_file(true);
    zip.start_file(MANIFEST, stored)?;
    zip.write_all(&serde_json::to_vec_pretty(&manifest)?)?;
    zip.start_file(DATABASE, packed)?;
    io::copy(&mut File::open(&snapshot)?, &mut zip)?;
    for (name, path) in &keys {
        zip.start_file(format!("{KEYS}{name}"), stored)?;
        io::copy(&mut File::open(path)?, &mut zip)?;
    }
    let file = zip.finish().context("could not finish the archive")?;
    file.sync_all()?;
    drop(file);
    // Never over a file that appeared meanwhile: hard-link, then drop the scratch copy.
    fs::hard_link(&partial, target)
        .or_else(|_| {
            if target.exists() {
                Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "the file appeared during the backup",
                ))
            } else {
                fs::rename(&partial, target)
            }
        })
        .with_context(|| format!("could not write {}", target.display()))?;
    // Best effort where a directory cannot be opened.
    let _ = atomic_file::sync_dir(&dir);
    Ok(format!(
        "backed up {} events (schema {}, {} bytes of database) and {} key file(s) to {}; it holds the signing keys: keep it secret",
        manifest.database.events,
        manifest.database.schema_version,
        manifest.database.bytes,
        manifest.keys.len(),
        target.display()
    ))
}

/// `countersign restore FILE`: into a data directory with no database and no keys.
pub async fn restore(config: &Config, args: &RestoreArgs) -> anyhow::Result<ExitCode> {
    let db = sqlite_path(config, "restore")?;
    for path in [db.clone(), wal_of(&db)] {
        if path.exists() {
            bail!(
                "{} exists: restore only into an empty data directory (give another --data-dir)",
                path.display()
            );
        }
    }
    let keys_dir = config.keys_dir();
    if fs::read_dir(&keys_dir).is_ok_and(|mut entries| entries.next().is_some()) {
        bail!(
            "{} is not empty: restore only into an empty data directory (give another --data-dir)",
            keys_dir.display()
        );
    }
    let file = args.file.clone();
    let summary = {
        let (db, keys_dir) = (db.clone(), keys_dir.clone());
        tokio::task::spawn_blocking(move || read_backup(&file, &db, &keys_dir))
            .await
            .context("the restore stopped")??
    };
    println!("{summary}");
    // The copy is held to its own log before it is called good: every checkpoint, every
    // payload, every row (what `countersign log verify` does).
    println!("checking the restored log:");
    let code = crate::cmd::log::verify_log(config).await?;
    if code != ExitCode::SUCCESS {
        bail!(
            "the restored data does not pass log verify (above); it is left in place for inspection"
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn read_backup(file: &Path, db: &Path, keys_dir: &Path) -> anyhow::Result<String> {
    let mut zip = zip::ZipArchive::new(
        File::open(file).with_context(|| format!("could not open {}", file.display()))?,
    )
    .with_context(|| {
        format!(
            "{} is not a countersign backup (not a ZIP archive)",
            file.display()
        )
    })?;
    let manifest: Manifest = {
        let mut text = String::new();
        zip.by_name(MANIFEST)
            .with_context(|| {
                format!(
                    "{} has no {MANIFEST}: not a countersign backup",
                    file.display()
                )
            })?
            .take(1 << 20)
            .read_to_string(&mut text)?;
        serde_json::from_str(&text).with_context(|| format!("{MANIFEST} cannot be read"))?
    };
    if manifest.format != FORMAT || manifest.version != FORMAT_VERSION {
        bail!(
            "{} is {} version {}; this countersign reads {FORMAT} version {FORMAT_VERSION}",
            file.display(),
            manifest.format,
            manifest.version
        );
    }
    if manifest.database.schema_version > countersign_sqlite::SCHEMA_VERSION {
        bail!(
            "the backup's database has schema {}, newer than this countersign's {}: restore it with countersign {} or later",
            manifest.database.schema_version,
            countersign_sqlite::SCHEMA_VERSION,
            manifest.countersign_version
        );
    }
    let mut names = Vec::new();
    for entry in &manifest.keys {
        names.push(safe_relative(&entry.name)?);
    }

    // The database: written beside its place, checked, then renamed into it.
    let db_dir = atomic_file::parent(db);
    fs::create_dir_all(&db_dir)
        .with_context(|| format!("could not create {}", db_dir.display()))?;
    let partial = db.with_extension("db.restoring");
    extract(&mut zip, DATABASE, &partial, &manifest.database.sha256)?;
    let found = countersign_sqlite::backup::describe_file(&partial)?;
    if found.events != manifest.database.events {
        bail!(
            "the backup's database holds {} events where its manifest says {}",
            found.events,
            manifest.database.events
        );
    }

    fs::create_dir_all(keys_dir)
        .with_context(|| format!("could not create {}", keys_dir.display()))?;
    set_mode(keys_dir, 0o700);
    for (entry, name) in manifest.keys.iter().zip(&names) {
        let path = keys_dir.join(name);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
            set_mode(parent, 0o700);
        }
        extract(
            &mut zip,
            &format!("{KEYS}{}", entry.name),
            &path,
            &entry.sha256,
        )?;
    }
    let _ = atomic_file::sync_dir(keys_dir);
    fs::rename(&partial, db).with_context(|| format!("could not write {}", db.display()))?;
    let _ = atomic_file::sync_dir(&db_dir);
    Ok(format!(
        "restored {} events (schema {}, backed up {} by countersign {}) and {} key file(s) into {}",
        manifest.database.events,
        manifest.database.schema_version,
        manifest.created_at,
        manifest.countersign_version,
        manifest.keys.len(),
        db_dir.display()
    ))
}

/// Writes the archive's entry `name` to a new file `to` (0600), checking its SHA-256.
fn extract<R: Read + Seek>(
    zip: &mut zip::ZipArchive<R>,
    name: &str,
    to: &Path,
    sha256: &str,
) -> anyhow::Result<()> {
    let mut entry = zip
        .by_name(name)
        .with_context(|| format!("the backup has no {name}, which its manifest lists"))?;
    let mut out = secret_file(to)?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = entry
            .read(&mut buf)
            .with_context(|| format!("the backup's {name} cannot be read"))?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        out.write_all(&buf[..n])?;
    }
    out.sync_all()?;
    if hex::encode(hash.finalize()) != sha256 {
        drop(out);
        let _ = fs::remove_file(to);
        bail!("the backup's {name} does not match its manifest's SHA-256: the archive is damaged");
    }
    Ok(())
}

/// The SQLite database file, or why this command does not apply.
fn sqlite_path(config: &Config, what: &str) -> anyhow::Result<PathBuf> {
    match &config.database {
        Database::Sqlite(path) => Ok(path.clone()),
        Database::Postgres(_) => bail!(
            "countersign {what} is for the embedded SQLite database; on PostgreSQL, use pg_dump and pg_restore (or your provider's snapshots) and copy the keys directory: see docs/deployment.md, \"Backup and restore\""
        ),
    }
}

/// The key files under `dir`, by their `/`-separated names.
fn key_files(dir: &Path) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let mut found = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), String::new())];
    while let Some((path, prefix)) = stack.pop() {
        let entries =
            fs::read_dir(&path).with_context(|| format!("could not read {}", path.display()))?;
        for entry in entries {
            let entry = entry?;
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                bail!(
                    "{}: a key file's name must be UTF-8",
                    entry.path().display()
                );
            };
            let kind = entry.file_type()?;
            if kind.is_dir() {
                stack.push((entry.path(), format!("{prefix}{name}/")));
            } else if kind.is_file() {
                found.push((format!("{prefix}{name}"), entry.path()));
            }
        }
    }
    found.sort();
    Ok(found)
}

/// `name` as a path under a directory: relative, no `..`, nothing but plain parts.
fn safe_relative(name: &str) -> anyhow::Result<PathBuf> {
    let path = Path::new(name);
    let plain = !name.is_empty() && path.components().all(|c| matches!(c, Component::Normal(_)));
    if !plain {
        bail!("the backup names a key file {name:?}, which is not a plain relative path");
    }
    Ok(path.to_path_buf())
}

fn sha256_file(path: &Path) -> anyhow::Result<String> {
    let mut hash = Sha256::new();
    io::copy(&mut File::open(path)?, &mut hash)?;
    Ok(hex::encode(hash.finalize()))
}

/// A new file only its owner may read.
fn secret_file(path: &Path) -> anyhow::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options
        .open(path)
        .with_context(|| format!("could not create {}", path.display()))
}

fn set_mode(path: &Path, mode: u32) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = fs::set_permissions(path, fs::Permissions::from_mode(mode));
    }
    #[cfg(not(unix))]
    let _ = (path, mode);
}

fn wal_of(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_os_string();
    name.push("-wal");
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_names_must_stay_under_the_keys_directory() {
        for bad in ["", "../x", "/etc/passwd", "a/../../b", "./a"] {
            assert!(safe_relative(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(
            safe_relative("retired/k1.json").unwrap(),
            PathBuf::from("retired/k1.json")
        );
    }
}
