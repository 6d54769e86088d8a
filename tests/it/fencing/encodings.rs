//! Statement names and encodings. Postgres converts a name from `client_encoding` to the
//! database's encoding before it keys the statement by it, so in a WIN1252 database a
//! UTF8 client's `é` is one byte, and names pgfence would cut alike are two. pgfence keys
//! a name by its bytes only where Postgres keeps them (the client's own encoding, ASCII);
//! any other non-ASCII name may run anything (PF004 on a fenced database), and a definition
//! under one may have replaced any non-ASCII name. Each test has its control: straight to
//! Postgres the stale write lands.

use super::{Fixture, SEED_SQL, fence_toml, install, take_lease};
use crate::common::inproc::Proxy;
use crate::common::pg::Cluster;
use crate::common::raw::{Raw, codes, message, query, sync};

const STALE: &str = "UPDATE sweep_state SET note = 'stale' WHERE id = 1";

/// A fixture whose database is WIN1252, its lease at epoch 2.
async fn win1252() -> Fixture {
    let cluster = Cluster::shared();
    let db = cluster.fresh_db().await;
    let db = format!("{db}_win1252");
    let postgres = cluster.admin("postgres").await;
    postgres
        .batch_execute(&format!(
            "CREATE DATABASE {db} ENCODING 'WIN1252' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
        ))
        .await
        .unwrap();
    let mut admin = cluster.admin(&db).await;
    admin.batch_execute(SEED_SQL).await.unwrap();
    install(&mut admin, cluster.port(), &fence_toml()).await;
    let proxy = Proxy::start(cluster.port(), &fence_toml()).await;
    take_lease(&admin, "a").await;
    take_lease(&admin, "b").await;
    Fixture {
        cluster,
        db,
        proxy,
        admin,
    }
}

fn cstrs(parts: &[&[u8]]) -> Vec<u8> {
    parts.iter().flat_map(|p| [*p, b"\0"].concat()).collect()
}

fn parse(name: &[u8], sql: &str) -> Vec<u8> {
    message(b'P', &[cstrs(&[name, sql.as_bytes()]), vec![0, 0]].concat())
}

fn bind(portal: &[u8], statement: &[u8]) -> Vec<u8> {
    message(b'B', &[cstrs(&[portal, statement]), vec![0; 6]].concat())
}

fn execute(portal: &[u8]) -> Vec<u8> {
    message(b'E', &[cstrs(&[portal]), vec![0; 4]].concat())
}

fn close(name: &[u8]) -> Vec<u8> {
    message(b'C', &[b"S".as_slice(), &cstrs(&[name])].concat())
}

/// Sends `msgs` and a Sync; the SQLSTATEs of the errors up to ReadyForQuery.
async fn run(s: &mut Raw, msgs: &[Vec<u8>]) -> Vec<String> {
    s.send(&[msgs.concat(), sync()].concat()).await;
    codes(&s.read_until(|m| m.tag == b'Z').await)
}

/// Two names a UTF8 client sends into a WIN1252 database that share their first 63 bytes of
/// UTF-8 but not of WIN1252: one to a byte cut of what the client sent, two to Postgres.
/// The stale write prepared under one runs under it: PF004 through pgfence, by the protocol
/// and by SQL `PREPARE`/`EXECUTE`.
#[tokio::test]
async fn names_a_database_keys_in_another_encoding_run_nothing_unchecked() {
    let f = win1252().await;
    let (a, b) = ("é".repeat(32) + "a", "é".repeat(32) + "b");
    let (c, d) = ("è".repeat(32) + "c", "è".repeat(32) + "d");
    let sql = format!("PREPARE \"{c}\" AS {STALE}; PREPARE \"{d}\" AS SELECT 1; EXECUTE \"{c}\"");
    for port in [f.proxy.port(), f.cluster.port()] {
        let mut s = f.raw(port, "1", &[("client_encoding", "UTF8")]).await;
        let got = run(&mut s, &[parse(a.as_bytes(), STALE), parse(b.as_bytes(), "SELECT 1")]).await;
        assert!(got.is_empty(), "{port}: {got:?}");
        let by_protocol = run(&mut s, &[bind(b"", a.as_bytes()), execute(b"")]).await;
        s.send(&query(&sql)).await;
        let by_sql = codes(&s.read_until(|m| m.tag == b'Z').await);
        if port == f.proxy.port() {
            assert_eq!(
                (by_protocol, by_sql),
                (vec!["PF004".to_owned()], vec!["PF004".to_owned()])
            );
            assert_eq!(f.note().await.0, "init");
        } else {
            assert!(
                by_protocol.is_empty() && by_sql.is_empty(),
                "{by_protocol:?} {by_sql:?}"
            );
            assert_eq!(f.note().await.0, "stale");
        }
    }
}

