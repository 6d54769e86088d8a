//! The extended protocol: statements are rewritten for the epoch current at
//! Bind, whenever they were prepared.

use super::{fixture, item_note, update_note};
use crate::common::pg::Cluster;
use crate::common::raw::{Msg, Raw, bind, close_statement, codes, execute, message, parse, query, sync, tags};
use crate::fencing::{Fixture, code};

#[tokio::test]
async fn rewrite_statement_prepared_before_the_epoch_uses_the_later_epoch() {
    let f = fixture(false).await;
    let s = f.session("").await;
    let st = s
        .prepare("UPDATE sweep_state SET note = $1 WHERE id = $2")
        .await
        .unwrap();
    assert_eq!(code(&s.execute(&st, &[&"none", &1i32]).await), "PF002");
    s.batch_execute("SET pgfence.epoch = 5").await.unwrap();
    assert_eq!(s.execute(&st, &[&"five", &1i32]).await.unwrap(), 1);
    assert_eq!(f.note().await, ("five".to_owned(), 5));
}

#[tokio::test]
async fn rewrite_named_statement_is_reprepared_across_epoch_changes() {
    let f = fixture(false).await;
    let s = f.leader(5).await;
    let st = s
        .prepare("UPDATE sweep_state SET note = $1, last_epoch = $2 WHERE id = 1 RETURNING last_epoch")
        .await
        .unwrap();
    let epoch_of = |rows: Vec<tokio_postgres::Row>| rows.first().map(|r| r.get::<_, i64>(0));
    assert_eq!(epoch_of(s.query(&st, &[&"five", &99i64]).await.unwrap()), Some(5));
    s.batch_execute("SET pgfence.epoch = 6").await.unwrap();
    assert_eq!(epoch_of(s.query(&st, &[&"six", &99i64]).await.unwrap()), Some(6));
    // Back to 5 (a stale session): the row written at 6 is not touched.
    s.batch_execute("SET pgfence.epoch = 5").await.unwrap();
    assert_eq!(epoch_of(s.query(&st, &[&"stale", &99i64]).await.unwrap()), None);
    assert_eq!(f.note().await, ("six".to_owned(), 6));
    // The unnamed statement (parse, bind, execute in one batch) too, and the session still works.
    let n = s
        .execute("INSERT INTO items (id, note) VALUES ($1, $2)", &[&1i32, &"x"])
        .await
        .unwrap();
    assert_eq!(n, 1);
    let e: i64 = f
        .admin
        .query_one("SELECT last_epoch FROM items WHERE id = 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(e, 5);
}

#[tokio::test]
async fn rewrite_set_inside_a_transaction_applies_to_the_next_execute() {
    let f = fixture(false).await;
    let s = f.leader(3).await;
    let st = s.prepare("DELETE FROM items WHERE id = $1").await.unwrap();
    f.admin
        .batch_execute("INSERT INTO items VALUES (1, 'a', 1, 4), (2, 'b', 2, 2)")
        .await
        .unwrap();
    s.batch_execute("BEGIN").await.unwrap();
    assert_eq!(
        s.execute(&st, &[&1i32]).await.unwrap(),
        0,
        "epoch 3 cannot delete a row at 4"
    );
    s.batch_execute("SET LOCAL pgfence.epoch = 4").await.unwrap();
    assert_eq!(s.execute(&st, &[&1i32]).await.unwrap(), 1);
    s.batch_execute("COMMIT").await.unwrap();
    // SET LOCAL ended: back at 3.
    assert_eq!(s.execute(&st, &[&2i32]).await.unwrap(), 1);
}

/// Command tags and error codes of `msgs`, in order: `UPDATE 1`, `E 22012`, …
fn outcomes(msgs: &[Msg]) -> Vec<String> {
    msgs.iter()
        .filter_map(|m| match m.tag {
            b'C' => Some(String::from_utf8_lossy(m.body.strip_suffix(b"\0").unwrap_or(&m.body)).into_owned()),
            b'E' => m.code().map(|c| format!("E {c}")),
            _ => None,
        })
        .collect()
}

/// Sends `msgs` and reads up to ReadyForQuery.
async fn batch(raw: &mut Raw, msgs: &[Vec<u8>]) -> Vec<String> {
    raw.send(&msgs.concat()).await;
    outcomes(&raw.read_until(|m| m.tag == b'Z').await)
}

const UPDATE_U: &str = "UPDATE sweep_state SET note = $1 WHERE id = 1";

/// Puts row 1 back at note 'init', epoch 1.
async fn reset_row(f: &Fixture) {
    f.admin
        .batch_execute("UPDATE sweep_state SET note = 'init', last_epoch = 1 WHERE id = 1")
        .await
        .unwrap();
}

/// A raw session on `port` at `epoch` with `UPDATE_U` prepared as `u`.
async fn prepared_u(f: &Fixture, port: u16, epoch: &str) -> Raw {
    let mut raw = f.raw(port, epoch, &[]).await;
    assert_eq!(
        batch(&mut raw, &[parse("u", UPDATE_U), sync()]).await,
        Vec::<String>::new()
    );
    raw
}

/// A re-prepare for a new epoch that Postgres skipped (an error earlier in its batch)
/// is sent again at the next Bind: pgfence does not take a re-prepare it sent for one
/// that ran. Both ways: a leader that moved up must write its new epoch (else a stale
/// writer between the two could overwrite its row), and a session that moved back
/// must not write with the newer epoch its statement was prepared for.
#[tokio::test]
async fn a_reprepare_skipped_after_an_error_is_sent_again() {
    let f = fixture(false).await;
    // (startup epoch, epoch of the Parse, epoch of the write, the other writer's epoch)
    for (start, parsed, writes, other) in [("80", 80, 90, 85), ("80", 90, 80, 85)] {
        let what = format!("prepared at {parsed}, written at {writes}");
        reset_row(&f).await;
        let mut a = f.raw(f.proxy.port(), start, &[]).await;
        a.simple(&format!("SET pgfence.epoch = {parsed}")).await;
        assert_eq!(
            batch(&mut a, &[parse("u", UPDATE_U), sync()]).await,
            Vec::<String>::new()
        );
        a.simple(&format!("SET pgfence.epoch = {writes}")).await;
        // The row at the epoch in between, when the session moved back.
        if writes < other {
            assert_eq!(update_note(&f.leader(other).await, "other").await, 1, "{what}");
        }
        // An error first: Postgres skips the re-prepare and the client's Bind alike.
        let failed = [
            parse("", "SELECT 1/0"),
            bind("", "", &[]),
            execute(""),
            bind("", "u", &["skipped"]),
            execute(""),
            sync(),
        ];
        assert_eq!(batch(&mut a, &failed).await, ["E 22012"], "{what}");
        let write = [bind("", "u", &["a"]), execute(""), sync()];
        if writes > other {
            assert_eq!(batch(&mut a, &write).await, ["UPDATE 1"], "{what}");
            assert_eq!(f.note().await, ("a".to_owned(), writes), "{what}");
            // The stale writer in between touches nothing.
            assert_eq!(update_note(&f.leader(other).await, "other").await, 0, "{what}");
            assert_eq!(f.note().await, ("a".to_owned(), writes), "{what}");
        } else {
            assert_eq!(batch(&mut a, &write).await, ["UPDATE 0"], "{what}");
            assert_eq!(f.note().await, ("other".to_owned(), other), "{what}");
        }
    }
    // Control: straight to Postgres, a stale write lands on the row a newer epoch wrote.
    let direct = f.direct().await;
    assert_eq!(update_note(&direct, "stale").await, 1);
    assert_eq!(f.note().await.0, "stale");
}

/// A re-prepare is not sent inside a transaction known to be aborted, where its Close
/// would run and its Parse fail: the client's statement survives the failed
/// transaction (Postgres answers its Bind with 25P02, as straight to Postgres), and the
/// next Bind after ROLLBACK writes at the new epoch. Also when the Bind comes in the
/// same pipeline as the error, where the re-prepare does run and fail: the next Bind
/// prepares it again.
#[tokio::test]
async fn a_statement_survives_an_epoch_change_in_an_aborted_transaction() {
    let f = fixture(false).await;
    for pipelined in [false, true] {
        for port in [f.proxy.port(), f.cluster.port()] {
            let what = format!("pipelined: {pipelined}, through pgfence: {}", port == f.proxy.port());
            reset_row(&f).await;
            let mut a = prepared_u(&f, port, "80").await;
            a.simple("SET pgfence.epoch = 82").await;
            let in_failed = [bind("", "u", &["x"]), execute(""), sync()];
            if pipelined {
                let mut msgs = vec![query("BEGIN"), query("SELECT 1/0")];
                msgs.extend(in_failed);
                let got = batch(&mut a, &msgs).await;
                assert_eq!(got, ["BEGIN"], "{what}");
                let got = outcomes(&a.read_until(|m| m.tag == b'Z').await);
                assert_eq!(got, ["E 22012"], "{what}");
                let got = outcomes(&a.read_until(|m| m.tag == b'Z').await);
                assert_eq!(got, ["E 25P02"], "{what}");
            } else {
                a.simple("BEGIN").await;
                a.simple("SELECT 1/0").await;
                assert_eq!(batch(&mut a, &in_failed).await, ["E 25P02"], "{what}");
                // Described as Postgres describes it: the statement is still there.
                a.send(&[message(b'D', b"Su\0"), sync()].concat()).await;
                assert_eq!(tags(&a.read_until(|m| m.tag == b'Z').await), "tnZ", "{what}");
            }
            a.simple("ROLLBACK").await;
            for note in ["one", "two"] {
                let got = batch(&mut a, &[bind("", "u", &[note]), execute(""), sync()]).await;
                assert_eq!(got, ["UPDATE 1"], "{what}");
            }
            let want = if port == f.proxy.port() { 82 } else { 1 };
            assert_eq!(f.note().await, ("two".to_owned(), want), "{what}");
        }
    }
}

/// A client's Parse of a name that is taken fails (42P05) and leaves the old statement
/// in place: pgfence does not take the new text for it. A rewrite write run by that
/// name afterwards is refused (PF004) rather than re-prepared from a text Postgres
/// never accepted.
#[tokio::test]
async fn a_failed_parse_of_a_taken_name_is_not_taken_for_the_statement() {
    let f = fixture(false).await;
    let mut a = prepared_u(&f, f.proxy.port(), "80").await;
    let other = "UPDATE sweep_state SET note = 'other' WHERE id = 1";
    assert_eq!(batch(&mut a, &[parse("u", other), sync()]).await, ["E 42P05"]);
    a.simple("SET pgfence.epoch = 81").await;
    let got = batch(&mut a, &[bind("", "u", &["x"]), execute(""), sync()]).await;
    assert_eq!(got, ["E PF004"]);
    assert_eq!(f.note().await.0, "init");
    // Control: straight to Postgres the old statement runs.
    let mut d = prepared_u(&f, f.cluster.port(), "80").await;
    assert_eq!(batch(&mut d, &[parse("u", other), sync()]).await, ["E 42P05"]);
    let got = batch(&mut d, &[bind("", "u", &["x"]), execute(""), sync()]).await;
    assert_eq!(got, ["UPDATE 1"]);
    assert_eq!(f.note().await.0, "x");
}

/// A rewrite statement's name taken over by SQL `PREPARE` (after a `DEALLOCATE`) runs
/// the new statement: pgfence no longer re-prepares the old text under it. Pipelined,
/// before Postgres confirmed anything, the name may be either statement, and a write
/// by it is refused (PF004) instead.
#[tokio::test]
async fn a_name_prepared_again_in_sql_runs_the_new_statement() {
    let f = fixture(false).await;
    for pipelined in [false, true] {
        let mut a = prepared_u(&f, f.proxy.port(), "80").await;
        let setup = [
            query("DEALLOCATE u"),
            query("PREPARE u (text) AS SELECT $1"),
            query("SET pgfence.epoch = 81"),
        ];
        let run = [bind("", "u", &["x"]), execute(""), sync()];
        if pipelined {
            a.send(&[setup.concat(), run.concat()].concat()).await;
            for want in ["DEALLOCATE", "PREPARE", "SET"] {
                assert_eq!(outcomes(&a.read_until(|m| m.tag == b'Z').await), [want]);
            }
            assert_eq!(outcomes(&a.read_until(|m| m.tag == b'Z').await), ["E PF004"]);
        } else {
            for msg in setup {
                assert_eq!(batch(&mut a, &[msg]).await.len(), 1);
            }
            assert_eq!(batch(&mut a, &run).await, ["SELECT 1"]);
        }
        assert_eq!(f.note().await.0, "init", "pipelined: {pipelined}");
    }
}

/// A `DEALLOCATE ALL` answered while a Parse sent after it is still in flight. A
/// re-prepare that Postgres then skips after an error must not pass for confirmed because
/// it is the only definition pgfence knows: the next Bind re-prepares again. (One pgfence
/// could not foresee, in a text whose split is uncertain, is refused: it would make
/// pgfence forget every definition.)
#[tokio::test]
async fn a_skipped_reprepare_is_not_taken_for_confirmed() {
    let f = fixture(false).await;
    reset_row(&f).await;
    let mut a = f.raw(f.proxy.port(), "80", &[]).await;
    let uncertain = "CREATE FUNCTION pg_temp.f(begin int) RETURNS int LANGUAGE sql AS 'select 1'; DEALLOCATE ALL";
    assert_eq!(outcomes(&a.simple(uncertain).await), ["E PF004"]);
    let first = [
        query("DEALLOCATE ALL"),
        parse("u", UPDATE_U),
        parse("", "SELECT pg_sleep(0.5)"),
        bind("", "", &[]),
        execute(""),
        sync(),
    ];
    a.send(&first.concat()).await;
    assert_eq!(outcomes(&a.read_until(|m| m.tag == b'Z').await), ["DEALLOCATE ALL"]);
    // While the sleep runs: a new epoch, and a re-prepare that an error makes Postgres skip.
    let second = [
        query("SET pgfence.epoch = 90"),
        parse("", "SELECT 1/0"),
        bind("", "", &[]),
        execute(""),
        bind("", "u", &["skipped"]),
        execute(""),
        sync(),
    ];
    a.send(&second.concat()).await;
    for want in [vec!["SELECT 1"], vec!["SET"], vec!["E 22012"]] {
        assert_eq!(outcomes(&a.read_until(|m| m.tag == b'Z').await), want);
    }
    assert_eq!(
        batch(&mut a, &[bind("", "u", &["a"]), execute(""), sync()]).await,
        ["UPDATE 1"]
    );
    assert_eq!(f.note().await, ("a".to_owned(), 90));
}

/// A Bind to a named portal Postgres still holds fails (42P03) and keeps the old portal;
/// after `ROLLBACK TO SAVEPOINT` the transaction goes on and an Execute of the name runs
/// the old one. Bound at another epoch than the session's now, it is refused (PF004)
/// instead of writing the old epoch. Straight to Postgres (the control) it runs.
#[tokio::test]
async fn a_portal_rebound_while_it_exists_is_not_taken_for_the_new_one() {
    let f = fixture(false).await;
    for port in [f.proxy.port(), f.cluster.port()] {
        reset_row(&f).await;
        let mut a = prepared_u(&f, port, "80").await;
        a.simple("BEGIN").await;
        assert_eq!(
            batch(&mut a, &[bind("p", "u", &["a"]), sync()]).await,
            Vec::<String>::new()
        );
        a.simple("SET pgfence.epoch = 90").await;
        a.simple("SAVEPOINT s").await;
        assert_eq!(batch(&mut a, &[bind("p", "u", &["b"]), sync()]).await, ["E 42P03"]);
        a.simple("ROLLBACK TO SAVEPOINT s").await;
        let got = batch(&mut a, &[execute("p"), sync()]).await;
        a.simple("COMMIT").await;
        if port == f.proxy.port() {
            assert_eq!(got, ["E PF004"]);
            assert_eq!(f.note().await, ("init".to_owned(), 1));
        } else {
            assert_eq!(got, ["UPDATE 1"]);
            assert_eq!(f.note().await.0, "a");
        }
    }
}

/// A ROLLBACK run by Execute and followed by a Flush (no Sync yet) ends the aborted
/// transaction: the next Bind re-prepares for the new epoch and writes, as straight to
/// Postgres, rather than waiting for an aborted transaction that is gone.
#[tokio::test]
async fn a_rollback_answered_before_any_sync_ends_the_aborted_state() {
    let f = fixture(false).await;
    for port in [f.proxy.port(), f.cluster.port()] {
        let mut a = prepared_u(&f, port, "80").await;
        a.simple("SET pgfence.epoch = 90").await;
        a.simple("BEGIN").await;
        a.simple("SELECT 1/0").await;
        let rollback = [
            parse("", "ROLLBACK"),
            bind("", "", &[]),
            execute(""),
            message(b'H', b""),
        ];
        a.send(&rollback.concat()).await;
        assert_eq!(outcomes(&a.read_until(|m| m.tag == b'C').await), ["ROLLBACK"]);
        let got = batch(&mut a, &[bind("", "u", &["d"]), execute(""), sync()]).await;
        assert_eq!(got, ["UPDATE 1"], "through pgfence: {}", port == f.proxy.port());
    }
}

/// A rewrite statement that was re-prepared for a new epoch and then deallocated is gone,
/// as straight to Postgres (26000): pgfence does not prepare it again behind the client.
#[tokio::test]
async fn a_deallocated_rewrite_statement_stays_gone() {
    let f = fixture(false).await;
    let mut seen = Vec::new();
    for port in [f.proxy.port(), f.cluster.port()] {
        let mut s = f.raw(port, "5", &[]).await;
        assert_eq!(
            batch(&mut s, &[parse("s", UPDATE_U), sync()]).await,
            Vec::<String>::new()
        );
        s.simple("SET pgfence.epoch = 6").await;
        let run = [bind("", "s", &["a"]), execute(""), sync()];
        assert_eq!(batch(&mut s, &run).await, ["UPDATE 1"]);
        assert_eq!(batch(&mut s, &[query("DEALLOCATE s")]).await, ["DEALLOCATE"]);
        seen.push(batch(&mut s, &run).await);
    }
    assert_eq!(seen, [["E 26000"], ["E 26000"]]);
}

/// A rewrite-mode refusal in a simple Query answers with the error alone, as Postgres
/// answers a failing statement: no RowDescription of pgfence's own call before it.
#[tokio::test]
async fn a_simple_query_refusal_answers_with_the_error_alone() {
    let f = fixture(false).await;
    let mut none = {
        let params = [("user", "postgres"), ("database", f.db.as_str())];
        Raw::startup(f.proxy.port(), &params).await.0
    };
    let got = none.simple("UPDATE sweep_state SET note = 'x' WHERE id = 1").await;
    assert_eq!(
        (tags(&got), outcomes(&got)),
        ("EZ".to_owned(), vec!["E PF002".to_owned()])
    );
    let mut s = f.raw(f.proxy.port(), "5", &[]).await;
    for (sql, want) in [
        ("TRUNCATE sweep_state", "E PF004"),
        ("INSERT INTO items VALUES (1, 'a', 1, 1)", "E PF004"),
    ] {
        let got = s.simple(sql).await;
        assert_eq!(
            (tags(&got), outcomes(&got)),
            ("EZ".to_owned(), vec![want.to_owned()]),
            "{sql}"
        );
    }
}

/// A client's Parse that Postgres skips after an error defines nothing, also when the
/// Bind of its name is already on the way (pipelined): the Bind fails (26000) as
/// straight to Postgres, rather than pgfence preparing the skipped text itself.
#[tokio::test]
async fn a_skipped_parse_of_a_rewrite_statement_is_not_prepared_behind_the_client() {
    let f = fixture(false).await;
    let mut seen = Vec::new();
    for port in [f.proxy.port(), f.cluster.port()] {
        let mut s = f.raw(port, "5", &[]).await;
        let msgs = [
            parse("", "SELECT 1/0"),
            bind("", "", &[]),
            execute(""),
            parse("s2", "DELETE FROM sweep_state WHERE id = 1"),
            sync(),
            bind("", "s2", &[]),
            execute(""),
            sync(),
        ];
        s.send(&msgs.concat()).await;
        let first = outcomes(&s.read_until(|m| m.tag == b'Z').await);
        let second = outcomes(&s.read_until(|m| m.tag == b'Z').await);
        seen.push((first, second));
    }
    assert_eq!(seen[0], seen[1], "through pgfence, then straight to Postgres");
    assert_eq!(seen[1].1, ["E 26000"]);
    assert_eq!(f.note().await.0, "init");
}

/// `INSERT … SELECT $1, $2, $3` naming the epoch column: Postgres types the parameters by
/// the columns they go to, through pgfence as straight to it (a typed driver such as
/// asyncpg sends them in those types), and the row gets the session's epoch. The same
/// holds for the query in parentheses, after a WITH list, and without the epoch column.
#[tokio::test]
async fn insert_select_parameters_keep_the_types_of_their_columns() {
    use tokio_postgres::types::{ToSql, Type};
    let f = fixture(false).await;
    let s = f.leader(5).await;
    let direct = f.direct().await;
    let forms = [
        "INSERT INTO items (id, note, n, last_epoch) SELECT $1, $2, $3, $4",
        "INSERT INTO items (id, note, n, last_epoch) (SELECT $1, $2, $3, $4)",
        "INSERT INTO items (id, note, n, last_epoch) ((SELECT $1, $2, $3, $4 LIMIT 1))",
        "INSERT INTO items (id, note, n, last_epoch) WITH c AS (SELECT 1) SELECT $1, $2, $3, $4 FROM c",
        "INSERT INTO items (id, note, n) (WITH RECURSIVE c (k) AS (SELECT 1) SELECT $1, $2, $3 FROM c)",
    ];
    for (k, sql) in forms.iter().enumerate() {
        let types = |st: &tokio_postgres::Statement| st.params().to_vec();
        let want = types(&direct.prepare(sql).await.unwrap());
        let st = s.prepare(sql).await.unwrap();
        assert_eq!(types(&st), want, "{sql}");
        assert_eq!(&want[..3], [Type::INT4, Type::TEXT, Type::INT4], "{sql}");
        let id = 7 + k as i32;
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&id, &"x", &1i32];
        if want.len() == 4 {
            assert_eq!(want[3], Type::INT8);
            params.push(&99i64);
        }
        assert_eq!(s.execute(&st, &params).await.unwrap(), 1, "{sql}");
        let row = f
            .admin
            .query_one("SELECT note, n, last_epoch FROM items WHERE id = $1", &[&id])
            .await
            .unwrap();
        assert_eq!(
            (row.get::<_, String>(0), row.get::<_, i32>(1), row.get::<_, i64>(2)),
            ("x".into(), 1, 5),
            "{sql}"
        );
    }
    // Untyped literals go to their columns' types too, in the simple protocol: straight to
    // Postgres `'20'` becomes an integer; in a wrapping subquery it would be text (42804).
    for (id, sql) in [
        (20, "INSERT INTO items (id, note) (SELECT '20', 'y')"),
        (
            21,
            "INSERT INTO items (id, note) WITH c AS (SELECT 1) SELECT '21', 'y' FROM c",
        ),
    ] {
        s.batch_execute(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
        let e: i64 = f
            .admin
            .query_one("SELECT last_epoch FROM items WHERE id = $1", &[&id])
            .await
            .unwrap()
            .get(0);
        assert_eq!(e, 5, "{sql}");
    }
}

/// A statement prepared before the epoch was declared is re-prepared at its first Bind with
/// an epoch, with the parameter types Postgres described for it: a driver encodes its values
/// for those (binary `int4` for an `int4` epoch column), while the rewritten text alone
/// would make Postgres read that parameter as `bigint`, beside the epoch it writes.
#[tokio::test]
async fn a_reprepare_declares_the_parameter_types_postgres_described() {
    use tokio_postgres::types::Type;
    let f = fixture(false).await;
    f.admin
        .batch_execute("ALTER TABLE items ALTER last_epoch TYPE int")
        .await
        .unwrap();
    let insert = "INSERT INTO items (id, note, last_epoch) VALUES ($1, $2, $3) RETURNING last_epoch";
    let update = "UPDATE items SET note = $1, last_epoch = $2 WHERE id = $3 RETURNING last_epoch";
    // Straight to Postgres the driver sends `int4` for the epoch column, and it lands.
    let direct = f.direct().await;
    let st = direct.prepare(insert).await.unwrap();
    assert_eq!(st.params(), [Type::INT4, Type::TEXT, Type::INT4]);
    let row = direct.query_one(&st, &[&1i32, &"d", &7i32]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 7);

    let s = f.session("").await;
    let (insert, update) = (s.prepare(insert).await.unwrap(), s.prepare(update).await.unwrap());
    assert_eq!(insert.params(), [Type::INT4, Type::TEXT, Type::INT4]);
    assert_eq!(update.params(), [Type::TEXT, Type::INT4, Type::INT4]);
    s.batch_execute("SET pgfence.epoch = 5").await.unwrap();
    let epoch = |row: Option<tokio_postgres::Row>| row.map(|r| r.get::<_, i32>(0));
    let row = s.query_opt(&insert, &[&2i32, &"x", &99i32]).await.unwrap();
    assert_eq!(epoch(row), Some(5));
    let row = s.query_opt(&update, &[&"y", &99i32, &2i32]).await.unwrap();
    assert_eq!(epoch(row), Some(5));
    // A new epoch prepares it again, with the same types; a stale one touches nothing.
    s.batch_execute("SET pgfence.epoch = 6").await.unwrap();
    let row = s.query_opt(&update, &[&"z", &99i32, &2i32]).await.unwrap();
    assert_eq!(epoch(row), Some(6));
    s.batch_execute("SET pgfence.epoch = 5").await.unwrap();
    let row = s.query_opt(&update, &[&"stale", &99i32, &2i32]).await.unwrap();
    assert_eq!(epoch(row), None);
    let row = f
        .admin
        .query_one("SELECT note, last_epoch FROM items WHERE id = 2", &[])
        .await
        .unwrap();
    assert_eq!((row.get::<_, String>(0), row.get::<_, i32>(1)), ("z".into(), 6));
}

/// An upsert whose rows come from a select list (no FROM): sqlparser reads the `ON` of
/// `ON CONFLICT` after it as a column alias, which Postgres never does; the check reads the
/// query in parentheses, so the write is rewritten (it was refused with PF004), and a stale
/// epoch's upsert touches no row.
#[tokio::test]
async fn an_upsert_of_a_select_list_is_rewritten() {
    let f = fixture(false).await;
    let sql = "INSERT INTO items (id, note) SELECT $1, $2 ON CONFLICT (id) DO UPDATE SET note = excluded.note";
    let new = f.leader(6).await;
    assert_eq!(new.execute(sql, &[&1i32, &"six"]).await.unwrap(), 1);
    assert_eq!(new.execute(sql, &[&1i32, &"six-again"]).await.unwrap(), 1);
    let old = f.leader(5).await;
    assert_eq!(old.execute(sql, &[&1i32, &"stale"]).await.unwrap(), 0);
    let row = f
        .admin
        .query_one("SELECT note, last_epoch FROM items WHERE id = 1", &[])
        .await
        .unwrap();
    assert_eq!((row.get::<_, String>(0), row.get::<_, i64>(1)), ("six-again".into(), 6));
    // Control: straight to Postgres the stale upsert lands.
    let n = f.direct().await.execute(sql, &[&1i32, &"stale"]).await.unwrap();
    assert_eq!((n, item_note(&f, 1).await), (1, "stale".to_owned()));
}

/// One message rewrites at most 4 MiB of statements (each costs the proxy's thread about
/// 300 ns a byte): past that the message is refused with PF004 and writes nothing, while
/// the same statements sent in two messages are rewritten as always.
#[tokio::test]
async fn a_message_of_more_statements_than_pgfence_rewrites_at_once_is_refused_whole() {
    let f = fixture(false).await;
    let pad = "x".repeat(60 * 1024);
    let insert = |id: usize| format!("INSERT INTO items (id, note) VALUES ({id}, '{pad}');");
    let all: Vec<String> = (0..72).map(insert).collect();
    let count = async || -> i64 {
        f.admin
            .query_one("SELECT count(*) FROM items", &[])
            .await
            .unwrap()
            .get(0)
    };
    let mut raw = f.raw(f.proxy.port(), "1", &[]).await;
    let replies = raw.simple(&all.concat()).await;
    assert_eq!(codes(&replies), ["PF004"], "{}", tags(&replies));
    assert_eq!(count().await, 0);
    for half in all.chunks(36) {
        let replies = raw.simple(&half.concat()).await;
        assert!(codes(&replies).is_empty(), "{:?}", codes(&replies));
    }
    assert_eq!(count().await, 72);
    let epochs: i64 = f
        .admin
        .query_one("SELECT count(*) FROM items WHERE last_epoch = 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(epochs, 72);
    // A lone statement over the rewriter's 64 KiB limit, even over the whole budget, gets
    // the rewriter's own refusal, and the session goes on.
    let huge = format!("INSERT INTO items (id, note) VALUES (100, '{}')", "y".repeat(5 << 20));
    let replies = raw.simple(&format!("{huge}; {}", insert(101))).await;
    assert_eq!(codes(&replies), ["PF004"], "{}", tags(&replies));
    let message = replies.iter().find_map(|m| m.field(b'M')).unwrap_or_default();
    assert!(!message.contains("MiB"), "{message}");
    assert!(codes(&raw.simple("SELECT 1").await).is_empty());
    assert_eq!(count().await, 72);
}

/// A Bind Postgres refuses (a wrong parameter count) leaves the unnamed portal from before,
/// which `ROLLBACK TO SAVEPOINT` keeps: here one bound while the session had no epoch, whose
/// text went as written. Run after the session declared an epoch, it is refused (PF004),
/// whether the refusal was answered before the Execute was sent or not, and the row a newer
/// epoch wrote keeps its epoch. Control: straight to Postgres the client's own
/// `last_epoch = 1` lands on it.
#[tokio::test]
async fn a_refused_bind_leaves_the_portal_from_before_with_its_epoch() {
    let f = fixture(false).await;
    let write = "UPDATE sweep_state SET note = 'stale', last_epoch = 1 WHERE id = 1";
    let step = |name: &str, sql: &str| [parse(name, sql), bind(name, name, &[]), execute(name), sync()].concat();
    let batches = [
        [parse("w", write), bind("", "w", &[]), sync()].concat(),
        step("set", "SET pgfence.epoch = 3"),
        step("sp", "SAVEPOINT s"),
        [bind("", "w", &["unexpected"]), sync()].concat(),
        step("rb", "ROLLBACK TO SAVEPOINT s"),
        [execute(""), sync()].concat(),
    ];
    for pipelined in [false, true] {
        for port in [f.proxy.port(), f.cluster.port()] {
            f.admin
                .batch_execute("UPDATE sweep_state SET note = 'newer', last_epoch = 9 WHERE id = 1")
                .await
                .unwrap();
            let params = [("user", "postgres"), ("database", f.db.as_str())];
            let (mut s, _) = Raw::startup(port, &params).await;
            s.simple("BEGIN").await;
            let mut got = Vec::new();
            if pipelined {
                s.send(&batches.concat()).await;
                for _ in &batches {
                    got.push(outcomes(&s.read_until(|m| m.tag == b'Z').await));
                }
            } else {
                for b in &batches {
                    got.push(batch(&mut s, std::slice::from_ref(b)).await);
                }
            }
            s.simple("COMMIT").await;
            assert_eq!(got[3], ["E 08P01"], "{got:?}");
            let last = got.last().cloned().unwrap_or_default();
            if port == f.proxy.port() {
                assert_eq!(last, ["E PF004"], "pipelined: {pipelined}");
                assert_eq!(f.note().await, ("newer".to_owned(), 9));
            } else {
                assert_eq!(last, ["UPDATE 1"]);
                assert_eq!(f.note().await, ("stale".to_owned(), 1));
            }
        }
    }
}

/// A Parse of a name Postgres still holds is refused (42P05), or skipped after an error in
/// its batch, and a Bind of the name in a later batch, sent before that answer, runs the
/// statement Postgres kept. pgfence does not put the client's new text in by a re-prepare
/// (it would run a write Postgres never accepted): the Execute is refused (PF004), and
/// the row stays as it was, as it does straight to Postgres, where the old SELECT runs.
#[tokio::test]
async fn a_parse_postgres_refuses_is_not_put_in_by_a_reprepare() {
    let f = fixture(false).await;
    let write = "UPDATE sweep_state SET note = 'never prepared' WHERE id = 1";
    let refusals = [
        [parse("w", write), sync()].concat(),
        [
            parse("", "SELECT 1/0"),
            bind("", "", &[]),
            execute(""),
            parse("w", write),
            sync(),
        ]
        .concat(),
    ];
    for refused in refusals {
        for port in [f.proxy.port(), f.cluster.port()] {
            reset_row(&f).await;
            let mut s = f.raw(port, "3", &[]).await;
            assert!(batch(&mut s, &[parse("w", "SELECT 'old'"), sync()]).await.is_empty());
            s.send(&[refused.clone(), bind("", "w", &[]), execute(""), sync()].concat())
                .await;
            let first = outcomes(&s.read_until(|m| m.tag == b'Z').await);
            assert_eq!(first.len(), 1, "{first:?}");
            let got = outcomes(&s.read_until(|m| m.tag == b'Z').await);
            if port == f.proxy.port() {
                assert_eq!(got, ["E PF004"]);
            } else {
                assert_eq!(got, ["SELECT 1"]);
            }
            assert_eq!(f.note().await, ("init".to_owned(), 1));
        }
    }
}

/// A portal runs the text bound into it, whatever its statement's name holds later. Bound
/// from a write of fence `sweeper`'s table, then the statement closed, its name prepared
/// again as a write of fence `other`'s table, and the session moved to `other`: the
/// portal's Execute is decided by the fence its text writes, not by the name (which would
/// run `sweeper`'s write under `other`'s check): PF002, as for any write of `sweeper`'s
/// table from a session of `other`. Straight to Postgres the portal runs its UPDATE.
#[tokio::test]
async fn a_portal_whose_statement_was_prepared_again_is_refused() {
    let rewrite = |name: &str, table: &str| {
        format!(
            "[[fence]]\nname = \"{name}\"\ntables = [\"public.{table}\"]\nmode = \"rewrite\"\nepoch_column = \"last_epoch\"\n"
        )
    };
    let toml = rewrite("sweeper", "sweep_state") + &rewrite("other", "items");
    let f = Fixture::with(Cluster::shared(), &toml).await;
    f.admin
        .batch_execute("CREATE TABLE items (id int PRIMARY KEY, note text, last_epoch bigint)")
        .await
        .unwrap();
    for port in [f.proxy.port(), f.cluster.port()] {
        let mut s = f.raw(port, "3", &[("pgfence.fence", "sweeper")]).await;
        s.simple("BEGIN").await;
        assert!(
            batch(&mut s, &[parse("w", UPDATE_U), bind("p", "w", &["a"]), sync()])
                .await
                .is_empty()
        );
        let again = [
            close_statement("w"),
            parse("w", "UPDATE items SET note = 'x' WHERE id = 1"),
            sync(),
        ];
        assert!(batch(&mut s, &again).await.is_empty());
        s.simple("SET pgfence.fence = other").await;
        let got = batch(&mut s, &[execute("p"), sync()]).await;
        s.simple("ROLLBACK").await;
        if port == f.proxy.port() {
            assert_eq!(got, ["E PF002"]);
        } else {
            assert_eq!(got, ["UPDATE 1"]);
        }
    }
}

/// A named portal closed and bound again in one batch inside a transaction runs the new
/// Bind: the Close comes first and cannot fail, so the old portal is gone (before, the
/// Execute was refused as if Postgres might have kept it). As straight to Postgres.
#[tokio::test]
async fn a_portal_closed_and_bound_again_in_one_batch_runs() {
    let f = fixture(false).await;
    for port in [f.proxy.port(), f.cluster.port()] {
        reset_row(&f).await;
        let mut s = f.raw(port, "3", &[]).await;
        s.simple("BEGIN").await;
        let first = [parse("w", UPDATE_U), bind("p", "w", &["a"]), execute("p"), sync()];
        assert_eq!(batch(&mut s, &first).await, ["UPDATE 1"]);
        let close_portal = message(b'C', b"Pp\0");
        let again = [close_portal, bind("p", "w", &["b"]), execute("p"), sync()];
        assert_eq!(batch(&mut s, &again).await, ["UPDATE 1"], "{port}");
        s.simple("COMMIT").await;
        assert_eq!(f.note().await.0, "b");
    }
}

/// A cursor over `UPDATE … RETURNING` read a row at a time (pgjdbc with a fetch size) while
/// another query reuses the unnamed statement it was bound from: the portal still hands out
/// the rows its write made, for the epoch it was bound with, as straight to Postgres (before,
/// its next fetch was refused).
#[tokio::test]
async fn a_cursor_over_a_rewrite_outlives_its_unnamed_statement() {
    let f = fixture(false).await;
    f.admin
        .batch_execute("INSERT INTO sweep_state VALUES (2, 'two', 1), (3, 'three', 1)")
        .await
        .unwrap();
    let one_row = message(b'E', b"c\0\0\0\0\x01");
    let write = "UPDATE sweep_state SET note = 'x' WHERE id IN (1, 2, 3) RETURNING id";
    for port in [f.proxy.port(), f.cluster.port()] {
        let mut s = f.raw(port, "3", &[]).await;
        s.simple("BEGIN").await;
        let first = [parse("", write), bind("c", "", &[]), one_row.clone(), sync()];
        s.send(&first.concat()).await;
        assert_eq!(tags(&s.read_until(|m| m.tag == b'Z').await), "12DsZ", "{port}");
        let other = [parse("", "SELECT 42"), bind("", "", &[]), execute(""), sync()];
        assert_eq!(batch(&mut s, &other).await, ["SELECT 1"]);
        s.send(&[one_row.clone(), sync()].concat()).await;
        assert_eq!(tags(&s.read_until(|m| m.tag == b'Z').await), "DsZ", "{port}");
        s.simple("ROLLBACK").await;
    }
}

/// A portal bound to a rewrite-mode write by a session without an epoch, run by a prepared
/// `FETCH` that SQL `EXECUTE` runs: pgfence follows the `EXECUTE` to the portal and refuses,
/// as it refuses `FETCH` of that portal run directly. Before, the write ran as the client
/// sent it, without the epoch check. Straight to Postgres (the control) it lands.
#[tokio::test]
async fn a_prepared_fetch_of_an_unrewritten_portal_is_refused() {
    let f = fixture(false).await;
    let write = "UPDATE sweep_state SET note = 'x' WHERE id = 1 RETURNING id";
    for port in [f.proxy.port(), f.cluster.port()] {
        f.admin
            .batch_execute("UPDATE sweep_state SET note = 'init' WHERE id = 1")
            .await
            .unwrap();
        let (mut s, started) = Raw::startup(port, &[("user", "postgres"), ("database", &f.db)]).await;
        assert_eq!(started.last().map(|m| m.tag), Some(b'Z'));
        s.send(&[parse("e", "FETCH ALL pp"), sync()].concat()).await;
        assert_eq!(tags(&s.read_until(|m| m.tag == b'Z').await), "1Z");
        s.simple("BEGIN").await;
        s.send(&[parse("", write), bind("pp", "", &[]), sync()].concat()).await;
        assert_eq!(tags(&s.read_until(|m| m.tag == b'Z').await), "12Z", "{port}");
        let got = codes(&s.simple("EXECUTE e").await);
        s.simple("COMMIT").await;
        let note = f.note().await.0;
        if port == f.proxy.port() {
            assert!(got == ["PF002"] || got == ["PF004"], "{got:?}");
            assert_eq!(note, "init", "the unchecked write committed");
        } else {
            assert_eq!((got.len(), note.as_str()), (0, "x"), "straight to Postgres");
        }
    }
}
