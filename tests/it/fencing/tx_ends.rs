//! A transaction that ends without the session going idle: `COMMIT AND CHAIN`, `ROLLBACK
//! AND CHAIN`, `COMMIT; BEGIN` in one string. The next transaction is checked again (a
//! guard passed in the one before holds nothing any more), and declarations end with their
//! transaction as Postgres ends them. Each safety test has its control: the same steps
//! straight to Postgres let the stale write land.

use super::{Fixture, code};
use tokio_postgres::Client;

const WRITE: &str = "UPDATE sweep_state SET note = 'stale' WHERE id = 1";

/// The lease moves on, committed, while `s` sits in a transaction that passed its guard.
async fn takeover_while_open(f: &Fixture) -> i64 {
    f.takeover("b").await
}

async fn shown_epoch(s: &Client) -> String {
    s.query_one("SHOW pgfence.epoch", &[]).await.unwrap().get(0)
}

#[tokio::test]
async fn the_transaction_after_commit_and_chain_is_checked_again() {
    for (how, extended) in [("simple", false), ("extended", true)] {
        let f = Fixture::new().await;
        let e = f.takeover("a").await;
        let s = f.leader(e).await;
        s.batch_execute("BEGIN").await.unwrap();
        s.batch_execute("UPDATE sweep_state SET note = 'a' WHERE id = 1")
            .await
            .unwrap();
        s.batch_execute("COMMIT AND CHAIN").await.unwrap();
        assert_eq!(f.note().await.0, "a", "{how}: the first transaction committed");
        takeover_while_open(&f).await;
        let r = match extended {
            true => s.execute(WRITE, &[]).await.map(|_| ()),
            false => s.batch_execute(WRITE).await,
        };
        assert_eq!(code(&r), "PF001", "{how}");
        s.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(f.note().await.0, "a", "{how}: the stale write did not land");
    }
}

#[tokio::test]
async fn the_transaction_after_commit_begin_in_one_string_is_checked_again() {
    for end in ["COMMIT; BEGIN", "END; START TRANSACTION", "ROLLBACK AND CHAIN"] {
        let f = Fixture::new().await;
        let e = f.takeover("a").await;
        let s = f.leader(e).await;
        s.batch_execute("BEGIN; UPDATE sweep_state SET note = 'a' WHERE id = 1")
            .await
            .unwrap();
        s.batch_execute(end).await.unwrap();
        takeover_while_open(&f).await;
        assert_eq!(code(&s.batch_execute(WRITE).await), "PF001", "{end}");
        s.batch_execute("ROLLBACK").await.unwrap();
        assert_ne!(f.note().await.0, "stale", "{end}");
    }
}

/// The control: the same steps straight to Postgres, with the fence's tables unguarded,
/// commit the stale write after the takeover.
#[tokio::test]
async fn control_the_chained_stale_write_lands_without_pgfence() {
    let f = Fixture::new().await;
    f.takeover("a").await;
    let s = f.direct().await;
    s.batch_execute("BEGIN").await.unwrap();
    s.batch_execute("UPDATE sweep_state SET note = 'a' WHERE id = 1")
        .await
        .unwrap();
    s.batch_execute("COMMIT AND CHAIN").await.unwrap();
    takeover_while_open(&f).await;
    s.batch_execute(WRITE).await.unwrap();
    s.batch_execute("COMMIT").await.unwrap();
    assert_eq!(f.note().await.0, "stale");
}

#[tokio::test]
async fn declarations_end_with_a_chained_transaction() {
    let f = Fixture::new().await;
    f.takeover("a").await;
    let two = f.takeover("b").await;
    let s = f.leader(two).await;
    // SET LOCAL ends with the transaction, though another begins at once.
    s.batch_execute("BEGIN; SET LOCAL pgfence.epoch = 1").await.unwrap();
    s.batch_execute("COMMIT AND CHAIN").await.unwrap();
    assert_eq!(shown_epoch(&s).await, two.to_string());
    assert_eq!(code(&s.batch_execute(WRITE).await), "ok");
    s.batch_execute("COMMIT").await.unwrap();
    // A session SET in a transaction that rolls back is undone, chained or not.
    for end in ["ROLLBACK AND CHAIN", "ROLLBACK; BEGIN"] {
        s.batch_execute("BEGIN; SET pgfence.epoch = 1").await.unwrap();
        s.batch_execute(end).await.unwrap();
        assert_eq!(shown_epoch(&s).await, two.to_string(), "{end}");
        assert_eq!(code(&s.execute(WRITE, &[]).await), "ok", "{end}");
        s.batch_execute("COMMIT").await.unwrap();
    }
    // And one that commits is kept.
    s.batch_execute("BEGIN; SET pgfence.epoch = 1").await.unwrap();
    s.batch_execute("COMMIT AND CHAIN").await.unwrap();
    assert_eq!(shown_epoch(&s).await, "1");
    assert_eq!(code(&s.batch_execute(WRITE).await), "PF001");
    s.batch_execute("ROLLBACK").await.unwrap();
}

