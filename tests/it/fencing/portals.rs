//! Portals that run a write other than by the Execute that follows their Bind. SQL
//! `FETCH` and `MOVE` run a portal, and a portal bound with the protocol may hold a write:
//! Postgres runs an `INSERT`/`UPDATE`/`DELETE … RETURNING` (or a data-modifying WITH) at the
//! portal's first fetch, whichever way that fetch comes. And a Bind Postgres refuses leaves
//! the portal it would have replaced in place. Each case has its control straight to Postgres.

use super::Fixture;
use crate::common::raw::{Raw, bind, close_statement, codes, execute, message, parse, query, sync, tags};

const STALE_UPDATE: &str = "UPDATE sweep_state SET note = 'stale' WHERE id = 1 RETURNING id";

/// Binds `sql` to `portal` and ends the batch with a Sync inside the open transaction
/// (the portal lives on to the transaction's end); the replies are checked.
async fn bind_portal(s: &mut Raw, portal: &str, sql: &str) {
    s.send(&[parse("", sql), bind(portal, "", &[]), sync()].concat()).await;
    assert_eq!(tags(&s.read_until(|m| m.tag == b'Z').await), "12Z");
}

/// `BEGIN`, a portal bound to a stale UPDATE, then the SQL command `run` on it and a
/// COMMIT; returns the error codes `run` got.
async fn fetch_in_transaction(s: &mut Raw, portal: &str, run: &str) -> Vec<String> {
    s.simple("BEGIN").await;
    bind_portal(s, portal, STALE_UPDATE).await;
    let got = codes(&s.simple(run).await);
    s.simple("COMMIT").await;
    got
}

#[tokio::test]
async fn a_portal_fetched_by_sql_is_checked_as_the_write_it_runs() {
    let f = Fixture::at_epoch_two().await;
    let mut s = f.raw(f.proxy.port(), "1", &[]).await;
    for (portal, run) in [
        ("p", "FETCH ALL FROM p"),
        ("p", "FETCH p"),
        ("q", "MOVE ALL IN q"),
        ("Q r", "FETCH FORWARD 1 FROM \"Q r\""),
        ("p", "fetch next from U&\"\\0070\""),
    ] {
        assert_eq!(fetch_in_transaction(&mut s, portal, run).await, ["PF001"], "{run}");
        assert_eq!(f.note().await.0, "init", "{run}");
    }
    // Outside BEGIN: the Query that follows the Bind without a Sync runs in the same
    // implicit transaction, and commits it.
    s.send(&[parse("", STALE_UPDATE), bind("p", "", &[])].concat()).await;
    s.send(&query("FETCH ALL FROM p")).await;
    assert_eq!(codes(&s.read_until(|m| m.tag == b'Z').await), ["PF001"]);
    s.send(&sync()).await;
    s.read_until(|m| m.tag == b'Z').await;
    // In a data-modifying WITH, and from a session that declared no epoch.
    let (mut none, started) = Raw::startup(f.proxy.port(), &[("user", "postgres"), ("database", &f.db)]).await;
    assert_eq!(started.last().map(|m| m.tag), Some(b'Z'));
    none.simple("BEGIN").await;
    bind_portal(
        &mut none,
        "w",
        "WITH u AS (UPDATE sweep_state SET note = 'stale' WHERE id = 1 RETURNING id) SELECT * FROM u",
    )
    .await;
    assert_eq!(codes(&none.simple("FETCH ALL FROM w").await), ["PF002"]);
    none.simple("COMMIT").await;
    assert_eq!(f.note().await.0, "init");

    // The leader's fetch runs its write; a cursor of a plain SELECT needs no epoch.
    let mut leader = f.raw(f.proxy.port(), "2", &[]).await;
    leader.simple("BEGIN").await;
    bind_portal(
        &mut leader,
        "p",
        "UPDATE sweep_state SET note = 'leader' WHERE id = 1 RETURNING id",
    )
    .await;
    let fetched = leader.simple("FETCH ALL FROM p").await;
    assert!(codes(&fetched).is_empty(), "{fetched:?}");
    assert_eq!(tags(&fetched), "TDCZ");
    leader.simple("COMMIT").await;
    assert_eq!(f.note().await.0, "leader");
    let got = none
        .simple("BEGIN; DECLARE c CURSOR FOR SELECT note FROM sweep_state; FETCH ALL FROM c; COMMIT")
        .await;
    assert!(codes(&got).is_empty(), "{got:?}");

    // Control: straight to Postgres the stale fetch commits its write.
    let mut d = f.raw(f.cluster.port(), "1", &[]).await;
    assert!(fetch_in_transaction(&mut d, "p", "FETCH ALL FROM p").await.is_empty());
    assert_eq!(f.note().await.0, "stale");
}

/// `ROLLBACK TO SAVEPOINT sp` by a named portal (a simple Query would drop the unnamed
/// portal); its error codes.
async fn rollback_to_sp_by_portal(s: &mut Raw) -> Vec<String> {
    let rollback_to = [
        parse("rb", "ROLLBACK TO SAVEPOINT sp"),
        bind("rb", "rb", &[]),
        execute("rb"),
        sync(),
    ];
    s.send(&rollback_to.concat()).await;
    codes(&s.read_until(|m| m.tag == b'Z').await)
}

/// `BEGIN`, the unnamed portal bound to a stale write, a savepoint, a Bind of the unnamed
/// portal that Postgres refuses (one parameter too many, 08P01, before the old portal
/// goes), `ROLLBACK TO` the savepoint by a named portal, then Execute of the unnamed portal: it runs the
/// write, so pgfence checks the write. Returns the Execute's error codes.
async fn execute_after_a_refused_bind(s: &mut Raw) -> Vec<String> {
    s.simple("BEGIN").await;
    s.send(
        &[
            parse("", STALE_UPDATE),
            bind("", "", &[]),
            parse("sp", "SAVEPOINT sp"),
            bind("sp", "sp", &[]),
            execute("sp"),
            sync(),
        ]
        .concat(),
    )
    .await;
    assert_eq!(tags(&s.read_until(|m| m.tag == b'Z').await), "1212CZ");
    s.send(&[parse("one", "SELECT 1"), bind("", "one", &["x"]), sync()].concat())
        .await;
    assert_eq!(codes(&s.read_until(|m| m.tag == b'Z').await), ["08P01"]);
    assert!(rollback_to_sp_by_portal(s).await.is_empty());
    s.send(&[execute(""), sync()].concat()).await;
    let got = codes(&s.read_until(|m| m.tag == b'Z').await);
    s.simple("COMMIT").await;
    got
}

#[tokio::test]
async fn a_refused_bind_leaves_the_portal_it_would_replace() {
    let f = Fixture::at_epoch_two().await;
    let mut s = f.raw(f.proxy.port(), "1", &[]).await;
    assert_eq!(execute_after_a_refused_bind(&mut s).await, ["PF001"]);
    assert_eq!(f.note().await.0, "init");
    // Control: straight to Postgres the old portal's stale write commits.
    let mut d = f.raw(f.cluster.port(), "1", &[]).await;
    assert!(execute_after_a_refused_bind(&mut d).await.is_empty());
    assert_eq!(f.note().await.0, "stale");
}

