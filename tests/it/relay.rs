//! The transparent proxy: real clients through pgfence behave as against Postgres.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt, TryStreamExt, future::join_all, pin_mut};
use tokio_postgres::{AsyncMessage, SimpleQueryMessage};

use crate::common::inproc::Proxy;
use crate::common::pg::{Cluster, config, connect, try_connect};

async fn setup() -> (&'static Cluster, String, Proxy) {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let proxy = Proxy::start(cluster.port(), "").await;
    (cluster, db, proxy)
}

fn sqlstate<T: std::fmt::Debug>(r: Result<T, tokio_postgres::Error>) -> String {
    r.unwrap_err().code().map(|c| c.code().to_owned()).unwrap_or_default()
}

#[tokio::test]
async fn simple_and_extended_queries_round_trip() {
    let (_, db, proxy) = setup().await;
    let c = connect(proxy.port(), &db, "").await;
    let msgs = c.simple_query("SELECT 1 AS a, 'x' AS b; SELECT 2").await.unwrap();
    let rows: Vec<_> = msgs
        .iter()
        .filter_map(|m| {
            if let SimpleQueryMessage::Row(r) = m {
                Some(r.get(0))
            } else {
                None
            }
        })
        .collect();
    assert_eq!(rows, [Some("1"), Some("2")]);
    let row = c
        .query_one("SELECT $1::int + 1, $2::text", &[&41i32, &"hé"])
        .await
        .unwrap();
    assert_eq!((row.get::<_, i32>(0), row.get::<_, String>(1)), (42, "hé".to_owned()));
    c.simple_query("").await.unwrap();
    let empty = c.simple_query(";").await.unwrap();
    assert!(empty.iter().all(|m| !matches!(m, SimpleQueryMessage::Row(_))));
}

#[tokio::test]
async fn prepared_statements_are_reused_many_times() {
    let (_, db, proxy) = setup().await;
    let c = connect(proxy.port(), &db, "").await;
    let stmt = c.prepare("SELECT $1::bigint * 2").await.unwrap();
    for i in 0..500i64 {
        let v: i64 = c.query_one(&stmt, &[&i]).await.unwrap().get(0);
        assert_eq!(v, i * 2);
    }
}

#[tokio::test]
async fn pipelined_queries_answer_in_order() {
    let (_, db, proxy) = setup().await;
    let c = connect(proxy.port(), &db, "").await;
    let stmt = c.prepare("SELECT $1::int").await.unwrap();
    let futs = (0..200i32).map(|i| {
        let c = &c;
        let stmt = &stmt;
        async move { c.query_one(stmt, &[&i]).await.unwrap().get::<_, i32>(0) }
    });
    let got = join_all(futs).await;
    assert_eq!(got, (0..200).collect::<Vec<_>>());
}

#[tokio::test]
async fn copy_in_and_out_of_10_mb() {
    let (_, db, proxy) = setup().await;
    let c = connect(proxy.port(), &db, "").await;
    c.batch_execute("CREATE TABLE blob (id int, payload text)")
        .await
        .unwrap();
    let line = format!("{}\n", "x".repeat(1000));
    let sink = c.copy_in("COPY blob (payload) FROM STDIN").await.unwrap();
    pin_mut!(sink);
    let chunk = Bytes::from(line.repeat(100));
    for _ in 0..110 {
        sink.send(chunk.clone()).await.unwrap();
    }
    let n = sink.finish().await.unwrap();
    assert_eq!(n, 11_000);
    let stream = c.copy_out("COPY blob (payload) TO STDOUT").await.unwrap();
    let chunks: Vec<Bytes> = stream.try_collect().await.unwrap();
    let total: usize = chunks.iter().map(Bytes::len).sum();
    assert_eq!(total, 11_000 * line.len());
    assert!(total > 10 * 1024 * 1024);
}

