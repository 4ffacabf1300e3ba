//! The signing keys in the data directory.
//!
//! `keys/signing-key.json` holds the active key as a private JWK (RFC 8037: `kty`, `crv`,
//! `x`, `d`, plus `kid` and `created_at`), mode 0600 in a 0700 directory. Retired keys go
//! to `keys/retired/<kid>.json` and stay in the published JWKS so old proofs still verify.
//! The first process to start creates the key atomically (write a temporary file, then
//! hard-link it into place, which fails if another process got there first), so several
//! processes starting on a fresh data directory agree on one key.
//!
//! Trust is anchored (see `countersign_core::anchor`): the keys this process trusts and
//! publishes are its key files and the keys those endorsed, in signed `key_endorsed`
//! entries of the log, directly or through a chain. A key that is only a `jwk:*` row in
//! the database (which every instance writes, and anyone with the database's
//! credentials could) is a candidate for `countersign keys trust`, never trusted by
//! itself.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use countersign_core::anchor::{self, Endorsement};
use countersign_core::{Jwk, Jwks, Signer, Timestamp};
use countersign_store::Store;

use crate::error::GateError;
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a valid countersign key file: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("{path} is readable by other users (mode {mode:o}); run `chmod 600 {path}`")]
    Permissions { path: PathBuf, mode: u32 },
    #[error("could not get randomness from the operating system: {0}")]
    Random(String),
}

#[derive(Debug, Serialize, Deserialize)]
struct KeyFile {
    kty: String,
    crv: String,
    kid: String,
    x: String,
    d: String,
    created_at: Timestamp,
}

struct Loaded {
    signer: Arc<Signer>,
    jwks: Jwks,
}

/// The active signer and every published public key.
pub struct KeyRing {
    dir: PathBuf,
    loaded: RwLock<Loaded>,
}

impl std::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyRing")
            .field("dir", &self.dir)
            .field("kid", &self.signer().kid())
            .finish()
    }
}

