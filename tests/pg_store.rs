//! The PostgreSQL store against a real server: the store's contract
//! (`support/store_contract.rs`, which `tests/sqlite_store.rs` runs on SQLite), and what is
//! PostgreSQL's own: fencing, recovery by the lease's new holder, concurrent migration, a
//! lost connection, the cluster's leases. Ignored unless asked:
//! `AGUI_TEST_PG_URL='host=/tmp/pg port=5432 user=postgres dbname=postgres' cargo test --test
//! pg_store -- --ignored`. The URL's user must be able to create databases: each test makes
//! its own (`agui_test_<uuid>`) and drops it at the end, so the tests run in parallel.

#[path = "support/store_contract.rs"]
mod store_contract;

use agui_serve::cluster::{Claim, Cluster, ClusterConfig};
use agui_serve::store::{Fence, Store, StoreError};
use store_contract::user;
use tokio_postgres::{Client, NoTls};

fn base_url() -> String {
    std::env::var("AGUI_TEST_PG_URL").expect(
        "AGUI_TEST_PG_URL is not set: these tests need a PostgreSQL server whose user may \
         create databases, e.g. AGUI_TEST_PG_URL='host=/tmp/pg port=5432 user=postgres dbname=postgres'",
    )
}

/// `url` naming database `db` instead (a later `dbname` wins in either form).
fn with_db(url: &str, db: &str) -> String {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}dbname={db}")
    } else {
        format!("{url} dbname={db}")
    }
}

async fn client(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("connect to AGUI_TEST_PG_URL");
    tokio::spawn(connection);
    client
}

/// A fresh, empty database for one test; dropped with it (best effort).
struct Db {
    name: String,
    url: String,
}

impl Db {
    async fn new() -> Db {
        let name = format!("agui_test_{}", uuid::Uuid::new_v4().simple());
        client(&base_url())
            .await
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create database");
        Db {
            url: with_db(&base_url(), &name),
            name,
        }
    }

    async fn store(&self, fence: &Fence) -> Store {
        Store::connect_postgres(&self.url, fence.clone())
            .await
            .expect("connect_postgres")
    }

    async fn admin(&self) -> Client {
        client(&self.url).await
    }

    async fn drop(self) {
        let _ = client(&base_url())
            .await
            .batch_execute(&format!("DROP DATABASE {} WITH (FORCE)", self.name))
            .await;
    }
}

/// Gives `fence`'s node the lease on `key` (epoch 1, a minute long), in the database and
/// in the fence.
async fn lease(admin: &Client, fence: &Fence, key: &str) {
    admin
        .execute(
            "INSERT INTO leases (thread_key, node, epoch, expires_at)
             VALUES ($1, $2, 1, agui_now_ms() + 60000)",
            &[&key, &fence.node()],
        )
        .await
        .expect("lease");
    fence.hold(key, 1);
}

/// A fresh database with a store on it as node `n1`: what each contract of the store runs
/// on, this node taking the lease of each thread before its first write.
struct Fresh {
    db: Db,
    fence: Fence,
    store: Store,
    admin: Client,
}

impl Fresh {
    async fn new() -> Fresh {
        let db = Db::new().await;
        let fence = Fence::new("n1");
        let store = db.store(&fence).await;
        let admin = db.admin().await;
        Fresh {
            db,
            fence,
            store,
            admin,
        }
    }

    /// Takes `key`'s lease for this node.
    async fn hold(&self, key: &str) {
        lease(&self.admin, &self.fence, key).await;
    }

    async fn drop(self) {
        drop(self.store);
        self.db.drop().await;
    }
}