/// Within one string, a later write is decided with the epoch Postgres will have after
/// the transaction end before it, not with one that ended with that transaction.
#[tokio::test]
async fn a_write_after_a_transaction_end_in_the_same_string_uses_the_epoch_left() {
    let f = Fixture::new().await;
    let one = f.takeover("a").await;
    let two = f.takeover("b").await;
    let s = f.leader(one).await;
    for (sql, how) in [
        (
            format!("BEGIN; SET pgfence.epoch = {two}; ROLLBACK; {WRITE}"),
            "rolled back",
        ),
        (
            format!("BEGIN; SET LOCAL pgfence.epoch = {two}; COMMIT; {WRITE}"),
            "local",
        ),
        (
            format!("BEGIN; SET LOCAL pgfence.epoch = {two}; COMMIT AND CHAIN; {WRITE}; COMMIT"),
            "local, chained",
        ),
    ] {
        assert_eq!(code(&s.batch_execute(&sql).await), "PF001", "{how}");
        // (The chained transaction is left aborted.)
        s.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(shown_epoch(&s).await, one.to_string(), "{how}");
    }
    // The epoch that stays is used.
    let sql = format!("BEGIN; SET pgfence.epoch = {two}; COMMIT; {WRITE}");
    s.batch_execute(&sql).await.unwrap();
    assert_eq!(f.note().await, ("stale".to_owned(), 0));
    // Control: straight to Postgres the first string's write lands at once.
    let f = Fixture::new().await;
    f.takeover("a").await;
    f.takeover("b").await;
    let sql = format!("BEGIN; SET pgfence.epoch = {two}; ROLLBACK; {WRITE}");
    f.direct().await.batch_execute(&sql).await.unwrap();
    assert_eq!(f.note().await.0, "stale");
}

/// A COMMIT or ROLLBACK inside a DO block or a procedure ends the transaction of an Execute
/// run outside a block, answered only with the tag DO or CALL: the guard passed before it
/// holds nothing in the block a BEGIN opens after it, when the lease moves on.
#[tokio::test]
async fn the_transaction_after_a_commit_inside_do_or_call_is_checked_again() {
    use crate::common::raw::{bind, codes, execute, parse, query, sync};
    let f = Fixture::new().await;
    f.admin
        .batch_execute("CREATE PROCEDURE undo() LANGUAGE plpgsql AS $$ BEGIN ROLLBACK; END $$")
        .await
        .unwrap();
    let step = |sql: &str| [parse("", sql), bind("", "", &[]), execute("")].concat();
    for ends in ["DO $$BEGIN COMMIT; END$$", "CALL undo()"] {
        for port in [f.proxy.port(), f.cluster.port()] {
            let e = f.takeover("a").await;
            let mut s = f.raw(port, &e.to_string(), &[]).await;
            let batch = [
                step("UPDATE sweep_state SET note = 'a' WHERE id = 1"),
                step(ends),
                step("BEGIN"),
                sync(),
            ];
            s.send(&batch.concat()).await;
            assert!(codes(&s.read_until(|m| m.tag == b'Z').await).is_empty());
            takeover_while_open(&f).await;
            s.send(&query(WRITE)).await;
            let got = codes(&s.read_until(|m| m.tag == b'Z').await);
            s.simple("COMMIT").await;
            if port == f.proxy.port() {
                assert_eq!(got, ["PF001"], "{ends}");
                assert_ne!(f.note().await.0, "stale", "{ends}");
            } else {
                assert!(got.is_empty(), "{ends}: {got:?}");
                assert_eq!(f.note().await.0, "stale", "{ends}");
                f.put_back().await;
            }
        }
    }
}

