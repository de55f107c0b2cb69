//! The store's contract (`support/store_contract.rs`) on the embedded SQLite store, each
//! test on a fresh data directory. The SQLite store's own tests (migrations, the WAL's
//! bound, recovery at open) are beside it, in `src/store/sqlite/tests.rs`.

#[path = "support/store_contract.rs"]
mod store_contract;

use std::path::PathBuf;

use agui_serve::store::Store;

/// A store on a fresh data directory, removed with it.
struct Fresh {
    store: Store,
    dir: PathBuf,
}

impl std::ops::Deref for Fresh {
    type Target = Store;
    fn deref(&self) -> &Store {
        &self.store
    }
}

impl Drop for Fresh {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn open() -> Fresh {
    let dir: PathBuf = std::env::temp_dir().join(format!("agui-store-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("dir");
    Fresh {
        store: Store::open(&dir).expect("open"),
        dir,
    }
}

/// Every thread is writable: the embedded store has no leases.
async fn any(_: &str) {}

#[tokio::test]
async fn threads_messages_and_runs_round_trip() {
    store_contract::threads_messages_and_runs_round_trip(&open(), any).await;
}

#[tokio::test]
async fn a_threads_state_is_kept() {
    store_contract::a_threads_state_is_kept(&open(), any).await;
}

#[tokio::test]
async fn a_rewind_cuts_the_transcript_and_lets_the_session_go() {
    store_contract::a_rewind_cuts_the_transcript_and_lets_the_session_go(&open(), any).await;
}

#[tokio::test]
async fn a_principal_s_spending_is_added_up_per_day() {
    store_contract::a_principal_s_spending_is_added_up_per_day(&open()).await;
}

#[tokio::test]
async fn a_threads_queue_is_kept_in_order() {
    store_contract::a_threads_queue_is_kept_in_order(&open(), any).await;
}

#[tokio::test]
async fn archived_threads_are_listed_only_when_asked() {
    store_contract::archived_threads_are_listed_only_when_asked(&open(), any).await;
}

#[tokio::test]
async fn listing_pages_newest_first_with_agent_filter() {
    store_contract::listing_pages_newest_first_with_agent_filter(&open(), any).await;
}

#[tokio::test]
async fn owners_keep_their_own_threads() {
    store_contract::owners_keep_their_own_threads(&open(), any).await;
}

#[tokio::test]
async fn recover_thread_marks_only_that_threads_live_runs() {
    store_contract::recover_thread_marks_only_that_threads_live_runs(&open(), any).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_commit_keeps_order_under_load() {
    store_contract::group_commit_keeps_order_under_load(&open(), any).await;
}

#[tokio::test]
async fn webhook_outbox_claims_in_order_per_thread() {
    store_contract::webhook_outbox_claims_in_order_per_thread(&open(), any).await;
}

#[tokio::test]
async fn schedules_are_kept_per_owner_and_claimed_once() {
    store_contract::schedules_are_kept_per_owner_and_claimed_once(&open()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claims_of_one_occurrence_let_one_through() {
    let fresh = open();
    store_contract::concurrent_claims_of_one_occurrence_let_one_through(std::slice::from_ref(
        &fresh.store,
    ))
    .await;
}