/// With `client_encoding` the database's own, names are the bytes the client sends, UTF-8
/// or not, cut at 63 as Postgres cuts them: a leader's statement named in WIN1252 runs
/// (before, such a name ended the session as malformed), and after a Close of another
/// spelling of the same 63 bytes and a Parse of the stale write under a third, the first
/// spelling runs that write: checked as the write it is (PF001).
#[tokio::test]
async fn names_in_the_databases_own_encoding_are_the_bytes_sent() {
    let f = win1252().await;
    let own = [("client_encoding", "WIN1252")];
    let mut leader = f.raw(f.proxy.port(), "2", &own).await;
    let got = run(
        &mut leader,
        &[parse(b"caf\xe9", "SELECT 1"), bind(b"", b"caf\xe9"), execute(b"")],
    )
    .await;
    assert!(got.is_empty(), "{got:?}");
    let spelling = |tail: &[u8]| [b"\xe9".repeat(63), tail.to_vec()].concat();
    let (a, b, c) = (spelling(b"a"), spelling(b"b"), spelling(b"c"));
    for port in [f.proxy.port(), f.cluster.port()] {
        let mut s = f.raw(port, "1", &own).await;
        assert!(run(&mut s, &[parse(&a, "SELECT 1")]).await.is_empty());
        assert!(run(&mut s, &[close(&c), parse(&b, STALE)]).await.is_empty());
        let got = run(&mut s, &[bind(b"", &a), execute(b"")]).await;
        f.verdict(port, got, "PF001").await;
    }
}

/// One statement, two spellings: `\xe9\xe9\xe9` while `client_encoding` is WIN1252 and
/// `ééé` while it is UTF8 are one name to Postgres. Closed and prepared again as the stale
/// write under the UTF8 spelling, then bound under the WIN1252 one: pgfence no longer takes
/// it for the read it was (PF004).
#[tokio::test]
async fn a_name_redefined_under_another_spelling_is_not_taken_for_what_it_was() {
    let f = win1252().await;
    let (latin, utf8) = (b"\xe9\xe9\xe9".as_slice(), "ééé".as_bytes());
    for port in [f.proxy.port(), f.cluster.port()] {
        let mut s = f.raw(port, "1", &[("client_encoding", "WIN1252")]).await;
        assert!(run(&mut s, &[parse(latin, "SELECT 1")]).await.is_empty());
        s.simple("SET client_encoding = 'UTF8'").await;
        assert!(run(&mut s, &[close(utf8), parse(utf8, STALE)]).await.is_empty());
        s.simple("SET client_encoding = 'WIN1252'").await;
        let got = run(&mut s, &[bind(b"", latin), execute(b"")]).await;
        f.verdict(port, got, "PF004").await;
    }
}

/// The same in a UTF8 database, with the encoding changed by a request still in flight:
/// pgfence has not seen the change when it reads the name (`\xe9`, which in LATIN1 is `é`).
/// The spelling sent then may be any name that is not ASCII.
#[tokio::test]
async fn a_name_sent_while_the_encoding_may_change_is_not_taken_for_another() {
    let f = Fixture::at_epoch_two().await;
    for port in [f.proxy.port(), f.cluster.port()] {
        let mut s = f.raw(port, "1", &[]).await;
        // A non-ASCII name keeps working as any name.
        let got = run(
            &mut s,
            &[
                parse("é".as_bytes(), "SELECT 1"),
                bind(b"", "é".as_bytes()),
                execute(b""),
            ],
        )
        .await;
        assert!(got.is_empty(), "{got:?}");
        // Postgres reports the change at ReadyForQuery, after the Sync: it converts the
        // names that follow the Execute from LATIN1 already.
        let set = "SET client_encoding = 'LATIN1'";
        let got = run(
            &mut s,
            &[
                parse(b"", set),
                bind(b"", b""),
                execute(b""),
                close(b"\xe9"),
                parse(b"\xe9", STALE),
            ],
        )
        .await;
        assert!(got.is_empty(), "{got:?}");
        s.simple("SET client_encoding = 'UTF8'").await;
        let got = run(&mut s, &[bind(b"", "é".as_bytes()), execute(b"")]).await;
        f.verdict(port, got, "PF004").await;
    }
}