/// A text pgfence takes whole (psql's routine-body rule decides its statement ends) that
/// fetches a portal bound to a stale write is refused.
#[tokio::test]
async fn a_fetch_inside_a_text_taken_whole_is_refused() {
    let f = Fixture::at_epoch_two().await;
    let text = "CREATE FUNCTION pg_temp.f(begin int) RETURNS int LANGUAGE sql AS 'select 1'; FETCH ALL FROM p";
    let mut s = f.raw(f.proxy.port(), "1", &[]).await;
    s.simple("BEGIN").await;
    bind_portal(&mut s, "p", STALE_UPDATE).await;
    assert_eq!(codes(&s.simple(text).await), ["PF004"]);
    s.simple("COMMIT").await;
    assert_eq!(f.note().await.0, "init");
    // Control.
    let mut d = f.raw(f.cluster.port(), "1", &[]).await;
    d.simple("BEGIN").await;
    bind_portal(&mut d, "p", STALE_UPDATE).await;
    assert!(codes(&d.simple(text).await).is_empty());
    d.simple("COMMIT").await;
    assert_eq!(f.note().await.0, "stale");
}

/// Closing a statement of a name over 63 bytes, then defining it again, and running the
/// first: Postgres takes both names for one (their first 63 bytes).
async fn run_after_a_swap_of_long_names(f: &Fixture, port: u16, s1: &str, s2: &str) -> Vec<String> {
    let mut s = f.raw(port, "1", &[]).await;
    s.send(&[parse(s1, "SELECT 1"), sync()].concat()).await;
    s.read_until(|m| m.tag == b'Z').await;
    // Closing s2 closes s1 (the same 63 bytes); s2 is then the stale write.
    s.send(&[close_statement(s2), parse(s2, STALE_UPDATE), sync()].concat())
        .await;
    assert!(codes(&s.read_until(|m| m.tag == b'Z').await).is_empty());
    s.send(&[bind("", s1, &[]), execute(""), sync()].concat()).await;
    codes(&s.read_until(|m| m.tag == b'Z').await)
}

/// Postgres keys protocol statements and portals by their first 63 bytes, and cuts an SQL
/// identifier to 63 bytes too: names that differ only after that are one name.
#[tokio::test]
async fn names_longer_than_63_bytes_are_the_names_postgres_keys() {
    let f = Fixture::at_epoch_two().await;
    let (s1, s2) = (format!("{}1", "s".repeat(66)), format!("{}2", "s".repeat(66)));
    assert_eq!(
        run_after_a_swap_of_long_names(&f, f.proxy.port(), &s1, &s2).await,
        ["PF001"]
    );
    assert_eq!(f.note().await.0, "init");
    // SQL FETCH of a portal bound under a longer name.
    let portal = "p".repeat(75);
    let run = format!("FETCH ALL FROM \"{portal}\"");
    // (Postgres' notice that the identifier is cut, 42622, comes first.)
    let errors = |codes: Vec<String>| codes.into_iter().filter(|c| c != "42622").collect::<Vec<_>>();
    let mut s = f.raw(f.proxy.port(), "1", &[]).await;
    assert_eq!(errors(fetch_in_transaction(&mut s, &portal, &run).await), ["PF001"]);
    assert_eq!(f.note().await.0, "init");
    // Control: straight to Postgres both run the stale write.
    assert!(
        run_after_a_swap_of_long_names(&f, f.cluster.port(), &s1, &s2)
            .await
            .is_empty()
    );
    assert_eq!(f.note().await.0, "stale");
    f.admin
        .execute("UPDATE sweep_state SET note = 'init' WHERE id = 1", &[])
        .await
        .unwrap();
    let mut d = f.raw(f.cluster.port(), "1", &[]).await;
    assert!(errors(fetch_in_transaction(&mut d, &portal, &run).await).is_empty());
    assert_eq!(f.note().await.0, "stale");
}

/// Four more ways the name a portal runs could differ from what pgfence expects, each
/// run at the stale epoch through pgfence (PF001) and straight to Postgres (the write
/// lands): a refused Bind then a good one of the same statement; a refused Bind followed
/// by a skipped one in the same batch; a Close of a portal followed by a Bind of the same
/// name before the Close is answered; and a portal whose statement is itself a FETCH.
#[tokio::test]
async fn what_a_portal_runs_follows_postgres_through_refusals_closes_and_fetches() {
    let f = Fixture::at_epoch_two().await;
    let close_portal = |name: &str| message(b'C', format!("P{name}\0").as_bytes());
    for port in [f.proxy.port(), f.cluster.port()] {
        let direct = port == f.cluster.port();
        let expect = |got: Vec<String>, what: &str| {
            if direct {
                assert!(got.is_empty(), "{what}: {got:?}");
            } else {
                assert_eq!(got, ["PF001"], "{what}");
            }
        };
        let mut s = f.raw(port, "1", &[]).await;
        // Refused, then bound again from the same statement.
        s.send(&[parse("w", STALE_UPDATE), bind("", "w", &["x"]), sync()].concat())
            .await;
        assert_eq!(codes(&s.read_until(|m| m.tag == b'Z').await), ["08P01"]);
        s.send(&[bind("", "w", &[]), execute(""), sync()].concat()).await;
        expect(codes(&s.read_until(|m| m.tag == b'Z').await), "bound again");
        // Refused, then skipped, in one batch; the portal from before the savepoint runs.
        s.simple("BEGIN").await;
        s.send(
            &[
                bind("", "w", &[]),
                parse("sp", "SAVEPOINT sp"),
                bind("sp", "sp", &[]),
                execute("sp"),
                parse("one", "SELECT 1"),
                sync(),
            ]
            .concat(),
        )
        .await;
        s.read_until(|m| m.tag == b'Z').await;
        s.send(&[bind("", "one", &["x"]), bind("", "one", &[]), sync()].concat())
            .await;
        assert_eq!(codes(&s.read_until(|m| m.tag == b'Z').await), ["08P01"]);
        rollback_to_sp_by_portal(&mut s).await;
        s.send(&[execute(""), sync()].concat()).await;
        expect(codes(&s.read_until(|m| m.tag == b'Z').await), "refused then skipped");
        s.simple("ROLLBACK").await;
        // Closed, then bound again before the Close is answered.
        s.simple("BEGIN").await;
        s.send(&[close_portal("x"), bind("x", "w", &[]), sync()].concat()).await;
        s.read_until(|m| m.tag == b'Z').await;
        s.send(&[execute("x"), sync()].concat()).await;
        expect(codes(&s.read_until(|m| m.tag == b'Z').await), "closed then bound");
        s.simple("ROLLBACK").await;
        // A portal whose statement fetches another.
        s.simple("BEGIN").await;
        bind_portal(&mut s, "y", STALE_UPDATE).await;
        s.send(&[parse("f", "FETCH ALL FROM y"), bind("x", "f", &[]), sync()].concat())
            .await;
        s.read_until(|m| m.tag == b'Z').await;
        expect(codes(&s.simple("FETCH ALL FROM x").await), "fetch of a fetch");
        s.simple("ROLLBACK").await;
    }
    assert_eq!(f.note().await.0, "stale");
}

