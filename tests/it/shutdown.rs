//! SIGTERM drains, SIGINT exits fast; the real binary with real signals.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::pg::{Cluster, connect};
use crate::common::proxy::ProxyProcess;
use crate::common::raw::{Raw, codes, query, startup_packet};

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

/// A stand-in upstream on a free port: reads each connection's startup packet, writes
/// `answer` (nothing: a hung server) and then holds the connection open without a word.
async fn silent_upstream(answer: &'static [u8]) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut len = [0u8; 4];
                if s.read_exact(&mut len).await.is_err() {
                    return;
                }
                let mut body = vec![0u8; u32::from_be_bytes(len) as usize - 4];
                let _ = s.read_exact(&mut body).await;
                let _ = s.write_all(answer).await;
                // Hold the connection until the peer closes it.
                let mut sink = [0u8; 256];
                while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
            });
        }
    });
    port
}

/// AuthenticationCleartextPassword: the client must answer before anything else happens.
const ASK_PASSWORD: &[u8] = b"R\0\0\0\x08\0\0\0\x03";

#[tokio::test]
async fn clients_still_logging_in_do_not_hold_up_shutdown() {
    let upstream = silent_upstream(ASK_PASSWORD).await;
    for signal in ["TERM", "INT"] {
        let mut proxy = ProxyProcess::start_for(upstream, "shutdown_grace = 30");
        // One client connected and said nothing (a health check); one is asked for its
        // password and does not answer.
        let mut silent = Raw::connect(proxy.port()).await;
        let mut asked = Raw::connect(proxy.port()).await;
        asked
            .send(&startup_packet(&[("user", "postgres"), ("database", "x")]))
            .await;
        let request = asked.read().await.expect("the password request");
        assert_eq!(request.tag, b'R');
        let started = Instant::now();
        proxy.signal(signal);
        let status = proxy.wait_exit(Duration::from_secs(10)).await;
        assert!(
            status.is_some_and(|s| s.success()),
            "SIG{signal}: {status:?}\n{}",
            proxy.log()
        );
        assert!(
            started.elapsed() < Duration::from_millis(2500),
            "SIG{signal}: {:?}",
            started.elapsed()
        );
        // The one past its startup packet is told why; the silent one is just closed.
        let rest = asked.read_until(|_| false).await;
        assert_eq!(codes(&rest), ["57P01"], "SIG{signal}");
        assert!(silent.read().await.is_none());
    }
}

#[tokio::test]
async fn a_client_that_stops_reading_does_not_hold_up_shutdown() {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    for (signal, grace) in [("INT", 30), ("TERM", 1)] {
        let mut proxy = ProxyProcess::start_for(cluster.port(), &format!("shutdown_grace = {grace}"));
        let (mut reader, _) = Raw::startup(proxy.port(), &[("user", "postgres"), ("database", &db)]).await;
        // About 50 MB of result that the client never reads: both socket buffers fill and
        // pgfence's writes to the client block.
        reader
            .send(&query("SELECT repeat('x', 1000) FROM generate_series(1, 50000)"))
            .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        // Another session is unaffected meanwhile.
        let other = connect(proxy.port(), &db, "").await;
        other.simple_query("SELECT 1").await.unwrap();
        let started = Instant::now();
        proxy.signal(signal);
        let status = proxy.wait_exit(Duration::from_secs(15)).await;
        assert!(
            status.is_some_and(|s| s.success()),
            "SIG{signal}: {status:?}\n{}",
            proxy.log()
        );
        // SIGINT: within a second and a bit; SIGTERM: the grace period, then a second for the
        // FATAL that cannot be delivered.
        let bound = Duration::from_millis(if signal == "INT" { 1500 } else { 4000 });
        assert!(started.elapsed() < bound, "SIG{signal}: {:?}", started.elapsed());
        drop(reader);
    }
}

#[tokio::test]
async fn sighup_is_ignored_and_sessions_carry_on() {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let mut proxy = ProxyProcess::start_for(cluster.port(), "");
    let session = connect(proxy.port(), &db, "").await;
    proxy.signal("HUP");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(proxy.try_wait().is_none(), "SIGHUP ended the proxy:\n{}", proxy.log());
    session.simple_query("SELECT 1").await.unwrap();
    connect(proxy.port(), &db, "")
        .await
        .simple_query("SELECT 1")
        .await
        .unwrap();
    assert!(proxy.log().contains("SIGHUP ignored"), "{}", proxy.log());
}

#[tokio::test]
async fn an_upstream_that_accepts_but_never_answers_is_unreachable() {
    let upstream = silent_upstream(b"").await;
    let proxy = ProxyProcess::start_for(upstream, "connect_timeout = 1");
    let started = Instant::now();
    let err = tokio_postgres::connect(
        &format!(
            "host=127.0.0.1 port={} user=postgres dbname=x connect_timeout=30",
            proxy.port()
        ),
        tokio_postgres::NoTls,
    )
    .await
    .err()
    .expect("a silent upstream must not give a session");
    assert_eq!(err.code().map(|c| c.code()), Some("08001"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
}
