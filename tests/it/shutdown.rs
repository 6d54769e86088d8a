//! SIGTERM drains, SIGINT exits fast; the real binary with real signals.

use std::time::{Duration, Instant};

use crate::common::pg::{Cluster, connect};
use crate::common::proxy::ProxyProcess;

#[tokio::test]
async fn idle_session_gets_57p01_on_sigterm_and_transaction_may_commit_first() {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let admin = cluster.admin(&db).await;
    admin.batch_execute("CREATE TABLE t (v int)").await.unwrap();
    let mut proxy = ProxyProcess::start_for(cluster.port(), "shutdown_grace = 20");
    let idle = connect(proxy.port(), &db, "").await;
    let busy = connect(proxy.port(), &db, "").await;
    busy.batch_execute("BEGIN; INSERT INTO t VALUES (1)").await.unwrap();
    proxy.sigterm();
    // The idle session is closed at once with 57P01.
    let mut idle_code = None;
    for _ in 0..50 {
        match idle.simple_query("SELECT 1").await {
            Err(e) => {
                idle_code = Some(e.code().map(|c| c.code().to_owned()).unwrap_or_else(|| e.to_string()));
                break;
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let idle_code = idle_code.expect("idle session was not closed");
    assert!(idle_code == "57P01" || idle_code.contains("closed"), "{idle_code}");
    // New connections are refused: the listener is closed.
    assert!(
        tokio_postgres::connect(
            &format!("host=127.0.0.1 port={} user=postgres dbname={db}", proxy.port()),
            tokio_postgres::NoTls
        )
        .await
        .is_err()
    );
    // The session inside a transaction finishes it.
    busy.batch_execute("INSERT INTO t VALUES (2); COMMIT").await.unwrap();
    let n: i64 = admin.query_one("SELECT count(*) FROM t", &[]).await.unwrap().get(0);
    assert_eq!(n, 2);
    let status = proxy
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("pgfence did not exit after draining");
    assert!(status.success(), "{status:?}");
    assert!(busy.simple_query("SELECT 1").await.is_err());
}

#[tokio::test]
async fn grace_period_ends_open_transactions() {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let admin = cluster.admin(&db).await;
    admin.batch_execute("CREATE TABLE t (v int)").await.unwrap();
    let mut proxy = ProxyProcess::start_for(cluster.port(), "shutdown_grace = 1");
    let busy = connect(proxy.port(), &db, "").await;
    busy.batch_execute("BEGIN; INSERT INTO t VALUES (1)").await.unwrap();
    let started = Instant::now();
    proxy.sigterm();
    let status = proxy.wait_exit(Duration::from_secs(10)).await.expect("no exit");
    assert!(status.success());
    assert!(started.elapsed() < Duration::from_secs(8));
    let err = busy.simple_query("COMMIT").await.unwrap_err();
    assert!(err.code().is_none_or(|c| c.code() == "57P01"), "{err}");
    let n: i64 = admin.query_one("SELECT count(*) FROM t", &[]).await.unwrap().get(0);
    assert_eq!(n, 0, "the cut transaction must roll back");
}

#[tokio::test]
async fn sigint_closes_everything_within_a_second() {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let mut proxy = ProxyProcess::start_for(cluster.port(), "");
    let busy = connect(proxy.port(), &db, "").await;
    busy.batch_execute("BEGIN").await.unwrap();
    let started = Instant::now();
    proxy.sigint();
    proxy.wait_exit(Duration::from_secs(5)).await.expect("no exit");
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
}
