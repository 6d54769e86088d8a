//! Sequences drivers never send: garbage, oversized and truncated messages,
//! hand-made pipelines. Each bad session ends alone; the proxy stays up.

use std::time::Duration;

use tokio::io::AsyncWriteExt;

use crate::common::inproc::Proxy;
use crate::common::pg::{Cluster, connect};
use crate::common::raw::{Raw, codes, message, query, startup_packet_bytes, tags};

async fn setup() -> (String, Proxy, tokio_postgres::Client) {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let proxy = Proxy::start(cluster.port(), "max_message_size = 65536").await;
    let bystander = connect(proxy.port(), &db, "").await;
    (db, proxy, bystander)
}

async fn still_fine(bystander: &tokio_postgres::Client, proxy: &Proxy) {
    assert_eq!(bystander.query_one("SELECT 7", &[]).await.unwrap().get::<_, i32>(0), 7);
    assert!(!proxy.is_finished());
}

#[tokio::test]
async fn garbage_first_bytes_close_only_that_session() {
    let (_, proxy, bystander) = setup().await;
    let mut raw = Raw::connect(proxy.port()).await;
    raw.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(raw.closed().await);
    still_fine(&bystander, &proxy).await;
}

#[tokio::test]
async fn oversized_startup_packet_is_refused() {
    let (_, proxy, bystander) = setup().await;
    let mut raw = Raw::connect(proxy.port()).await;
    let mut packet = 20_000u32.to_be_bytes().to_vec();
    packet.extend((3u32 << 16).to_be_bytes());
    raw.send(&packet).await;
    assert!(raw.closed().await);
    still_fine(&bystander, &proxy).await;
}

#[tokio::test]
async fn two_gib_length_header_gets_08p01() {
    let (db, proxy, bystander) = setup().await;
    let (mut raw, msgs) = Raw::startup(proxy.port(), &[("user", "postgres"), ("database", &db)]).await;
    assert_eq!(msgs.last().unwrap().tag, b'Z');
    raw.send(&[b'Q', 0x7f, 0xff, 0xff, 0xff, b'S']).await;
    let rest = raw.read_until(|_| false).await;
    assert_eq!(codes(&rest), ["08P01"], "{rest:?}");
    still_fine(&bystander, &proxy).await;
}

/// Streamed messages (CopyData, Bind) are not read whole, but Postgres refuses any message
/// over 1 GiB by ending the session without a word: pgfence says why.
#[tokio::test]
async fn streamed_message_over_the_protocol_limit_gets_08p01() {
    let (db, proxy, bystander) = setup().await;
    for tag in [b'd', b'B'] {
        let (mut raw, _) = Raw::startup(proxy.port(), &[("user", "postgres"), ("database", &db)]).await;
        raw.send(&[tag, 0x40, 0, 0, 0, 0]).await;
        let rest = raw.read_until(|_| false).await;
        assert_eq!(codes(&rest), ["08P01"], "{}: {rest:?}", tag as char);
        let message = rest.iter().find_map(|m| m.field(b'M')).unwrap_or_default();
        assert!(message.contains("limit"), "{message}");
    }
    still_fine(&bystander, &proxy).await;
}

#[tokio::test]
async fn negative_length_and_malformed_messages_get_08p01() {
    let (db, proxy, bystander) = setup().await;
    for bad in [
        vec![b'Q', 0xff, 0xff, 0xff, 0xf0],
        message(b'Q', b"SELECT 1"),
        message(b'E', b"no-terminator"),
        message(b'P', b"stmt\0SELECT 1"),
        // Postgres answers these by an error where a ReadyForQuery, or nothing, is owed.
        [message(b'H', b"abc"), query("SELECT 1"), message(b'S', b"")].concat(),
        message(b'S', b"x"),
    ] {
        let (mut raw, _) = Raw::startup(proxy.port(), &[("user", "postgres"), ("database", &db)]).await;
        raw.send(&bad).await;
        let rest = raw.read_until(|_| false).await;
        assert_eq!(codes(&rest), ["08P01"], "{bad:?}: {rest:?}");
        assert!(raw.closed().await, "{bad:?}");
    }
    still_fine(&bystander, &proxy).await;
}

