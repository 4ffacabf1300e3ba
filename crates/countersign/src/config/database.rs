//! Where the data lives: the database URL (which may carry a password, so it is also
//! readable from a file) and what depends on the backend, such as how often a process polls
//! for other processes' writes.

use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use super::Overrides;
use super::env::Env;

/// The embedded database's file in the data directory, unless `database_url` says otherwise.
const SQLITE_FILE_NAME: &str = "countersign.db";

/// `feed_poll_ms` bounds cross-process wake-up: too short wastes the database's time,
/// too long keeps a waiting agent waiting.
const FEED_POLL_MS: RangeInclusive<u64> = 5..=1000;

/// The storage backend, from `database_url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Database {
    Sqlite(PathBuf),
    Postgres(String),
}

impl Database {
    /// Parses `sqlite://PATH` (relative paths are relative to the working directory,
    /// `sqlite:///abs/path` is absolute) or `postgres://...` / `postgresql://...`.
    pub fn parse(url: &str) -> anyhow::Result<Self> {
        if let Some(path) = url.strip_prefix("sqlite://") {
            if path.is_empty() {
                bail!(
                    "database_url {url:?} names no file (e.g. sqlite:///var/lib/countersign/countersign.db)"
                );
            }
            return Ok(Database::Sqlite(PathBuf::from(path)));
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(Database::Postgres(url.to_string()));
        }
        bail!(
            "database_url must start with sqlite:// or postgres:// (got {})",
            redact(url)
        )
    }

    /// A description without any password, for messages.
    pub fn describe(&self) -> String {
        match self {
            Database::Sqlite(path) => format!("SQLite {}", path.display()),
            Database::Postgres(url) => format!("PostgreSQL {}", redact(url)),
        }
    }

    /// How often a process looks for other processes' writes, unless configured. SQLite
    /// processes learn of each other's writes by polling; PostgreSQL instances are told at
    /// once (NOTIFY), and the poll only covers a lost notification.
    fn default_feed_poll_ms(&self) -> u64 {
        match self {
            Database::Sqlite(_) => 50,
            Database::Postgres(_) => 1000,
        }
    }
}

/// The SQLite file in `data_dir`: the default database.
pub fn sqlite_file(data_dir: &Path) -> PathBuf {
    data_dir.join(SQLITE_FILE_NAME)
}

/// The URL with any password replaced by `***`.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// The database: the flag, the variable, a file the variable `_FILE` names, the config
/// file, else the SQLite file in the data directory.
pub fn resolve(
    overrides: &Overrides,
    env: &Env,
    file: Option<String>,
    data_dir: &Path,
) -> anyhow::Result<Database> {
    let url = match (
        overrides.database.clone(),
        env.get("COUNTERSIGN_DATABASE_URL"),
        env.get("COUNTERSIGN_DATABASE_URL_FILE"),
    ) {
        (Some(url), _, _) => Some(url),
        (None, Some(url), _) => Some(url),
        (None, None, Some(path)) => Some(
            std::fs::read_to_string(&path)
                .with_context(|| format!("could not read COUNTERSIGN_DATABASE_URL_FILE {path}"))?
                .trim()
                .to_string(),
        ),
        (None, None, None) => file,
    };
    match url {
        Some(url) => Database::parse(&url),
        None => Ok(Database::Sqlite(sqlite_file(data_dir))),
    }
}

/// `feed_poll_ms` from the variable or the file, else the backend's default (also for 0,
/// which has always meant "the default").
pub fn feed_poll_ms(env: &Env, file: Option<u64>, database: &Database) -> anyhow::Result<u64> {
    let set = env.number("COUNTERSIGN_FEED_POLL_MS")?.or(file);
    let Some(ms) = set.filter(|&ms| ms != 0) else {
        return Ok(database.default_feed_poll_ms());
    };
    if !FEED_POLL_MS.contains(&ms) {
        bail!(
            "feed_poll_ms must be between {} and {} (it bounds cross-process wake-up)",
            FEED_POLL_MS.start(),
            FEED_POLL_MS.end()
        );
    }
    Ok(ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::vars;

    #[test]
    fn the_poll_follows_the_backend_unless_set() {
        let vars = vars(&[]);
        let env = Env::new(&vars).unwrap();
        let sqlite = Database::parse("sqlite:///tmp/x.db").unwrap();
        let postgres = Database::parse("postgres://u:pw@db/cs").unwrap();
        assert_eq!(feed_poll_ms(&env, None, &sqlite).unwrap(), 50);
        assert_eq!(feed_poll_ms(&env, None, &postgres).unwrap(), 1000);
        assert_eq!(feed_poll_ms(&env, Some(200), &postgres).unwrap(), 200);
        assert_eq!(feed_poll_ms(&env, Some(0), &postgres).unwrap(), 1000);
        let err = feed_poll_ms(&env, Some(4), &sqlite).unwrap_err();
        assert!(err.to_string().contains("between 5 and 1000"), "{err}");
        assert_eq!(postgres.describe(), "PostgreSQL postgres://u:***@db/cs");
    }
}