#[tokio::test]
#[ignore = "needs PostgreSQL: AGUI_TEST_PG_URL"]
async fn threads_messages_and_runs_round_trip() {
    let on = Fresh::new().await;
    store_contract::threads_messages_and_runs_round_trip(&on.store, async |key: &str| {
        on.hold(key).await
    })
    .await;
    assert_eq!(on.store.queue_depth(), 0);
    on.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: AGUI_TEST_PG_URL"]
async fn a_threads_state_is_kept() {
    let on = Fresh::new().await;
    store_contract::a_threads_state_is_kept(&on.store, async |key: &str| on.hold(key).await).await;
    on.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: AGUI_TEST_PG_URL"]
async fn a_rewind_cuts_the_transcript_and_lets_the_session_go() {
    let on = Fresh::new().await;
    store_contract::a_rewind_cuts_the_transcript_and_lets_the_session_go(
        &on.store,
        async |key: &str| on.hold(key).await,
    )
    .await;
    on.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: AGUI_TEST_PG_URL"]
async fn a_principal_s_spending_is_added_up_per_day() {
    let on = Fresh::new().await;
    store_contract::a_principal_s_spending_is_added_up_per_day(&on.store).await;
    on.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: AGUI_TEST_PG_URL"]
async fn a_threads_queue_is_kept_in_order() {
    let on = Fresh::new().await;
    store_contract::a_threads_queue_is_kept_in_order(&on.store, async |key: &str| {
        on.hold(key).await
    })
    .await;
    on.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: AGUI_TEST_PG_URL"]
async fn archived_threads_are_listed_only_when_asked() {
    let on = Fresh::new().await;
    store_contract::archived_threads_are_listed_only_when_asked(&on.store, async |key: &str| {
        on.hold(key).await
    })
    .await;
    on.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: AGUI_TEST_PG_URL"]
async fn listing_pages_newest_first_with_agent_filter() {
    let on = Fresh::new().await;
    store_contract::listing_pages_newest_first_with_agent_filter(&on.store, async |key: &str| {
        on.hold(key).await
    })
    .await;
    on.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: AGUI_TEST_PG_URL"]
async fn owners_keep_their_own_threads() {
    let on = Fresh::new().await;
    store_contract::owners_keep_their_own_threads(&on.store, async |key: &str| on.hold(key).await)
        .await;
    on.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: AGUI_TEST_PG_URL"]
async fn recover_thread_marks_only_that_threads_live_runs() {
    let on = Fresh::new().await;
    store_contract::recover_thread_marks_only_that_threads_live_runs(
        &on.store,
        async |key: &str| on.hold(key).await,
    )
    .await;
    on.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: AGUI_TEST_PG_URL"]
async fn webhook_outbox_claims_in_order_per_thread() {
    let on = Fresh::new().await;
    store_contract::webhook_outbox_claims_in_order_per_thread(&on.store, async |key: &str| {
        on.hold(key).await
    })
    .await;
    on.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: AGUI_TEST_PG_URL"]
async fn group_commit_keeps_order_under_load() {
    let on = Fresh::new().await;
    store_contract::group_commit_keeps_order_under_load(&on.store, async |key: &str| {
        on.hold(key).await
    })
    .await;
    on.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: AGUI_TEST_PG_URL"]
async fn writes_without_the_lease_are_refused_and_the_thread_marked_lost() {
    let db = Db::new().await;
    let fence = Fence::new("n1");
    let store = db.store(&fence).await;
    let admin = db.admin().await;

    // Not held by this node: refused before the database.
    store.record_run_start("none", "a", None, "r", vec![user("u", "x")], 1);
    store.commit().await.expect("commit");
    assert_eq!(store.queue_depth(), 0);
    assert!(store.thread("none").await.expect("read").is_none());
    assert!(fence.is_lost("none"));

    // Held in the fence, but no lease row: refused in the database, marked lost.
    fence.hold("ghost", 1);
    store.record_run_start("ghost", "a", None, "r", vec![], 1);
    store
        .commit()
        .await
        .expect("a refusal is not a failed commit");
    assert!(store.thread("ghost").await.expect("read").is_none());
    assert!(fence.is_lost("ghost"));

    // With the right lease: stored.
    lease(&admin, &fence, "a").await;
    lease(&admin, &fence, "b").await;
    store.record_run_start("a", "x", None, "r", vec![user("a1", "x")], 1);
    store.record_run_start("b", "x", None, "r", vec![user("b1", "x")], 1);
    store.commit().await.expect("commit");
    assert!(!fence.is_lost("a") && !fence.is_lost("b"));

    // Another node takes `a`: this node's next write for it is refused and marks it lost,
    // while `b`'s write in the same batch commits.
    admin
        .execute(
            "UPDATE leases SET node = 'other', epoch = epoch + 1 WHERE thread_key = 'a'",
            &[],
        )
        .await
        .expect("take over");
    store.record_messages("a", vec![user("a2", "late")], 2);
    store.record_messages("b", vec![user("b2", "fine")], 2);
    store.set_title("b", "still mine", 2);
    store.commit().await.expect("commit");
    assert!(fence.is_lost("a"));
    assert!(!fence.is_lost("b"));
    let a = store.thread("a").await.expect("read").expect("there");
    assert_eq!((a.message_count, a.updated_at), (1, 1));
    let b = store.thread("b").await.expect("read").expect("there");
    assert_eq!((b.message_count, b.updated_at), (2, 2));
    assert_eq!(b.title.as_deref(), Some("still mine"));

    // An expired lease refuses too.
    admin
        .execute(
            "INSERT INTO leases (thread_key, node, epoch, expires_at)
             VALUES ('e', $1, 7, agui_now_ms() - 1)",
            &[&fence.node()],
        )
        .await
        .expect("lease");
    fence.hold("e", 7);
    store.record_run_start("e", "x", None, "r", vec![], 3);
    store.commit().await.expect("commit");
    assert!(fence.is_lost("e"));
    assert!(store.thread("e").await.expect("read").is_none());

    // Deletes are fenced too: not once the lease is lost, yes while it is held.
    assert!(matches!(
        store.delete_thread("a").await,
        Err(StoreError::LeaseLost)
    ));
    assert!(store.thread("a").await.expect("read").is_some());
    assert!(store.delete_thread("b").await.expect("delete"));
    drop(store);
    db.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: AGUI_TEST_PG_URL"]
async fn connecting_recovers_nothing_and_recover_thread_recovers_one_thread() {
    let db = Db::new().await;
    let fence = Fence::new("n1");
    let store = db.store(&fence).await;
    let admin = db.admin().await;
    for key in ["t1", "t2"] {
        lease(&admin, &fence, key).await;
        store.record_run_start(key, "a", None, "r1", vec![user("u", "x")], 1);
        store.record_run_end(key, "r1", "finished", "idle", 2);
        store.record_run_start(key, "a", None, "r2", vec![], 3);
    }
    store.commit().await.expect("commit");

    // Another node connecting leaves live runs alone.
    let other = db.store(&Fence::new("n2")).await;
    let row = other.thread("t1").await.expect("read").expect("there");
    assert_eq!(row.status, "running");
    assert_eq!(row.last_run.expect("run").outcome, None);

    // Recovery is fenced: only the node that took the lease over recovers.
    let other_fence = Fence::new("n2");
    let other = db.store(&other_fence).await;
    assert!(matches!(
        other.recover_thread("t1").await,
        Err(StoreError::LeaseLost)
    ));
    for key in ["t1", "missing"] {
        admin
            .execute(
                "INSERT INTO leases (thread_key, node, epoch, expires_at)
                 VALUES ($1, 'n2', 2, agui_now_ms() + 60000)
                 ON CONFLICT (thread_key) DO UPDATE SET node = 'n2', epoch = 2,
                     expires_at = agui_now_ms() + 60000",
                &[&key],
            )
            .await
            .expect("take over");
        other_fence.hold(key, 2);
    }
    assert_eq!(other.recover_thread("t1").await.expect("recover"), 1);
    let row = other.thread("t1").await.expect("read").expect("there");
    assert_eq!(row.status, "idle");
    let run = row.last_run.expect("run");
    assert_eq!(
        (run.id.as_str(), run.outcome.as_deref()),
        ("r2", Some("interrupted"))
    );
    assert!(run.ended_at.is_some());
    assert_eq!(other.recover_thread("t1").await.expect("recover"), 0);
    assert_eq!(other.recover_thread("missing").await.expect("recover"), 0);
    let untouched = store.thread("t2").await.expect("read").expect("there");
    assert_eq!(untouched.status, "running");
    drop((store, other));
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: AGUI_TEST_PG_URL"]
async fn nodes_starting_together_migrate_an_empty_database_once() {
    let db = Db::new().await;
    let connects = (0..6).map(|i| {
        let url = db.url.clone();
        tokio::spawn(
            async move { Store::connect_postgres(&url, Fence::new(&format!("n{i}"))).await },
        )
    });
    let stores = futures_util::future::join_all(connects).await;
    for store in &stores {
        store.as_ref().expect("task").as_ref().expect("connect");
    }
    let admin = db.admin().await;
    let versions: Vec<i32> = admin
        .query(
            "SELECT version FROM schema_migrations ORDER BY version",
            &[],
        )
        .await
        .expect("versions")
        .iter()
        .map(|r| r.get(0))
        .collect();
    // Every migration the build ships, each applied once.
    let shipped = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/postgres"))
        .expect("migrations")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "sql"))
        })
        .count() as i32;
    assert_eq!(versions, (1..=shipped).collect::<Vec<_>>());

    // A database migrated by a newer build is refused.
    admin
        .execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES (99, 0)",
            &[],
        )
        .await
        .expect("insert");
    match Store::connect_postgres(&db.url, Fence::new("n9")).await {
        Err(StoreError::TooNew(99)) => {}
        other => panic!("expected TooNew(99), got {other:?}"),
    }
    drop(stores);
    db.drop().await;
}

#[tokio::test]
#[ignore = "needs PostgreSQL: AGUI_TEST_PG_URL"]
async fn a_lost_connection_fails_the_commit_and_the_next_batch_reconnects() {
    let db = Db::new().await;
    let fence = Fence::new("n1");
    let store = db.store(&fence).await;
    let admin = db.admin().await;
    lease(&admin, &fence, "t").await;
    store.record_run_start("t", "a", None, "r", vec![user("u1", "x")], 1);
    store.commit().await.expect("commit");
    let killed = admin
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = 'agui-serve'",
            &[],
        )
        .await
        .expect("terminate");
    assert_eq!(killed.len(), 1);
    // Let the client see its connection closed.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    store.record_messages("t", vec![user("u2", "lost")], 2);
    // Either the batch ran on the dead connection and failed, or the writer reconnected
    // first and it committed; never a silent loss.
    let first = store.commit().await;
    store.record_messages("t", vec![user("u3", "kept")], 3);
    store.commit().await.expect("the next batch reconnects");
    let loaded = store.load_thread("t").await.expect("read").expect("there");
    let ids: Vec<_> = loaded
        .transcript
        .iter()
        .map(|m| m.id().to_owned())
        .collect();
    match first {
        Err(StoreError::Commit) => assert_eq!(ids, ["u1", "u3"]),
        Ok(()) => assert_eq!(ids, ["u1", "u2", "u3"]),
        Err(other) => panic!("unexpected {other}"),
    }
    drop(store);
    db.drop().await;
}

/// A cluster node's lease layer on the test database (the store made the tables).
async fn node(db: &Db, name: &str, ttl_ms: u64) -> (Cluster, Store) {
    let fence = Fence::new(&Cluster::process_id(name));
    let store = db.store(&fence).await;
    let cluster = Cluster::join(
        ClusterConfig {
            url: db.url.clone(),
            node_name: name.to_owned(),
            advertise: format!("http://{name}.invalid:8443"),
            lease_ttl: std::time::Duration::from_millis(ttl_ms),
            cert: Some(format!("{name}-cert").into_bytes()),
        },
        fence,
    )
    .await
    .expect("join");
    (cluster, store)
}

#[tokio::test]
#[ignore = "needs PostgreSQL: AGUI_TEST_PG_URL"]
async fn leases_one_owner_at_a_time_fenced_taken_over_once_lapsed() {
    let db = Db::new().await;
    let (a, a_store) = node(&db, "a", 1_000).await;
    let (b, _b_store) = node(&db, "b", 1_000).await;

    // Many claims at once on one node: one holding, never a takeover of itself.
    let claims = futures_util::future::join_all((0..8).map(|_| a.claim("t"))).await;
    for claim in &claims {
        assert_eq!(
            claim.as_ref().expect("claim"),
            &Claim::Mine {
                epoch: 1,
                taken_over: false
            }
        );
    }
    a_store.record_run_start("t", "demo", None, "r1", vec![user("u1", "hi")], 1);
    a_store.commit().await.expect("commit");
    assert!(!a.fence().is_lost("t"));

    // Another node is told who owns it, with the address to send the request to.
    match b.claim("t").await.expect("claim") {
        Claim::Elsewhere(owner) => {
            assert_eq!(owner.node, a.node());
            assert_eq!(owner.address, "http://a.invalid:8443");
            assert_eq!(owner.cert.as_deref(), Some(&b"a-cert"[..]));
            assert!(owner.expires_in <= std::time::Duration::from_millis(1_000));
        }
        other => panic!("b claimed a live lease: {other:?}"),
    }
    assert_eq!(
        b.owner_elsewhere("t").await.expect("owner").map(|o| o.node),
        Some(a.node().to_owned())
    );
    assert_eq!(
        b.peers().await.expect("peers"),
        [("http://a.invalid:8443".to_owned(), Some(b"a-cert".to_vec()))]
    );

    // Renewal keeps it; without renewal it lapses and b takes it over (epoch 2).
    assert!(a.renew(&["t".to_owned()]).await.expect("renew").is_empty());
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    assert_eq!(b.orphans(10).await.expect("orphans"), ["t"]);
    assert_eq!(
        b.claim("t").await.expect("claim"),
        Claim::Mine {
            epoch: 2,
            taken_over: true
        }
    );
    // The old owner's renewal reports the loss, and its writes are refused from now on.
    assert_eq!(a.renew(&["t".to_owned()]).await.expect("renew"), ["t"]);
    assert!(a.fence().is_lost("t"));
    a_store.record_messages("t", vec![user("late", "too late")], 2);
    a_store.commit().await.expect("commit");
    let (stored, _) = a_store
        .messages("t", 10)
        .await
        .expect("read")
        .expect("there");
    assert_eq!(stored.len(), 1, "{stored:?}");

    // Leaving gives every lease back and takes no more.
    assert_eq!(b.leave().await.expect("leave"), 1);
    assert!(b.claim("u").await.is_err());
    assert_eq!(
        a.claim("t").await.expect("claim"),
        Claim::Mine {
            epoch: 1,
            taken_over: false
        }
    );
    drop((a, b, a_store));
    db.drop().await;
}

/// Two nodes on one database drain one endpoint's webhook outbox together: every event is
/// claimed by exactly one of them, each thread's events one after the other in order, and
/// a node that dies holding claims leaves its events to the other once the claims lapse.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: AGUI_TEST_PG_URL"]
async fn two_nodes_deliver_each_webhook_event_once_in_order_per_thread() {
    use agui_serve::store::{Attempt, Outgoing};
    use std::sync::{Arc, Mutex};
    let db = Db::new().await;
    let (f1, f2) = (Fence::new("n1"), Fence::new("n2"));
    let (s1, s2) = (db.store(&f1).await, db.store(&f2).await);
    let admin = db.admin().await;
    let threads = 10;
    let per_thread = 8;
    for t in 0..threads {
        lease(&admin, &f1, &format!("t{t}")).await;
    }
    for n in 0..per_thread {
        for t in 0..threads {
            s1.add_outgoing(Outgoing {
                id: format!("t{t}-e{n}"),
                thread: format!("t{t}"),
                kind: "run.finished".to_owned(),
                body: "{}".to_owned(),
                created_at: n,
                endpoints: vec!["a".to_owned()],
            });
        }
    }
    s1.commit().await.expect("commit");

    // A node that claims and dies: nobody else takes its events until the claims lapse.
    let dead = s2.claim_outgoing("a", "dead", 3, 700).await.expect("claim");
    assert_eq!(dead.rows.len(), 3);
    let held: Vec<String> = dead.rows.iter().map(|r| r.id.clone()).collect();
    let others = s1
        .claim_outgoing("a", "n1", 100, 60_000)
        .await
        .expect("claim");
    assert_eq!(
        others.rows.len(),
        threads as usize - 3,
        "only the heads not held"
    );
    assert!(others.rows.iter().all(|r| !held.contains(&r.id)));
    let release: Vec<Attempt> = others
        .rows
        .iter()
        .map(|r| Attempt {
            id: r.id.clone(),
            endpoint: "a".to_owned(),
            failed: Some(("released".to_owned(), 0)),
        })
        .collect();
    s1.record_attempts("n1", release).await.expect("release");
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;

    // Two nodes deliver everything, claiming a few at a time.
    let log: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let worker = |store: Store, node: &'static str| {
        let log = log.clone();
        tokio::spawn(async move {
            let mut idle = 0;
            while idle < 20 {
                let claims = store
                    .claim_outgoing("a", node, 4, 60_000)
                    .await
                    .expect("claim");
                if claims.rows.is_empty() {
                    idle += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
                idle = 0;
                let mut attempts = Vec::new();
                for row in claims.rows {
                    log.lock()
                        .expect("log")
                        .push((node.to_owned(), row.id.clone()));
                    attempts.push(Attempt {
                        id: row.id,
                        endpoint: "a".to_owned(),
                        failed: None,
                    });
                }
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                store.record_attempts(node, attempts).await.expect("record");
            }
        })
    };
    let (w1, w2) = (worker(s1.clone(), "n1"), worker(s2.clone(), "n2"));
    w1.await.expect("n1");
    w2.await.expect("n2");
    let log = log.lock().expect("log").clone();
    assert_eq!(log.len(), (threads * per_thread) as usize, "{log:?}");
    let ids: std::collections::HashSet<&str> = log.iter().map(|(_, id)| id.as_str()).collect();
    assert_eq!(ids.len(), log.len(), "each event claimed once");
    for node in ["n1", "n2"] {
        assert!(
            log.iter().any(|(n, _)| n == node),
            "{node} delivered none: {log:?}"
        );
    }
    for t in 0..threads {
        let order: Vec<&str> = log
            .iter()
            .map(|(_, id)| id.as_str())
            .filter(|id| id.starts_with(&format!("t{t}-")))
            .collect();
        let expected: Vec<String> = (0..per_thread).map(|n| format!("t{t}-e{n}")).collect();
        assert_eq!(order, expected, "thread t{t}");
    }
    let summary = s2.outbox_summary().await.expect("summary");
    assert_eq!(summary[0].pending, 0);
    drop((s1, s2));
}

#[tokio::test]
#[ignore = "needs PostgreSQL: AGUI_TEST_PG_URL"]
async fn schedules_are_kept_per_owner_and_claimed_once() {
    let on = Fresh::new().await;
    store_contract::schedules_are_kept_per_owner_and_claimed_once(&on.store).await;
    on.drop().await;
}

/// Two nodes' stores on one database claim the same occurrences at once: one claim each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs PostgreSQL: AGUI_TEST_PG_URL"]
async fn concurrent_claims_of_one_occurrence_let_one_through() {
    let db = Db::new().await;
    let a = db.store(&Fence::new("a")).await;
    let b = db.store(&Fence::new("b")).await;
    store_contract::concurrent_claims_of_one_occurrence_let_one_through(&[a.clone(), b.clone()])
        .await;
    drop((a, b));
    db.drop().await;
}