#[tokio::test]
async fn listen_notify_across_two_sessions() {
    let (_, db, proxy) = setup().await;
    let (listener, mut connection) = config(proxy.port(), &db).connect(tokio_postgres::NoTls).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        let mut stream = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(msg)) = stream.next().await {
            if let AsyncMessage::Notification(n) = msg {
                let _ = tx.send((n.channel().to_owned(), n.payload().to_owned())).await;
            }
        }
    });
    listener.batch_execute("LISTEN jobs").await.unwrap();
    let other = connect(proxy.port(), &db, "").await;
    other.batch_execute("NOTIFY jobs, 'hello'").await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, ("jobs".to_owned(), "hello".to_owned()));
}

#[tokio::test]
async fn cancel_request_stops_a_long_query() {
    let (_, db, proxy) = setup().await;
    let c = connect(proxy.port(), &db, "").await;
    let token = c.cancel_token();
    let started = Instant::now();
    let canceller = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        token.cancel_query(tokio_postgres::NoTls).await.unwrap();
    });
    let r = c.simple_query("SELECT pg_sleep(30)").await;
    canceller.await.unwrap();
    assert_eq!(sqlstate(r), "57014");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(c.query_one("SELECT 1", &[]).await.unwrap().get::<_, i32>(0), 1);
}

#[tokio::test]
async fn errors_keep_their_sqlstate_and_the_session_stays_usable() {
    let (_, db, proxy) = setup().await;
    let c = connect(proxy.port(), &db, "").await;
    c.batch_execute("CREATE TABLE u (id int PRIMARY KEY); INSERT INTO u VALUES (1)")
        .await
        .unwrap();
    assert_eq!(sqlstate(c.execute("INSERT INTO u VALUES (1)", &[]).await), "23505");
    assert_eq!(sqlstate(c.batch_execute("SELECT * FROM missing").await), "42P01");
    assert_eq!(
        sqlstate(c.query("SELECT * FROM missing WHERE x = $1", &[&1i32]).await),
        "42P01"
    );
    assert_eq!(
        c.query_one("SELECT count(*) FROM u", &[])
            .await
            .unwrap()
            .get::<_, i64>(0),
        1
    );
}

#[tokio::test]
async fn transaction_status_through_begin_error_rollback() {
    let (_, db, proxy) = setup().await;
    let mut c = connect(proxy.port(), &db, "").await;
    c.batch_execute("CREATE TABLE t (v int)").await.unwrap();
    let tx = c.transaction().await.unwrap();
    tx.execute("INSERT INTO t VALUES (1)", &[]).await.unwrap();
    assert_eq!(sqlstate(tx.execute("SELECT 1/0", &[]).await), "22012");
    assert_eq!(sqlstate(tx.execute("SELECT 1", &[]).await), "25P02");
    tx.rollback().await.unwrap();
    assert_eq!(
        c.query_one("SELECT count(*) FROM t", &[])
            .await
            .unwrap()
            .get::<_, i64>(0),
        0
    );
    c.batch_execute("BEGIN; INSERT INTO t VALUES (2); COMMIT")
        .await
        .unwrap();
    assert_eq!(
        c.query_one("SELECT count(*) FROM t", &[])
            .await
            .unwrap()
            .get::<_, i64>(0),
        1
    );
}