/// A message type byte that is not printable goes into the log and the FATAL escaped.
#[tokio::test]
async fn an_unprintable_message_type_is_shown_escaped() {
    let (db, proxy, bystander) = setup().await;
    let (mut raw, _) = Raw::startup(proxy.port(), &[("user", "postgres"), ("database", &db)]).await;
    raw.send(&[b'\n', 0x7f, 0xff, 0xff, 0xff]).await;
    let rest = raw.read_until(|_| false).await;
    assert_eq!(codes(&rest), ["08P01"], "{rest:?}");
    let message = rest.iter().find_map(|m| m.field(b'M')).unwrap_or_default();
    assert!(message.contains("message type '\\n'"), "{message}");
    assert!(!message.chars().any(char::is_control), "{message:?}");
    still_fine(&bystander, &proxy).await;
}

/// A Query while Postgres copies from the client: Postgres' own answer, as straight to it
/// (the COPY fails with 08P01 "unexpected message type", then a FATAL), and no more.
#[tokio::test]
async fn a_query_during_copy_is_answered_as_postgres_answers_it() {
    let (db, proxy, bystander) = setup().await;
    bystander.batch_execute("CREATE TABLE copied (v int)").await.unwrap();
    let mut seen = Vec::new();
    for port in [Cluster::shared().port(), proxy.port()] {
        let (mut raw, _) = Raw::startup(port, &[("user", "postgres"), ("database", &db)]).await;
        raw.send(&query("COPY copied FROM STDIN")).await;
        raw.read_until(|m| m.tag == b'G').await;
        raw.send(&[message(b'd', b"1\n"), query("SELECT 1")].concat()).await;
        let rest = raw.read_until(|_| false).await;
        assert!(raw.closed().await);
        let said: Vec<_> = rest.iter().filter_map(|m| m.field(b'M')).collect();
        seen.push((tags(&rest), codes(&rest), said));
    }
    assert_eq!(seen[0].1, ["08P01", "08P01"], "{:?}", seen[0]);
    assert!(seen[0].2[0].contains("unexpected message type 0x51"), "{:?}", seen[0]);
    assert_eq!(seen[1], seen[0], "through pgfence, then straight to Postgres");
    let copied: i64 = bystander
        .query_one("SELECT count(*) FROM copied", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(copied, 0);
    still_fine(&bystander, &proxy).await;
}

#[tokio::test]
async fn truncated_message_then_close_leaves_others_alone() {
    let (db, proxy, bystander) = setup().await;
    let (mut raw, _) = Raw::startup(proxy.port(), &[("user", "postgres"), ("database", &db)]).await;
    let q = query("SELECT 1");
    raw.send(&q[..q.len() - 3]).await;
    raw.stream.shutdown().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    still_fine(&bystander, &proxy).await;
}

#[tokio::test]
async fn bytes_after_terminate_are_ignored() {
    let (db, proxy, bystander) = setup().await;
    let (mut raw, _) = Raw::startup(proxy.port(), &[("user", "postgres"), ("database", &db)]).await;
    let mut bytes = message(b'X', b"");
    bytes.extend(query("SELECT 1"));
    raw.send(&bytes).await;
    let rest = raw.read_until(|_| false).await;
    assert!(rest.is_empty(), "{rest:?}");
    assert!(raw.closed().await);
    still_fine(&bystander, &proxy).await;
}

/// How a session ends on the client's side, sent right behind two queries that are still
/// owed their replies (an INSERT, then a query that is still running).
#[derive(Clone, Copy, Debug)]
enum Ending {
    Terminate,
    /// The client closes its sending side and reads on.
    HalfClose,
    /// A message header Postgres and pgfence both refuse (length 3).
    BadHeader,
}

/// Runs the two queries and `ending` in one write to `port`; returns the tags of every
/// reply up to the end of the connection and the rows the INSERT left.
async fn owed_replies(
    port: u16,
    db: &str,
    admin: &tokio_postgres::Client,
    ending: Ending,
) -> (String, Vec<String>, i64) {
    admin.batch_execute("DELETE FROM owed").await.unwrap();
    let (mut raw, _) = Raw::startup(port, &[("user", "postgres"), ("database", db)]).await;
    let mut bytes = query("INSERT INTO owed VALUES (1)");
    bytes.extend(query("SELECT pg_sleep(0.3)"));
    match ending {
        Ending::Terminate => bytes.extend(message(b'X', b"")),
        Ending::HalfClose => {}
        Ending::BadHeader => bytes.extend([b'Q', 0, 0, 0, 3]),
    }
    raw.send(&bytes).await;
    if let Ending::HalfClose = ending {
        raw.stream.shutdown().await.unwrap();
    }
    let rest = raw.read_until(|_| false).await;
    assert!(raw.closed().await, "{ending:?}: the session must end");
    let n: i64 = admin.query_one("SELECT count(*) FROM owed", &[]).await.unwrap().get(0);
    (tags(&rest), codes(&rest), n)
}

/// Postgres answers every message that came before the end of a session, and runs it: a
/// client that ends its side right behind its queries (Terminate, a half-close, a protocol
/// violation) gets those replies through pgfence too, and its writes are not lost.
#[tokio::test]
async fn replies_owed_before_a_session_ends_still_arrive() {
    let (db, proxy, bystander) = setup().await;
    let cluster = Cluster::shared();
    bystander.batch_execute("CREATE TABLE owed (v int)").await.unwrap();
    for ending in [Ending::Terminate, Ending::HalfClose, Ending::BadHeader] {
        // The control: Postgres itself, directly.
        let direct = owed_replies(cluster.port(), &db, &bystander, ending).await;
        assert_eq!(
            (&direct.0[..], direct.2),
            ("CZTDCZ", 1),
            "{ending:?} directly: {direct:?}"
        );
        let proxied = owed_replies(proxy.port(), &db, &bystander, ending).await;
        match ending {
            // Postgres ends a session with a bad header without a word; pgfence says why.
            Ending::BadHeader => assert_eq!(proxied, ("CZTDCZE".into(), vec!["08P01".into()], 1), "{ending:?}"),
            _ => assert_eq!(proxied, direct, "{ending:?}"),
        }
    }
    still_fine(&bystander, &proxy).await;
}

#[tokio::test]
async fn query_over_max_message_size_is_refused_but_copy_data_streams() {
    let (db, proxy, bystander) = setup().await;
    let (mut raw, _) = Raw::startup(proxy.port(), &[("user", "postgres"), ("database", &db)]).await;
    let big = format!("SELECT '{}'", "x".repeat(70_000));
    raw.send(&query(&big)).await;
    let rest = raw.read_until(|_| false).await;
    assert_eq!(codes(&rest), ["08P01"]);
    // CopyData is not capped by max_message_size.
    let (mut raw, _) = Raw::startup(proxy.port(), &[("user", "postgres"), ("database", &db)]).await;
    raw.simple("CREATE TEMP TABLE big (t text)").await;
    raw.send(&query("COPY big FROM STDIN")).await;
    assert_eq!(raw.read().await.unwrap().tag, b'G');
    let mut row = "y".repeat(200_000).into_bytes();
    row.push(b'\n');
    raw.send(&message(b'd', &row)).await;
    raw.send(&message(b'c', b"")).await;
    let rest = raw.read_until(|m| m.tag == b'Z').await;
    assert_eq!(tags(&rest), "CZ", "{rest:?}");
    still_fine(&bystander, &proxy).await;
}

#[tokio::test]
async fn error_mid_pipeline_skips_to_sync_as_postgres_does() {
    let (db, proxy, _) = setup().await;
    let cluster = Cluster::shared();
    let mut batch = Vec::new();
    batch.extend(message(b'P', b"\0SELECT 1/0\0\0\0"));
    batch.extend(message(b'B', b"\0\0\0\0\0\0\0\0"));
    batch.extend(message(b'E', b"\0\0\0\0\0"));
    batch.extend(message(b'P', b"\0SELECT 2\0\0\0"));
    batch.extend(message(b'B', b"\0\0\0\0\0\0\0\0"));
    batch.extend(message(b'E', b"\0\0\0\0\0"));
    batch.extend(message(b'S', b""));
    batch.extend(message(b'P', b"\0SELECT 3\0\0\0"));
    batch.extend(message(b'B', b"\0\0\0\0\0\0\0\0"));
    batch.extend(message(b'E', b"\0\0\0\0\0"));
    batch.extend(message(b'H', b""));
    batch.extend(message(b'S', b""));
    let mut seen = Vec::new();
    for port in [cluster.port(), proxy.port()] {
        let (mut raw, _) = Raw::startup(port, &[("user", "postgres"), ("database", &db)]).await;
        raw.send(&batch).await;
        let first = raw.read_until(|m| m.tag == b'Z').await;
        let second = raw.read_until(|m| m.tag == b'Z').await;
        seen.push((tags(&first), tags(&second)));
    }
    // Postgres folds 1/0 while planning, so the error comes at Bind or Execute; either way the
    // rest of the batch is skipped up to Sync and the next batch answers normally.
    assert!(seen[0].0.ends_with("EZ") && seen[0].1 == "12DCZ", "{seen:?}");
    assert_eq!(seen[0], seen[1], "pgfence must answer exactly as Postgres");
}

/// sqlparser builds `1+1+…` in a loop but drops and prints the tree recursively; a stack
/// overflow aborts the process, every session with it. The real binary, with more than one
/// worker thread (whose stacks are not the main thread's), in both modes.
#[tokio::test]
async fn the_deepest_statement_pgfence_parses_fails_alone() {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let mut admin = cluster.admin(&db).await;
    admin
        .batch_execute("CREATE TABLE deep (id int PRIMARY KEY, note text, last_epoch bigint)")
        .await
        .unwrap();
    let fences = [
        "[[fence]]\nname = \"deep\"\ntables = [\"deep\"]\n",
        "[[fence]]\nname = \"deep\"\ntables = [\"deep\"]\nmode = \"rewrite\"\nepoch_column = \"last_epoch\"\n",
    ];
    crate::fencing::install(&mut admin, cluster.port(), fences[0]).await;
    let chain = "1+".repeat(32_000);
    for fence in fences {
        let proxy = crate::common::proxy::ProxyProcess::start_for(cluster.port(), &format!("workers = 2\n{fence}"));
        let bystander = connect(proxy.port(), &db, "").await;
        let (mut raw, _) = Raw::startup(
            proxy.port(),
            &[
                ("user", "postgres"),
                ("database", &db),
                ("options", "-c pgfence.epoch=1"),
            ],
        )
        .await;
        for sql in [
            format!("SELECT {chain}1 FROM deep WHERE insert"),
            format!("UPDATE deep SET note = 'x' WHERE id = {chain}1"),
            format!("INSERT INTO deep (id, note) VALUES ({chain}1, 'a')"),
        ] {
            let replies = raw.simple(&sql).await;
            assert_eq!(
                tags(&replies).chars().last(),
                Some('Z'),
                "{fence}{}: {replies:?}",
                &sql[..40]
            );
        }
        assert_eq!(bystander.query_one("SELECT 7", &[]).await.unwrap().get::<_, i32>(0), 7);
    }
}

/// The proxy's resident memory (VmRSS), in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap();
    kb * 1024
}

