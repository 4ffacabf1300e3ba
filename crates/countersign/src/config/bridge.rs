//! `[[bridge]]`: the processes on approval-gate-mcp's file contract that `serve` (and
//! `countersign bridge`) gates: a name, and the directory of `pending.json`,
//! `approved.json` and `records.json`, or the three paths one by one. docs/bridge.md.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::bail;
use countersign_server::bridge::BridgeConfig;
use countersign_server::bridge::files::{LOCK_FILE_NAME, Paths};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeSection {
    pub name: String,
    /// The folder that holds the three files under their seed names.
    pub dir: Option<PathBuf>,
    pub pending: Option<PathBuf>,
    pub approved: Option<PathBuf>,
    pub records: Option<PathBuf>,
    /// The file a cooperating process `flock`s (default: `bridge.lock` beside
    /// `pending.json`).
    pub lock_file: Option<PathBuf>,
    /// How long a proposal waits for a decision (default: the server's 24 hours).
    pub timeout_hours: Option<f64>,
}

/// The longest a proposal may wait (the server's longest request).
const MAX_TIMEOUT_HOURS: f64 = 168.0;

/// The bridges, checked. Relative paths are from the config file's directory.
pub fn resolve(
    sections: Vec<BridgeSection>,
    config_file: Option<&Path>,
) -> anyhow::Result<Vec<BridgeConfig>> {
    let base = super::base_dir(config_file);
    let mut out: Vec<BridgeConfig> = Vec::new();
    for section in sections {
        let what = format!("[[bridge]] {:?}", section.name);
        let bridge = one(&what, section, &base)?;
        if out.iter().any(|b| b.name == bridge.name) {
            bail!("{what} is configured twice");
        }
        if let Some(other) = out.iter().find(|b| b.paths.pending == bridge.paths.pending) {
            bail!(
                "{what} watches {}, as [[bridge]] {:?} does: one process's files have one bridge",
                bridge.paths.pending.display(),
                other.name
            );
        }
        out.push(bridge);
    }
    Ok(out)
}

/// One bridge from its keys (also what `countersign bridge --name N --dir D` builds).
pub fn one(what: &str, section: BridgeSection, base: &Path) -> anyhow::Result<BridgeConfig> {
    super::plain_name(what, &section.name)?;
    let paths = match (
        section.dir,
        section.pending,
        section.approved,
        section.records,
    ) {
        (Some(dir), None, None, None) => {
            let mut paths = Paths::in_dir(&base.join(dir));
            if let Some(lock) = section.lock_file {
                paths.lock = base.join(lock);
            }
            paths
        }
        (None, Some(pending), Some(approved), Some(records)) => {
            let pending = base.join(pending);
            let lock = match section.lock_file {
                Some(lock) => base.join(lock),
                None => pending
                    .parent()
                    .map(|d| d.join(LOCK_FILE_NAME))
                    .unwrap_or_else(|| PathBuf::from(LOCK_FILE_NAME)),
            };
            Paths {
                pending,
                approved: base.join(approved),
                records: base.join(records),
                lock,
            }
        }
        (Some(_), _, _, _) => {
            bail!("{what}: give dir, or pending, approved and records, not both")
        }
        (None, None, None, None) => bail!(
            "{what}: give dir (the folder of pending.json, approved.json and records.json), or the three paths: pending, approved, records"
        ),
        (None, _, _, _) => {
            bail!("{what}: give all three of pending, approved and records (or dir)")
        }
    };
    let distinct = [&paths.pending, &paths.approved, &paths.records, &paths.lock];
    for (i, a) in distinct.iter().enumerate() {
        if distinct[i + 1..].contains(a) {
            bail!(
                "{what}: {} is named twice; each file is its own",
                a.display()
            );
        }
    }
    let timeout = match section.timeout_hours {
        None => None,
        Some(hours) if hours.is_finite() && hours > 0.0 && hours <= MAX_TIMEOUT_HOURS => {
            Some(Duration::from_secs_f64(hours * 3600.0))
        }
        Some(_) => bail!("{what}: timeout_hours: give more than 0 and at most {MAX_TIMEOUT_HOURS}"),
    };
    Ok(BridgeConfig {
        name: section.name,
        paths,
        timeout,
    })
}