#[tokio::test]
async fn unreachable_upstream_gets_08001_not_a_hang() {
    // A port bound without listening, held to the test's end: connecting to it is refused,
    // and no other test's server can take it meanwhile (a port merely found free could be).
    let closed = tokio::net::TcpSocket::new_v4().unwrap();
    closed.bind((std::net::Ipv4Addr::LOCALHOST, 0).into()).unwrap();
    let port = closed.local_addr().unwrap().port();
    let proxy = Proxy::start(port, "").await;
    let started = Instant::now();
    let r = try_connect(proxy.port(), "postgres", "").await;
    let Err(err) = r else { panic!("must fail") };
    let db = err.as_db_error().expect("an ErrorResponse from pgfence");
    assert_eq!(db.code().code(), "08001");
    assert!(db.message().contains("pgfence"), "{}", db.message());
    // The cause, as the system gives it.
    assert!(db.message().to_lowercase().contains("refused"), "{}", db.message());
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn upstream_death_ends_only_that_session() {
    let (cluster, db, proxy) = setup().await;
    let victim = connect(proxy.port(), &db, "").await;
    let bystander = connect(proxy.port(), &db, "").await;
    let pid: i32 = victim.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    let admin = cluster.admin(&db).await;
    admin.execute("SELECT pg_terminate_backend($1)", &[&pid]).await.unwrap();
    assert!(victim.query_one("SELECT 1", &[]).await.is_err());
    assert_eq!(bystander.query_one("SELECT 1", &[]).await.unwrap().get::<_, i32>(0), 1);
}

#[tokio::test]
async fn vanished_client_rolls_back_its_transaction() {
    let (cluster, db, proxy) = setup().await;
    let admin = cluster.admin(&db).await;
    admin.batch_execute("CREATE TABLE t (v int)").await.unwrap();
    {
        let c = connect(proxy.port(), &db, "").await;
        c.batch_execute("BEGIN; INSERT INTO t VALUES (1)").await.unwrap();
    }
    // The upstream backend goes away and nothing was committed.
    for _ in 0..100 {
        let n: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if n == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        admin
            .query_one("SELECT count(*) FROM t", &[])
            .await
            .unwrap()
            .get::<_, i64>(0),
        0
    );
    let n: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "the upstream connection must be closed");
}

#[tokio::test]
async fn connection_limit_gives_53300() {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let proxy = Proxy::start(cluster.port(), "max_client_conn = 2").await;
    let _a = connect(proxy.port(), &db, "").await;
    let _b = connect(proxy.port(), &db, "").await;
    let Err(err) = try_connect(proxy.port(), &db, "").await else {
        panic!("third must fail")
    };
    assert_eq!(err.code().map(|c| c.code()), Some("53300"));
    drop(_a);
    tokio::time::sleep(Duration::from_millis(200)).await;
    connect(proxy.port(), &db, "").await;
}

/// The TCP timer of the loopback socket from `local` to `remote` port, from /proc/net/tcp:
/// 2 is keepalive, 0 none.
fn tcp_timer(local: u16, remote: u16) -> Option<u8> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let port = |addr: &str| u16::from_str_radix(addr.rsplit(':').next()?, 16).ok();
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (port(f[1]) == Some(local) && port(f[2]) == Some(remote))
            .then(|| u8::from_str_radix(f[5].split(':').next().unwrap_or(""), 16).ok())
            .flatten()
    })
}

/// Both legs of a session have TCP keepalive on, as Postgres' own client sockets do, so a
/// peer whose host vanished is noticed (with the system's timing) and its session ends.
#[tokio::test]
async fn both_legs_of_a_session_keep_alive() {
    let (cluster, db, proxy) = setup().await;
    // The client leg: pgfence's end of a connection to it.
    let raw = std::net::TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    let mine = raw.local_addr().unwrap().port();
    // The upstream leg: pgfence's end of its connection to Postgres, found by its port.
    let mut c = config(proxy.port(), &db);
    c.application_name(format!("ka_{db}")).keepalives(false);
    let (client, connection) = c.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let upstream: i32 = client
        .query_one(
            "SELECT client_port FROM pg_stat_activity WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let upstream = u16::try_from(upstream).unwrap();
    assert_eq!(tcp_timer(proxy.port(), mine), Some(2), "client leg");
    assert_eq!(tcp_timer(upstream, cluster.port()), Some(2), "upstream leg");
    // Control: the test's own socket to pgfence has none.
    assert_eq!(tcp_timer(mine, proxy.port()), Some(0));
    drop(raw);
}