/// The refused Bind of the test above, with everything sent in one write: pgfence
/// decides the later Execute before Postgres has refused the Bind, so that Execute may
/// run either statement. A division by zero after the savepoint makes Postgres refuse the
/// next Bind (25P02) and keep the portal; `ROLLBACK TO` brings the transaction back.
#[tokio::test]
async fn a_bind_refused_later_in_the_same_pipeline_leaves_the_portal_it_would_replace() {
    let f = Fixture::at_epoch_two().await;
    let pipeline = [
        query("BEGIN"),
        parse("w", STALE_UPDATE),
        bind("", "w", &[]),
        parse("sp", "SAVEPOINT sp"),
        bind("sp", "sp", &[]),
        execute("sp"),
        parse("z", "SELECT 1/0"),
        bind("z", "z", &[]),
        execute("z"),
        sync(),
        parse("one", "SELECT 1"),
        bind("", "one", &[]),
        sync(),
        parse("rb", "ROLLBACK TO SAVEPOINT sp"),
        bind("rb", "rb", &[]),
        execute("rb"),
        sync(),
        execute(""),
        sync(),
        query("COMMIT"),
    ]
    .concat();
    for port in [f.proxy.port(), f.cluster.port()] {
        let got = six_batches(&f, port, &[], &pipeline).await;
        assert_eq!(got[1..3], [["22012"], ["25P02"]], "{got:?}");
        old_portal_outcome(&f, port, &got, "").await;
    }
}

/// Sends `first` (when not empty, its answer awaited) then `pipeline` in one write on
/// `port`, at the stale epoch; the error codes of the pipeline's six batches.
async fn six_batches(f: &Fixture, port: u16, first: &[u8], pipeline: &[u8]) -> Vec<Vec<String>> {
    let mut s = f.raw(port, "1", &[]).await;
    if !first.is_empty() {
        s.send(first).await;
        s.read_until(|m| m.tag == b'Z').await;
    }
    s.send(pipeline).await;
    let mut got = Vec::new();
    for _ in 0..6 {
        got.push(codes(&s.read_until(|m| m.tag == b'Z').await));
    }
    got
}

/// The pipeline's last Execute (its fifth batch) runs the old portal's stale write: PF001
/// through pgfence; straight to Postgres (the control) it runs and commits.
async fn old_portal_outcome(f: &Fixture, port: u16, got: &[Vec<String>], what: &str) {
    if port == f.proxy.port() {
        assert_eq!(got[4], ["PF001"], "{what}: {got:?}");
        assert_eq!(f.note().await.0, "init", "{what}");
    } else {
        assert!(got[4].is_empty(), "{what}: {got:?}");
        assert_eq!(f.note().await.0, "stale", "{what}");
    }
}

/// The same with the transaction opened by a `BEGIN` prepared in an earlier round trip:
/// its Bind, not its text, is all pgfence sees of it in the pipeline.
#[tokio::test]
async fn a_begin_prepared_earlier_counts_when_it_is_bound() {
    for begin in ["BEGIN", ";BEGIN", ";; START TRANSACTION"] {
        a_begin_prepared_earlier_counts(begin).await;
    }
}

async fn a_begin_prepared_earlier_counts(begin: &str) {
    let f = Fixture::at_epoch_two().await;
    let pipeline = [
        bind("bp", "beg", &[]),
        execute("bp"),
        sync(),
        parse("w", STALE_UPDATE),
        bind("", "w", &[]),
        parse("sp", "SAVEPOINT sp"),
        bind("sp", "sp", &[]),
        execute("sp"),
        sync(),
        parse("one", "SELECT 1"),
        bind("", "one", &["x"]),
        sync(),
        parse("rb", "ROLLBACK TO SAVEPOINT sp"),
        bind("rb", "rb", &[]),
        execute("rb"),
        sync(),
        execute(""),
        sync(),
        query("COMMIT"),
    ]
    .concat();
    let prepare = [parse("beg", begin), sync()].concat();
    for port in [f.proxy.port(), f.cluster.port()] {
        let got = six_batches(&f, port, &prepare, &pipeline).await;
        assert_eq!(got[2], ["08P01"], "{begin}: {got:?}");
        old_portal_outcome(&f, port, &got, begin).await;
    }
}

/// A Query that Postgres skips after an error in the extended protocol gets no answer at
/// all: pgfence does not wait for one. A portal of the next batch is gone at its idle
/// ReadyForQuery, so a read bound to that name later runs as the read it is, with no epoch
/// (before, pgfence still counted the skipped Query, kept the portal, and took the read for
/// the write the name had held: PF002).
#[tokio::test]
async fn a_query_skipped_after_an_error_is_not_waited_for() {
    let f = Fixture::at_epoch_two().await;
    let params = [("user", "postgres"), ("database", f.db.as_str())];
    let (mut s, _) = Raw::startup(f.proxy.port(), &params).await;
    s.send(&[parse("", "selec 1"), query("SELECT 1"), sync()].concat())
        .await;
    assert_eq!(codes(&s.read_until(|m| m.tag == b'Z').await), ["42601"]);
    s.send(&[parse("ws", STALE_UPDATE), bind("w", "ws", &[]), sync()].concat())
        .await;
    assert!(codes(&s.read_until(|m| m.tag == b'Z').await).is_empty());
    let read = [
        parse("rs", "SELECT count(*) FROM sweep_state"),
        bind("w", "rs", &[]),
        execute("w"),
        sync(),
    ];
    s.send(&read.concat()).await;
    let got = s.read_until(|m| m.tag == b'Z').await;
    assert!(codes(&got).is_empty(), "{got:?}");
    assert!(got.iter().any(|m| m.tag == b'D'));
}

/// Names longer than the part of a Bind pgfence reads (64 KiB) are keyed, as Postgres
/// keys them, by their first 63 bytes: a read under such a statement name runs (before, the
/// session ended with 08P01), and the stale write under it is refused (PF001) as under any
/// name. A statement name that starts beyond that part, after a portal name of more than 64
/// KiB (which only SQL `FETCH` can run: Postgres takes an Execute of at most 10 000 bytes),
/// may be any: refused (PF004) on a database with fences. Control: straight to Postgres the
/// stale write lands.
#[tokio::test]
async fn names_longer_than_a_bind_is_read_are_keyed_by_their_first_bytes() {
    let f = Fixture::at_epoch_two().await;
    let (statement, portal) = ("s".repeat(70_000), "p".repeat(100));
    for port in [f.proxy.port(), f.cluster.port()] {
        let direct = port == f.cluster.port();
        let mut s = f.raw(port, "1", &[]).await;
        let read = [
            parse(&statement, "SELECT 1"),
            bind(&portal, &statement, &[]),
            execute(&portal),
            sync(),
        ];
        s.send(&read.concat()).await;
        assert_eq!(tags(&s.read_until(|m| m.tag == b'Z').await), "12DCZ", "{port}");
        s.simple("BEGIN").await;
        let huge = "p".repeat(70_000);
        s.send(&[bind(&huge, &statement, &[]), sync()].concat()).await;
        assert_eq!(tags(&s.read_until(|m| m.tag == b'Z').await), "2Z");
        s.send(&query(&format!("FETCH ALL FROM \"{huge}\""))).await;
        let got = codes(&s.read_until(|m| m.tag == b'Z').await);
        let got: Vec<_> = got.into_iter().filter(|c| c != "42622").collect();
        assert_eq!(got, if direct { vec![] } else { vec!["PF004".to_owned()] });
        s.simple("ROLLBACK").await;
        s.simple("BEGIN").await;
        // (A Close of so long a name is more than Postgres takes: another name.)
        let writer = "w".repeat(70_000);
        let write = [
            parse(&writer, STALE_UPDATE),
            bind(&portal, &writer, &[]),
            execute(&portal),
            sync(),
        ];
        s.send(&write.concat()).await;
        let got = codes(&s.read_until(|m| m.tag == b'Z').await);
        s.simple("COMMIT").await;
        if direct {
            assert!(got.is_empty(), "{got:?}");
            assert_eq!(f.note().await.0, "stale");
        } else {
            assert_eq!(got, ["PF001"]);
            assert_eq!(f.note().await.0, "init");
        }
    }
}

