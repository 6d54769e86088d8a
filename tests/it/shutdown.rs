//! SIGTERM drains, SIGINT exits fast; the real binary with real signals.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::free_port;
use crate::common::pg::{Cluster, connect};
use crate::common::proxy::{ProxyProcess, proxy_toml};
use crate::common::raw::{Raw, bind, codes, execute, message, parse, query, startup_packet, sync, tags};

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

/// Log lines stderr cannot take (`2>/dev/full`, a log pipe whose reader died) are lost; the
/// proxy serves on and exits as asked. Reporting the failed write on that same stderr
/// panicked the runtime and ended every session.
#[tokio::test]
async fn a_full_stderr_loses_log_lines_not_sessions() {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let config = proxy_toml(free_port(), cluster.port(), "");
    let mut proxy = ProxyProcess::start_after(&config, "exec 2>/dev/full");
    for _ in 0..3 {
        let s = connect(proxy.port(), &db, "").await;
        s.batch_execute("SELECT 1").await.unwrap();
    }
    assert!(proxy.try_wait().is_none(), "the proxy ended");
    proxy.sigterm();
    let status = proxy.wait_exit(Duration::from_secs(5)).await.expect("no exit");
    assert!(status.success(), "{status:?}");
}

/// A stand-in upstream on a free port: reads each connection's startup packet, writes
/// `answer` (nothing: a hung server) and then holds the connection open without a word.
async fn silent_upstream(answer: &'static [u8]) -> u16 {
    upstream_at_startup(answer, true).await
}

/// [`silent_upstream`], or with `hold` false one that closes each connection after its
/// answer.
async fn upstream_at_startup(answer: &'static [u8], hold: bool) -> u16 {
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
                while hold && matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
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
    // SIGQUIT, Postgres' immediate shutdown, closes as SIGINT does.
    for signal in ["TERM", "INT", "QUIT"] {
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

/// SIGHUP (reload, to PgBouncer and Postgres) and SIGUSR1/SIGUSR2 (PgBouncer's PAUSE and
/// RESUME) would end the process by default, dropping every session without a word.
#[tokio::test]
async fn sighup_and_sigusr_are_ignored_and_sessions_carry_on() {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let mut proxy = ProxyProcess::start_for(cluster.port(), "");
    let session = connect(proxy.port(), &db, "").await;
    for signal in ["HUP", "USR1", "USR2"] {
        proxy.signal(signal);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            proxy.try_wait().is_none(),
            "SIG{signal} ended the proxy:\n{}",
            proxy.log()
        );
        session.simple_query("SELECT 1").await.unwrap();
        connect(proxy.port(), &db, "")
            .await
            .simple_query("SELECT 1")
            .await
            .unwrap();
        assert!(proxy.log().contains(&format!("SIG{signal} ignored")), "{}", proxy.log());
    }
}

/// A login through `proxy` that must fail; its error.
async fn login_refused(proxy: &ProxyProcess) -> tokio_postgres::Error {
    let url = format!(
        "host=127.0.0.1 port={} user=postgres password=x dbname=x connect_timeout=30",
        proxy.port()
    );
    tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .err()
        .expect("a failing upstream gives no session")
}

#[tokio::test]
async fn an_upstream_that_accepts_but_never_answers_is_unreachable() {
    let upstream = silent_upstream(b"").await;
    let proxy = ProxyProcess::start_for(upstream, "connect_timeout = 1");
    let started = Instant::now();
    let err = login_refused(&proxy).await;
    assert_eq!(err.code().map(|c| c.code()), Some("08001"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
}

/// An upstream that breaks off or breaks the protocol while the client logs in is the
/// server's fault: the client gets FATAL 08001 saying so, not a bare close or a protocol
/// violation of its own (08P01). (A close right after the client's answer to a request is
/// Postgres refusing that answer, and stays a bare close, as straight to Postgres.)
#[tokio::test]
async fn an_upstream_failing_during_startup_is_reported_as_unreachable() {
    for (answer, hold, says) in [
        (&b""[..], false, "closed the connection during startup"),
        (b"R\0\0\0\x08\0\0", false, "closed the connection during startup"),
        (
            b"R\x7f\xff\xff\xffgarbage",
            true,
            "sent an invalid message during startup",
        ),
        (b"R\0\0\0\x04", true, "sent an invalid message during startup"),
    ] {
        let upstream = upstream_at_startup(answer, hold).await;
        let proxy = ProxyProcess::start_for(upstream, "connect_timeout = 2");
        let err = login_refused(&proxy).await;
        let db = err
            .as_db_error()
            .unwrap_or_else(|| panic!("{answer:?}: no FATAL but {err}"));
        assert_eq!(db.code().code(), "08001", "{answer:?}: {db:?}");
        assert!(db.message().contains(says), "{answer:?}: {db:?}");
    }
}

/// A stand-in upstream that logs the client in, answers its first message with `answer`,
/// and then closes (`close`) or holds the connection. Returns its port.
async fn upstream_answering(answer: Vec<u8>, close: bool) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut len = [0u8; 4];
                if s.read_exact(&mut len).await.is_err() {
                    return;
                }
                let mut body = vec![0u8; u32::from_be_bytes(len) as usize - 4];
                let _ = s.read_exact(&mut body).await;
                // AuthenticationOk, BackendKeyData, ReadyForQuery.
                let _ = s
                    .write_all(b"R\0\0\0\x08\0\0\0\0K\0\0\0\x0c\0\0\x30\x39\0\0\0\x07Z\0\0\0\x05I")
                    .await;
                let mut sink = [0u8; 256];
                if !matches!(s.read(&mut sink).await, Ok(n) if n > 0) {
                    return;
                }
                let _ = s.write_all(&answer).await;
                if !close {
                    while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
                }
            });
        }
    });
    port
}