/// The same with the CALL's portal suspended (Execute of one row, answered by
/// PortalSuspended, not its tag), after a COMMIT sent with Flush so that no ReadyForQuery
/// says the session left its block: the guard passed before the CALL holds nothing after it.
#[tokio::test]
async fn the_transaction_after_a_suspended_call_that_commits_is_checked_again() {
    use crate::common::raw::{bind, codes, message, parse, sync};
    let f = Fixture::new().await;
    f.admin
        .batch_execute("CREATE PROCEDURE tidy(INOUT x int) LANGUAGE plpgsql AS $$ BEGIN COMMIT; x := 1; END $$")
        .await
        .unwrap();
    let flush = message(b'H', b"");
    let run = |sql: &str, rows: u32| {
        let execute = message(b'E', &[b"\0".as_slice(), &rows.to_be_bytes()].concat());
        [parse("", sql), bind("", "", &[]), execute].concat()
    };
    for port in [f.proxy.port(), f.cluster.port()] {
        let e = f.takeover("a").await;
        let mut s = f.raw(port, &e.to_string(), &[]).await;
        s.simple("BEGIN").await;
        s.send(&[run("COMMIT", 0), flush.clone()].concat()).await;
        s.read_until(|m| m.tag == b'C').await;
        s.send(&[run("UPDATE sweep_state SET note = 'a' WHERE id = 1", 0), flush.clone()].concat())
            .await;
        assert_eq!(codes(&s.read_until(|m| m.tag == b'C').await), Vec::<String>::new());
        s.send(&[run("CALL tidy(NULL)", 1), flush.clone()].concat()).await;
        s.read_until(|m| m.tag == b's').await;
        takeover_while_open(&f).await;
        s.send(&[run(WRITE, 0), sync()].concat()).await;
        let got = codes(&s.read_until(|m| m.tag == b'Z').await);
        if port == f.proxy.port() {
            assert_eq!(got, ["PF001"]);
            assert_ne!(f.note().await.0, "stale");
        } else {
            assert!(got.is_empty(), "{got:?}");
            assert_eq!(f.note().await.0, "stale");
        }
    }
}

/// `PREPARE TRANSACTION` where no block is open: Postgres warns, answers with the tag
/// `ROLLBACK`, and commits the implicit transaction, so a `SET` or `RESET` of the epoch
/// before it stays: in the same batch, or run by an Execute still waiting for its Sync
/// when the `PREPARE TRANSACTION` comes as a Query (also once a Flush answered the portal's
/// Close, so that no portal is left for the transaction's end to drop). pgfence follows it: the session's next
/// write is checked at the epoch Postgres shows (here stale, PF001, or none, PF002).
/// Reading the tag as a rollback kept the epoch from before; straight to Postgres (the
/// control) the write lands.
#[tokio::test]
async fn a_prepare_transaction_outside_a_block_keeps_what_was_declared_before_it() {
    use crate::common::raw::{Raw, bind, codes, execute, message, parse, query, sync};
    let f = Fixture::at_epoch_two().await;
    let prepare = "PREPARE TRANSACTION 'g'";
    for (change, refused) in [("SET pgfence.epoch = 1", "PF001"), ("RESET pgfence.epoch", "PF002")] {
        let change_then = [parse("", change), bind("", "", &[]), execute("")].concat();
        let ways = [
            (
                "in one batch",
                [parse("", prepare), bind("", "", &[]), execute(""), sync()].concat(),
            ),
            ("as a Query", query(prepare)),
            ("as a Query after the portal's Close", query(prepare)),
        ];
        for (how, then) in ways {
            for port in [f.proxy.port(), f.cluster.port()] {
                let what = format!("{change}, {how}, through pgfence: {}", port == f.proxy.port());
                // Declared by `SET`, which `RESET` undoes (a startup value is what it returns to).
                let params = [("user", "postgres"), ("database", f.db.as_str())];
                let (mut s, _) = Raw::startup(port, &params).await;
                assert!(codes(&s.simple("SET pgfence.epoch = 2").await).is_empty(), "{what}");
                if how.ends_with("Close") {
                    let (close, flush) = (message(b'C', b"P\0"), message(b'H', b""));
                    s.send(&[change_then.clone(), close, flush].concat()).await;
                    s.read_until(|m| m.tag == b'3').await;
                    s.send(&then).await;
                } else {
                    s.send(&[change_then.clone(), then.clone()].concat()).await;
                }
                // Only the warning that no transaction is in progress.
                let answer = s.read_until(|m| m.tag == b'Z').await;
                assert_eq!(codes(&answer), ["25P01"], "{what}");
                f.verdict(port, codes(&s.simple(WRITE).await), refused).await;
            }
        }
    }
}