/// SQL `EXECUTE` of a prepared statement that itself runs something by name: an `EXECUTE`
/// of a prepared write (several deep), an `EXPLAIN ANALYZE EXECUTE`, a `FETCH`/`MOVE` of a
/// portal holding a write. Postgres follows every step
/// when the statement runs, so pgfence checks what the last one writes. Before, it
/// looked one step down and let the stale write through. Each form is run straight to
/// Postgres too, where the write lands.
#[tokio::test]
async fn what_an_execute_runs_by_name_is_followed_to_the_write() {
    const WRITE: &str = "UPDATE sweep_state SET note = 'stale' WHERE id = 1";
    let f = Fixture::at_epoch_two().await;
    // (setup batches, each sent and read to its ReadyForQuery; then the Query run in a
    // transaction).
    let forms: Vec<(&str, Vec<Vec<u8>>, &str)> = vec![
        (
            "EXECUTE of a prepared EXECUTE",
            vec![[parse("s", WRITE), parse("e", "EXECUTE s"), sync()].concat()],
            "EXECUTE e",
        ),
        (
            "three EXECUTEs deep, the write PREPAREd in SQL",
            vec![
                query(&format!("PREPARE s AS {WRITE}")),
                [parse("e1", "EXECUTE s"), parse("e2", "EXECUTE e1"), sync()].concat(),
            ],
            "EXECUTE e2",
        ),
        (
            "EXECUTE of a prepared EXPLAIN ANALYZE EXECUTE",
            vec![[parse("s", WRITE), parse("e", "EXPLAIN ANALYZE EXECUTE s"), sync()].concat()],
            "EXECUTE e",
        ),
        (
            "EXECUTE of a prepared FETCH",
            vec![
                [parse("e", "FETCH ALL pp"), sync()].concat(),
                [parse("", STALE_UPDATE), bind("pp", "", &[]), sync()].concat(),
            ],
            "EXECUTE e",
        ),
        (
            "EXECUTE of a prepared MOVE",
            vec![
                [parse("e", "MOVE ALL pp"), sync()].concat(),
                [parse("", STALE_UPDATE), bind("pp", "", &[]), sync()].concat(),
            ],
            "EXECUTE e",
        ),
    ];
    for (what, setup, run) in &forms {
        for port in [f.proxy.port(), f.cluster.port()] {
            f.put_back().await;
            let mut s = f.raw(port, "1", &[]).await;
            s.simple("BEGIN").await;
            for batch in setup {
                s.send(batch).await;
                let replies = s.read_until(|m| m.tag == b'Z').await;
                assert_eq!(codes(&replies), Vec::<String>::new(), "{what}: setup");
            }
            let got = codes(&s.simple(run).await);
            s.simple("COMMIT").await;
            let note = f.note().await.0;
            if port == f.proxy.port() {
                assert_eq!(got, ["PF001"], "{what}");
                assert_eq!(note, "init", "{what}: the stale write committed");
            } else {
                assert_eq!(got, Vec::<String>::new(), "{what}: straight to Postgres");
                assert_eq!(note, "stale", "{what}: the control's write landed");
            }
        }
    }
}

/// The chain is followed 8 `EXECUTE`s down; one more is refused (`PF004`) even at the
/// current epoch, where Postgres itself runs it.
#[tokio::test]
async fn a_chain_of_executes_is_followed_eight_steps() {
    let f = Fixture::at_epoch_two().await;
    let mut chain = vec![parse("e0", "UPDATE sweep_state SET note = 'chained' WHERE id = 1")];
    for i in 1..=8 {
        chain.push(parse(&format!("e{i}"), &format!("EXECUTE e{}", i - 1)));
    }
    chain.push(sync());
    for port in [f.proxy.port(), f.cluster.port()] {
        let mut s = f.raw(port, "2", &[]).await;
        s.send(&chain.concat()).await;
        assert_eq!(codes(&s.read_until(|m| m.tag == b'Z').await), Vec::<String>::new());
        assert_eq!(codes(&s.simple("EXECUTE e7").await), Vec::<String>::new(), "{port}");
        let nine = codes(&s.simple("EXECUTE e8").await);
        if port == f.proxy.port() {
            assert_eq!(nine, ["PF004"]);
        } else {
            assert_eq!(nine, Vec::<String>::new());
        }
        assert_eq!(f.note().await.0, "chained");
    }
}

/// A statement that changes what pgfence tracks of the session, prepared with the protocol
/// (Parse takes any statement) and run by SQL `EXECUTE`: Postgres applies it, and pgfence,
/// which sees an `EXECUTE`, would not. Before, each of these let a stale write through
/// afterwards: a statement name redefined behind pgfence's back, an epoch lowered without
/// pgfence knowing, a rollback to a savepoint taken for the end of the transaction. Now the
/// `EXECUTE` is refused (`PF004`) on a database with fences; straight to Postgres (the
/// control) the same script ends with the stale write committed.
#[tokio::test]
async fn a_session_change_run_by_sql_execute_is_refused() {
    let f = Fixture::at_epoch_two().await;
    let write = "UPDATE sweep_state SET note = 'stale' WHERE id = 1";
    /// The epoch declared at startup, setup batches, the refused Query, then what writes.
    struct Script {
        what: &'static str,
        epoch: &'static str,
        setup: Vec<Vec<u8>>,
        execute: &'static str,
        then: String,
    }
    let scripts = [
        Script {
            what: "a DEALLOCATE and a PREPARE of a read's name",
            epoch: "1",
            setup: vec![
                query("PREPARE w AS SELECT 1"),
                [
                    parse("d", "DEALLOCATE w"),
                    parse("p", &format!("PREPARE w AS {write}")),
                    sync(),
                ]
                .concat(),
            ],
            execute: "EXECUTE d",
            then: "EXECUTE p; EXECUTE w".into(),
        },
        Script {
            what: "a SET of the epoch",
            epoch: "2",
            setup: vec![[parse("se", "SET pgfence.epoch = 1"), sync()].concat()],
            execute: "EXECUTE se",
            then: write.into(),
        },
        Script {
            what: "a ROLLBACK TO SAVEPOINT",
            epoch: "2",
            setup: vec![
                [parse("rb", "ROLLBACK TO SAVEPOINT a"), sync()].concat(),
                query("BEGIN; SET pgfence.epoch = 1; SAVEPOINT a"),
            ],
            execute: "EXECUTE rb",
            then: write.into(),
        },
    ];
    for Script {
        what,
        epoch,
        setup,
        execute,
        then,
    } in &scripts
    {
        for port in [f.proxy.port(), f.cluster.port()] {
            f.put_back().await;
            let mut s = f.raw(port, epoch, &[]).await;
            for batch in setup {
                s.send(batch).await;
                let replies = s.read_until(|m| m.tag == b'Z').await;
                assert_eq!(codes(&replies), Vec::<String>::new(), "{what}: setup");
            }
            let got = codes(&s.simple(execute).await);
            if port == f.proxy.port() {
                assert_eq!(got, ["PF004"], "{what}");
            } else {
                assert_eq!(got, Vec::<String>::new(), "{what}: straight to Postgres");
                s.simple(then).await;
                s.simple("COMMIT").await;
                assert_eq!(f.note().await.0, "stale", "{what}: the control's write landed");
            }
        }
    }
}