impl KeyRing {
    /// Loads the keys in `dir`, creating the directory and a first key if there is none.
    pub fn open_or_create(dir: &Path, now: Timestamp) -> Result<Self, KeyError> {
        create_private_dir(dir)?;
        let active = dir.join("signing-key.json");
        if !active.exists() {
            create_key_file(dir, &active, now)?;
        }
        let loaded = load(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            loaded: RwLock::new(loaded),
        })
    }

    /// Loads existing keys; fails if there are none (for read-only commands).
    pub fn open_existing(dir: &Path) -> Result<Self, KeyError> {
        let loaded = load(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            loaded: RwLock::new(loaded),
        })
    }

    /// A ring holding just `signer`, for tests and embedding.
    pub fn from_signer(signer: Signer) -> Self {
        let jwks = Jwks {
            keys: vec![signer.jwk()],
        };
        Self {
            dir: PathBuf::new(),
            loaded: RwLock::new(Loaded {
                signer: Arc::new(signer),
                jwks,
            }),
        }
    }

    pub fn signer(&self) -> Arc<Signer> {
        match self.loaded.read() {
            Ok(l) => l.signer.clone(),
            Err(poisoned) => poisoned.into_inner().signer.clone(),
        }
    }

    pub fn jwks(&self) -> Jwks {
        match self.loaded.read() {
            Ok(l) => l.jwks.clone(),
            Err(poisoned) => poisoned.into_inner().jwks.clone(),
        }
    }

    /// Starts signing with a new key; the old one moves to `retired/` and stays
    /// published. Returns the old and new key ids.
    pub fn rotate(&self, now: Timestamp) -> Result<(String, String), KeyError> {
        let active = self.dir.join("signing-key.json");
        let old = read_key_file(&active)?;
        let retired_dir = self.dir.join("retired");
        create_private_dir(&retired_dir)?;
        let retired = retired_dir.join(format!("{}.json", old.kid()));
        match fs::hard_link(&active, &retired) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err(&retired)(e)),
        }
        // Write the new key beside the active one, then swap it in atomically.
        let staged = self.dir.join("signing-key.next.json");
        let _ = fs::remove_file(&staged);
        create_key_file(&self.dir, &staged, now)?;
        fs::rename(&staged, &active).map_err(io_err(&active))?;
        if let Ok(d) = fs::File::open(&self.dir) {
            let _ = d.sync_all();
        }
        self.reload()?;
        Ok((old.kid().to_string(), self.signer().kid().to_string()))
    }

    /// The signers of every key file, oldest first (by `created_at`), the active key
    /// last: the order in which the keys were rotated in.
    pub fn file_signers(&self) -> Result<Vec<Signer>, KeyError> {
        if self.dir.as_os_str().is_empty() {
            return Ok(vec![(*self.signer()).clone()]);
        }
        let mut retired = Vec::new();
        let retired_dir = self.dir.join("retired");
        if retired_dir.is_dir() {
            for entry in fs::read_dir(&retired_dir).map_err(io_err(&retired_dir))? {
                let path = entry.map_err(io_err(&retired_dir))?.path();
                if path.extension().is_some_and(|x| x == "json") {
                    retired.push((created_at(&path)?, read_key_file(&path)?));
                }
            }
        }
        retired.sort_by(|a, b| (a.0, a.1.kid()).cmp(&(b.0, b.1.kid())));
        let active = read_key_file(&self.dir.join("signing-key.json"))?;
        let mut signers: Vec<Signer> = retired
            .into_iter()
            .map(|(_, s)| s)
            .filter(|s| s.kid() != active.kid())
            .collect();
        signers.push(active);
        Ok(signers)
    }

    /// Re-reads the key directory (another process may have rotated the key).
    pub fn reload(&self) -> Result<(), KeyError> {
        if self.dir.as_os_str().is_empty() {
            return Ok(());
        }
        let loaded = load(&self.dir)?;
        match self.loaded.write() {
            Ok(mut l) => *l = loaded,
            Err(poisoned) => *poisoned.into_inner() = loaded,
        }
        Ok(())
    }
}

/// The settings key under which an instance publishes a public key in the database.
const PUBLISHED: &str = "jwk:";

/// Publishes the active key in the database as a candidate: another instance's operator
/// can then endorse it by its key id (`countersign keys trust KID`).
pub async fn publish(store: &dyn Store, keys: &KeyRing) -> Result<(), GateError> {
    let jwk = keys.signer().jwk();
    let json = serde_json::to_string(&jwk).map_err(|e| GateError::internal("encode a key", e))?;
    store
        .meta_set_once(&format!("{PUBLISHED}{}", jwk.kid), &json)
        .await?;
    Ok(())
}

/// The keys this process trusts and publishes: its key files (current and retired) and
/// every key they endorsed in the log, directly or through a chain of endorsements.
pub async fn published_jwks(store: &dyn Store, keys: &KeyRing) -> Result<Jwks, GateError> {
    Ok(anchor::trusted(&keys.jwks(), &endorsements(store).await?))
}

/// Every endorsement recorded in the log (verified or not: `anchor::trusted` checks).
pub async fn endorsements(store: &dyn Store) -> Result<Vec<Endorsement>, GateError> {
    Ok(store
        .events_of_subject(anchor::KEYS_SUBJECT)
        .await?
        .iter()
        .filter_map(|e| Endorsement::from_entry(&e.entry))
        .collect())
}

/// The keys published in the database (`jwk:*` rows) that are not trusted here, by key
/// id: each is named by `doctor` and `log verify`, and trusted only once endorsed.
pub async fn untrusted_candidates(
    store: &dyn Store,
    keys: &KeyRing,
) -> Result<Vec<String>, GateError> {
    let trusted = published_jwks(store, keys).await?;
    Ok(store
        .meta_list(PUBLISHED)
        .await?
        .into_iter()
        .map(|(key, json)| {
            serde_json::from_str::<Jwk>(&json)
                .map(|jwk| jwk.kid)
                .unwrap_or_else(|_| key.trim_start_matches(PUBLISHED).to_string())
        })
        .filter(|kid| trusted.find(kid).is_none())
        .collect())
}