/// The bytes of a DataRow that says it is 1 000 bytes long, cut after 200.
fn partial_row() -> Vec<u8> {
    let mut row = b"D\0\0\x03\xe8\0\x01\0\0\x03\xde".to_vec();
    row.resize(200, b'y');
    row
}

/// Everything a client gets after logging in and sending one query, until the proxy closes.
async fn bytes_after_query(port: u16, after_query: impl AsyncFnOnce()) -> Vec<u8> {
    let (mut raw, msgs) = Raw::startup(port, &[("user", "postgres"), ("database", "x")]).await;
    assert_eq!(tags(&msgs).chars().last(), Some('Z'), "{msgs:?}");
    raw.send(&query("SELECT repeat('y', 994)")).await;
    // The partial row is in flight; let pgfence forward it before anything else happens.
    tokio::time::sleep(Duration::from_millis(300)).await;
    after_query().await;
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), raw.stream.read_to_end(&mut got)).await;
    assert!(matches!(read, Ok(Ok(_))), "{read:?}");
    got
}

#[tokio::test]
async fn nothing_of_pgfence_follows_part_of_a_message_when_the_upstream_goes() {
    let proxy = ProxyProcess::start_for(upstream_answering(partial_row(), true).await, "");
    let got = bytes_after_query(proxy.port(), async || {}).await;
    // Postgres itself just closes in mid-message; a FATAL after it would be read as the
    // rest of the row.
    assert_eq!(got, partial_row(), "{}", String::from_utf8_lossy(&got));
    // Between messages, the client is still told why.
    let complete = b"C\0\0\0\x0dSELECT 0\0".to_vec();
    let proxy = ProxyProcess::start_for(upstream_answering(complete.clone(), true).await, "");
    let got = bytes_after_query(proxy.port(), async || {}).await;
    assert!(got.starts_with(&complete), "{}", String::from_utf8_lossy(&got));
    let mut raw_rest = got[complete.len()..].to_vec();
    assert_eq!(raw_rest.first(), Some(&b'E'), "{}", String::from_utf8_lossy(&got));
    raw_rest.retain(|&b| b != 0);
    assert!(
        String::from_utf8_lossy(&raw_rest).contains("C08006"),
        "{}",
        String::from_utf8_lossy(&got)
    );
}