/// A `BEGIN` run by an Execute that a Flush answered opens a block before any
/// ReadyForQuery says so (and a `COMMIT` after it, answered the same way, closes it). A
/// `SET` pipelined after it is undone by the `ROLLBACK` behind in the block, and stands
/// after the block's end; the write after that is checked at the epoch `SHOW` gives: the
/// session's stale one (PF001), or the current one. Taking the last ReadyForQuery (idle)
/// as current kept the `SET` in the block as committed and passed the stale write; straight
/// to Postgres (the control) it lands.
#[tokio::test]
async fn a_block_answered_before_its_sync_counts_for_what_follows() {
    use crate::common::raw::{bind, codes, execute, first_value, message, parse, query};
    let f = Fixture::at_epoch_two().await;
    let run = |sql: &str| [parse("", sql), bind("", "", &[]), execute("")].concat();
    for (ends, closed) in [(false, "BEGIN"), (true, "BEGIN, COMMIT")] {
        for port in [f.proxy.port(), f.cluster.port()] {
            let through = port == f.proxy.port();
            let what = format!("{closed}, through pgfence: {through}");
            let mut s = f.raw(port, "1", &[]).await;
            let mut first = run("BEGIN");
            if ends {
                first.extend(run("COMMIT"));
            }
            first.extend(message(b'H', b""));
            s.send(&first).await;
            for _ in 0..1 + usize::from(ends) {
                s.read_until(|m| m.tag == b'C').await;
            }
            let pipeline = [
                query("SET pgfence.epoch = 2"),
                query("ROLLBACK"),
                query("SHOW pgfence.epoch"),
                query(WRITE),
            ];
            s.send(&pipeline.concat()).await;
            let mut got = Vec::new();
            let mut shown = None;
            for _ in 0..4 {
                let answer = s.read_until(|m| m.tag == b'Z').await;
                shown = shown.or(first_value(&answer));
                got.push(codes(&answer));
            }
            // The block's end (ours or its COMMIT) makes the ROLLBACK a no-op that warns.
            let want_shown = if ends { "2" } else { "1" };
            assert_eq!(shown.as_deref(), Some(want_shown), "{what}: {got:?}");
            let refused = through && !ends;
            assert_eq!(
                got[3],
                if refused { vec!["PF001".to_owned()] } else { vec![] },
                "{what}"
            );
            assert_eq!(f.note().await.0, if refused { "init" } else { "stale" }, "{what}");
            f.put_back().await;
        }
    }
}

