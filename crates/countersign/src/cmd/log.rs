//! Evidence bundles and the transparency log from the command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use countersign_core::Jwks;
use countersign_core::bundle;
use countersign_core::checkpoint::Checkpoint;
use countersign_core::logcheck::LogVerifier;
use countersign_core::merkle;
use countersign_server::KeyRing;
use countersign_server::views::parse_mode;

use crate::config::Config;
use crate::runtime;

#[derive(Debug, Args)]
pub struct EvidenceArgs {
    /// A request id (req_...) or a recorded decision id (dec_...).
    pub id: String,
    /// redacted (default) or full (needs [evidence] raw_payload_export = true).
    #[arg(long)]
    pub mode: Option<String>,
    /// Where to write the ZIP (default: <id>.evidence.zip; `-` for standard output).
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct VerifyBundleArgs {
    /// The bundle (ZIP).
    pub file: PathBuf,
    /// Verify signatures against this JWKS (your own pinned copy of the server's keys)
    /// instead of the one inside the bundle.
    #[arg(long, value_name = "FILE", conflicts_with = "server")]
    pub jwks: Option<PathBuf>,
    /// Verify against the keys this countersign server publishes (e.g.
    /// http://127.0.0.1:8787). Without --jwks or --server, the keys of --data-dir (when
    /// given) are used; with none of them, the keys are not pinned.
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum LogCommand {
    /// Recompute the whole log from its stored entries and check every stored checkpoint
    /// (root and signature) and the stored Merkle nodes; open every payload commitment,
    /// and replay the log into the state it implies and compare it with the database's
    /// rows (requests, tokens, accounts, rooms), naming each difference by table and id.
    Verify,
    /// Prove that the log of NEW (a checkpoint file) extends the log of OLD: nothing
    /// was removed or rewritten in between.
    Consistency {
        old: PathBuf,
        new: PathBuf,
        /// Verify the checkpoints against this JWKS (default: the data directory's keys).
        #[arg(long, value_name = "FILE")]
        jwks: Option<PathBuf>,
    },
    /// Print the newest signed checkpoint (integrating new entries first).
    Checkpoint,
}

pub async fn evidence(config: &Config, args: &EvidenceArgs) -> anyhow::Result<ExitCode> {
    let gate = runtime::open(config).await?;
    let mode = parse_mode(args.mode.as_deref())?;
    let zip = gate
        .evidence(&runtime::local_admin(), &args.id, mode)
        .await?;
    match &args.output {
        Some(path) if path.as_os_str() == "-" => {
            use std::io::Write;
            std::io::stdout().write_all(&zip)?;
        }
        other => {
            let path = other
                .clone()
                .unwrap_or_else(|| PathBuf::from(format!("{}.evidence.zip", args.id)));
            std::fs::write(&path, &zip)
                .with_context(|| format!("could not write {}", path.display()))?;
            eprintln!("wrote {} ({} bytes)", path.display(), zip.len());
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn read_jwks(path: &PathBuf) -> anyhow::Result<Jwks> {
    let text = std::fs::read(path).with_context(|| format!("could not read {}", path.display()))?;
    serde_json::from_slice(&text)
        .with_context(|| format!("{} is not a JWKS ({{\"keys\": [...]}})", path.display()))
}

/// Verifies a bundle against pinned keys: `--jwks`, `--server`, or the keys of the
/// data directory when one was named (`data_dir_given`). With none, only against the
/// bundle's own jwks.json, and says so: such a bundle may have been made by anyone.
pub async fn verify_bundle(
    config: &Config,
    args: &VerifyBundleArgs,
    data_dir_given: bool,
) -> anyhow::Result<ExitCode> {
    let zip = std::fs::read(&args.file)
        .with_context(|| format!("could not read {}", args.file.display()))?;
    let pinned = match (&args.jwks, &args.server) {
        (Some(path), _) => Some(read_jwks(path)?),
        (None, Some(server)) => Some(crate::cmd::verify::server_jwks(server).await?),
        (None, None) if data_dir_given => Some(crate::cmd::verify::data_dir_jwks(config).await?),
        (None, None) => None,
    };
    let report = bundle::verify(&zip, pinned.as_ref());
    let summary = || {
        format!(
            "{} ({} entries: {}; {} decision proof(s)) in log {} at size {}, complete (manifest signed by {})",
            report.subject.as_deref().unwrap_or("?"),
            report.events.len(),
            report.events.join(", "),
            report.decisions,
            report.log_origin.as_deref().unwrap_or("?"),
            report.tree_size.unwrap_or(0),
            report.manifest_signed_by.as_deref().unwrap_or("?")
        )
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if report.valid && !report.keys_pinned {
        println!("keys not pinned: {}", summary());
        println!(
            "  the bundle only agrees with its own jwks.json, which proves nothing about who made it: give --jwks FILE, --server URL or --data-dir DIR to check it against keys you trust"
        );
    } else if report.valid {
        println!("valid: {}", summary());
    } else {
        println!("INVALID bundle:");
        for reason in &report.reasons {
            println!("  - {reason}");
        }
    }
    Ok(if report.valid && report.keys_pinned {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

pub async fn run(config: &Config, command: LogCommand) -> anyhow::Result<ExitCode> {
    match command {
        LogCommand::Verify => verify_log(config).await,
        LogCommand::Checkpoint => {
            let gate = runtime::open(config).await?;
            // Sign one for everything stored so far, not just print the last one signed.
            gate.log().integrate().await?;
            let checkpoint = gate.log().checkpoint(None).await?;
            print!("{}", checkpoint.note);
            Ok(ExitCode::SUCCESS)
        }
        LogCommand::Consistency { old, new, jwks } => {
            consistency(config, &old, &new, jwks.as_ref()).await
        }
    }
}

/// Recomputes the tree from the entries, and holds the database's rows and payloads to
/// the log (`countersign_store::audit`).
pub(crate) async fn verify_log(config: &Config) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    if let crate::config::Database::Sqlite(db) = &config.database
        && !db.exists()
    {
        bail!("no database at {}", db.display());
    }
    let store = runtime::open_store(config).await?;
    let keys = KeyRing::open_existing(&config.keys_dir())?;
    let jwks = countersign_server::keyring::published_jwks(&*store, &keys).await?;
    let origin = store.log_origin("").await?;
    let checkpoints = store.checkpoints().await?;
    let notes: Vec<String> = checkpoints.iter().map(|c| c.note.clone()).collect();
    let verifier = LogVerifier::new(&notes, &jwks, &origin);
    // The tree is recomputed on a thread of its own from the same pages the audit
    // replays (one pass over the log, two cores).
    let (pages, received) = std::sync::mpsc::sync_channel::<Vec<countersign_store::StoredEvent>>(8);
    let tree = std::thread::spawn(move || {
        let mut verifier = verifier;
        for page in received {
            for event in &page {
                verifier.push(&event.bytes);
            }
        }
        verifier.finish()
    });
    let mut problems = Vec::new();
    let mut cursor = 0;
    let audit = countersign_store::audit::run_with(&*store, &mut |page| {
        for event in &page {
            if event.seq != cursor + 1 {
                problems.push(format!(
                    "event {} follows event {cursor}: the sequence has a gap",
                    event.seq
                ));
            }
            cursor = event.seq;
        }
        // The thread ends only when `pages` is dropped, so it is there to receive.
        let _ = pages.send(page);
    })
    .await;
    drop(pages);
    let report = tree
        .join()
        .map_err(|_| anyhow::anyhow!("recomputing the tree failed"))?;
    let audit = audit?;
    problems.extend(report.problems.iter().cloned());
    // A key only the database knows is no key of this log: name each.
    for kid in countersign_server::keyring::untrusted_candidates(&*store, &keys).await? {
        problems.push(format!(
            "key {kid} is published in the database but not traceable to a key file through the log's endorsements: it is not trusted (`countersign keys trust {kid}` endorses it, if it is yours)"
        ));
    }
    // The stored tree (what proofs are served from) agrees with the recomputed one.
    for stored in &checkpoints {
        if stored.size > report.entries {
            continue;
        }
        let nodes = store.log_nodes(&merkle::root_nodes(stored.size)).await;
        let root = nodes
            .ok()
            .and_then(|nodes| merkle::root(stored.size, &mut |id| nodes.get(&id).copied()).ok());
        if root.is_none() || root.as_ref() != report.roots.get(&stored.size) {
            problems.push(format!(
                "the stored Merkle nodes of size {} do not match the entries",
                stored.size
            ));
        }
    }
    println!(
        "{} entries, {} checkpoints, log {origin}, recomputed in {:.2?}",
        report.entries,
        checkpoints.len(),
        started.elapsed()
    );
    println!(
        "audit: {} rows held to {} entries and their payloads",
        audit.rows, audit.entries
    );
    if problems.is_empty() && audit.ok() {
        println!(
            "ok: every checkpoint matches the entries and is signed by a published key; every payload opens its commitment; the database says what the log says"
        );
        return Ok(ExitCode::SUCCESS);
    }
    if !problems.is_empty() {
        println!("INVALID log:");
        for p in &problems {
            println!("  - {p}");
        }
    }
    if !audit.ok() {
        println!(
            "the DATABASE DISAGREES with the log ({} differences, by table and id):",
            audit.differences.len()
        );
        for d in audit.differences.iter().take(MAX_SHOWN) {
            println!("  - {d}");
        }
        if audit.differences.len() > MAX_SHOWN {
            println!("  ... and {} more", audit.differences.len() - MAX_SHOWN);
        }
    }
    Ok(ExitCode::from(1))
}

/// Differences printed at most; the count says how many more there are.
const MAX_SHOWN: usize = 1000;

async fn consistency(
    config: &Config,
    old: &PathBuf,
    new: &PathBuf,
    jwks: Option<&PathBuf>,
) -> anyhow::Result<ExitCode> {
    let jwks = match jwks {
        Some(path) => read_jwks(path)?,
        None => KeyRing::open_existing(&config.keys_dir())?.jwks(),
    };
    let read = |path: &PathBuf| -> anyhow::Result<Checkpoint> {
        let note = std::fs::read_to_string(path)
            .with_context(|| format!("could not read {}", path.display()))?;
        Checkpoint::verify(&note, &jwks, None)
            .with_context(|| format!("{} is not a valid signed checkpoint", path.display()))
    };
    let (a, b) = (read(old)?, read(new)?);
    if a.origin != b.origin {
        bail!(
            "the checkpoints are of different logs ({} and {})",
            a.origin,
            b.origin
        );
    }
    let store = runtime::open_store(config).await?;
    let ids = merkle::consistency_nodes(a.size, b.size)?;
    let nodes = store.log_nodes(&ids).await?;
    let proof = merkle::consistency_proof(a.size, b.size, &mut |id| nodes.get(&id).copied())?;
    match merkle::verify_consistency(a.size, b.size, &a.root, &b.root, &proof) {
        Ok(()) => {
            println!(
                "consistent: the log of {} entries extends the log of {} entries ({} proof hashes)",
                b.size,
                a.size,
                proof.len()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            println!("INCONSISTENT: {e}");
            Ok(ExitCode::from(1))
        }
    }
}