/// On a database no fence applies to, nothing is refused for being beyond pgfence's sight:
/// a chain deeper than it follows runs as straight to Postgres.
#[tokio::test]
async fn a_database_without_fences_runs_any_chain() {
    let toml = "[[fence]]\nname = \"sweeper\"\ndatabase = \"elsewhere\"\ntables = [\"public.sweep_state\"]\n";
    let f = Fixture::with(crate::common::pg::Cluster::shared(), toml).await;
    let mut chain = vec![parse("e0", "UPDATE sweep_state SET note = 'deep' WHERE id = 1")];
    for i in 1..=10 {
        chain.push(parse(&format!("e{i}"), &format!("EXECUTE e{}", i - 1)));
    }
    chain.push(parse("se", "SET pgfence.epoch = 1"));
    chain.push(sync());
    let (mut s, started) = Raw::startup(f.proxy.port(), &[("user", "postgres"), ("database", &f.db)]).await;
    assert_eq!(started.last().map(|m| m.tag), Some(b'Z'));
    s.send(&chain.concat()).await;
    assert_eq!(codes(&s.read_until(|m| m.tag == b'Z').await), Vec::<String>::new());
    assert_eq!(codes(&s.simple("EXECUTE e10").await), Vec::<String>::new());
    assert_eq!(codes(&s.simple("EXECUTE se").await), Vec::<String>::new());
    assert_eq!(f.note().await.0, "deep");
}

/// A portal is forgotten when Postgres drops it: SQL `CLOSE` of it, `CLOSE ALL`, or the end
/// of its transaction (a `COMMIT` or `ROLLBACK` in the middle of a string included). Its
/// name can then be a read cursor's, and fetching from that is a read, as straight to
/// Postgres; before, it was refused as the write the old portal held. A portal that is
/// still there is still checked: one `CLOSE` does not name, and one bound after the
/// transaction's end in the same pipeline.
#[tokio::test]
async fn a_portal_closed_or_ended_is_forgotten_and_no_other() {
    let f = Fixture::at_epoch_two().await;
    let read_again = "DECLARE pp CURSOR FOR SELECT 42";
    for (what, drop_it) in [
        ("CLOSE", "CLOSE pp"),
        ("CLOSE ALL", "CLOSE ALL"),
        ("ROLLBACK in a string", "ROLLBACK; BEGIN"),
        ("COMMIT AND CHAIN", "COMMIT AND CHAIN"),
    ] {
        for port in [f.proxy.port(), f.cluster.port()] {
            let mut s = f.raw(port, "1", &[]).await;
            s.simple("BEGIN").await;
            bind_portal(&mut s, "pp", STALE_UPDATE).await;
            assert_eq!(codes(&s.simple(drop_it).await), Vec::<String>::new(), "{what}");
            assert_eq!(codes(&s.simple(read_again).await), Vec::<String>::new(), "{what}");
            let fetched = s.simple("FETCH pp").await;
            assert_eq!(
                (codes(&fetched), tags(&fetched)),
                (vec![], "TDCZ".into()),
                "{what}: {port}"
            );
            s.simple("ROLLBACK").await;
        }
    }
    // Still there: CLOSE of another portal leaves it.
    let mut s = f.raw(f.proxy.port(), "1", &[]).await;
    s.simple("BEGIN").await;
    bind_portal(&mut s, "pp", STALE_UPDATE).await;
    s.send(&[parse("", "SELECT 1"), bind("other", "", &[]), sync()].concat())
        .await;
    let bound = s.read_until(|m| m.tag == b'Z').await;
    assert_eq!(tags(&bound), "12Z", "{:?}", crate::common::raw::codes(&bound));
    assert_eq!(codes(&s.simple("CLOSE other").await), Vec::<String>::new());
    assert_eq!(codes(&s.simple("FETCH pp").await), ["PF001"]);
    s.simple("ROLLBACK").await;
    // Bound after a COMMIT that is still in flight: the COMMIT does not drop it.
    s.send(
        &[
            query("BEGIN"),
            query("COMMIT; BEGIN"),
            parse("", STALE_UPDATE),
            bind("pp", "", &[]),
            sync(),
        ]
        .concat(),
    )
    .await;
    s.read_until(|m| m.tag == b'Z').await;
    s.read_until(|m| m.tag == b'Z').await;
    assert_eq!(tags(&s.read_until(|m| m.tag == b'Z').await), "12Z");
    assert_eq!(codes(&s.simple("FETCH ALL pp").await), ["PF001"]);
    s.simple("ROLLBACK").await;
    assert_eq!(f.note().await.0, "init");
}

/// Messages to send, each with what to wait for after it.
type Steps = Vec<(Vec<u8>, Wait)>;

/// What to wait for after sending a step of a [`plan`].
#[derive(Clone, Copy)]
enum Wait {
    /// This many ReadyForQuery.
    Ready(usize),
    /// This many messages with this tag (an ErrorResponse counts as one).
    Count(u8, usize),
}

/// Sends each step on a session at `epoch` on `port`, waiting as it says; the error
/// codes of all the replies.
async fn plan(f: &Fixture, port: u16, epoch: &str, steps: Steps) -> Vec<String> {
    let mut s = f.raw(port, epoch, &[]).await;
    let mut got = Vec::new();
    for (bytes, wait) in steps {
        s.send(&bytes).await;
        match wait {
            Wait::Ready(n) => {
                for _ in 0..n {
                    got.extend(codes(&s.read_until(|m| m.tag == b'Z').await));
                }
            }
            Wait::Count(tag, n) => {
                for _ in 0..n {
                    got.extend(codes(&s.read_until(|m| m.tag == tag || m.tag == b'E').await));
                }
            }
        }
    }
    got
}

fn flush() -> Vec<u8> {
    message(b'H', &[])
}

