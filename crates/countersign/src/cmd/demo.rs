//! `countersign demo`: a working dashboard in one command.

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::bail;
use clap::Args;
use countersign_core::{Channel, DecisionInput, NewRequest, Principal, Role, Verdict};
use countersign_server::Decider;
use countersign_server::rooms::HumanGate;

use crate::config::Config;
use crate::runtime;

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Address to serve on (default 127.0.0.1:8787).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Only fill the data directory; do not start the server.
    #[arg(long)]
    pub no_serve: bool,
}

fn details(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn ask(description: &str, pairs: &[(&str, &str)], hours: f64) -> NewRequest {
    NewRequest {
        description: description.into(),
        details: details(pairs),
        timeout_hours: Some(hours),
        ..NewRequest::default()
    }
}

pub async fn run(config: &Config, args: &DemoArgs) -> anyhow::Result<ExitCode> {
    let db = config.database_path();
    if db.exists() {
        set_aside(config, &db).await?;
    }
    let gate = runtime::open(config).await?;
    let admin = runtime::local_admin();
    let mut password = [0u8; 12];
    getrandom::fill(&mut password).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    let password = hex::encode(password);
    let (_, invite) = gate
        .accounts()
        .invite("demo", Some("Dana Demo"), Role::Admin, &admin, 3600)
        .await?;
    gate.accounts()
        .accept(&invite, None, None, &password)
        .await?;

    let deploy = Principal::from_token("deploy-bot", Role::Agent);
    let finance = Principal::from_token("finance-agent", Role::Agent);
    let support = Principal::from_token("support-agent", Role::Agent);
    for name in ["deploy-bot", "finance-agent", "support-agent"] {
        gate.create_token(name, Role::Agent, &admin).await?;
    }
    let approver = Decider::new(Principal::from_token("ops-lead", Role::Approver))?;

    // Waiting for a decision.
    let mut pay = ask(
        "Transfer GBP 12,450 to Globex Corp for invoice INV-2341",
        &[
            ("vendor", "Globex Corp"),
            ("amount", "12450.00"),
            ("currency", "GBP"),
            ("invoice_ref", "INV-2341"),
            ("iban", "GB82 WEST 1234 5698 7654 32"),
        ],
        4.0,
    );
    pay.requested_fields = vec!["po_number".into()];
    gate.request_approval(&finance, pay).await?;
    gate.request_approval(
        &deploy,
        ask(
            "Deploy web v2.14.0 to production",
            &[
                ("service", "web"),
                ("version", "v2.14.0"),
                ("environment", "production"),
                ("change", "CHG-1182"),
            ],
            1.0,
        ),
    )
    .await?;
    gate.request_approval(
        &support,
        ask(
            "Email 3,200 customers about the billing change",
            &[
                ("template", "billing-change-2026-12"),
                ("audience", "active customers, EU"),
                ("recipients", "3200"),
            ],
            24.0,
        ),
    )
    .await?;
    let mut soon = ask(
        "Delete the staging database snapshot from 2026-10-01",
        &[("database", "staging-pg"), ("snapshot", "snap-2026-10-01")],
        1.0,
    );
    soon.timeout_hours = None;
    soon.timeout_seconds = Some(600);
    gate.request_approval(&deploy, soon).await?;

    // Decided ones, for the history.
    let refund = gate
        .request_approval(
            &support,
            ask(
                "Refund order 88123 (EUR 49.90)",
                &[("order", "88123"), ("amount", "49.90"), ("currency", "EUR")],
                24.0,
            ),
        )
        .await?
        .request;
    gate.decide(
        &approver,
        &refund.id,
        Verdict::Approved,
        DecisionInput {
            comment: Some("Customer was double charged".into()),
            fields: BTreeMap::new(),
        },
        Channel::Api,
    )
    .await?;
    gate.record_action(
        &support,
        &refund.id,
        "payments.refund".into(),
        details(&[("psp_ref", "re_3Kd9")]),
    )
    .await?;
    let rotate = gate
        .request_approval(
            &deploy,
            ask(
                "Rotate the production database password",
                &[("database", "prod-pg"), ("window", "now")],
                24.0,
            ),
        )
        .await?
        .request;
    gate.decide(
        &approver,
        &rotate.id,
        Verdict::Rejected,
        DecisionInput {
            comment: Some("Wait for the maintenance window on Saturday".into()),
            fields: BTreeMap::new(),
        },
        Channel::Api,
    )
    .await?;
    let stale = gate
        .request_approval(
            &finance,
            ask(
                "Pay contractor invoice C-77 (USD 3,100)",
                &[("amount", "3100.00"), ("currency", "USD")],
                24.0,
            ),
        )
        .await?
        .request;
    gate.cancel(&finance, &stale.id).await?;

    // Two rooms with agents in every state and gates of every kind.
    let qa = Principal::from_token("qa-bot", Role::Agent);
    gate.create_token("qa-bot", Role::Agent, &admin).await?;
    gate.rooms()
        .create(&deploy, "release-train", Some("Release train 2.14"))
        .await?;
    gate.rooms().join(&deploy, "release-train").await?;
    gate.rooms().join(&qa, "release-train").await?;
    gate.rooms()
        .post_message(
            &deploy,
            "release-train",
            "Built web v2.14.0; canary at 5%.",
            "progress",
        )
        .await?;
    gate.rooms()
        .post_message(
            &qa,
            "release-train",
            "Regression suite green: 1,482 passed, 0 failed.",
            "done",
        )
        .await?;
    gate.rooms().post_message(&deploy, "release-train", "Canary error rate is 0.4% (baseline 0.3%). Promote to 100% now or wait for the EU morning peak?", "question").await?;
    let mut promote = ask(
        "Promote web v2.14.0 from 5% to 100%",
        &[
            ("service", "web"),
            ("version", "v2.14.0"),
            ("from", "5%"),
            ("to", "100%"),
        ],
        2.0,
    );
    promote.room = Some("release-train".into());
    gate.request_approval(&deploy, promote).await?;
    let lead = Decider::new(Principal::from_token("ops-lead", Role::Approver))?;
    let asked = gate
        .rooms()
        .post_message(
            &qa,
            "release-train",
            "Should the flaky checkout test block the release?",
            "question",
        )
        .await?;
    gate.rooms()
        .close(
            &lead,
            "release-train",
            &asked.id,
            HumanGate::Question,
            "No, it is quarantined; ship.",
        )
        .await?;

    gate.rooms()
        .create(&finance, "month-end", Some("Month-end close"))
        .await?;
    gate.rooms().join(&finance, "month-end").await?;
    gate.rooms().join(&support, "month-end").await?;
    gate.rooms()
        .report_blocker(
            &finance,
            "month-end",
            "The bank portal asks for a new 2FA device; I cannot download the November statements.",
        )
        .await?;
    let old = gate
        .rooms()
        .report_blocker(
            &support,
            "month-end",
            "Refund queue locked by an expired session.",
        )
        .await?;
    gate.rooms()
        .close(
            &lead,
            "month-end",
            &old.id,
            HumanGate::Blocker,
            "Session renewed; the queue is open again.",
        )
        .await?;
    gate.rooms()
        .set_presence(
            &support,
            "month-end",
            countersign_core::rooms::Presence::Working,
            Some("processing 12 refunds".into()),
        )
        .await?;
    gate.log().integrate().await?;

    eprintln!("demo data written to {}", config.data_dir.display());
    eprintln!("sign in as:  demo / {password}");
    if args.no_serve {
        eprintln!(
            "start it with: countersign serve --data-dir {}",
            config.data_dir.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    drop(gate);
    eprintln!("open {} in a browser", config.public_url);
    crate::cmd::serve::run(config).await
}

/// An existing database is backed up first (`countersign backup`: the database and its
/// signing keys, one consistent snapshot, durable before anything is removed) into
/// `countersign-before-demo-<UTC time>.zip` in the data directory, then set aside, so
/// that the demo fills a fresh one; `countersign restore` brings the backup back.
/// Refused while a `serve` answers at the configured address.
async fn set_aside(config: &Config, db: &std::path::Path) -> anyhow::Result<()> {
    let at = crate::cmd::healthcheck::loopback_for(config.listen);
    if crate::cmd::healthcheck::ask(&format!("http://{at}"), std::time::Duration::from_secs(2))
        .await
        .is_ok()
    {
        bail!(
            "a countersign serve answers at {at}: stop it before `countersign demo` replaces the database of {} (or try --data-dir /tmp/countersign-demo)",
            config.data_dir.display()
        );
    }
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ");
    let file = config
        .data_dir
        .join(format!("countersign-before-demo-{stamp}.zip"));
    crate::cmd::backup::backup(
        config,
        &crate::cmd::backup::BackupArgs { file: file.clone() },
    )
    .await
    .map_err(|e| {
        anyhow::anyhow!(
            "could not back up the existing database {} (nothing was changed): {e:#}",
            db.display()
        )
    })?;
    for suffix in ["", "-wal", "-shm", "-poke"] {
        let part = std::path::PathBuf::from(format!("{}{suffix}", db.display()));
        match std::fs::remove_file(&part) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => bail!(
                "backed up to {}, but could not remove {}: {err}",
                file.display(),
                part.display()
            ),
        }
    }
    crate::cmd::announce(
        "INFO",
        &format!(
            "the existing database is backed up to {} and set aside; the demo fills a fresh one (to go back: `countersign restore {} --data-dir <an empty directory>`)",
            file.display(),
            file.display()
        ),
    );
    Ok(())
}
