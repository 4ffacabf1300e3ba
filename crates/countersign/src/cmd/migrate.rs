//! `countersign migrate` and `countersign migrate-data`: schema upgrades, and moving an
//! installation from one database to another with its log intact.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use base64::Engine;
use clap::Args;
use countersign_core::SealedEvent;
use countersign_core::logcheck::LogVerifier;
use countersign_core::merkle::{self, CompactRange};
use countersign_postgres::PostgresStore;
use countersign_sqlite::SqliteStore;
use countersign_store::{RequestQuery, Store};

use crate::config::{Config, Database};
use crate::runtime;

#[derive(Debug, Args)]
pub struct MigrateDataArgs {
    /// The database to copy from, e.g. sqlite:///var/lib/countersign/countersign.db.
    #[arg(long, value_name = "URL")]
    pub from: String,
    /// The database to copy to (must be empty), e.g. postgres://countersign@db/countersign.
    #[arg(long, value_name = "URL")]
    pub to: String,
}

/// Document kinds that move with the data. Sessions do not: people sign in again.
const DOC_KINDS: &[&str] = &["user", "invite"];

async fn open(url: &str) -> anyhow::Result<Arc<dyn Store>> {
    let database = Database::parse(url)?;
    Ok(match &database {
        Database::Sqlite(path) => Arc::new(
            SqliteStore::open(path)
                .with_context(|| format!("could not open {}", database.describe()))?,
        ),
        Database::Postgres(url) => Arc::new(
            PostgresStore::connect(url)
                .await
                .with_context(|| format!("could not open {}", database.describe()))?,
        ),
    })
}

/// Brings the configured database's schema up to date and says so.
pub async fn migrate(config: &Config) -> anyhow::Result<ExitCode> {
    runtime::open_store(config).await?;
    println!("{} is up to date", config.database.describe());
    // Where the key files are, opening the gate endorses in the log what they and the
    // database held before keys were anchored (see docs/deployment.md).
    if config.keys_dir().join("signing-key.json").exists() {
        let gate = runtime::open(config).await?;
        gate.log().integrate().await?;
        println!(
            "{} trusted key(s): the key files and the keys they endorsed",
            gate.jwks().await?.keys.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn migrate_data(config: &Config, args: &MigrateDataArgs) -> anyhow::Result<ExitCode> {
    let from = open(&args.from).await?;
    let to = open(&args.to).await?;
    let (from_name, to_name) = (
        Database::parse(&args.from)?.describe(),
        Database::parse(&args.to)?.describe(),
    );
    if to.last_event_seq().await? != 0
        || !to.list_tokens().await?.is_empty()
        || !to
            .list_requests(&RequestQuery {
                limit: 1,
                ..RequestQuery::default()
            })
            .await?
            .is_empty()
    {
        bail!("{to_name} is not empty: migrate-data only copies into a fresh database");
    }
    let origin = from.log_origin("").await?;
    if origin.is_empty() {
        bail!("{from_name} has no log origin: is it a countersign database?");
    }
    if to.log_origin(&origin).await? != origin {
        bail!("{to_name} already has another log origin");
    }

    // The log: every entry, byte for byte, at the same position, with its payload.
    let mut cursor = 0;
    let mut range = CompactRange::empty();
    let mut nodes = Vec::new();
    loop {
        let page = from.events_after(cursor, 1000).await?;
        if page.is_empty() {
            break;
        }
        let seqs: Vec<u64> = page.iter().map(|e| e.seq).collect();
        let mut payloads = from.payloads(&seqs).await?;
        for event in page {
            let sealed = SealedEvent {
                payload: payloads.remove(&event.seq),
                entry: event.entry,
                bytes: event.bytes,
            };
            let seq = to.append_event(&sealed).await?;
            if seq != event.seq {
                bail!("event {} landed at {seq} in {to_name}; stopping", event.seq);
            }
            nodes.extend(range.append(merkle::leaf_hash(&sealed.bytes)));
            cursor = event.seq;
        }
        if nodes.len() > 50_000 {
            let from_size = to.integrated_size().await?;
            to.integrate(from_size, range.size(), &std::mem::take(&mut nodes))
                .await?;
        }
    }
    let integrated = to.integrated_size().await?;
    to.integrate(integrated, range.size(), &nodes).await?;
    let checkpoints = from.checkpoints().await?;
    for checkpoint in &checkpoints {
        to.add_checkpoint(checkpoint).await?;
    }

    // State: requests, tokens, accounts, published keys.
    let requests = from
        .list_requests(&RequestQuery {
            status: None,
            requested_by: None,
            limit: usize::MAX / 2,
        })
        .await?;
    for request in &requests {
        to.import_request(request).await?;
    }
    let tokens = from.list_tokens().await?;
    for token in &tokens {
        to.import_token(token).await?;
    }
    let mut docs = 0;
    for kind in DOC_KINDS {
        for doc in from.doc_list(kind, "", usize::MAX / 2).await? {
            to.doc_insert(&doc, None).await?;
            docs += 1;
        }
    }
    for (key, value) in from.meta_list("jwk:").await? {
        to.meta_set_once(&key, &value).await?;
    }

    // Prove it: the moved entries produce every checkpoint's root, in the new database.
    let notes: Vec<String> = checkpoints.iter().map(|c| c.note.clone()).collect();
    // The keys that signed: those published in the source and this installation's.
    let jwks = match countersign_server::KeyRing::open_existing(&config.keys_dir()) {
        Ok(keys) => {
            countersign_server::keyring::publish(&*to, &keys).await?;
            countersign_server::keyring::published_jwks(&*from, &keys).await?
        }
        Err(_) => countersign_core::Jwks {
            keys: from
                .meta_list("jwk:")
                .await?
                .iter()
                .filter_map(|(_, json)| serde_json::from_str(json).ok())
                .collect(),
        },
    };
    let mut verifier = LogVerifier::new(&notes, &jwks, &origin);
    let mut cursor = 0;
    loop {
        let page = to.events_after(cursor, 1000).await?;
        if page.is_empty() {
            break;
        }
        for event in &page {
            verifier.push(&event.bytes);
            cursor = event.seq;
        }
    }
    let report = verifier.finish();
    let root = report
        .roots
        .iter()
        .next_back()
        .map(|(size, root)| {
            format!(
                "size {size}, root {}",
                base64::engine::general_purpose::STANDARD.encode(root)
            )
        })
        .unwrap_or_else(|| "no checkpoint yet".into());
    eprintln!(
        "copied {} log entries, {} checkpoints, {} requests, {} tokens, {} accounts and invitations from {from_name} to {to_name}",
        range.size(),
        checkpoints.len(),
        requests.len(),
        tokens.len(),
        docs
    );
    if report.valid() {
        println!("the moved log verifies: {root}");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("the moved log does NOT verify:");
        for p in &report.problems {
            println!("  - {p}");
        }
        Ok(ExitCode::from(1))
    }
}