/// Refuses to start a bridge whose folders do not exist, rather than guess (the seed
/// refuses to start without its directory too). The files themselves may be missing:
/// the process creates them on its first cycle.
pub fn check_dirs(bridge: &BridgeConfig) -> anyhow::Result<()> {
    let p = &bridge.paths;
    for (key, path) in [
        ("pending", &p.pending),
        ("approved", &p.approved),
        ("records", &p.records),
        ("lock_file", &p.lock),
    ] {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        if !dir.is_dir() {
            bail!(
                "[[bridge]] {:?}: the folder of {key} ({}) does not exist; create it, or fix the path",
                bridge.name,
                path.display()
            );
        }
        if path.is_dir() {
            bail!(
                "[[bridge]] {:?}: {key} ({}) is a directory, not a file",
                bridge.name,
                path.display()
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testing::ConfigFile;

    #[test]
    fn bridges_resolve_from_a_dir_or_three_paths() {
        let file = ConfigFile::new();
        let config = file
            .resolve(
                r#"
[[bridge]]
name = "reindexer"
dir = "proc"
timeout_hours = 2

[[bridge]]
name = "trader"
pending = "/srv/t/in/pending.json"
approved = "/srv/t/out/approved.json"
records = "/srv/t/records.json"
lock_file = "/srv/t/gate.lock"
"#,
            )
            .unwrap();
        let [reindexer, trader] = &config.bridges[..] else {
            panic!("two bridges: {:?}", config.bridges)
        };
        let dir = file.dir.path().join("proc");
        assert_eq!(reindexer.paths.pending, dir.join("pending.json"));
        assert_eq!(reindexer.paths.approved, dir.join("approved.json"));
        assert_eq!(reindexer.paths.records, dir.join("records.json"));
        assert_eq!(reindexer.paths.lock, dir.join("bridge.lock"));
        assert_eq!(reindexer.timeout.unwrap().as_secs(), 7200);
        assert_eq!(
            trader.paths.approved.to_str(),
            Some("/srv/t/out/approved.json")
        );
        assert_eq!(trader.paths.lock.to_str(), Some("/srv/t/gate.lock"));
        assert!(trader.timeout.is_none());
    }

    #[test]
    fn a_bad_bridge_is_refused_with_the_reason() {
        let file = ConfigFile::new();
        let cases = [
            ("[[bridge]]\nname = \"b\"\n", "give dir"),
            (
                "[[bridge]]\nname = \"b\"\ndir = \"d\"\npending = \"p.json\"\n",
                "not both",
            ),
            (
                "[[bridge]]\nname = \"b\"\npending = \"p.json\"\napproved = \"a.json\"\n",
                "all three",
            ),
            (
                "[[bridge]]\nname = \"b\"\npending = \"p.json\"\napproved = \"p.json\"\nrecords = \"r.json\"\n",
                "named twice",
            ),
            ("[[bridge]]\nname = \"Big Name\"\ndir = \"d\"\n", "name"),
            (
                "[[bridge]]\nname = \"b\"\ndir = \"d\"\ntimeout_hours = 0\n",
                "timeout_hours",
            ),
            (
                "[[bridge]]\nname = \"b\"\ndir = \"d\"\n[[bridge]]\nname = \"b\"\ndir = \"e\"\n",
                "configured twice",
            ),
            (
                "[[bridge]]\nname = \"b\"\ndir = \"d\"\n[[bridge]]\nname = \"c\"\ndir = \"d\"\n",
                "one bridge",
            ),
            (
                "[[bridge]]\nname = \"b\"\ndir = \"d\"\ntypo = 1\n",
                "unknown field",
            ),
        ];
        for (toml, expected) in cases {
            let err = format!("{:#}", file.resolve(toml).unwrap_err());
            assert!(err.contains(expected), "{toml}\n→ {err}");
        }
    }

    #[test]
    fn a_missing_folder_stops_the_bridge_before_it_starts() {
        let file = ConfigFile::new();
        let config = file
            .resolve("[[bridge]]\nname = \"b\"\ndir = \"nowhere\"\n")
            .unwrap();
        let err = super::check_dirs(&config.bridges[0])
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not exist"), "{err}");
        std::fs::create_dir(file.dir.path().join("nowhere")).unwrap();
        super::check_dirs(&config.bridges[0]).unwrap();
    }
}