/// The candidate key `kid` (a `jwk:*` row), well-formed and named by its thumbprint.
pub async fn candidate(store: &dyn Store, kid: &str) -> Result<Option<Jwk>, GateError> {
    let row = store.meta_list(&format!("{PUBLISHED}{kid}")).await?;
    let Some((_, json)) = row
        .into_iter()
        .find(|(k, _)| k == &format!("{PUBLISHED}{kid}"))
    else {
        return Ok(None);
    };
    let jwk: Jwk = serde_json::from_str(&json)
        .map_err(|e| GateError::BadInput(format!("the published key {kid} is not a JWK: {e}")))?;
    anchor::check_published_key(&jwk)
        .map_err(|e| GateError::BadInput(format!("the published key {kid}: {e}")))?;
    if jwk.kid != kid {
        return Err(GateError::BadInput(format!(
            "the row of {kid} holds key {}",
            jwk.kid
        )));
    }
    Ok(Some(jwk))
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> KeyError + '_ {
    move |source| KeyError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn create_private_dir(dir: &Path) -> Result<(), KeyError> {
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(io_err(dir))
}

fn create_key_file(dir: &Path, target: &Path, now: Timestamp) -> Result<(), KeyError> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| KeyError::Random(e.to_string()))?;
    let signer = Signer::from_seed(seed);
    let jwk = signer.jwk();
    let file = KeyFile {
        kty: jwk.kty,
        crv: jwk.crv,
        kid: jwk.kid,
        x: jwk.x,
        d: URL_SAFE_NO_PAD.encode(seed),
        created_at: now,
    };
    let text = serde_json::to_vec_pretty(&file).map_err(|e| KeyError::Invalid {
        path: target.to_path_buf(),
        message: e.to_string(),
    })?;
    // Unique per attempt: several threads or processes may race to create the key.
    let mut tag = [0u8; 8];
    getrandom::fill(&mut tag).map_err(|e| KeyError::Random(e.to_string()))?;
    let tmp = dir.join(format!(".signing-key.{}.tmp", hex::encode(tag)));
    {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io_err(&tmp))?;
        f.write_all(&text).map_err(io_err(&tmp))?;
        f.sync_all().map_err(io_err(&tmp))?;
    }
    // hard_link fails with AlreadyExists if another process created the key first; then
    // theirs is the key and ours is discarded.
    let linked = fs::hard_link(&tmp, target);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            if let Ok(d) = fs::File::open(dir) {
                let _ = d.sync_all();
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(io_err(target)(e)),
    }
}

fn read_key_file(path: &Path) -> Result<Signer, KeyError> {
    let meta = fs::metadata(path).map_err(io_err(path))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyError::Permissions {
            path: path.to_path_buf(),
            mode,
        });
    }
    let text = fs::read(path).map_err(io_err(path))?;
    let invalid = |message: String| KeyError::Invalid {
        path: path.to_path_buf(),
        message,
    };
    let file: KeyFile = serde_json::from_slice(&text).map_err(|e| invalid(e.to_string()))?;
    if file.kty != "OKP" || file.crv != "Ed25519" {
        return Err(invalid(format!(
            "key type {}/{}, expected OKP/Ed25519",
            file.kty, file.crv
        )));
    }
    let seed = URL_SAFE_NO_PAD
        .decode(file.d.trim_end_matches('='))
        .map_err(|e| invalid(format!("d is not base64url: {e}")))?;
    let seed: [u8; 32] = seed
        .try_into()
        .map_err(|_| invalid("d is not a 32-byte Ed25519 seed".into()))?;
    let signer = Signer::from_seed(seed);
    if signer.kid() != file.kid || signer.jwk().x != file.x {
        return Err(invalid(
            "the public key or kid does not match the private key".into(),
        ));
    }
    Ok(signer)
}