/// A portal bound to a stale write lives on where Postgres opened a transaction block, or
/// kept the implicit transaction open, in ways pgfence's reading of the messages does not
/// show: its later Execute is still checked. Straight to Postgres (the control) the write
/// commits.
#[tokio::test]
async fn a_portal_held_in_a_transaction_pgfence_cannot_see_is_still_checked() {
    let f = Fixture::at_epoch_two().await;
    let stale = "UPDATE sweep_state SET note = 'stale' WHERE id = 1";
    let write_p = || [parse("w", stale), bind("p", "w", &[])].concat();
    let run_p = || [execute("p"), sync()].concat();
    // Each builds its steps from the Bind of the write and the run of it.
    type Case = (&'static str, fn(Vec<u8>, Vec<u8>) -> Steps);
    let cases: [Case; 6] = [
        ("a BEGIN executed before a Flush, its Sync still to come", |w, r| {
            vec![
                (
                    [parse("b", "BEGIN"), bind("", "b", &[]), execute(""), flush()].concat(),
                    Wait::Count(b'C', 1),
                ),
                ([w, sync()].concat(), Wait::Ready(1)),
                (r, Wait::Ready(1)),
                (query("COMMIT"), Wait::Ready(1)),
            ]
        }),
        ("a BEGIN prepared by Parse, run by SQL EXECUTE", |w, r| {
            vec![
                ([parse("b", "BEGIN"), sync()].concat(), Wait::Ready(1)),
                ([query("EXECUTE b"), w, sync()].concat(), Wait::Ready(2)),
                (r, Wait::Ready(1)),
                (query("COMMIT"), Wait::Ready(1)),
            ]
        }),
        ("a BEGIN run by an EXECUTE prepared by Parse", |w, r| {
            vec![
                (
                    [parse("b", "BEGIN"), parse("x", "EXECUTE b"), sync()].concat(),
                    Wait::Ready(1),
                ),
                ([bind("", "x", &[]), execute(""), w, sync()].concat(), Wait::Ready(1)),
                (r, Wait::Ready(1)),
                (query("COMMIT"), Wait::Ready(1)),
            ]
        }),
        ("a BEGIN after a string's end that a pending SET moves", |w, r| {
            vec![
                (query("SET standard_conforming_strings = off"), Wait::Ready(1)),
                (
                    [
                        query("SET standard_conforming_strings = on"),
                        query("SELECT 'a\\'; BEGIN; --'"),
                        w,
                        sync(),
                    ]
                    .concat(),
                    Wait::Ready(3),
                ),
                (r, Wait::Ready(1)),
                (query("COMMIT"), Wait::Ready(1)),
            ]
        }),
        ("a BEGIN statement whose re-Parse Postgres refused", |w, r| {
            vec![
                ([parse("b", "BEGIN"), sync()].concat(), Wait::Ready(1)),
                ([parse("b", "SELECT 1"), sync()].concat(), Wait::Ready(1)),
                ([bind("", "b", &[]), execute(""), w, sync()].concat(), Wait::Ready(1)),
                (r, Wait::Ready(1)),
                (query("COMMIT"), Wait::Ready(1)),
            ]
        }),
        ("a Sync that Postgres ignores in COPY", |w, r| {
            vec![
                (
                    [
                        w,
                        parse("c", "COPY audit FROM STDIN"),
                        bind("", "c", &[]),
                        execute(""),
                        sync(),
                    ]
                    .concat(),
                    Wait::Count(b'G', 1),
                ),
                (
                    [message(b'd', b"1\tcopied\n"), message(b'c', &[]), r].concat(),
                    Wait::Ready(1),
                ),
            ]
        }),
    ];
    for (what, steps) in cases {
        // Checked (PF001), or refused where the block would open (PF004: SQL `EXECUTE` of
        // a `BEGIN`).
        let got = plan(&f, f.proxy.port(), "1", steps(write_p(), run_p())).await;
        assert!(got.iter().any(|c| c == "PF001" || c == "PF004"), "{what}: {got:?}");
        assert_eq!(f.note().await.0, "init", "{what}");
        let got = plan(&f, f.cluster.port(), "1", steps(write_p(), run_p())).await;
        assert!(!got.iter().any(|c| c.starts_with("PF")), "{what}: {got:?}");
        assert_eq!(f.note().await.0, "stale", "{what}");
        f.admin
            .batch_execute("UPDATE sweep_state SET note = 'init' WHERE id = 1; TRUNCATE audit")
            .await
            .unwrap();
    }
}

/// A portal bound in an implicit transaction that a Flush left open goes into the block a
/// client's `BEGIN` opens there: pgfence prepares its guard statement (a Query of its own)
/// only once no Bind waits for its Sync, or that Query would end the transaction first.
#[tokio::test]
async fn a_portal_bound_before_the_first_query_is_kept_by_its_begin() {
    let f = Fixture::at_epoch_two().await;
    for port in [f.proxy.port(), f.cluster.port()] {
        let mut s = f.raw(port, "2", &[]).await;
        s.send(&[parse("r", "SELECT 42"), bind("p", "r", &[]), flush()].concat())
            .await;
        s.read_until(|m| m.tag == b'2').await;
        assert!(codes(&s.simple("BEGIN").await).is_empty());
        s.send(&[execute("p"), sync()].concat()).await;
        let ran = s.read_until(|m| m.tag == b'Z').await;
        assert_eq!((codes(&ran), tags(&ran)), (vec![], "DCZ".to_owned()), "{port}");
        s.simple("COMMIT").await;
    }
}

/// A block opened where pgfence cannot see (SQL `EXECUTE` of a Parse'd `BEGIN`) keeps a
/// portal bound to a stale write through a failed batch that would have closed and re-bound
/// it; `ROLLBACK TO` brings the block back and the portal runs, by Execute or by SQL `FETCH`.
/// pgfence refuses that `EXECUTE` (PF004), and checks what the name held before each
/// unanswered Bind, block or not; straight to Postgres (the control) the write commits.
#[tokio::test]
async fn a_rebind_in_a_failed_batch_of_an_unseen_block_leaves_the_write_checked() {
    let f = Fixture::at_epoch_two().await;
    let prepared = [
        parse("b", "BEGIN"),
        parse("w", "UPDATE sweep_state SET note = 'stale' WHERE id = 1 RETURNING id"),
        parse("r", "SELECT 1"),
        parse("e", "SELECT 1/0"),
        parse("sp", "SAVEPOINT s"),
        parse("rb", "ROLLBACK TO SAVEPOINT s"),
        sync(),
    ]
    .concat();
    let open = || {
        [
            query("EXECUTE b"),
            bind("p", "w", &[]),
            bind("", "sp", &[]),
            execute(""),
        ]
        .concat()
    };
    let failed_rebind = || {
        [
            bind("", "e", &[]),
            execute(""),
            message(b'C', b"Pp\0"),
            bind("p", "r", &[]),
            sync(),
            bind("", "rb", &[]),
            execute(""),
        ]
        .concat()
    };
    let cases: [(&str, Steps); 3] = [
        (
            "answered after a Flush, then Execute",
            vec![
                (prepared.clone(), Wait::Ready(1)),
                ([open(), flush()].concat(), Wait::Count(b'C', 2)),
                ([failed_rebind(), execute("p"), sync()].concat(), Wait::Ready(2)),
                (query("COMMIT"), Wait::Ready(1)),
            ],
        ),
        (
            "all in one write, then Execute",
            vec![
                (prepared.clone(), Wait::Ready(1)),
                (
                    [open(), flush(), failed_rebind(), execute("p"), sync()].concat(),
                    Wait::Ready(3),
                ),
                (query("COMMIT"), Wait::Ready(1)),
            ],
        ),
        (
            "answered after a Flush, then FETCH",
            vec![
                (prepared.clone(), Wait::Ready(1)),
                ([open(), flush()].concat(), Wait::Count(b'C', 2)),
                (
                    [failed_rebind(), sync(), query("FETCH ALL FROM p")].concat(),
                    Wait::Ready(3),
                ),
                (query("COMMIT"), Wait::Ready(1)),
            ],
        ),
    ];
    for (what, steps) in cases {
        // Refused where the block would open (PF004), or checked (PF001).
        let got = plan(&f, f.proxy.port(), "1", steps.clone()).await;
        assert!(got.iter().any(|c| c == "PF001" || c == "PF004"), "{what}: {got:?}");
        assert_eq!(f.note().await.0, "init", "{what}");
        let got = plan(&f, f.cluster.port(), "1", steps).await;
        assert_eq!(got, ["22012"], "{what}");
        assert_eq!(f.note().await.0, "stale", "{what}");
        f.put_back().await;
    }
}

/// A name bound twice in a block, each Bind sent before Postgres answered the other and
/// each refused or skipped; the first answered before an Execute (or FETCH) of the name is
/// sent, the second not: the write the name held from before both is what runs, and it is
/// checked. The second Bind's batch waits on an advisory lock another session holds until
/// the Execute is sent.
#[tokio::test]
async fn a_portal_bound_twice_in_vain_runs_its_first_write_checked() {
    let f = Fixture::at_epoch_two().await;
    let locker = f.direct().await;
    let statements = [
        parse("w", "UPDATE sweep_state SET note = 'stale' WHERE id = 1 RETURNING id"),
        parse("r", "SELECT 1"),
        parse("e", "SELECT 1/0"),
        parse("z", "SELECT pg_advisory_xact_lock(4242)"),
        parse("sp", "SAVEPOINT s"),
        parse("rb", "ROLLBACK TO SAVEPOINT s"),
    ]
    .concat();
    // (what, the name, the failed batch's Close, the refused Bind's parameters, the run)
    type Case = (&'static str, &'static str, Vec<u8>, &'static [&'static str], Vec<u8>);
    let cases: [Case; 3] = [
        (
            "named, Execute",
            "p",
            message(b'C', b"Pp\0"),
            &[],
            [execute("p"), sync()].concat(),
        ),
        (
            "named, FETCH",
            "p",
            message(b'C', b"Pp\0"),
            &[],
            query("FETCH ALL FROM p"),
        ),
        (
            "unnamed, refused for its parameters",
            "",
            Vec::new(),
            &["1"],
            [execute(""), sync()].concat(),
        ),
    ];
    for (what, name, close, params, run) in cases {
        for port in [f.proxy.port(), f.cluster.port()] {
            locker.batch_execute("SELECT pg_advisory_lock(4242)").await.unwrap();
            let mut s = f.raw(port, "1", &[]).await;
            s.simple("BEGIN").await;
            let setup = [
                statements.clone(),
                bind(name, "w", &[]),
                bind("sp", "sp", &[]),
                execute("sp"),
                sync(),
            ];
            s.send(&setup.concat()).await;
            assert!(codes(&s.read_until(|m| m.tag == b'Z').await).is_empty(), "{what}");
            // The first batch fails before its Close and Bind; back to the savepoint; the next
            // batch waits on the lock before its Bind, which Postgres refuses.
            let back = || [bind("rb", "rb", &[]), execute("rb"), sync()].concat();
            let failed = [
                bind("x", "e", &[]),
                execute("x"),
                close.clone(),
                bind(name, "r", &[]),
                sync(),
            ];
            let refused = [bind("zz", "z", &[]), execute("zz"), bind(name, "r", params), sync()].concat();
            s.send(&[failed.concat(), back(), refused].concat()).await;
            let mut got = Vec::new();
            for _ in 0..2 {
                got.extend(codes(&s.read_until(|m| m.tag == b'Z').await));
            }
            assert_eq!(got, ["22012"], "{what}");
            // Back again, and the run, sent while it waits.
            s.send(&[back(), run.clone()].concat()).await;
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            locker.batch_execute("SELECT pg_advisory_unlock(4242)").await.unwrap();
            for _ in 0..3 {
                got.extend(codes(&s.read_until(|m| m.tag == b'Z').await));
            }
            s.simple("COMMIT").await;
            let note = f.note().await.0;
            if port == f.proxy.port() {
                assert!(got.contains(&"PF001".to_owned()), "{what}: {got:?}");
                assert_eq!(note, "init", "{what}");
            } else {
                assert!(!got.iter().any(|c| c.starts_with("PF")), "{what}: {got:?}");
                assert_eq!(note, "stale", "{what}");
                f.put_back().await;
            }
        }
    }
}