#[tokio::test]
async fn nothing_of_pgfence_follows_part_of_a_message_at_shutdown() {
    for signal in ["INT", "TERM"] {
        let mut proxy = ProxyProcess::start_for(upstream_answering(partial_row(), false).await, "shutdown_grace = 1");
        let got = bytes_after_query(proxy.port(), async || proxy.signal(signal)).await;
        assert_eq!(got, partial_row(), "SIG{signal}: {}", String::from_utf8_lossy(&got));
        let status = proxy.wait_exit(Duration::from_secs(10)).await;
        assert!(status.is_some_and(|s| s.success()), "SIG{signal}: {status:?}");
    }
}

/// Sends `work` through a proxy with a 1 s grace period, signals it 300 ms later, and
/// checks that the client is told 57P01 and the proxy exits cleanly; returns when the signal
/// was sent.
async fn cut_short(cluster: &Cluster, db: &str, signal: &str, work: &[u8]) -> Instant {
    let mut proxy = ProxyProcess::start_for(cluster.port(), "shutdown_grace = 1");
    let (mut raw, _) = Raw::startup(proxy.port(), &[("user", "postgres"), ("database", db)]).await;
    raw.send(work).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    proxy.signal(signal);
    let rest = raw.read_until(|_| false).await;
    assert_eq!(codes(&rest), ["57P01"], "SIG{signal}: {rest:?}");
    let status = proxy.wait_exit(Duration::from_secs(10)).await;
    assert!(status.is_some_and(|s| s.success()), "SIG{signal}: {status:?}");
    started
}

