//! What a prepared statement's name runs is what Postgres holds under it: protocol Parse
//! and SQL PREPARE share one namespace, and a Parse, PREPARE, Close or DEALLOCATE that
//! fails or is skipped after an error changes nothing. A stale session cannot run a
//! fenced write by name without the guard; each test has its control, the same
//! messages straight to Postgres, where the stale write lands.

use super::{Fixture, code};
use crate::common::pg::connect;
use crate::common::raw::{Raw, bind, close_statement, codes, execute, first_value, parse, sync};

const WRITE: &str = "UPDATE sweep_state SET note = 'stale' WHERE id = 1";

/// A raw session at the stale epoch 1 (the lease is at 2).
async fn stale(f: &Fixture, port: u16) -> Raw {
    f.raw(port, "1", &[]).await
}

/// Sends `msgs` and reads up to the ReadyForQuery of each of `batches` requests; returns
/// the error codes of each.
async fn run(raw: &mut Raw, msgs: &[Vec<u8>], batches: usize) -> Vec<Vec<String>> {
    raw.send(&msgs.concat()).await;
    let mut out = Vec::new();
    for _ in 0..batches {
        out.push(codes(&raw.read_until(|m| m.tag == b'Z').await));
    }
    out
}

fn run_named(name: &str) -> Vec<Vec<u8>> {
    vec![bind("", name, &[]), execute(""), sync()]
}

fn q(sql: &str) -> Vec<u8> {
    crate::common::raw::query(sql)
}