/// A portal bound under a name sent while the encoding may change (an Execute waits for
/// its Sync) may be any non-ASCII name: run later by that name, by the protocol or by SQL
/// `FETCH`, when pgfence would key it, it is refused (PF004), not taken for a portal
/// pgfence never saw bound.
#[tokio::test]
async fn a_portal_bound_under_a_name_pgfence_cannot_key_is_not_taken_for_an_unknown_one() {
    let f = Fixture::at_epoch_two().await;
    let e = "é".as_bytes();
    let runs = [
        [execute(e), sync()].concat(),
        message(b'Q', b"FETCH ALL FROM \"\xc3\xa9\"\0"),
    ];
    for run_it in runs {
        for port in [f.proxy.port(), f.cluster.port()] {
            let mut s = f.raw(port, "1", &[]).await;
            s.simple("BEGIN").await;
            let bound = [
                parse(b"w", &format!("{STALE} RETURNING id")),
                parse(b"", "SELECT 1"),
                bind(b"", b""),
                execute(b""),
                bind(e, b"w"),
            ];
            s.send(&[bound.concat(), sync()].concat()).await;
            let got = s.read_until(|m| m.tag == b'Z').await;
            assert!(
                codes(&got).is_empty(),
                "{port}: {:?}",
                got.iter().find_map(|m| m.field(b'M'))
            );
            s.send(&run_it).await;
            let got = codes(&s.read_until(|m| m.tag == b'Z').await);
            s.simple("COMMIT").await;
            f.verdict(port, got, "PF004").await;
        }
    }
}

/// In a database that is not UTF8, Postgres writes the escape of `U&"\00e9"` in the
/// database's encoding (one byte in WIN1252), while `"é"` sent as UTF-8 bytes by a WIN1252
/// client is two characters: two names, though both read `é` to pgfence. An SQL name that is
/// not ASCII may be any there: its EXECUTE is refused (PF004).
#[tokio::test]
async fn an_escaped_name_is_not_taken_for_the_bytes_it_reads_as() {
    let f = win1252().await;
    let sql = format!("PREPARE U&\"\\00e9\" AS {STALE}; PREPARE \"\u{e9}\" AS SELECT 1; EXECUTE U&\"\\00e9\"");
    for port in [f.proxy.port(), f.cluster.port()] {
        let mut s = f.raw(port, "1", &[("client_encoding", "WIN1252")]).await;
        s.send(&query(&sql)).await;
        let got = codes(&s.read_until(|m| m.tag == b'Z').await);
        f.verdict(port, got, "PF004").await;
    }
}