/// A portal re-bound in a batch Postgres refuses (the name is held: 42P03), executed in a
/// later batch before that answer comes: Postgres runs the old statement, a read. Had
/// pgfence taken the new one's effect (a transaction's end or `CLOSE ALL` forgets portals,
/// a `PREPARE` replaces a definition), a stale write bound or prepared before would run
/// unguarded; such an Execute is refused (PF004) instead, and the write is checked.
#[tokio::test]
async fn a_refused_rebind_changes_nothing_pgfence_follows() {
    let f = Fixture::at_epoch_two().await;
    let stale = "UPDATE sweep_state SET note = 'stale' WHERE id = 1";
    for new in ["COMMIT", "CLOSE ALL", "ROLLBACK", "PREPARE x AS SELECT 1"] {
        for port in [f.proxy.port(), f.cluster.port()] {
            let mut s = f.raw(port, "1", &[]).await;
            let mut got = codes(&s.simple("BEGIN").await);
            // The stale write: bound to portal m, and prepared as x.
            let setup = [
                query(&format!("PREPARE x AS {stale}")),
                parse("w", stale),
                parse("s", "SELECT 1"),
                parse("c", new),
                bind("m", "w", &[]),
                bind("n", "s", &[]),
                sync(),
                query("SAVEPOINT sp"),
            ];
            s.send(&setup.concat()).await;
            for _ in 0..3 {
                got.extend(codes(&s.read_until(|m| m.tag == b'Z').await));
            }
            assert!(got.is_empty(), "{new}: {got:?}");
            // The refused re-Bind and the Execute of its name, answered before the rest goes;
            // each run after a ROLLBACK TO, so that a refusal does not hide the next one.
            let back = || query("ROLLBACK TO SAVEPOINT sp");
            let batches = [
                [bind("n", "c", &[]), sync(), back(), execute("n"), sync()].concat(),
                [
                    back(),
                    execute("m"),
                    sync(),
                    back(),
                    query("EXECUTE x"),
                    query("COMMIT"),
                ]
                .concat(),
            ];
            for (batch, answers) in batches.iter().zip([3, 5]) {
                s.send(batch).await;
                for _ in 0..answers {
                    got.extend(codes(&s.read_until(|m| m.tag == b'Z').await));
                }
            }
            let note = f.note().await.0;
            if port == f.proxy.port() {
                assert_eq!(got, ["42P03", "PF004", "PF001", "PF001"], "{new}");
                assert_eq!(note, "init", "{new}");
            } else {
                assert_eq!(got, ["42P03"], "{new}");
                assert_eq!(note, "stale", "{new}");
                f.put_back().await;
            }
        }
    }
}

/// `PREPARE transaction AS …` prepares a statement named `transaction`: unlike `PREPARE
/// TRANSACTION 'gid'` it ends nothing, and the block's portals stay. A portal bound to a
/// stale write before it is still checked, run by Execute or by SQL `FETCH`.
#[tokio::test]
async fn a_statement_named_transaction_ends_no_transaction() {
    let f = Fixture::at_epoch_two().await;
    for run in [[execute("m"), sync()].concat(), query("FETCH ALL FROM m")] {
        for port in [f.proxy.port(), f.cluster.port()] {
            let mut s = f.raw(port, "1", &[]).await;
            s.simple("BEGIN").await;
            s.send(&[parse("w", STALE_UPDATE), bind("m", "w", &[]), sync()].concat())
                .await;
            s.read_until(|m| m.tag == b'Z').await;
            assert!(codes(&s.simple("PREPARE transaction AS SELECT 1").await).is_empty());
            s.send(&run).await;
            let got = codes(&s.read_until(|m| m.tag == b'Z').await);
            s.simple("COMMIT").await;
            f.verdict(port, got, "PF001").await;
        }
    }
}