/// A scenario: what it is, set-up messages and how many requests they answer, then the
/// statement run by name. Through pgfence the last one is PF001; straight to Postgres it
/// writes.
type Scenario = (&'static str, Vec<Vec<u8>>, usize, Vec<Vec<u8>>);

fn scenarios() -> Vec<Scenario> {
    vec![
        (
            "SQL PREPARE, run with Bind",
            vec![q(&format!("PREPARE foo AS {WRITE}"))],
            1,
            run_named("foo"),
        ),
        (
            "Parse, run with SQL EXECUTE",
            vec![parse("foo", WRITE), sync()],
            1,
            vec![q("EXECUTE foo")],
        ),
        (
            "a second Parse of the name fails (42P05)",
            vec![parse("s1", WRITE), sync(), parse("s1", "SELECT 1"), sync()],
            2,
            run_named("s1"),
        ),
        (
            "Close and Parse skipped after an error",
            vec![
                parse("s1", WRITE),
                sync(),
                parse("bad", "SELEC garbage"),
                close_statement("s1"),
                parse("s1", "SELECT 1"),
                sync(),
            ],
            2,
            run_named("s1"),
        ),
        (
            "a second SQL PREPARE of the name fails (42P05)",
            vec![q(&format!("PREPARE p AS {WRITE}")), q("PREPARE p AS SELECT 1")],
            2,
            vec![q("EXECUTE p")],
        ),
        (
            "a DEALLOCATE in a failed transaction",
            vec![
                q(&format!("PREPARE p AS {WRITE}")),
                q("BEGIN"),
                q("SELECT 1/0"),
                q("DEALLOCATE p"),
                q("ROLLBACK"),
            ],
            5,
            vec![q("EXECUTE p")],
        ),
        (
            "a DEALLOCATE parsed and never executed",
            vec![q(&format!("PREPARE p AS {WRITE}")), parse("d", "DEALLOCATE p"), sync()],
            2,
            vec![q("EXECUTE p")],
        ),
    ]
}

#[tokio::test]
async fn a_stale_write_run_by_name_is_always_guarded() {
    for (how, setup, answers, run_it) in scenarios() {
        let f = Fixture::at_epoch_two().await;
        let mut s = stale(&f, f.proxy.port()).await;
        run(&mut s, &setup, answers).await;
        let got = run(&mut s, &run_it, 1).await;
        assert_eq!(got, [["PF001"]], "{how}");
        assert_eq!(f.note().await.0, "init", "{how}");
        // Control: the same messages straight to Postgres write.
        let mut d = stale(&f, f.cluster.port()).await;
        run(&mut d, &setup, answers).await;
        let got = run(&mut d, &run_it, 1).await;
        assert_eq!(got, [Vec::<String>::new()], "{how} (control)");
        assert_eq!(f.note().await.0, "stale", "{how} (control)");
    }
}

/// What clients do every day keeps working for a stale session's reads: a name closed and
/// parsed again in one batch, the unnamed statement re-parsed in pipelined batches.
#[tokio::test]
async fn redefined_names_run_what_they_now_are() {
    let f = Fixture::at_epoch_two().await;
    let mut s = stale(&f, f.proxy.port()).await;
    let setup = vec![parse("s1", WRITE), sync()];
    assert_eq!(run(&mut s, &setup, 1).await, [Vec::<String>::new()]);
    let again = vec![
        close_statement("s1"),
        parse("s1", "SELECT 1"),
        bind("", "s1", &[]),
        execute(""),
        sync(),
    ];
    assert_eq!(run(&mut s, &again, 1).await, [Vec::<String>::new()]);
    // And in a later batch, once Postgres confirmed it.
    assert_eq!(run(&mut s, &run_named("s1"), 1).await, [Vec::<String>::new()]);
    // Ten pipelined batches, each re-parsing the unnamed statement: reads need no epoch,
    // the writes among them are each refused.
    let mut msgs = Vec::new();
    for i in 0..10 {
        let sql = if i % 3 == 0 { WRITE } else { "SELECT 1" };
        msgs.extend([parse("", sql), bind("", "", &[]), execute(""), sync()]);
    }
    let got = run(&mut s, &msgs, 10).await;
    let want: Vec<Vec<String>> = (0..10)
        .map(|i| {
            if i % 3 == 0 {
                vec!["PF001".to_owned()]
            } else {
                Vec::new()
            }
        })
        .collect();
    assert_eq!(got, want);
    assert_eq!(f.note().await.0, "init");
}

/// A `DISCARD ALL` or `DEALLOCATE ALL` answered while a definition sent after it is still
/// unconfirmed drops only the definitions sent before it: the later name runs what it is
/// (guarded), rather than counting as unknown and being refused with PF004.
#[tokio::test]
async fn a_definition_sent_after_a_discard_outlives_it() {
    let f = Fixture::at_epoch_two().await;
    // Keeps the definition unconfirmed while the next message is dispatched.
    let slow = "SELECT pg_sleep(0.5)";
    for drop in ["DISCARD ALL", "DEALLOCATE ALL"] {
        let ways = [
            (
                "PREPARE",
                vec![q(&format!("{slow}; PREPARE w AS {WRITE}"))],
                1,
                vec![q("EXECUTE w")],
            ),
            ("Parse", vec![q(slow), parse("w", WRITE), sync()], 2, run_named("w")),
        ];
        for (how, define, answers, run_it) in ways {
            for (epoch, want) in [("2", ""), ("1", "PF001")] {
                let what = format!("{drop}, then {how}, epoch {epoch}");
                let mut s = f.raw(f.proxy.port(), epoch, &[]).await;
                s.send(&[q(drop), define.concat()].concat()).await;
                // The drop is answered; the definition is not yet.
                assert_eq!(
                    codes(&s.read_until(|m| m.tag == b'Z').await),
                    Vec::<String>::new(),
                    "{what}"
                );
                s.send(&run_it.concat()).await;
                for _ in 0..answers {
                    assert_eq!(
                        codes(&s.read_until(|m| m.tag == b'Z').await),
                        Vec::<String>::new(),
                        "{what}"
                    );
                }
                let got = codes(&s.read_until(|m| m.tag == b'Z').await);
                assert_eq!(got.join(","), want, "{what}");
            }
        }
    }
}

/// SQL `EXECUTE` of a name pgfence knows no definition of fails as Postgres fails it
/// (26000), in both protocols. If the session does hold such a statement, prepared where
/// pgfence cannot see (inside `DO`), it is refused (PF004): it may write anything.
#[tokio::test]
async fn an_execute_of_an_unknown_name_fails_as_in_postgres_unless_prepared_unseen() {
    let f = Fixture::at_epoch_two().await;
    let hidden =
        "DO $$ BEGIN EXECUTE 'PREPARE hidden AS UPDATE sweep_' || 'state SET note = ''stale'' WHERE id = 1'; END $$";
    // A text = that finds nothing equal, for the session's search_path: pgfence's lookup of
    // the name must not use it.
    f.admin
        .batch_execute(
            "CREATE SCHEMA evil;
             CREATE FUNCTION evil.no(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT false';
             CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.no);",
        )
        .await
        .unwrap();
    for port in [f.proxy.port(), f.cluster.port()] {
        let through = port == f.proxy.port();
        let s = connect(port, &f.db, "-c pgfence.epoch=1").await;
        for sql in ["EXECUTE nosuch", "EXPLAIN ANALYZE EXECUTE nosuch"] {
            assert_eq!(
                code(&s.batch_execute(sql).await),
                "26000",
                "{sql}, simple, through pgfence: {through}"
            );
            assert_eq!(
                code(&s.execute(sql, &[]).await),
                "26000",
                "{sql}, extended, through pgfence: {through}"
            );
        }
        s.batch_execute(hidden).await.unwrap();
        s.batch_execute("SET search_path = evil, pg_catalog, public")
            .await
            .unwrap();
        if through {
            assert_eq!(code(&s.batch_execute("EXECUTE hidden").await), "PF004");
            assert_eq!(code(&s.execute("EXECUTE hidden", &[]).await), "PF004");
            assert_eq!(f.note().await.0, "init");
        } else {
            // Control: straight to Postgres the stale write lands.
            s.batch_execute("EXECUTE hidden").await.unwrap();
            assert_eq!(f.note().await.0, "stale");
        }
    }
}

/// A Bind to a named portal Postgres still holds fails (42P03) and keeps the old portal,
/// and after `ROLLBACK TO SAVEPOINT` the transaction goes on: an Execute of the name may
/// run the old portal's write, so it is guarded. Straight to Postgres (the control) the
/// stale write commits.
#[tokio::test]
async fn a_portal_rebound_while_it_exists_keeps_its_write_guarded() {
    let f = Fixture::at_epoch_two().await;
    for port in [f.proxy.port(), f.cluster.port()] {
        let mut s = stale(&f, port).await;
        s.simple("BEGIN").await;
        let first = [
            parse("w", "UPDATE sweep_state SET note = $1 WHERE id = 1"),
            bind("p", "w", &["stale"]),
            sync(),
        ];
        assert_eq!(run(&mut s, &first, 1).await, [Vec::<String>::new()]);
        s.simple("SAVEPOINT s").await;
        let again = [parse("q", "SELECT 1"), bind("p", "q", &[]), sync()];
        assert_eq!(run(&mut s, &again, 1).await, [["42P03"]]);
        s.simple("ROLLBACK TO SAVEPOINT s").await;
        let got = run(&mut s, &[execute("p"), sync()], 1).await;
        s.simple("COMMIT").await;
        if port == f.proxy.port() {
            assert_eq!(got, [["PF001"]]);
            assert_eq!(f.note().await.0, "init");
        } else {
            assert_eq!(got, [Vec::<String>::new()]);
            assert_eq!(f.note().await.0, "stale");
        }
    }
}

/// A Parse that Postgres refuses (42P05: the name is taken) or skips after an error
/// defines nothing: the name still runs its old statement, as straight to Postgres,
/// rather than counting as possibly the refused text (here one pgfence cannot analyse,
/// PF004).
#[tokio::test]
async fn a_refused_or_skipped_parse_defines_nothing() {
    let f = Fixture::at_epoch_two().await;
    let unreadable = "DO $$BEGIN DELETE FROM sweep_state; END$$";
    for port in [f.proxy.port(), f.cluster.port()] {
        for skipped in [false, true] {
            let mut s = stale(&f, port).await;
            assert_eq!(
                run(&mut s, &[parse("s1", "SELECT 1"), sync()], 1).await,
                [Vec::<String>::new()]
            );
            let (again, code) = if skipped {
                (vec![bind("", "nosuch", &[]), parse("s1", unreadable), sync()], "26000")
            } else {
                (vec![parse("s1", unreadable), sync()], "42P05")
            };
            assert_eq!(run(&mut s, &again, 1).await, [[code]]);
            let got = run(&mut s, &run_named("s1"), 1).await;
            assert_eq!(
                got,
                [Vec::<String>::new()],
                "skipped: {skipped}, through pgfence: {}",
                port == f.proxy.port()
            );
        }
    }
    assert_eq!(f.note().await.0, "init");
}

/// A `PREPARE` after the failing statement of a string never runs, nor does a failing
/// `PREPARE` define anything: reading the name afterwards runs what Postgres still holds,
/// a read here, which needs no epoch. Before, the unmade definitions stayed candidates
/// for the name for the whole session, so the read was refused (PF002) as a possible write.
#[tokio::test]
async fn prepares_of_a_failed_query_string_define_nothing() {
    let f = Fixture::at_epoch_two().await;
    for port in [f.proxy.port(), f.cluster.port()] {
        let (mut s, msgs) = Raw::startup(port, &[("user", "postgres"), ("database", f.db.as_str())]).await;
        assert_eq!(msgs.last().map(|m| m.tag), Some(b'Z'), "{msgs:?}");
        let setup = [
            q("PREPARE r AS SELECT 1"),
            q(&format!("SELECT 1/0; PREPARE r AS {WRITE}; PREPARE w AS {WRITE}")),
            q(&format!("PREPARE r AS {WRITE}")),
        ];
        assert_eq!(
            run(&mut s, &setup, 3).await,
            [vec![], vec!["22012".to_owned()], vec!["42P05".to_owned()]]
        );
        let got = run(&mut s, &[q("EXECUTE r"), run_named("r").concat()], 2).await;
        assert_eq!(
            got,
            [Vec::<String>::new(), vec![]],
            "through pgfence: {}",
            port == f.proxy.port()
        );
        // `w` was never made: Postgres says so, as pgfence lets it.
        assert_eq!(run(&mut s, &[q("EXECUTE w")], 1).await, [["26000"]]);
    }
    assert_eq!(f.note().await.0, "init");
}

/// A text taken whole (more statements than pgfence tells apart, or split by psql's
/// routine-body rule) names no fenced table, yet an `EXECUTE` in it runs a prepared
/// write: refused (PF004), where straight to Postgres the stale write lands.
#[tokio::test]
async fn an_execute_inside_a_text_taken_whole_is_refused() {
    let routine = "CREATE FUNCTION one() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; END; EXECUTE w";
    let many = format!("{}EXECUTE w", "SELECT 1;".repeat(100_000));
    for (how, text) in [("routine body", routine.to_owned()), ("100 001 statements", many)] {
        let f = Fixture::at_epoch_two().await;
        for port in [f.proxy.port(), f.cluster.port()] {
            let direct = port == f.cluster.port();
            let mut s = stale(&f, port).await;
            assert_eq!(
                run(&mut s, &[q(&format!("PREPARE w AS {WRITE}"))], 1).await,
                [Vec::<String>::new()]
            );
            let got = run(&mut s, &[q(&text)], 1).await;
            let (expected, note) = if direct {
                (vec![], "stale")
            } else {
                (vec!["PF004".to_owned()], "init")
            };
            assert_eq!(got, [expected], "{how}, direct: {direct}");
            assert_eq!(f.note().await.0, note, "{how}, direct: {direct}");
        }
    }
}

/// A Bind of a name whose re-Parse is still unanswered may run either definition. Where one
/// of them changes what pgfence follows (a declaration, a `ROLLBACK TO`, a `ROLLBACK`),
/// taking neither change lost the one Postgres made: pgfence went on enforcing an epoch the session no
/// longer had. Such a Bind's Execute is refused (PF004), and the epoch pgfence enforces is
/// the one `SHOW` gives. The re-Parse's batch waits on an advisory lock another session
/// holds until the Execute is sent.
#[tokio::test]
async fn a_bind_of_a_name_being_redefined_keeps_what_pgfence_follows() {
    let f = Fixture::at_epoch_two().await;
    let locker = f.direct().await;
    // (the name, the new definition, in a block whose SET a savepoint keeps, the epoch
    // Postgres then shows)
    let cases = [
        ("s", "SET pgfence.epoch = 1", false, "1"),
        ("", "SET pgfence.epoch = 1", false, "1"),
        ("s", "ROLLBACK TO SAVEPOINT sp", true, "1"),
        ("s", "ROLLBACK", true, "2"),
    ];
    for (name, new, in_block, then) in cases {
        for port in [f.proxy.port(), f.cluster.port()] {
            let what = format!("{name:?} {new} {port}");
            let mut s = f.raw(port, "2", &[]).await;
            if in_block {
                for sql in ["BEGIN", "SET pgfence.epoch = 1", "SAVEPOINT sp"] {
                    assert!(codes(&s.simple(sql).await).is_empty(), "{what}");
                }
            }
            let got = redefine_and_run(&mut s, &locker, name, new).await;
            let shown = first_value(&s.simple("SHOW pgfence.epoch").await);
            let wrote = codes(&s.simple(WRITE).await);
            if in_block {
                s.simple("COMMIT").await;
            }
            let note = f.note().await.0;
            if port == f.proxy.port() {
                assert_eq!(got, ["PF004"], "{what}");
                // What pgfence enforces is what Postgres shows, where a write can run.
                match shown.as_deref() {
                    Some("2") => assert!(wrote.is_empty(), "{what}: {wrote:?}"),
                    Some(e) => panic!("{what}: SHOW gives {e}, pgfence enforced 2"),
                    None => assert!(!wrote.is_empty(), "{what}: the block failed"),
                }
                assert_eq!(note == "stale", wrote.is_empty(), "{what}");
            } else {
                assert!(got.is_empty(), "{what}: {got:?}");
                assert_eq!(shown.as_deref(), Some(then), "{what}");
                assert_eq!(note, "stale", "{what}");
            }
            f.put_back().await;
        }
    }
}

/// `name`, defined as `SELECT 1`, redefined as `new` in a batch held on an advisory lock
/// that `locker` holds, and bound and executed in the batch after, sent while it waits;
/// the error codes of both batches.
async fn redefine_and_run(s: &mut Raw, locker: &tokio_postgres::Client, name: &str, new: &str) -> Vec<String> {
    locker.batch_execute("SELECT pg_advisory_lock(4242)").await.unwrap();
    s.send(&[parse(name, "SELECT 1"), sync()].concat()).await;
    s.read_until(|m| m.tag == b'Z').await;
    let wait = format!("wait_{name}");
    let redefine = [
        parse(&wait, "SELECT pg_advisory_xact_lock(4242)"),
        bind("", &wait, &[]),
        execute(""),
        close_statement(name),
        parse(name, new),
        sync(),
    ];
    s.send(&[redefine.concat(), bind("", name, &[]), execute(""), sync()].concat())
        .await;
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    locker.batch_execute("SELECT pg_advisory_unlock(4242)").await.unwrap();
    let mut got = Vec::new();
    for _ in 0..2 {
        got.extend(codes(&s.read_until(|m| m.tag == b'Z').await));
    }
    got
}

/// The same with a `DEALLOCATE` of a read and a `PREPARE` of a stale write under its name,
/// each run through a name being redefined: had pgfence missed both, it would take `x`
/// for the read, and `EXECUTE` it unguarded. Through pgfence both Executes are refused
/// (PF004), so `x` stays the read; straight to Postgres the stale write runs.
#[tokio::test]
async fn a_statement_prepared_through_a_name_being_redefined_is_not_missed() {
    let f = Fixture::at_epoch_two().await;
    let locker = f.direct().await;
    for port in [f.proxy.port(), f.cluster.port()] {
        let mut s = f.raw(port, "1", &[]).await;
        assert!(codes(&s.simple("PREPARE x AS SELECT 1").await).is_empty());
        let mut got = redefine_and_run(&mut s, &locker, "s", "DEALLOCATE x").await;
        got.extend(redefine_and_run(&mut s, &locker, "t", &format!("PREPARE x AS {WRITE}")).await);
        let ran = codes(&s.simple("EXECUTE x").await);
        if port == f.proxy.port() {
            assert_eq!(got, ["PF004", "PF004"]);
            // Neither ran: x is still the read.
            assert!(ran.is_empty(), "{ran:?}");
            assert_eq!(f.note().await.0, "init");
        } else {
            assert!(got.is_empty() && ran.is_empty(), "{got:?} {ran:?}");
            assert_eq!(f.note().await.0, "stale");
            f.put_back().await;
        }
    }
}

/// A Bind of a name that held `BEGIN` when its redefinition may not have happened: a Parse
/// Postgres refuses (42P05) or skips after an error leaves the `BEGIN`, one it accepts
/// replaces it. Answered before the Bind, what the name holds is known: a `BEGIN` opens a
/// block, so a `SET` in it is undone by the `ROLLBACK` after. Unanswered, either may run,
/// and a `SET` behind would be kept or undone unlike Postgres: the Execute is refused
/// (PF004), which skips the `SET` too. Either way the write after is checked at the epoch
/// `SHOW` gives (PF001 at the stale one). Straight to Postgres (the control) the stale write
/// lands wherever the `SET` is undone or declares a stale epoch.
#[tokio::test]
async fn a_begin_name_stays_a_begin_until_its_redefinition_is_answered() {
    let f = Fixture::at_epoch_two().await;
    let refused = vec![parse("b", "SELECT 1"), sync()];
    let skipped = vec![
        bind("", "nosuch", &[]),
        close_statement("b"),
        parse("b", "SELECT 1"),
        sync(),
    ];
    let accepted = vec![close_statement("b"), parse("b", "SELECT 1"), sync()];
    // (how, the redefinition, its error, the epoch declared at startup, then by the SET)
    let cases = [
        ("refused", refused, Some("42P05"), "1", "2"),
        ("skipped", skipped, Some("26000"), "1", "2"),
        ("accepted", accepted, None, "2", "1"),
    ];
    for (how, redefine, code, start, set) in cases {
        for pipelined in [false, true] {
            for port in [f.proxy.port(), f.cluster.port()] {
                let through = port == f.proxy.port();
                let what = format!("{how}, pipelined: {pipelined}, through pgfence: {through}");
                let mut s = f.raw(port, start, &[]).await;
                assert_eq!(
                    run(&mut s, &[parse("b", "BEGIN"), sync()], 1).await,
                    [Vec::<String>::new()]
                );
                let set = format!("SET pgfence.epoch = {set}");
                let block = vec![
                    bind("", "b", &[]),
                    execute(""),
                    parse("", &set),
                    bind("", "", &[]),
                    execute(""),
                    sync(),
                    q("ROLLBACK"),
                ];
                let got = if pipelined {
                    run(&mut s, &[redefine.clone(), block].concat(), 3).await
                } else {
                    let mut got = run(&mut s, &redefine, 1).await;
                    got.extend(run(&mut s, &block, 2).await);
                    got
                };
                let shown = first_value(&s.simple("SHOW pgfence.epoch").await);
                let wrote = codes(&s.simple(WRITE).await);
                let code: Vec<String> = code.iter().map(|c| (*c).to_owned()).collect();
                assert_eq!(got[0], code, "{what}");
                let opened = how != "accepted";
                let refused = through && pipelined;
                // A block opened: the ROLLBACK undoes the SET; none: it only warns.
                let rollback: &[&str] = if opened && !refused { &[] } else { &["25P01"] };
                assert_eq!(got[1], if refused { vec!["PF004"] } else { vec![] }, "{what}");
                assert_eq!(got[2], rollback, "{what}");
                let stale = shown.as_deref() == Some("1");
                if through {
                    assert_eq!(wrote, if stale { vec!["PF001"] } else { vec![] }, "{what}: {shown:?}");
                } else {
                    assert!(stale && wrote.is_empty(), "{what}: {shown:?} {wrote:?}");
                }
                let note = f.note().await.0;
                assert_eq!(note == "stale", wrote.is_empty(), "{what}");
                f.put_back().await;
            }
        }
    }
}

/// SQL `EXECUTE` of a `BEGIN` prepared with the protocol opens a block pgfence does not see
/// open: a `SET` pipelined after it, which the `ROLLBACK` after undoes, would be kept as
/// committed, and the stale write behind checked at the epoch rolled back. Such an
/// `EXECUTE` is refused (PF004), directly or through a statement bound to it, so no block
/// opens, the `SET` stands, and the epoch pgfence checks is the one `SHOW` gives. Straight
/// to Postgres (the control) the block opens, the `SET` is undone, and the stale write
/// lands.
#[tokio::test]
async fn an_execute_of_a_begin_prepared_with_the_protocol_is_refused() {
    let f = Fixture::at_epoch_two().await;
    let ways = [
        ("SQL EXECUTE", q("EXECUTE b")),
        (
            "Bind of EXECUTE",
            [parse("", "EXECUTE b"), run_named("").concat()].concat(),
        ),
    ];
    for (how, opens) in ways {
        for port in [f.proxy.port(), f.cluster.port()] {
            let through = port == f.proxy.port();
            let what = format!("{how}, through pgfence: {through}");
            let mut s = stale(&f, port).await;
            assert_eq!(
                run(&mut s, &[parse("b", "BEGIN"), sync()], 1).await,
                [Vec::<String>::new()]
            );
            let pipeline = [opens.clone(), q("SET pgfence.epoch = 2"), q("ROLLBACK")];
            let got = run(&mut s, &pipeline, 3).await;
            let shown = first_value(&s.simple("SHOW pgfence.epoch").await);
            let wrote = codes(&s.simple(WRITE).await);
            if through {
                let want: [&[&str]; 3] = [&["PF004"], &[], &["25P01"]];
                assert_eq!(got, want, "{what}");
                // No block opened: the SET stands, and the write at epoch 2 is current.
                assert_eq!(shown.as_deref(), Some("2"), "{what}");
                assert!(wrote.is_empty(), "{what}: {wrote:?}");
            } else {
                assert!(got.iter().all(Vec::is_empty), "{what}: {got:?}");
                assert_eq!(shown.as_deref(), Some("1"), "{what}");
                assert!(wrote.is_empty(), "{what}: {wrote:?}");
            }
            assert_eq!(f.note().await.0, "stale", "{what}");
            f.put_back().await;
        }
    }
}

/// A `BEGIN` statement bound (and described) but never executed opens nothing: a `SET`
/// after it in the batch commits at the Sync, a `ROLLBACK` after that only warns, and the
/// write pipelined behind is checked at the stale epoch the `SET` declared (PF001). Counting the Bind as the
/// `BEGIN` kept the `SET` pending, let the `ROLLBACK` undo it and passed the write at the
/// epoch before; straight to Postgres (the control) the stale write lands.
#[tokio::test]
async fn a_begin_bound_and_never_executed_opens_no_block() {
    let f = Fixture::at_epoch_two().await;
    for port in [f.proxy.port(), f.cluster.port()] {
        let mut s = f.raw(port, "2", &[]).await;
        assert_eq!(
            run(&mut s, &[parse("b", "BEGIN"), sync()], 1).await,
            [Vec::<String>::new()]
        );
        let batch = [
            bind("", "b", &[]),
            crate::common::raw::message(b'D', b"P\0"),
            parse("", "SET pgfence.epoch = 1"),
            bind("", "", &[]),
            execute(""),
            sync(),
            q("ROLLBACK"),
            q(WRITE),
        ];
        let got = run(&mut s, &batch, 3).await;
        assert_eq!(got[..2], [vec![], vec!["25P01".to_owned()]]);
        assert_eq!(first_value(&s.simple("SHOW pgfence.epoch").await).as_deref(), Some("1"));
        f.verdict(port, got[2].clone(), "PF001").await;
    }
}