/// A Query is read whole, so its buffer grows to its size; an idle session must not keep
/// that, nor the copy of it made when pgfence put a guard before it. Messages of 40 MB are
/// above glibc's largest mmap threshold, so what is freed leaves the process.
#[tokio::test]
async fn idle_sessions_give_back_the_buffers_of_large_messages() {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let mut admin = cluster.admin(&db).await;
    admin.batch_execute("CREATE TABLE big (v text)").await.unwrap();
    let fence = "[[fence]]\nname = \"big\"\ntables = [\"big\"]\n";
    crate::fencing::install(&mut admin, cluster.port(), fence).await;
    let proxy = crate::common::proxy::ProxyProcess::start_for(cluster.port(), fence);
    let pad = "x".repeat(40 << 20);
    let mut sessions = Vec::new();
    for _ in 0..3 {
        let (raw, _) = Raw::startup(
            proxy.port(),
            &[
                ("user", "postgres"),
                ("database", &db),
                ("options", "-c pgfence.epoch=1"),
            ],
        )
        .await;
        sessions.push(raw);
    }
    let before = rss(proxy.pid());
    for raw in &mut sessions {
        // A read, forwarded as it came; a fenced write, sent with the guard before it.
        for sql in [
            format!("SELECT length('{pad}')"),
            format!("INSERT INTO big VALUES ('{pad}')"),
        ] {
            let replies = raw.simple(&sql).await;
            assert_eq!(tags(&replies).chars().last(), Some('Z'), "{replies:?}");
            assert!(codes(&replies).is_empty(), "{replies:?}");
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let grown = rss(proxy.pid()).saturating_sub(before);
    // Kept, each of the three would hold 80 MB.
    assert!(grown < 40 << 20, "idle sessions hold {} MiB more", grown >> 20);
}

/// Messages Postgres answers with nothing must cost pgfence nothing to remember: CopyDone
/// with no COPY, and whatever follows an error until the Sync. Before, each kept a 64-byte
/// record until a reply that never came.
#[tokio::test]
async fn messages_postgres_never_answers_are_not_remembered() {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let proxy = crate::common::proxy::ProxyProcess::start_for(cluster.port(), "");
    let bystander = connect(proxy.port(), &db, "").await;
    let before = rss(proxy.pid());
    let copy_done = message(b'c', b"");
    let describe = message(b'D', b"P\0");
    for flood in [copy_done, describe] {
        let (mut raw, _) = Raw::startup(proxy.port(), &[("user", "postgres"), ("database", &db)]).await;
        if flood[0] == b'D' {
            // A Parse that fails: Postgres skips what follows until a Sync.
            raw.send(&crate::common::raw::parse("", "SELEC 1")).await;
        }
        let chunk = flood.repeat(100_000);
        for _ in 0..40 {
            raw.send(&chunk).await;
        }
        // Four million messages later, the session still answers as Postgres does.
        raw.send(&crate::common::raw::sync()).await;
        let replies = raw.read_until(|m| m.tag == b'Z').await;
        let expected = if flood[0] == b'D' { "EZ" } else { "Z" };
        assert_eq!(tags(&replies), expected, "{replies:?}");
    }
    let grown = rss(proxy.pid()).saturating_sub(before);
    // Remembered, the four million would take 244 MiB.
    assert!(grown < 100 << 20, "{} MiB for unanswered messages", grown >> 20);
    assert_eq!(bystander.query_one("SELECT 7", &[]).await.unwrap().get::<_, i32>(0), 7);
}

/// Two COPY FROM STDIN in one string, all their data sent before Postgres asks for it:
/// each COPY takes one CopyDone, and the session carries on as straight to Postgres.
#[tokio::test]
async fn two_copies_in_one_string_each_take_their_copy_done() {
    let (db, proxy, bystander) = setup().await;
    let cluster = Cluster::shared();
    cluster
        .admin(&db)
        .await
        .batch_execute("CREATE TABLE two (v int)")
        .await
        .unwrap();
    let mut outcomes = Vec::new();
    for port in [proxy.port(), cluster.port()] {
        let (mut raw, _) = Raw::startup(port, &[("user", "postgres"), ("database", &db)]).await;
        let mut batch = query("COPY two FROM STDIN; COPY two FROM STDIN");
        for row in [b"1\n", b"2\n"] {
            batch.extend(message(b'd', row));
            batch.extend(message(b'c', b""));
        }
        raw.send(&batch).await;
        let copied = raw.read_until(|m| m.tag == b'Z').await;
        let after = raw.simple("SELECT 1").await;
        outcomes.push((tags(&copied), tags(&after), codes(&after)));
    }
    assert_eq!(outcomes[0], outcomes[1], "through pgfence, then straight to Postgres");
    assert_eq!(outcomes[1].1, "TDCZ");
    still_fine(&bystander, &proxy).await;
}

/// A string of more COPYs than the CopyDone run pgfence keeps (1 024), with the client
/// staying two CopyDones ahead of Postgres: the run never holds more than two, and every
/// COPY gets its own.
#[tokio::test]
async fn a_client_ahead_by_two_copy_dones_through_many_copies_stays_in_step() {
    let (db, proxy, bystander) = setup().await;
    let cluster = Cluster::shared();
    let admin = cluster.admin(&db).await;
    admin.batch_execute("CREATE TABLE many (v int)").await.unwrap();
    let copies = 1_100;
    let (mut raw, _) = Raw::startup(proxy.port(), &[("user", "postgres"), ("database", &db)]).await;
    let row = |k: usize| {
        let mut m = message(b'd', format!("{k}\n").as_bytes());
        m.extend(message(b'c', b""));
        m
    };
    let mut batch = query(&"COPY many FROM STDIN;".repeat(copies));
    batch.extend(row(0));
    batch.extend(row(1));
    raw.send(&batch).await;
    let mut asked = 0;
    loop {
        let m = raw.read().await.expect("a reply");
        match m.tag {
            b'G' => {
                asked += 1;
                if asked + 1 < copies {
                    raw.send(&row(asked + 1)).await;
                }
            }
            b'E' => panic!("{:?}", m.field(b'M')),
            b'Z' => break,
            _ => {}
        }
    }
    assert_eq!(asked, copies);
    let n: i64 = admin.query_one("SELECT count(*) FROM many", &[]).await.unwrap().get(0);
    assert_eq!(n, copies as i64);
    assert_eq!(tags(&raw.simple("SELECT 1").await), "TDCZ");
    still_fine(&bystander, &proxy).await;
}

/// Postgres reads startup parameters as bytes in the client's encoding: a LATIN1
/// `application_name` starts a session directly and through pgfence alike, and Postgres
/// gets the bytes as sent.
#[tokio::test]
async fn startup_parameters_that_are_not_utf8_pass_as_sent() {
    let (db, proxy, bystander) = setup().await;
    let cluster = Cluster::shared();
    let mut seen = Vec::new();
    for port in [cluster.port(), proxy.port()] {
        let mut raw = Raw::connect(port).await;
        raw.send(&startup_packet_bytes(&[
            (b"user", b"postgres"),
            (b"database", db.as_bytes()),
            (b"application_name", b"caf\xe9"),
        ]))
        .await;
        let started = raw.read_until(|m| m.tag == b'Z' || m.tag == b'E').await;
        assert_eq!(started.last().map(|m| m.tag), Some(b'Z'), "port {port}: {started:?}");
        let shown = raw.simple("SHOW application_name").await;
        assert_eq!(tags(&shown), "TDCZ");
        seen.push(shown[1].body.clone());
    }
    // The same value either way: the one Postgres makes of these bytes (of U+FFFD's three
    // bytes it would make another).
    assert_eq!(seen[0], seen[1]);
    still_fine(&bystander, &proxy).await;
}

/// What a connection answers to these encryption requests (each answer's first byte), then
/// to a startup packet (`Z` when the session starts), with the error codes of a refusal.
async fn encryption_answers(port: u16, db: &str, requests: &[u32]) -> (String, Vec<String>) {
    use tokio::io::AsyncReadExt;
    let mut raw = Raw::connect(port).await;
    let mut answers = String::new();
    for &code in requests {
        raw.send(&encryption_request(code)).await;
        let first = raw.stream.read_u8().await.unwrap();
        answers.push(first as char);
        if first != b'N' {
            let mut rest = vec![first];
            raw.stream.read_to_end(&mut rest).await.unwrap();
            let refusal = crate::common::raw::Msg {
                tag: first,
                body: rest.get(5..).unwrap_or_default().to_vec(),
            };
            return (answers, codes(&[refusal]));
        }
    }
    raw.send(&crate::common::raw::startup_packet(&[
        ("user", "postgres"),
        ("database", db),
    ]))
    .await;
    let started = raw.read_until(|m| m.tag == b'Z' || m.tag == b'E').await;
    answers.push(started.last().unwrap().tag as char);
    (answers, Vec::new())
}

/// An SSLRequest or GSSENCRequest: a length of 8 and the request's code.
fn encryption_request(code: u32) -> Vec<u8> {
    let mut request = 8u32.to_be_bytes().to_vec();
    request.extend(code.to_be_bytes());
    request
}

/// Encryption requests as Postgres answers them: `N` to each (pgfence has no TLS or GSS
/// encryption), alternating SSL and GSS requests any number of times, but one right after
/// a refused one of the same kind is refused as a startup packet of an unknown protocol
/// version (FATAL 0A000).
#[tokio::test]
async fn encryption_requests_are_answered_as_postgres_answers_them() {
    const SSL: u32 = 80_877_103;
    const GSS: u32 = 80_877_104;
    let (db, proxy, bystander) = setup().await;
    let cluster = Cluster::shared();
    // SSL, compared with Postgres (which refuses it: no certificate configured).
    for requests in [&[SSL][..], &[SSL, SSL]] {
        let direct = encryption_answers(cluster.port(), &db, requests).await;
        let proxied = encryption_answers(proxy.port(), &db, requests).await;
        assert_eq!(proxied, direct, "{requests:?}");
    }
    assert_eq!(
        encryption_answers(proxy.port(), &db, &[SSL, SSL]).await,
        ("NE".into(), vec!["0A000".into()])
    );
    // GSS, which this Postgres build accepts ('G'): pgfence refuses it by the same rules.
    for (requests, expected) in [
        (&[GSS, GSS][..], ("NE", &["0A000"][..])),
        (&[SSL, GSS, SSL, GSS], ("NNNNZ", &[])),
        (&[GSS, SSL, SSL], ("NNE", &["0A000"])),
    ] {
        let (answers, codes) = encryption_answers(proxy.port(), &db, requests).await;
        assert_eq!(answers, expected.0, "{requests:?}");
        assert_eq!(codes, expected.1, "{requests:?}");
    }
    still_fine(&bystander, &proxy).await;
}

/// A startup packet sent in the same write as the SSL request, before its answer: Postgres
/// answers `N`, then refuses the bytes that came unasked (FATAL 08P01), and so does pgfence.
#[tokio::test]
async fn a_startup_packet_sent_before_the_ssl_answer_is_refused_as_postgres_refuses_it() {
    use tokio::io::AsyncReadExt;
    let (db, proxy, bystander) = setup().await;
    let mut seen = Vec::new();
    for port in [Cluster::shared().port(), proxy.port()] {
        let mut raw = Raw::connect(port).await;
        let mut bytes = encryption_request(pgfence::protocol::startup::SSL_REQUEST);
        bytes.extend(crate::common::raw::startup_packet(&[
            ("user", "postgres"),
            ("database", &db),
        ]));
        raw.send(&bytes).await;
        let answer = raw.stream.read_u8().await.unwrap();
        let rest = raw.read_until(|_| false).await;
        let said = rest.iter().find_map(|m| m.field(b'M')).unwrap_or_default();
        // pgfence's own errors say so ("pgfence: …").
        assert!(said.ends_with("received unencrypted data after SSL request"), "{said}");
        seen.push((answer as char, tags(&rest), codes(&rest)));
    }
    assert_eq!(seen[0], ('N', "E".to_owned(), vec!["08P01".to_owned()]));
    assert_eq!(seen[1], seen[0], "through pgfence, then straight to Postgres");
    still_fine(&bystander, &proxy).await;
}

/// A startup packet of protocol 2 or older is refused in that protocol's own error form, as
/// Postgres refuses it (`E`, the text, a newline and a NUL), which such a client can read; a
/// newer unknown major version, or 0.0, gets protocol 3's ErrorResponse (0A000).
#[tokio::test]
async fn an_old_protocol_is_refused_in_its_own_error_form() {
    use tokio::io::AsyncReadExt;
    let (_db, proxy, bystander) = setup().await;
    let cluster = Cluster::shared();
    let answer = |port: u16, major: u32| async move {
        let mut packet = 8u32.to_be_bytes().to_vec();
        packet.extend((major << 16).to_be_bytes());
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        s.write_all(&packet).await.unwrap();
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got))
            .await
            .expect("closed")
            .unwrap();
        got
    };
    for major in [1, 2] {
        let text = format!("unsupported frontend protocol {major}.0: server supports 3.0 to 3.0\n\0");
        let direct = answer(cluster.port(), major).await;
        assert_eq!(String::from_utf8_lossy(&direct), format!("EFATAL:  {text}"), "control");
        let proxied = answer(proxy.port(), major).await;
        assert_eq!(String::from_utf8_lossy(&proxied), format!("EFATAL:  pgfence: {text}"));
    }
    // 4.0, and 0.0, which Postgres takes for no version given: protocol 3's form.
    for major in [4, 0] {
        for port in [cluster.port(), proxy.port()] {
            let got = answer(port, major).await;
            assert_eq!(got.first(), Some(&b'E'));
            assert!(got.windows(6).any(|w| w == b"C0A000"), "{major}.0 on {port}: {got:?}");
        }
    }
    still_fine(&bystander, &proxy).await;
}

