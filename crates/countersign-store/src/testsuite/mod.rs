//! The test suite every backend must pass, so that SQLite and PostgreSQL cannot drift
//! apart in what they promise.
//!
//! A backend runs it from its own test binary with [`store_test_suite!`](crate::store_test_suite):
//!
//! ```ignore
//! mod suite {
//!     countersign_store::store_test_suite!(async {
//!         let dir = tempfile::tempdir().unwrap();
//!         let store = MyStore::open(&dir.path().join("db")).unwrap();
//!         (std::sync::Arc::new(store), dir)
//!     });
//! }
//! ```
//!
//! The factory expression is evaluated once per test and must yield, when awaited, a
//! fresh **empty** store (as an `Arc` of any [`Store`]) and a guard that lives until the
//! test ends (a temporary directory, a database to drop, or `()`). Each test is a
//! `#[tokio::test]` on a 4-thread runtime, so the test binary needs `tokio` with the
//! `macros` and `rt-multi-thread` features. Each test is also a public function here,
//! for a backend that wants to run one differently.
//!
//! The tests live in one module per part of the store (requests, events, log, tokens,
//! feed, documents, settings, imports), beside the fixtures they share; everything a
//! backend calls is re-exported here.

// Test code compiled into the library only under the `testsuite` feature: failing loudly
// is its job.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod audit;
mod collection;
mod doc_writes;
mod docs;
mod events;
mod feed;
mod fixtures;
mod imports;
mod log;
mod requests;
mod settings;
mod tokens;

pub use audit::audit_reads_rows_as_stored_and_holds_them_to_the_log;
pub use collection::{
    modify_retries_until_every_writer_is_in, typed_docs_round_trip_and_refuse_bad_bodies,
};
pub use doc_writes::{
    concurrent_doc_writes_one_wins, doc_ids_and_keys_are_unique, doc_update_is_compare_and_swap,
    doc_writes_append_events_atomically,
};
pub use docs::{doc_delete_and_delete_prefix, doc_list_recent_is_latest_first, docs_round_trip};
pub use events::{
    append_event_returns_the_next_seq, erased_payloads_leave_the_log_intact,
    events_are_gap_free_and_exact, events_of_subject_in_order, payloads_are_kept_beside_entries,
};
pub use feed::{change_feed_polls_without_poke, change_feed_wakes_watchers_on_poke};
pub use fixtures::{
    agent, approver, assert_tree, at, decide, doc, doc_event, fill_log, grow, leaves, new_request,
    read_nodes, recorded_decision, salt, seal_event, sealed, signer, token, token_revoked,
};
pub use imports::imports_copy_rows_without_events;
pub use log::{
    checkpoints_one_per_size, concurrent_integrators_one_wins, concurrent_log_origins_agree,
    integration_stores_the_tree, integration_with_its_checkpoint_is_one_write,
    log_origin_first_wins,
};
pub use requests::{
    apply_is_compare_and_swap, concurrent_idempotent_creates_make_one_request,
    create_decided_writes_both_or_neither, duplicate_request_id_is_refused, expiry_queries,
    first_decision_wins, idempotent_create_returns_existing, list_requests_filters_and_order,
    request_round_trip,
};
pub use settings::meta_set_once_first_writer_wins;
pub use tokens::{
    SCHEMA_1_TOKENS, token_names_expiry_and_scopes, tokens, tokens_of_schema_1_keep_working,
};

/// Expands into one `#[tokio::test]` per suite test; see the [module docs](crate::testsuite).
#[macro_export]
macro_rules! store_test_suite {
    ($factory:expr) => {
        $crate::store_test_suite!(@each $factory;
            request_round_trip,
            idempotent_create_returns_existing,
            concurrent_idempotent_creates_make_one_request,
            duplicate_request_id_is_refused,
            create_decided_writes_both_or_neither,
            apply_is_compare_and_swap,
            first_decision_wins,
            events_are_gap_free_and_exact,
            payloads_are_kept_beside_entries,
            events_of_subject_in_order,
            append_event_returns_the_next_seq,
            log_origin_first_wins,
            concurrent_log_origins_agree,
            integration_stores_the_tree,
            erased_payloads_leave_the_log_intact,
            concurrent_integrators_one_wins,
            integration_with_its_checkpoint_is_one_write,
            checkpoints_one_per_size,
            expiry_queries,
            list_requests_filters_and_order,
            tokens,
            token_names_expiry_and_scopes,
            change_feed_wakes_watchers_on_poke,
            change_feed_polls_without_poke,
            docs_round_trip,
            doc_ids_and_keys_are_unique,
            doc_update_is_compare_and_swap,
            concurrent_doc_writes_one_wins,
            doc_writes_append_events_atomically,
            doc_delete_and_delete_prefix,
            doc_list_recent_is_latest_first,
            meta_set_once_first_writer_wins,
            imports_copy_rows_without_events,
            typed_docs_round_trip_and_refuse_bad_bodies,
            modify_retries_until_every_writer_is_in,
            audit_reads_rows_as_stored_and_holds_them_to_the_log,
        );
    };
    (@each $factory:expr; $($test:ident),+ $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $test() {
                let (store, _guard) = $factory.await;
                $crate::testsuite::$test(store).await;
            }
        )+
    };
}