fn created_at(path: &Path) -> Result<Timestamp, KeyError> {
    let text = fs::read(path).map_err(io_err(path))?;
    let file: KeyFile = serde_json::from_slice(&text).map_err(|e| KeyError::Invalid {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    Ok(file.created_at)
}

fn load(dir: &Path) -> Result<Loaded, KeyError> {
    let active_path = dir.join("signing-key.json");
    let signer = read_key_file(&active_path)?;
    let mut keys: Vec<Jwk> = vec![signer.jwk()];
    let retired_dir = dir.join("retired");
    if retired_dir.is_dir() {
        let mut entries: Vec<PathBuf> = fs::read_dir(&retired_dir)
            .map_err(io_err(&retired_dir))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        entries.sort();
        for path in entries {
            let retired = read_key_file(&path)?;
            if !keys.iter().any(|k| k.kid == retired.kid()) {
                keys.push(retired.jwk());
            }
        }
    }
    Ok(Loaded {
        signer: Arc::new(signer),
        jwks: Jwks { keys },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Timestamp {
        Timestamp::parse("2026-11-29T12:00:00Z").unwrap()
    }

    #[test]
    fn creates_a_private_key_once_and_reloads_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("keys");
        let first = KeyRing::open_or_create(&dir, now()).unwrap();
        let mode = fs::metadata(dir.join("signing-key.json"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let second = KeyRing::open_or_create(&dir, now()).unwrap();
        assert_eq!(first.signer().kid(), second.signer().kid());
        assert_eq!(first.jwks().keys.len(), 1);
    }

    #[test]
    fn refuses_a_key_readable_by_others() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("keys");
        KeyRing::open_or_create(&dir, now()).unwrap();
        let path = dir.join("signing-key.json");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let err = KeyRing::open_existing(&dir).unwrap_err();
        assert!(err.to_string().contains("chmod 600"), "{err}");
    }

    #[test]
    fn concurrent_first_starts_agree_on_one_key() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("keys");
        let kids: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        KeyRing::open_or_create(&dir, now())
                            .unwrap()
                            .signer()
                            .kid()
                            .to_string()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(kids.windows(2).all(|w| w[0] == w[1]), "{kids:?}");
    }

    #[test]
    fn rotation_keeps_the_old_key_published() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("keys");
        let ring = KeyRing::open_or_create(&dir, now()).unwrap();
        let first = ring.signer().kid().to_string();
        let (old, new) = ring.rotate(now()).unwrap();
        assert_eq!(old, first);
        assert_ne!(new, first);
        assert_eq!(ring.signer().kid(), new);
        let kids: Vec<_> = ring.jwks().keys.into_iter().map(|k| k.kid).collect();
        assert_eq!(kids, vec![new.clone(), first.clone()]);
        let mode = fs::metadata(dir.join("retired").join(format!("{first}.json")))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // Another process opening the directory sees the same.
        let other = KeyRing::open_existing(&dir).unwrap();
        assert_eq!(other.signer().kid(), new);
        assert_eq!(other.jwks().keys.len(), 2);
    }

    #[test]
    fn retired_keys_stay_published() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("keys");
        let old = KeyRing::open_or_create(&dir, now()).unwrap();
        let old_kid = old.signer().kid().to_string();
        fs::create_dir_all(dir.join("retired")).unwrap();
        fs::rename(
            dir.join("signing-key.json"),
            dir.join("retired").join(format!("{old_kid}.json")),
        )
        .unwrap();
        let new = KeyRing::open_or_create(&dir, now()).unwrap();
        assert_ne!(new.signer().kid(), old_kid);
        let kids: Vec<_> = new.jwks().keys.into_iter().map(|k| k.kid).collect();
        assert_eq!(kids.len(), 2);
        assert!(kids.contains(&old_kid));
    }
}