/// What Postgres answered before a Sync counts for what is pipelined behind it: an error
/// after a Flush fails its transaction (the implicit one, or the block whose `COMMIT`
/// then rolls back), an Execute of a `BEGIN` bound before a Flush opens a block, and a
/// `DISCARD ALL` right after a block's end in a batch runs. In each, the `SET` to the
/// current epoch is undone, so the stale write after is refused (PF001); pgfence had
/// counted the `SET` and passed it. Straight to Postgres (the control) the write lands.
#[tokio::test]
async fn what_was_answered_before_a_sync_counts_for_what_follows() {
    use crate::common::raw::{bind, codes, execute, message, parse, query, sync};
    let f = Fixture::at_epoch_two().await;
    let run = |sql: &str| [parse("", sql), bind("", "", &[]), execute("")].concat();
    let flush = || message(b'H', b"");
    // (what, steps each answered before the next is sent (up to the message type given),
    // then the pipeline ending in the write, and how many requests it answers)
    type Case = (&'static str, Vec<(Vec<u8>, u8)>, Vec<u8>, usize);
    let cases: Vec<Case> = vec![
        (
            "an error after a Flush in a block",
            vec![
                (query("BEGIN"), b'Z'),
                (query("SET pgfence.epoch = 2"), b'Z'),
                ([run("SELECT 1/0"), flush()].concat(), b'E'),
            ],
            [sync(), query("COMMIT"), query(WRITE)].concat(),
            3,
        ),
        (
            "an error after a Flush, after a COMMIT",
            vec![
                (query("BEGIN"), b'Z'),
                (
                    [run("COMMIT"), run("SET pgfence.epoch = 2"), run("SELECT 1/0"), flush()].concat(),
                    b'E',
                ),
            ],
            [sync(), query("ROLLBACK"), query(WRITE)].concat(),
            3,
        ),
        (
            "a BEGIN bound before a Flush",
            vec![([parse("", "BEGIN"), bind("", "", &[]), flush()].concat(), b'2')],
            [
                execute(""),
                sync(),
                query("SET pgfence.epoch = 2"),
                query("ROLLBACK"),
                query(WRITE),
            ]
            .concat(),
            4,
        ),
        (
            "a DISCARD ALL after a ROLLBACK in a batch",
            vec![(query("SET pgfence.epoch = 2"), b'Z')],
            [
                run("ROLLBACK"),
                run("DISCARD ALL"),
                run("ROLLBACK"),
                sync(),
                query(WRITE),
            ]
            .concat(),
            2,
        ),
    ];
    for (what, steps, pipeline, answers) in cases {
        for port in [f.proxy.port(), f.cluster.port()] {
            let mut s = f.raw(port, "1", &[]).await;
            for (msgs, until) in &steps {
                s.send(msgs).await;
                s.read_until(|m| m.tag == *until).await;
            }
            s.send(&pipeline).await;
            let mut got = Vec::new();
            for _ in 0..answers {
                got.push(codes(&s.read_until(|m| m.tag == b'Z').await));
            }
            let wrote = got.pop().unwrap_or_default();
            s.simple("ROLLBACK").await;
            eprintln!("{what}, through pgfence: {}", port == f.proxy.port());
            f.verdict(port, wrote, "PF001").await;
        }
    }
}

/// Statements that fail whatever the data count for nothing pipelined behind them, and
/// those that may not fail count for what they do. An Execute of a `BEGIN` portal that
/// Postgres no longer holds (dropped at its Sync, closed by the client, or dropped by a
/// `COMMIT` before it in the batch) opens no block, so the `ROLLBACK` after only warns and
/// the `SET` before it stands; a statement pgfence takes for an `EXECUTE` of a name no one
/// prepared runs, and so does the `SET` after it. The write is checked at the epoch `SHOW`
/// gives (here the stale one: PF001). pgfence had counted the block (or dropped the `SET`)
/// and passed the write; straight to Postgres (the control) it lands.
#[tokio::test]
async fn statements_that_fail_whatever_the_data_count_for_nothing_behind_them() {
    use crate::common::raw::{bind, codes, execute, first_value, message, parse, query, sync};
    let f = Fixture::at_epoch_two().await;
    let run = |sql: &str| [parse("", sql), bind("", "", &[]), execute("")].concat();
    let begin_bound = [parse("", "BEGIN"), bind("p", "", &[])].concat();
    // (what, the epoch at startup, the pipeline up to the write, how many it answers)
    let cases = [
        // Not failing: taken for an `EXECUTE` of a name no one prepared, whose refusal
        // raises only if it is prepared, it runs, and so does the `SET` after it.
        (
            "a statement taken for an EXECUTE, then SET",
            "2",
            query("CREATE TEMP VIEW v AS SELECT 1 AS execute FROM pg_class LIMIT 1; SET pgfence.epoch = 1"),
            1,
        ),
        (
            "a BEGIN portal dropped by a COMMIT",
            "2",
            [
                begin_bound.clone(),
                run("COMMIT"),
                execute("p"),
                sync(),
                query("SET pgfence.epoch = 1"),
                query("ROLLBACK"),
            ]
            .concat(),
            3,
        ),
        (
            "a BEGIN portal dropped at its Sync",
            "2",
            [
                begin_bound.clone(),
                sync(),
                execute("p"),
                sync(),
                query("SET pgfence.epoch = 1"),
                query("ROLLBACK"),
            ]
            .concat(),
            4,
        ),
        (
            "a BEGIN portal closed by the client",
            "2",
            [
                begin_bound,
                message(b'C', b"Pp\0"),
                execute("p"),
                sync(),
                query("SET pgfence.epoch = 1"),
                query("ROLLBACK"),
            ]
            .concat(),
            3,
        ),
    ];
    for (what, start, pipeline, answers) in cases {
        for port in [f.proxy.port(), f.cluster.port()] {
            let through = port == f.proxy.port();
            let mut s = f.raw(port, start, &[]).await;
            s.send(&[pipeline.clone(), query("SHOW pgfence.epoch"), query(WRITE)].concat())
                .await;
            for _ in 0..answers {
                s.read_until(|m| m.tag == b'Z').await;
            }
            let shown = first_value(&s.read_until(|m| m.tag == b'Z').await);
            let wrote = codes(&s.read_until(|m| m.tag == b'Z').await);
            assert_eq!(shown.as_deref(), Some("1"), "{what}, through pgfence: {through}");
            f.verdict(port, wrote, "PF001").await;
        }
    }
}
