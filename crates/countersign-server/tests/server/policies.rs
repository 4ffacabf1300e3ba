//! The policy watcher: a policy file changed at any moment after the set in force was
//! read is reloaded, even before the watcher has first looked at it.

use std::sync::Arc;
use std::time::Duration;

use countersign_server::Gate;
use countersign_server::gate::{PolicySettings, Settings};
use countersign_sqlite::SqliteStore;
use countersign_store::Store;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn a_file_changed_before_the_watcher_first_looks_is_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.cedar");
    std::fs::write(
        &file,
        r#"@id("first") permit(principal, action, resource);"#,
    )
    .unwrap();
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(&dir.path().join("countersign.db")).unwrap());
    let settings = Settings {
        policy: Some(PolicySettings {
            files: vec![file.clone()],
            zone: chrono_tz::UTC,
        }),
        ..Settings::default()
    };
    let gate = Gate::builder(store, dir.path().join("keys"))
        .settings(settings)
        .build()
        .await
        .unwrap();
    let first = gate.policies().digest().to_string();
    assert!(gate.policies().policy("first").is_some());

    // Changed after the load and before the watcher starts (another size, so that the
    // change shows whatever the file system's clock resolution).
    std::fs::write(
        &file,
        r#"@id("second") forbid(principal, action, resource);"#,
    )
    .unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(gate.clone().watch_policies(shutdown.clone()));
    let mut reloaded = false;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if gate.policies().digest() != first {
            reloaded = true;
            break;
        }
    }
    shutdown.cancel();
    assert!(reloaded, "the change was not noticed within 6 s");
    assert!(gate.policies().policy("second").is_some());
}