/// A fence whose name is not ASCII, written by sessions whose `client_encoding` is not
/// UTF8: Postgres reads a text parameter in the client's encoding, so the names pgfence
/// passes its guard must not go as text in the extended protocol (`été` in UTF-8 bytes,
/// read as LATIN1, is another fence, which no epoch has written). Stale writes are refused
/// in both protocols, and no other fence row appears. The control: straight to Postgres
/// the stale write lands.
#[tokio::test]
async fn a_fence_named_in_another_alphabet_is_checked_in_any_client_encoding() {
    use crate::common::raw::{bind as raw_bind, execute as raw_execute, parse as raw_parse};
    let toml = "[[fence]]\nname = \"été\"\ntables = [\"sweep_state\"]\n";
    let f = Fixture::with(Cluster::shared(), toml).await;
    f.leader(5).await.execute(STALE, &[]).await.unwrap();
    // (Not SJIS: it has no `é`, and Postgres cannot send a message naming the fence in it.)
    for encoding in ["LATIN1", "WIN1252", "LATIN9", "UTF8"] {
        for port in [f.proxy.port(), f.cluster.port()] {
            let params = [
                ("user", "postgres"),
                ("database", f.db.as_str()),
                ("client_encoding", encoding),
                ("pgfence.epoch", "3"),
            ];
            let (mut s, _) = Raw::startup(port, &params).await;
            s.send(&[raw_parse("", STALE), raw_bind("", "", &[]), raw_execute(""), sync()].concat())
                .await;
            let extended = codes(&s.read_until(|m| m.tag == b'Z').await);
            let simple = codes(&s.simple(STALE).await);
            if port == f.proxy.port() {
                assert_eq!(
                    (extended, simple),
                    (vec!["PF001".to_owned()], vec!["PF001".to_owned()]),
                    "{encoding}"
                );
            } else {
                assert!(
                    extended.is_empty() && simple.is_empty(),
                    "control {encoding}: {extended:?} {simple:?}"
                );
            }
        }
    }
    let fences: i64 = f
        .admin
        .query_one("SELECT count(*) FROM pgfence.fence", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(fences, 1, "only the configured fence has a row");
    // The refusals pgfence decides name it in the client's encoding, with its epoch.
    let params = [
        ("user", "postgres"),
        ("database", f.db.as_str()),
        ("client_encoding", "LATIN1"),
    ];
    let (mut s, _) = Raw::startup(f.proxy.port(), &params).await;
    s.send(&[raw_parse("", STALE), raw_bind("", "", &[]), raw_execute(""), sync()].concat())
        .await;
    let msgs = s.read_until(|m| m.tag == b'Z').await;
    let error = msgs.iter().find(|m| m.tag == b'E').expect("a refusal");
    assert_eq!(error.code().as_deref(), Some("PF002"));
    let want = b"pgfence: write to fence \"\xe9t\xe9\" without an epoch (current epoch 5)";
    assert!(
        error.body.windows(want.len()).any(|w| w == want),
        "the name in LATIN1, and the fence's epoch: {:?}",
        String::from_utf8_lossy(&error.body)
    );
}

/// A SQL_ASCII database, where Postgres refuses Unicode escapes above U+007F: the texts
/// pgfence writes into its calls (a fence named `été` in the guard call it spells out
/// before its statement is prepared, the messages of its refusals) still reach the
/// database, as UTF-8 bytes. Current writes commit, stale ones get PF001, none PF002, and
/// an `EXECUTE` of no statement Postgres' own 26000. Control: straight to Postgres the
/// stale write lands.
#[tokio::test]
async fn a_fence_named_in_another_alphabet_works_in_a_sql_ascii_database() {
    let cluster = Cluster::shared();
    let db = format!("{}_ascii", cluster.fresh_db().await);
    let postgres = cluster.admin("postgres").await;
    postgres
        .batch_execute(&format!(
            "CREATE DATABASE {db} ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
        ))
        .await
        .unwrap();
    let toml = "[[fence]]\nname = \"été\"\ntables = [\"sweep_state\"]\n";
    let mut admin = cluster.admin(&db).await;
    admin.batch_execute(SEED_SQL).await.unwrap();
    install(&mut admin, cluster.port(), toml).await;
    let proxy = Proxy::start(cluster.port(), toml).await;
    let session = |port: u16, epoch: Option<&'static str>| {
        let db = db.clone();
        async move {
            let mut params = vec![("user", "postgres"), ("database", db.as_str())];
            if let Some(e) = epoch {
                params.push(("pgfence.epoch", e));
            }
            Raw::startup(port, &params).await.0
        }
    };
    // Each session's first write spells the guard call out.
    assert!(codes(&session(proxy.port(), Some("5")).await.simple(STALE).await).is_empty());
    assert_eq!(
        codes(&session(proxy.port(), Some("3")).await.simple(STALE).await),
        ["PF001"]
    );
    let mut none = session(proxy.port(), None).await;
    assert_eq!(codes(&none.simple(STALE).await), ["PF002"]);
    assert_eq!(codes(&none.simple("EXECUTE nosuch").await), ["26000"]);
    // Control.
    assert!(codes(&session(cluster.port(), Some("3")).await.simple(STALE).await).is_empty());
}