/// A client that breaks the protocol inside COPY FROM STDIN: pgfence forwards what came
/// before and ends the upstream's input, and Postgres ends the COPY with its own error and
/// FATAL. That is the session's last word; pgfence adds no second FATAL.
#[tokio::test]
async fn a_violation_inside_copy_gets_one_fatal() {
    let (db, proxy, bystander) = setup().await;
    bystander.batch_execute("CREATE TABLE copied (v int)").await.unwrap();
    let (mut raw, _) = Raw::startup(proxy.port(), &[("user", "postgres"), ("database", &db)]).await;
    let mut bytes = query("COPY copied FROM STDIN");
    bytes.extend(message(b'd', b"1\n"));
    // A malformed Query (no closing NUL), which pgfence refuses.
    bytes.extend(message(b'Q', b"SELECT 1"));
    raw.send(&bytes).await;
    let rest = raw.read_until(|_| false).await;
    assert!(raw.closed().await);
    let fatal = |m: &crate::common::raw::Msg| m.tag == b'E' && m.body.windows(7).any(|w| w == b"SFATAL\0");
    assert_eq!(rest.iter().filter(|m| fatal(m)).count(), 1, "{rest:?}");
    assert_eq!(codes(&rest).last().map(String::as_str), Some("08P01"), "{rest:?}");
    still_fine(&bystander, &proxy).await;
}