/// A portal Postgres dropped (at `ROLLBACK TO SAVEPOINT`) that pgfence still counts, bound
/// again to the same `EXECUTE w`: what it runs is looked up when it runs, after `w` was
/// prepared again as a write to another fence's table. The session declared an epoch for
/// the first fence only, so the write is refused (PF002), by SQL `FETCH` and by Execute
/// alike. Deciding it at the Bind kept it a write to the first fence, whose guard passed;
/// straight to Postgres (the control) the write lands.
#[tokio::test]
async fn a_portal_bound_again_to_an_execute_runs_what_the_name_holds_then() {
    use crate::common::pg::Cluster;
    let toml = format!(
        "{}[[fence]]\nname = \"other\"\ntables = [\"audit\"]\n",
        super::fence_toml()
    );
    let f = Fixture::with(Cluster::shared(), &toml).await;
    let e = f.takeover("a").await.to_string();
    let runs = [
        ("FETCH", query("FETCH ALL IN p")),
        ("Execute", [execute("p"), sync()].concat()),
    ];
    for (how, run) in runs {
        for port in [f.proxy.port(), f.cluster.port()] {
            let what = format!("{how}, through pgfence: {}", port == f.proxy.port());
            let mut s = f.raw(port, &e, &[("pgfence.fence", "sweeper")]).await;
            for sql in [
                "PREPARE w AS UPDATE sweep_state SET note = 'a' WHERE id = 1 RETURNING id",
                "BEGIN",
                "SAVEPOINT sp",
            ] {
                assert!(codes(&s.simple(sql).await).is_empty(), "{what}: {sql}");
            }
            s.send(&[parse("s", "EXECUTE w"), bind("p", "s", &[]), sync()].concat())
                .await;
            assert_eq!(tags(&s.read_until(|m| m.tag == b'Z').await), "12Z", "{what}");
            assert!(codes(&s.simple("ROLLBACK TO SAVEPOINT sp").await).is_empty(), "{what}");
            s.send(&[bind("p", "s", &[]), sync()].concat()).await;
            assert_eq!(tags(&s.read_until(|m| m.tag == b'Z').await), "2Z", "{what}");
            for sql in [
                "DEALLOCATE w",
                "PREPARE w AS INSERT INTO audit (note) VALUES ('undeclared') RETURNING id",
            ] {
                assert!(codes(&s.simple(sql).await).is_empty(), "{what}: {sql}");
            }
            s.send(&run).await;
            let got = codes(&s.read_until(|m| m.tag == b'Z').await);
            s.simple("COMMIT").await;
            if port == f.proxy.port() {
                assert_eq!(got, ["PF002"], "{what}");
                assert_eq!(f.audit_rows().await, 0, "{what}");
            } else {
                assert!(got.is_empty(), "{what}: {got:?}");
                assert_eq!(f.audit_rows().await, 1, "{what}");
                f.admin.batch_execute("DELETE FROM audit").await.unwrap();
            }
        }
    }
}

/// Chains that branch at every step cost a bounded number of steps to decide. Each name
/// below may stand for several statements still unanswered (a portal bound to a `FETCH`
/// naming itself many times, a name parsed again and again as `EXECUTE` of itself);
/// followed to every end, one statement would keep the proxy's thread busy for hours,
/// stalling every session. It is decided (refused, or failed as Postgres fails it) at
/// once, and another session goes on.
#[tokio::test]
async fn a_branching_chain_is_decided_in_bounded_time() {
    let f = Fixture::at_epoch_two().await;
    let fetch_self = format!("FETCH {}", vec!["a"; 16].join(" "));
    let wide_fetch = format!("FETCH {}", vec!["a"; 20_000].join(" "));
    let execute_self: Vec<u8> = (0..8)
        .flat_map(|_| [parse("w", "EXECUTE w"), sync()].concat())
        .collect();
    let cases = [
        (
            "FETCH",
            [parse("s", &fetch_self), bind("a", "s", &[]), sync()].concat(),
            1,
            "FETCH a".to_owned(),
        ),
        ("EXECUTE", execute_self, 8, vec!["EXECUTE w"; 20].join("; ")),
        // Wide rather than deep: many names in one FETCH, many FETCHes in one Query.
        (
            "wide FETCH",
            [parse("s", &wide_fetch), bind("a", "s", &[]), sync()].concat(),
            1,
            vec!["FETCH a"; 50].join("; "),
        ),
    ];
    for (how, in_flight, answers, run) in cases {
        let mut s = f.raw(f.proxy.port(), "2", &[]).await;
        let started = [query("BEGIN"), query("SELECT pg_sleep(0.2)"), in_flight, query(&run)].concat();
        s.send(&started).await;
        let mut got = Vec::new();
        for _ in 0..answers + 3 {
            let answer = s.read_until(|m| m.tag == b'Z').await;
            assert_eq!(answer.last().map(|m| m.tag), Some(b'Z'), "{how}: {got:?}");
            got.push(codes(&answer));
        }
        // The chain is refused, or fails as straight to Postgres; nothing ran.
        assert!(!got[answers + 2].is_empty(), "{how}: {got:?}");
        s.simple("ROLLBACK").await;
        let other = f.session("").await;
        other.simple_query("SELECT 1").await.unwrap();
    }
    assert_eq!(f.note().await.0, "init");
}

/// A transaction fetches a `… RETURNING` write's portal a row at a time. Its first fetch ran
/// the write at the current epoch; a `SET LOCAL` to the same epoch leaves the next fetch
/// alone, while one to a stale epoch makes the next fetch run the guard again: PF001, and
/// the transaction commits nothing. Control: straight to Postgres the fetches return the
/// rows and the write commits.
#[tokio::test]
async fn a_new_epoch_is_checked_at_the_next_fetch_of_a_write_portal() {
    let f = Fixture::at_epoch_two().await;
    f.admin
        .batch_execute("INSERT INTO sweep_state VALUES (2, 'init', 0), (3, 'init', 0)")
        .await
        .unwrap();
    let notes = async || -> Vec<String> {
        f.admin
            .query("SELECT note FROM sweep_state ORDER BY id", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    };
    let sql = "UPDATE sweep_state SET note = 'p' RETURNING id";
    let mut through = f.leader(2).await;
    let mut direct = f.direct().await;
    for (client, proxied) in [(&mut through, true), (&mut direct, false)] {
        let tx = client.transaction().await.unwrap();
        let portal = tx.bind(sql, &[]).await.unwrap();
        assert_eq!(tx.query_portal(&portal, 1).await.unwrap().len(), 1);
        tx.batch_execute("SET LOCAL pgfence.epoch = 2").await.unwrap();
        assert_eq!(tx.query_portal(&portal, 1).await.unwrap().len(), 1);
        tx.batch_execute("SET LOCAL pgfence.epoch = 1").await.unwrap();
        let last = tx.query_portal(&portal, 1).await;
        if proxied {
            assert_eq!(super::code(&last), "PF001");
            // COMMIT of the aborted transaction answers ROLLBACK.
            tx.commit().await.unwrap();
            assert_eq!(notes().await, ["init", "init", "init"]);
        } else {
            assert_eq!(last.unwrap().len(), 1, "control");
            tx.commit().await.unwrap();
            assert_eq!(notes().await, ["p", "p", "p"], "control");
        }
    }
}