#[tokio::test]
async fn a_statement_cut_short_by_shutdown_is_cancelled_not_left_to_commit() {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let admin = cluster.admin(&db).await;
    admin.batch_execute("CREATE TABLE t (v int)").await.unwrap();
    for signal in ["TERM", "INT"] {
        // One implicit transaction: the row commits only if the sleep runs to its end.
        let work = query(&format!("INSERT INTO t VALUES (1); SELECT pg_sleep(3) /* {signal} */"));
        let started = cut_short(cluster, &db, signal, &work).await;
        // The backend stops with the session instead of sleeping on and committing.
        let sleeping = format!(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(3) /* {signal}%' AND pid <> pg_backend_pid()"
        );
        loop {
            let n: i64 = admin.query_one(&sleeping, &[]).await.unwrap().get(0);
            if n == 0 {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "SIG{signal}: the backend never ended"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            started.elapsed() < Duration::from_millis(2500),
            "SIG{signal}: the backend ran on for {:?}",
            started.elapsed()
        );
        let n: i64 = admin.query_one("SELECT count(*) FROM t", &[]).await.unwrap().get(0);
        assert_eq!(n, 0, "SIG{signal}: a statement whose client was told 57P01 committed");
    }
}

/// A fresh database with a table `t (v int)`, a proxy with a 20 s grace period, and a raw
/// session through it: for the drain's view of open transactions.
async fn draining_fixture() -> (tokio_postgres::Client, ProxyProcess, Raw) {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let admin = cluster.admin(&db).await;
    admin.batch_execute("CREATE TABLE t (v int)").await.unwrap();
    let proxy = ProxyProcess::start_for(cluster.port(), "shutdown_grace = 20");
    let (raw, _) = Raw::startup(proxy.port(), &[("user", "postgres"), ("database", &db)]).await;
    (admin, proxy, raw)
}

/// Parse, Bind and Execute of `sql` as the unnamed statement and portal.
fn run_unnamed(sql: &str) -> Vec<u8> {
    let mut batch = parse("", sql);
    batch.extend(bind("", "", &[]));
    batch.extend(execute(""));
    batch
}

/// SIGTERM while the client's transaction waits for its Sync: the session stays until
/// the Sync, whose ReadyForQuery comes before the FATAL, and the rows it wrote commit.
async fn drains_after_its_sync(admin: &tokio_postgres::Client, proxy: &mut ProxyProcess, raw: &mut Raw) {
    proxy.sigterm();
    tokio::time::sleep(Duration::from_millis(500)).await;
    raw.send(&sync()).await;
    let end = raw.read_until(|_| false).await;
    assert_eq!(tags(&end), "ZE", "{end:?}");
    assert_eq!(codes(&end), ["57P01"]);
    let n: i64 = admin.query_one("SELECT count(*) FROM t", &[]).await.unwrap().get(0);
    assert_eq!(n, 1, "the row the client saw written");
    let status = proxy.wait_exit(Duration::from_secs(10)).await;
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}

/// SIGTERM with no transaction open: the session gets its FATAL at once, the proxy
/// exits well before the grace period, and the row written before commits.
async fn drains_at_once(admin: &tokio_postgres::Client, proxy: &mut ProxyProcess, raw: &mut Raw, case: &str) {
    ends_at_once(proxy, raw, case).await;
    let n: i64 = admin.query_one("SELECT count(*) FROM t", &[]).await.unwrap().get(0);
    assert_eq!(n, 1);
}

/// SIGTERM: the session gets its FATAL at once and the proxy exits well before the grace
/// period.
async fn ends_at_once(proxy: &mut ProxyProcess, raw: &mut Raw, case: &str) {
    let started = Instant::now();
    proxy.sigterm();
    let end = raw.read_until(|_| false).await;
    assert_eq!(codes(&end), ["57P01"], "{case}: {end:?}");
    let status = proxy.wait_exit(Duration::from_secs(10)).await;
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{case}: {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn an_implicit_transaction_waiting_for_its_sync_is_a_transaction_to_drain() {
    let (admin, mut proxy, mut raw) = draining_fixture().await;
    let mut batch = run_unnamed("INSERT INTO t VALUES (1)");
    batch.extend(message(b'H', b""));
    raw.send(&batch).await;
    let done = raw.read_until(|m| m.tag == b'C').await;
    assert_eq!(tags(&done), "12C", "{done:?}");
    // The client was told the INSERT ran; the transaction it is in ends with its Sync.
    drains_after_its_sync(&admin, &mut proxy, &mut raw).await;
}

/// A COPY run with the extended protocol: its Sync, sent with the Execute, is read and
/// dropped in COPY mode, so once CopyDone is answered (the client sees `COPY 1` after a
/// Flush) the transaction still waits for a Sync, and the drain waits with it.
#[tokio::test]
async fn a_copy_answered_before_its_sync_is_a_transaction_to_drain() {
    let (admin, mut proxy, mut raw) = draining_fixture().await;
    let mut batch = run_unnamed("COPY t FROM STDIN");
    batch.extend(sync());
    raw.send(&batch).await;
    let asked = raw.read_until(|m| m.tag == b'G').await;
    assert_eq!(tags(&asked), "12G", "{asked:?}");
    let mut data = message(b'd', b"1\n");
    data.extend(message(b'c', b""));
    data.extend(message(b'H', b""));
    raw.send(&data).await;
    let done = raw.read_until(|m| m.tag == b'C').await;
    assert_eq!(tags(&done), "C", "{done:?}");
    drains_after_its_sync(&admin, &mut proxy, &mut raw).await;
}

/// A simple Query after an Execute with no Sync ends the implicit transaction (Postgres
/// commits it with the Query's and says idle): a drain then ends the session at once.
#[tokio::test]
async fn a_query_ends_the_implicit_transaction_an_execute_left_open() {
    let (admin, mut proxy, mut raw) = draining_fixture().await;
    let mut batch = run_unnamed("INSERT INTO t VALUES (1)");
    batch.extend(message(b'H', b""));
    raw.send(&batch).await;
    assert_eq!(tags(&raw.read_until(|m| m.tag == b'C').await), "12C");
    let replies = raw.simple("SELECT 1").await;
    assert_eq!(tags(&replies).chars().last(), Some('Z'), "{replies:?}");
    assert_eq!(replies.last().map(|z| z.body.clone()), Some(b"I".to_vec()), "idle");
    drains_at_once(&admin, &mut proxy, &mut raw, "").await;
}

/// The same COPY with what ends its transaction sent ahead (`Execute, Sync, data,
/// CopyDone`, then a Sync, or a Query, which ends it as a Sync does): once that is
/// answered the drain ends the session at once rather than after the grace period.
#[tokio::test]
async fn a_copy_whose_transaction_end_came_ahead_drains_at_once() {
    for (end, replies) in [(sync(), "12GCZ"), (query("SELECT 1"), "12GCTDCZ")] {
        let (admin, mut proxy, mut raw) = draining_fixture().await;
        let mut batch = run_unnamed("COPY t FROM STDIN");
        batch.extend(sync());
        batch.extend(message(b'd', b"1\n"));
        batch.extend(message(b'c', b""));
        batch.extend(end);
        raw.send(&batch).await;
        let done = raw.read_until(|m| m.tag == b'Z').await;
        assert_eq!(tags(&done), replies, "{done:?}");
        drains_at_once(&admin, &mut proxy, &mut raw, replies).await;
    }
}

/// Work pipelined behind the statement shutdown cuts short, already sent to Postgres, does
/// not run on and commit once the client was told 57P01: Postgres' own shutdown ends the
/// backend, and pgfence, which cannot, resets the connection before it cancels, so the
/// backend finds its client gone before it commits anything more. Before, the INSERT queued
/// behind the sleep committed.
#[tokio::test]
async fn work_pipelined_behind_a_cut_statement_does_not_commit() {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let admin = cluster.admin(&db).await;
    admin.batch_execute("CREATE TABLE t (v int)").await.unwrap();
    for signal in ["TERM", "INT"] {
        let work = [
            query(&format!("SELECT pg_sleep(3) /* pipelined {signal} */")),
            query("INSERT INTO t VALUES (1)"),
            run_unnamed("INSERT INTO t VALUES (2)"),
            sync(),
        ]
        .concat();
        cut_short(cluster, &db, signal, &work).await;
        // Long enough for the queued INSERTs to have run, had the backend gone on.
        let gone = format!(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = '{db}' AND pid <> pg_backend_pid() \
             AND (query LIKE '%pg_sleep(3) /* pipelined {signal}%' OR query LIKE 'INSERT INTO t VALUES%')"
        );
        for _ in 0..100 {
            let n: i64 = admin.query_one(&gone, &[]).await.unwrap().get(0);
            if n == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let n: i64 = admin.query_one("SELECT count(*) FROM t", &[]).await.unwrap().get(0);
        assert_eq!(n, 0, "SIG{signal}: work queued behind the cut statement committed");
    }
}

/// A replication stream (CopyBoth after `START_REPLICATION`) never reaches the end of a
/// transaction: SIGTERM ends it at once with 57P01, as an idle session, instead of holding
/// the drain for the whole grace period.
#[tokio::test]
async fn a_replication_stream_is_ended_at_once_by_a_drain() {
    let cluster = Cluster::shared();
    let admin = cluster.admin("postgres").await;
    let lsn: String = admin
        .query_one("SELECT pg_current_wal_flush_lsn()::text", &[])
        .await
        .unwrap()
        .get(0);
    let mut proxy = ProxyProcess::start_for(cluster.port(), "shutdown_grace = 20");
    let (mut raw, hello) = Raw::startup(proxy.port(), &[("user", "postgres"), ("replication", "true")]).await;
    assert_eq!(hello.last().map(|m| m.tag), Some(b'Z'), "{hello:?}");
    raw.send(&query(&format!("START_REPLICATION PHYSICAL {lsn}"))).await;
    let started = raw.read_until(|m| m.tag == b'W' || m.tag == b'E').await;
    assert_eq!(started.last().map(|m| m.tag), Some(b'W'), "{started:?}");
    ends_at_once(&mut proxy, &mut raw, "a replication stream").await;
}
