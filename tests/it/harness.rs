//! Checks of the test scaffolding itself, so a broken harness fails here, by name, rather than as
//! a puzzle in a proxy test.

use std::time::Duration;

use crate::common::pg::{Cluster, config, connect, connect_config, try_connect};

#[tokio::test]
async fn shared_cluster_gives_each_test_its_own_database() {
    let cluster = Cluster::shared();
    let first = cluster.fresh_db().await;
    let second = cluster.fresh_db().await;
    assert_ne!(first, second);

    let client = connect(cluster.port(), &first, "").await;
    let row = client
        .query_one("SELECT current_database(), 40 + 2", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), first);
    assert_eq!(row.get::<_, i32>(1), 42);

    // Tests declare epochs through libpq `options`; check it reaches the server.
    let client = connect(cluster.port(), &second, "-c pgfence.epoch=7").await;
    let row = client.query_one("SHOW pgfence.epoch", &[]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "7");
}

#[tokio::test]
async fn private_cluster_survives_immediate_restart_and_applies_hba() {
    let cluster = Cluster::start();
    let db = cluster.fresh_db().await;
    let client = connect(cluster.port(), &db, "").await;
    client
        .batch_execute("CREATE TABLE t (v int); INSERT INTO t VALUES (1)")
        .await
        .unwrap();

    cluster.restart_immediate();
    assert!(
        client.simple_query("SELECT 1").await.is_err(),
        "restart must cut open sessions"
    );
    let client = connect(cluster.port(), &db, "").await;
    let v: i32 = client.query_one("SELECT v FROM t", &[]).await.unwrap().get(0);
    assert_eq!(v, 1, "a committed row survives an immediate restart");

    cluster
        .set_hba_and_reload(&["host all alice 127.0.0.1/32 reject", "host all all 127.0.0.1/32 trust"])
        .await;
    client.batch_execute("CREATE ROLE alice LOGIN").await.unwrap();
    let mut alice = config(cluster.port(), &db);
    alice.user("alice").connect_timeout(Duration::from_secs(5));
    let err = connect_config(&alice).await.expect_err("pg_hba.conf rejects alice");
    assert_eq!(err.code().map(|c| c.code()), Some("28000"), "{err}");
    assert!(
        try_connect(cluster.port(), &db, "").await.is_ok(),
        "other users still get in"
    );
}
