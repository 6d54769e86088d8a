//! Every way to declare an epoch × {stale, current, none, invalid}.

use super::{Fixture, NO_LEASE, code, fence_toml};
use crate::common::pg::{Cluster, try_connect};
use crate::common::raw::{Raw, codes};

const WRITE: &str = "UPDATE sweep_state SET note = 'w' WHERE id = 1";

#[tokio::test]
async fn options_declaration_matrix() {
    let f = Fixture::at_epoch_two().await;
    for (epoch, expect) in [(Some("1"), "PF001"), (Some("2"), "ok"), (None, "PF002")] {
        let opts = epoch.map(|e| format!("-c pgfence.epoch={e}")).unwrap_or_default();
        let s = f.session(&opts).await;
        assert_eq!(code(&s.execute(WRITE, &[]).await), expect, "options {opts:?} extended");
        assert_eq!(code(&s.batch_execute(WRITE).await), expect, "options {opts:?} simple");
    }
    let r = try_connect(f.proxy.port(), &f.db, "-c pgfence.epoch=abc").await;
    assert_eq!(code(&r), "PF003", "an invalid startup value fails the connection");
}

#[tokio::test]
async fn startup_parameter_declaration_matrix() {
    let f = Fixture::at_epoch_two().await;
    for (epoch, expect) in [
        (Some("1"), "PF001"),
        (Some("2"), ""),
        (None, "PF002"),
        (Some("+02"), ""),
    ] {
        let mut params = vec![("user", "postgres"), ("database", f.db.as_str())];
        if let Some(e) = epoch {
            params.push(("pgfence.epoch", e));
        }
        let (mut raw, msgs) = Raw::startup(f.proxy.port(), &params).await;
        assert_eq!(msgs.last().map(|m| m.tag), Some(b'Z'), "{epoch:?}: {msgs:?}");
        let got = codes(&raw.simple(WRITE).await).join(",");
        assert_eq!(got, expect, "startup pgfence.epoch={epoch:?}");
    }
    for bad in ["0", "", "-1", "9223372036854775808", "x"] {
        let params = [
            ("user", "postgres"),
            ("database", f.db.as_str()),
            ("pgfence.epoch", bad),
        ];
        let (_, msgs) = Raw::startup(f.proxy.port(), &params).await;
        assert_eq!(codes(&msgs), ["PF003"], "startup pgfence.epoch={bad:?}");
        // AuthenticationOk, then the FATAL in place of the rest of the login.
        assert_eq!(msgs.iter().map(|m| m.tag).collect::<Vec<_>>(), b"RE", "{bad:?}");
        let fatal = msgs.last().unwrap();
        assert_eq!(fatal.field(b'S').as_deref(), Some("FATAL"));
        assert_eq!(fatal.field(b'V').as_deref(), Some("FATAL"));
        let message = fatal.field(b'M').unwrap();
        assert!(message.ends_with(" (current epoch 2)"), "{message}");
        assert!(
            fatal.field(b'H').is_some_and(|h| h.contains("pgfence.epoch")),
            "{bad:?}"
        );
        // Nothing of how Postgres raised it for pgfence.
        assert_eq!(fatal.field(b'W'), None, "{bad:?}");
    }
    // The raw parameter wins over options, as Postgres applies it last.
    let params = [
        ("user", "postgres"),
        ("database", f.db.as_str()),
        ("options", "-c pgfence.epoch=1"),
        ("pgfence.epoch", "2"),
    ];
    let (mut raw, _) = Raw::startup(f.proxy.port(), &params).await;
    assert!(codes(&raw.simple(WRITE).await).is_empty());
}

#[tokio::test]
async fn set_declaration_matrix() {
    let f = Fixture::at_epoch_two().await;
    for set in [
        "SET pgfence.epoch = {}",
        "SET SESSION pgfence.epoch TO {}",
        "set PGFENCE.EPOCH to '{}'",
        // Postgres joins a quoted name's parts and matches them without regard to case.
        "SET \"pgfence.epoch\" = {}",
        "SET \"PGFENCE\".\"Epoch\" TO {}",
    ] {
        for (epoch, expect) in [("1", "PF001"), ("2", "ok"), ("05", "PF003"), ("+2", "ok")] {
            let s = f.session("").await;
            let stmt = set.replace("{}", epoch);
            s.batch_execute(&stmt).await.unwrap();
            assert_eq!(code(&s.execute(WRITE, &[]).await), expect, "{stmt}");
        }
        for bad in ["''", "0", "-3", "'abc'", "1.5", "9223372036854775808"] {
            let s = f.session("-c pgfence.epoch=2").await;
            let stmt = set.replace("'{}'", "{}").replace("{}", bad);
            assert_eq!(code(&s.batch_execute(&stmt).await), "PF003", "{stmt}");
            assert_eq!(code(&s.execute(&stmt, &[]).await), "PF003", "{stmt} (extended)");
            // The session keeps its previous epoch.
            assert_eq!(code(&s.execute(WRITE, &[]).await), "ok", "after {stmt}");
            let shown: String = s.query_one("SHOW pgfence.epoch", &[]).await.unwrap().get(0);
            assert_eq!(shown, "2");
        }
    }
    let s = f.session("").await;
    assert_eq!(code(&s.execute(WRITE, &[]).await), "PF002");
}

/// A literal continued over a newline is one value to Postgres (`'1'` newline `'2'` is
/// `12`); pgfence declares what `SHOW` then reports, in both protocols.
#[tokio::test]
async fn continued_literal_declares_what_postgres_sets() {
    let f = Fixture::at_epoch_two().await;
    for (set, shown, expect) in [
        ("SET pgfence.epoch = ''\n'1'", "1", "PF001"),
        ("SET pgfence.epoch = '' -- one\n'2'", "2", "ok"),
        // 12, not 1 or 2: above the lease's epoch.
        ("SET pgfence.epoch = '1'\n'2'", "12", "PF003"),
    ] {
        for extended in [false, true] {
            let s = f.session("").await;
            if extended {
                s.execute(set, &[]).await.unwrap();
            } else {
                s.batch_execute(set).await.unwrap();
            }
            assert_eq!(shown_epoch(&s).await, shown, "{set}");
            assert_eq!(
                code(&s.execute(WRITE, &[]).await),
                expect,
                "{set} (extended: {extended})"
            );
        }
    }
}

#[tokio::test]
async fn set_local_lasts_until_the_transaction_ends() {
    let f = Fixture::at_epoch_two().await;
    let s = f.session("").await;
    s.batch_execute("BEGIN; SET LOCAL pgfence.epoch = 2").await.unwrap();
    s.execute(WRITE, &[]).await.unwrap();
    s.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        code(&s.execute(WRITE, &[]).await),
        "PF002",
        "SET LOCAL is gone after COMMIT"
    );
    s.batch_execute("BEGIN; SET LOCAL pgfence.epoch = 1").await.unwrap();
    assert_eq!(code(&s.execute(WRITE, &[]).await), "PF001");
    s.batch_execute("ROLLBACK").await.unwrap();
    // SET LOCAL over a session epoch, in one simple Query.
    s.batch_execute("SET pgfence.epoch = 2").await.unwrap();
    let r = s
        .batch_execute("BEGIN; SET LOCAL pgfence.epoch = 1; UPDATE sweep_state SET note = 'x' WHERE id = 1; COMMIT")
        .await;
    assert_eq!(code(&r), "PF001");
    s.batch_execute("ROLLBACK").await.unwrap();
    s.execute(WRITE, &[]).await.unwrap();
}

/// `SET … FROM CURRENT` sets the value in force, in the scope it names, as in Postgres: a
/// session SET of a `SET LOCAL` value keeps it after COMMIT.
#[tokio::test]
async fn set_from_current_keeps_the_value_in_force() {
    let f = Fixture::at_epoch_two().await;
    let s = f.session("-c pgfence.epoch=1").await;
    s.batch_execute("SET pgfence.epoch FROM CURRENT").await.unwrap();
    assert_eq!(shown_epoch(&s).await, "1");
    assert_eq!(code(&s.execute(WRITE, &[]).await), "PF001");
    s.batch_execute("BEGIN; SET LOCAL pgfence.epoch = 2; SET pgfence.epoch FROM CURRENT; COMMIT")
        .await
        .unwrap();
    assert_eq!(shown_epoch(&s).await, "2", "the LOCAL value became the session's");
    s.execute(WRITE, &[]).await.unwrap();
    // SET LOCAL … FROM CURRENT ends with its transaction.
    s.batch_execute("BEGIN; SET pgfence.epoch = 1; SET LOCAL pgfence.epoch FROM CURRENT; ROLLBACK")
        .await
        .unwrap();
    assert_eq!(shown_epoch(&s).await, "2");
    s.execute(WRITE, &[]).await.unwrap();
    // Nothing declared: Postgres knows no such setting, and says so.
    let none = f.session("").await;
    assert_eq!(
        code(&none.batch_execute("SET pgfence.epoch FROM CURRENT").await),
        "42704"
    );
    assert_eq!(code(&none.execute(WRITE, &[]).await), "PF002");
}

#[tokio::test]
async fn session_set_in_a_rolled_back_transaction_is_undone() {
    let f = Fixture::at_epoch_two().await;
    let s = f.session("-c pgfence.epoch=1").await;
    s.batch_execute("BEGIN; SET pgfence.epoch = 2; ROLLBACK").await.unwrap();
    assert_eq!(code(&s.execute(WRITE, &[]).await), "PF001");
    let shown: String = s.query_one("SHOW pgfence.epoch", &[]).await.unwrap().get(0);
    assert_eq!(shown, "1");
    s.batch_execute("BEGIN; SET pgfence.epoch = 2; COMMIT").await.unwrap();
    s.execute(WRITE, &[]).await.unwrap();
    // An implicit transaction that fails undoes its SET too.
    let s = f.session("-c pgfence.epoch=1").await;
    assert!(s.batch_execute("SET pgfence.epoch = 2; SELECT 1/0").await.is_err());
    assert_eq!(code(&s.execute(WRITE, &[]).await), "PF001");
}

#[tokio::test]
async fn reset_returns_to_the_connection_value() {
    let f = Fixture::at_epoch_two().await;
    let s = f.session("-c pgfence.epoch=2").await;
    s.batch_execute("SET pgfence.epoch = 1").await.unwrap();
    assert_eq!(code(&s.execute(WRITE, &[]).await), "PF001");
    s.batch_execute("RESET pgfence.epoch").await.unwrap();
    s.execute(WRITE, &[]).await.unwrap();
    s.batch_execute("SET pgfence.epoch = 1").await.unwrap();
    s.batch_execute("SET pgfence.epoch = DEFAULT").await.unwrap();
    s.execute(WRITE, &[]).await.unwrap();
    s.batch_execute("SET pgfence.epoch = 1; RESET ALL").await.unwrap();
    s.execute(WRITE, &[]).await.unwrap();
    let shown: String = s.query_one("SHOW pgfence.epoch", &[]).await.unwrap().get(0);
    assert_eq!(shown, "2");
    let s = f.session("").await;
    s.batch_execute("SET pgfence.epoch = 2").await.unwrap();
    s.batch_execute("RESET pgfence.epoch").await.unwrap();
    assert_eq!(code(&s.execute(WRITE, &[]).await), "PF002");
}

#[tokio::test]
async fn show_agrees_with_the_declaration() {
    let f = Fixture::at_epoch_two().await;
    let s = f.session("-c pgfence.epoch=2").await;
    let shown: String = s.query_one("SHOW pgfence.epoch", &[]).await.unwrap().get(0);
    assert_eq!(shown, "2");
    s.execute("SET pgfence.epoch = 1", &[]).await.unwrap();
    let shown: String = s
        .query_one("SELECT current_setting('pgfence.epoch')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(shown, "1");
    assert_eq!(code(&s.execute(WRITE, &[]).await), "PF001");
}

/// The usual fence "sweeper" and a second one, "other", on table `audit`.
fn two_fences() -> String {
    format!("{}[[fence]]\nname = \"other\"\ntables = [\"audit\"]\n", fence_toml())
}

#[tokio::test]
async fn several_fences_need_pgfence_fence() {
    let cluster = Cluster::shared();
    let f = Fixture::with(cluster, &two_fences()).await;
    let e = f.takeover("a").await;
    let s = f.leader(e).await;
    // With no fence named, the message says to name one, whether or not an epoch is there.
    for s in [s, f.session("").await] {
        let r = s.execute(WRITE, &[]).await;
        assert_eq!(code(&r), "PF002");
        let e = r.unwrap_err();
        let e = e.as_db_error().unwrap();
        assert!(e.message().contains("pgfence.fence"), "{e:?}");
        assert!(e.hint().unwrap_or_default().contains("SET pgfence.fence"), "{e:?}");
    }
    let s = f
        .session(&format!("-c pgfence.epoch={e} -c pgfence.fence=sweeper"))
        .await;
    s.execute(WRITE, &[]).await.unwrap();
    // A write to another fence's table is PF002 for that fence.
    let r = s.execute("INSERT INTO audit (note) VALUES ('x')", &[]).await;
    assert_eq!(code(&r), "PF002");
    assert!(r.unwrap_err().as_db_error().unwrap().message().contains("\"other\""));
    let s2 = f.session("").await;
    s2.batch_execute(&format!("SET pgfence.fence = 'other'; SET pgfence.epoch = {e}"))
        .await
        .unwrap();
    s2.execute("INSERT INTO audit (note) VALUES ('x')", &[]).await.unwrap();
}

/// `ROLLBACK TO SAVEPOINT` undoes the declarations made after the savepoint, as Postgres
/// undoes the settings: pgfence, `SHOW` and the write's outcome agree, in both protocols.
#[tokio::test]
async fn rollback_to_savepoint_undoes_later_declarations() {
    let f = Fixture::at_epoch_two().await;
    let s = f.session("-c pgfence.epoch=2").await;
    // Simple protocol: a stale epoch set after the savepoint is rolled back with it.
    s.batch_execute("BEGIN; SAVEPOINT a; SET pgfence.epoch = 1; ROLLBACK TO SAVEPOINT a")
        .await
        .unwrap();
    assert_eq!(shown_epoch(&s).await, "2");
    s.batch_execute(WRITE).await.unwrap();
    // SET LOCAL too, and nested savepoints restore their own level.
    s.batch_execute("SAVEPOINT \"Outer\"; SET LOCAL pgfence.epoch = 1; SAVEPOINT nested; SET pgfence.epoch = 2")
        .await
        .unwrap();
    s.batch_execute(WRITE).await.unwrap();
    s.batch_execute("ROLLBACK TO nested").await.unwrap();
    assert_eq!(shown_epoch(&s).await, "1");
    assert_eq!(code(&s.batch_execute(WRITE).await), "PF001");
    s.batch_execute("ROLLBACK TO \"Outer\"").await.unwrap();
    assert_eq!(shown_epoch(&s).await, "2");
    s.execute(WRITE, &[]).await.unwrap();
    s.batch_execute("COMMIT").await.unwrap();
    assert_eq!(f.note().await.0, "w");
    // Extended protocol, and RELEASE keeps what was set.
    s.execute("BEGIN", &[]).await.unwrap();
    s.execute("SAVEPOINT b", &[]).await.unwrap();
    s.execute("SET pgfence.epoch = 1", &[]).await.unwrap();
    s.execute("ROLLBACK TO b", &[]).await.unwrap();
    s.execute(WRITE, &[]).await.unwrap();
    s.execute("SET pgfence.epoch = 1", &[]).await.unwrap();
    s.execute("RELEASE b", &[]).await.unwrap();
    assert_eq!(shown_epoch(&s).await, "1");
    assert_eq!(code(&s.execute(WRITE, &[]).await), "PF001");
    s.batch_execute("ROLLBACK").await.unwrap();
    // After the ROLLBACK, the epoch is the committed one again.
    assert_eq!(shown_epoch(&s).await, "2");
    s.execute(WRITE, &[]).await.unwrap();
    // A savepoint named in U&"…" form is the same savepoint as its decoded name.
    s.batch_execute("BEGIN; SAVEPOINT U&\"\\0075\"; SET pgfence.epoch = 1; ROLLBACK TO u")
        .await
        .unwrap();
    assert_eq!(shown_epoch(&s).await, "2");
    s.batch_execute(WRITE).await.unwrap();
    s.batch_execute("COMMIT").await.unwrap();
}

async fn shown_epoch(s: &tokio_postgres::Client) -> String {
    s.query_one("SHOW pgfence.epoch", &[]).await.unwrap().get(0)
}

/// A startup parameter given twice: Postgres keeps the last value of each, for the
/// database, the user and `options` alike, and so does pgfence. Reading the first
/// `database` chose the fences of a database without any and let a stale write through;
/// reading the first `options` enforced an epoch other than the one Postgres shows.
#[tokio::test]
async fn a_repeated_startup_parameter_counts_as_postgres_counts_it() {
    let f = Fixture::at_epoch_two().await;
    let stale_in = |port| {
        let db = f.db.clone();
        async move {
            let params = [
                ("user", "postgres"),
                ("database", "postgres"),
                ("database", db.as_str()),
                ("pgfence.epoch", "1"),
            ];
            let (mut s, started) = Raw::startup(port, &params).await;
            assert_eq!(started.last().map(|m| m.tag), Some(b'Z'), "{started:?}");
            let db_now = s.simple("SELECT current_database()").await;
            assert!(db_now.iter().any(|m| m.tag == b'D' && m.body.ends_with(db.as_bytes())));
            codes(&s.simple(WRITE).await)
        }
    };
    assert_eq!(stale_in(f.proxy.port()).await, ["PF001"]);
    assert_eq!(f.note().await.0, "init");
    // `options` twice: the last declares epoch 2, the current one, which SHOW reports.
    let params = [
        ("user", "postgres"),
        ("database", f.db.as_str()),
        ("options", "-c pgfence.epoch=3"),
        ("options", "-c pgfence.epoch=2"),
    ];
    let (mut s, started) = Raw::startup(f.proxy.port(), &params).await;
    assert_eq!(started.last().map(|m| m.tag), Some(b'Z'), "{started:?}");
    let shown = s.simple("SHOW pgfence.epoch").await;
    assert!(
        shown.iter().any(|m| m.tag == b'D' && m.body.ends_with(b"2")),
        "{shown:?}"
    );
    assert!(codes(&s.simple(WRITE).await).is_empty());
    assert_eq!(f.note().await.0, "w");
    // `options` read as Postgres' getopt reads them: `-C` takes the next word as its value,
    // so epoch 9 is never declared and the session is at the stale epoch 1.
    f.admin
        .execute("UPDATE sweep_state SET note = 'init' WHERE id = 1", &[])
        .await
        .unwrap();
    let params = [
        ("user", "postgres"),
        ("database", f.db.as_str()),
        ("options", "-c pgfence.epoch=1 -C --pgfence.epoch=9"),
    ];
    let (mut s, started) = Raw::startup(f.proxy.port(), &params).await;
    assert_eq!(started.last().map(|m| m.tag), Some(b'Z'), "{started:?}");
    let shown = s.simple("SHOW pgfence.epoch").await;
    assert!(
        shown.iter().any(|m| m.tag == b'D' && m.body.ends_with(b"1")),
        "{shown:?}"
    );
    assert_eq!(codes(&s.simple(WRITE).await), ["PF001"]);
    assert_eq!(f.note().await.0, "init");
    // Control: straight to Postgres the stale write lands.
    f.admin
        .execute("UPDATE sweep_state SET note = 'init' WHERE id = 1", &[])
        .await
        .unwrap();
    assert!(stale_in(f.cluster.port()).await.is_empty());
    assert_eq!(f.note().await.0, "w");
}

/// Postgres cuts a startup packet's database name to 63 bytes; a fence restricted to a
/// database of 63 bytes applies to a session that named it with more.
#[tokio::test]
async fn a_database_name_is_cut_to_63_bytes_as_postgres_cuts_it() {
    use super::{SEED_SQL, install};
    use crate::common::inproc::Proxy;
    let cluster = Cluster::shared();
    let name = format!("{:x<63}", "it_long_name_");
    let postgres = cluster.admin("postgres").await;
    for sql in [
        format!("DROP DATABASE IF EXISTS \"{name}\""),
        format!("CREATE DATABASE \"{name}\""),
    ] {
        postgres.batch_execute(&sql).await.unwrap();
    }
    let toml = format!("[[fence]]\nname = \"sweeper\"\ndatabase = \"{name}\"\ntables = [\"sweep_state\"]\n");
    let mut admin = cluster.admin(&name).await;
    admin.batch_execute(SEED_SQL).await.unwrap();
    install(&mut admin, cluster.port(), &toml).await;
    let proxy = Proxy::start(cluster.port(), &toml).await;
    let longer = format!("{name}zzz");
    let write_as = |port| {
        let longer = longer.clone();
        async move {
            let (mut s, started) = Raw::startup(port, &[("user", "postgres"), ("database", &longer)]).await;
            assert_eq!(started.last().map(|m| m.tag), Some(b'Z'), "{started:?}");
            codes(&s.simple(WRITE).await)
        }
    };
    assert_eq!(write_as(proxy.port()).await, ["PF002"]);
    let note = "SELECT note FROM sweep_state WHERE id = 1";
    let got: String = admin.query_one(note, &[]).await.unwrap().get(0);
    assert_eq!(got, "init");
    // Control: straight to Postgres the longer name reaches the database and writes.
    assert!(write_as(cluster.port()).await.is_empty());
    let got: String = admin.query_one(note, &[]).await.unwrap().get(0);
    assert_eq!(got, "w");
}

/// A named portal bound again in a block: Postgres refuses the second Bind (42P03) and,
/// after `ROLLBACK TO SAVEPOINT`, runs what the portal held before. When one of the two
/// statements declares an epoch, pgfence cannot tell which runs: the Execute is refused
/// (PF004), so the epoch pgfence enforces stays the one `SHOW pgfence.epoch` gives.
#[tokio::test]
async fn a_portal_that_may_run_either_of_two_declarations_is_refused() {
    use crate::common::raw::{bind, execute, parse, query, sync};
    let f = Fixture::with(Cluster::shared(), NO_LEASE).await;
    f.admin
        .batch_execute("UPDATE pgfence.fence SET hwm = 1000")
        .await
        .unwrap();
    let step = |sql: &str| [parse("", sql), bind("", "", &[]), execute("")].concat();
    let pairs = [
        ("SELECT 1", "SET pgfence.epoch = 50"),
        ("SET pgfence.epoch = 50", "SELECT 1"),
    ];
    for (old, new) in pairs {
        // Control: straight to Postgres the Execute runs the portal from before.
        let mut d = f.raw(f.cluster.port(), "5", &[]).await;
        let mut s = f.raw(f.proxy.port(), "5", &[]).await;
        for s in [&mut d, &mut s] {
            s.simple("BEGIN").await;
            s.send(&[parse("s1", old), bind("p", "s1", &[]), step("SAVEPOINT sp"), sync()].concat())
                .await;
            assert!(codes(&s.read_until(|m| m.tag == b'Z').await).is_empty());
            let refused = [parse("s2", new), bind("p", "s2", &[]), sync()].concat();
            s.send(&[refused, step("ROLLBACK TO sp"), execute("p"), sync()].concat())
                .await;
            assert_eq!(codes(&s.read_until(|m| m.tag == b'Z').await), ["42P03"]);
        }
        assert!(codes(&d.read_until(|m| m.tag == b'Z').await).is_empty());
        assert_eq!(
            codes(&s.read_until(|m| m.tag == b'Z').await),
            ["PF004"],
            "{old} / {new}"
        );
        s.simple("ROLLBACK").await;
        let shown = s.simple("SHOW pgfence.epoch").await;
        let row = shown.iter().find(|m| m.tag == b'D').expect("a row");
        let shown = String::from_utf8_lossy(&row.body[6..]).into_owned();
        s.send(&query("UPDATE sweep_state SET note = 'x' WHERE id = 1")).await;
        let refusal = s.read_until(|m| m.tag == b'Z').await;
        let message = refusal.iter().find_map(|m| m.field(b'M')).unwrap_or_default();
        assert!(
            message.contains(&format!("epoch {shown} is stale")),
            "{shown}: {message}"
        );
    }
}

/// A libpq-style pipeline, each statement in its own batch through the unnamed statement
/// and portal, sent before any answer: a declaration among them does not make the Executes
/// after it ambiguous, as each batch binds the portal it runs. The leader's transaction
/// commits, as straight to Postgres.
#[tokio::test]
async fn a_pipeline_of_batches_with_a_declaration_runs_as_sent() {
    use crate::common::raw::{bind, execute, parse, sync};
    let f = Fixture::at_epoch_two().await;
    let batch = |sql: &str| [parse("", sql), bind("", "", &[]), execute(""), sync()].concat();
    for port in [f.proxy.port(), f.cluster.port()] {
        let mut s = f.raw(port, "2", &[]).await;
        let sent = [
            "BEGIN",
            "SET LOCAL pgfence.epoch = 2",
            "UPDATE sweep_state SET note = 'one' WHERE id = 1",
            "SELECT note FROM sweep_state",
            "UPDATE sweep_state SET note = 'two' WHERE id = 1",
            "COMMIT",
        ];
        s.send(&sent.map(batch).concat()).await;
        for sql in sent {
            let got = codes(&s.read_until(|m| m.tag == b'Z').await);
            assert!(got.is_empty(), "{port}: {sql}: {got:?}");
        }
        assert_eq!(f.note().await.0, "two");
        f.put_back().await;
    }
}

/// The message of a refusal, from either protocol.
fn refusal<T>(r: Result<T, tokio_postgres::Error>) -> String {
    let e = r.err().expect("a refusal");
    e.as_db_error().expect("an error from Postgres").message().to_owned()
}

/// Every refusal names its fence, the declared epoch when there is one, and the fence's
/// current epoch, which only Postgres knows: in both protocols, as the contract's
/// example spells them.
#[tokio::test]
async fn refusals_name_the_fence_and_its_current_epoch() {
    let f = Fixture::at_epoch_two().await;
    let none = f.session("").await;
    let no_epoch = "pgfence: write to fence \"sweeper\" without an epoch (current epoch 2)";
    assert_eq!(refusal(none.execute(WRITE, &[]).await), no_epoch, "extended");
    assert_eq!(refusal(none.batch_execute(WRITE).await), no_epoch, "simple");
    let s = f.session("-c pgfence.epoch=2").await;
    let unanalysable = "pgfence: statement cannot be analysed and may write a table of fence \"sweeper\"; \
                        refused at epoch 2 (current epoch 2)";
    let call = "DO $$ BEGIN UPDATE sweep_state SET note = 'd' WHERE id = 1; END $$";
    assert_eq!(refusal(s.batch_execute(call).await), unanalysable, "simple");
    assert_eq!(refusal(s.execute(call, &[]).await), unanalysable, "extended");
    // A SET names the session's fence, the value it refused and the current epoch.
    let invalid = "pgfence: invalid value for pgfence.epoch of fence \"sweeper\": invalid epoch \"0\": out of range; \
                   an epoch is an integer from 1 to 9223372036854775807 (current epoch 2)";
    let r = s.batch_execute("SET pgfence.epoch = 0").await;
    assert_eq!(code(&r), "PF003");
    assert_eq!(refusal(r), invalid, "simple");
    let r = s.execute("SET pgfence.epoch = 0", &[]).await;
    assert_eq!(code(&r), "PF003");
    assert_eq!(refusal(r), invalid, "extended");
    let r = s.batch_execute("BEGIN; SET LOCAL pgfence.epoch = 'x'").await;
    assert!(
        refusal(r).ends_with("not an integer; an epoch is an integer from 1 to 9223372036854775807 (current epoch 2)")
    );
    s.batch_execute("ROLLBACK").await.unwrap();
    // So does a startup declaration's FATAL: the session is logged in when it is refused.
    let r = try_connect(f.proxy.port(), &f.db, "-c pgfence.epoch=0").await;
    assert_eq!(code(&r), "PF003");
    assert_eq!(refusal(r), invalid, "startup");
    // A takeover moves the number the next refusal gives.
    f.takeover("b").await;
    let three = "pgfence: write to fence \"sweeper\" without an epoch (current epoch 3)";
    assert_eq!(refusal(none.execute(WRITE, &[]).await), three);
}

/// With several fences, each fence named gets its own current epoch; a fence no epoch has
/// written yet is at 0.
#[tokio::test]
async fn refusals_of_several_fences_give_each_current_epoch() {
    let cluster = Cluster::shared();
    let f = Fixture::with(cluster, &two_fences()).await;
    let e = f.takeover("a").await;
    let s = f
        .session(&format!("-c pgfence.epoch={e} -c pgfence.fence=sweeper"))
        .await;
    s.execute(WRITE, &[]).await.unwrap();
    let r = s.execute("INSERT INTO audit (note) VALUES ('x')", &[]).await;
    assert_eq!(
        refusal(r),
        format!(
            "pgfence: write to fence \"other\" without an epoch for it: the session's epoch {e} is for fence \
             \"sweeper\" (current epoch 0)"
        )
    );
    let call = "DO $$ BEGIN UPDATE sweep_state SET note = 'd'; INSERT INTO audit (note) VALUES ('y'); END $$";
    assert_eq!(
        refusal(s.batch_execute(call).await),
        format!(
            "pgfence: statement cannot be analysed and may write a table of fence \"sweeper\", \"other\"; \
             refused at epoch {e} (current epochs: \"sweeper\" {e}, \"other\" 0)"
        )
    );
}

/// `SET pgfence.epoch = $1` is a syntax error in Postgres, which takes no parameters in
/// SET: the client gets that error (42601), not pgfence's PF003, and keeps its epoch.
#[tokio::test]
async fn a_set_with_a_parameter_is_postgres_syntax_error() {
    let f = Fixture::at_epoch_two().await;
    for port in [f.proxy.port(), f.cluster.port()] {
        let s = crate::common::pg::connect(port, &f.db, "-c pgfence.epoch=2").await;
        assert_eq!(code(&s.execute("SET pgfence.epoch = $1", &[&"1"]).await), "42601");
        assert_eq!(code(&s.batch_execute("SET pgfence.epoch = $1").await), "42601");
        let shown: String = s.query_one("SHOW pgfence.epoch", &[]).await.unwrap().get(0);
        assert_eq!(shown, "2");
    }
    let s = f.session("-c pgfence.epoch=2").await;
    assert!(s.execute("SET pgfence.epoch = $1", &[&"1"]).await.is_err());
    s.execute(WRITE, &[]).await.unwrap();
}

/// A session `SET` or `RESET` outside a transaction block is kept when its implicit
/// transaction ends (its Query, or its batch's Sync), so a `ROLLBACK` pipelined after it,
/// with no transaction or a later one to end, leaves it in force. The writes pipelined
/// behind them run at the epoch Postgres shows; directly, with nothing to refuse them,
/// the same pipelines write (the control).
#[tokio::test]
async fn a_declaration_kept_by_its_implicit_transaction_outlives_a_pipelined_rollback() {
    use crate::common::raw::{bind, execute, parse, query, sync};
    let f = Fixture::at_epoch_two().await;
    let simple = |sqls: &[&str]| sqls.iter().map(|s| query(s)).collect::<Vec<_>>().concat();
    let extended = |sqls: &[&str]| {
        sqls.iter()
            .map(|s| [parse("", s), bind("", "", &[]), execute(""), sync()].concat())
            .collect::<Vec<_>>()
            .concat()
    };
    /// A session declaring `startup` at connection time (and `first`, answered), then
    /// sending `pipeline` at once; what pgfence refuses its write with.
    struct Case {
        startup: Option<&'static str>,
        first: Option<&'static str>,
        pipeline: Vec<u8>,
        refusal: Option<&'static str>,
    }
    let case = |startup, first, pipeline, refusal| Case {
        startup,
        first,
        pipeline,
        refusal,
    };
    let set2 = Some("SET pgfence.epoch = 2");
    let cases = [
        case(
            Some("2"),
            None,
            simple(&["SET pgfence.epoch = 1", "ROLLBACK", WRITE]),
            Some("PF001"),
        ),
        case(
            Some("2"),
            None,
            simple(&["SET pgfence.epoch = 1", "ABORT; SELECT 1", WRITE]),
            Some("PF001"),
        ),
        case(
            Some("2"),
            None,
            extended(&["SET pgfence.epoch = 1", "ROLLBACK", WRITE]),
            Some("PF001"),
        ),
        case(
            None,
            set2,
            simple(&["RESET pgfence.epoch", "BEGIN", "ROLLBACK", WRITE]),
            Some("PF002"),
        ),
        case(None, set2, simple(&["DISCARD ALL", "ROLLBACK", WRITE]), Some("PF002")),
        // Undone: the SET was inside the block the ROLLBACK ends; a SET LOCAL ends with its Query.
        case(
            Some("2"),
            None,
            simple(&["BEGIN", "SET pgfence.epoch = 1", "ROLLBACK", WRITE]),
            None,
        ),
        case(
            Some("2"),
            None,
            simple(&["SET LOCAL pgfence.epoch = 1; SELECT 1", WRITE]),
            None,
        ),
    ];
    for (i, c) in cases.into_iter().enumerate() {
        for port in [f.proxy.port(), f.cluster.port()] {
            f.put_back().await;
            let mut params = vec![("user", "postgres"), ("database", f.db.as_str())];
            params.extend(c.startup.map(|e| ("pgfence.epoch", e)));
            let (mut s, _) = Raw::startup(port, &params).await;
            if let Some(sql) = c.first {
                assert_eq!(codes(&s.simple(sql).await), Vec::<String>::new());
            }
            s.send(&c.pipeline).await;
            let mut got = Vec::new();
            // One ReadyForQuery per Query or Sync; the write is the last of them.
            for _ in 0..count_ends(&c.pipeline) {
                got = codes(&s.read_until(|m| m.tag == b'Z').await);
            }
            let proxied = port == f.proxy.port();
            let expected: Vec<String> = c.refusal.filter(|_| proxied).map(str::to_owned).into_iter().collect();
            assert_eq!(got, expected, "case {i}, port {port}");
            let written = f.note().await.0 == "w";
            assert_eq!(written, expected.is_empty(), "case {i}, port {port}");
        }
    }
}

/// The Queries and Syncs in a stretch of client messages: one ReadyForQuery each.
fn count_ends(mut bytes: &[u8]) -> usize {
    let mut n = 0;
    while bytes.len() >= 5 {
        let len = u32::from_be_bytes(bytes[1..5].try_into().unwrap()) as usize;
        n += usize::from(matches!(bytes[0], b'Q' | b'S'));
        bytes = &bytes[1 + len..];
    }
    n
}

/// A `SET` or `RESET` of a pgfence setting that Postgres cannot parse is Postgres' own
/// syntax error, and nothing in its text runs, as directly (a COMMIT before it commits
/// nothing); in the extended protocol its Parse fails. Every key word Postgres lists
/// reads as a value, or not, as Postgres reads it.
#[tokio::test]
async fn a_declaration_postgres_cannot_parse_is_its_syntax_error() {
    use crate::common::raw::{describe_statement, parse, sync};
    let f = Fixture::at_epoch_two().await;
    let unparsable = [
        "SET pgfence.epoch = 7 8",
        "SET pgfence.epoch =",
        "SET LOCAL pgfence.epoch",
        "RESET pgfence.epoch junk",
        "SET pgfence.fence = 'a' 'b'",
        "SET pgfence.epoch = b'1'",
        "SET pgfence.fence = user",
        "SET pgfence.epoch FROM CURRENT 1",
        // Expressions, casts and stray signs: no value to Postgres' grammar.
        "SET pgfence.epoch = 4::bigint",
        "SET LOCAL pgfence.epoch = (4)",
        "SET SESSION pgfence.epoch = 4 + 0",
        "SET pgfence.epoch = 4+0",
        "SET pgfence.epoch = - - 4",
        "SET pgfence.epoch = +'4'",
        "SET pgfence.epoch TO DEFAULT 4",
        "SET pgfence.epoch = cast(4 as bigint)",
        "SET pgfence.epoch = 1e-5-1",
    ];
    for port in [f.proxy.port(), f.cluster.port()] {
        let mut s = f.raw(port, "2", &[]).await;
        for bad in unparsable {
            let text = format!("INSERT INTO audit (note) VALUES ('x'); COMMIT; {bad}; {WRITE}");
            assert_eq!(codes(&s.simple(&text).await), ["42601"], "{port}: {bad}");
            s.send(&[parse("s", bad), describe_statement("s"), sync()].concat())
                .await;
            assert_eq!(
                codes(&s.read_until(|m| m.tag == b'Z').await),
                ["42601"],
                "{port}: {bad}"
            );
        }
        assert_eq!(f.audit_rows().await, 0, "{port}");
        assert_eq!(f.note().await.0, "init", "{port}");
        assert_eq!(shown_epoch_raw(&mut s).await, "2", "{port}");
    }
    let keywords: Vec<(String, String)> = f
        .admin
        .query("SELECT word, catcode::text FROM pg_get_keywords()", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    // pgfence's table of the restricted ones is the server's.
    for (word, catcode) in &keywords {
        use pgfence::sql::keywords::{Category, category};
        let expected = match catcode.as_str() {
            "R" => Some(Category::Reserved),
            "T" => Some(Category::TypeFunction),
            _ => None,
        };
        assert_eq!(category(word), expected, "{word}");
    }
    let words: Vec<&String> = keywords.iter().map(|(w, _)| w).collect();
    let mut through = f.raw(f.proxy.port(), "2", &[]).await;
    let mut direct = f.raw(f.cluster.port(), "2", &[]).await;
    for word in &words {
        let sql = format!("SET pgfence.fence = {word}");
        let got = codes(&through.simple(&sql).await);
        assert_eq!(got, codes(&direct.simple(&sql).await), "{sql}");
    }
}

async fn shown_epoch_raw(s: &mut Raw) -> String {
    let msgs = s.simple("SHOW pgfence.epoch").await;
    let row = msgs.iter().find(|m| m.tag == b'D').expect("a row");
    // DataRow: column count (2), length (4), value.
    String::from_utf8_lossy(&row.body[6..]).into_owned()
}

/// Values spelled with escapes (`E'…'`, `U&'…'` with or without `UESCAPE`, `U&"…"`, and
/// backslashes with standard_conforming_strings off) declare what Postgres reads them
/// as: the write runs at the epoch `SHOW` gives.
#[tokio::test]
async fn escaped_values_declare_what_postgres_reads() {
    let f = Fixture::at_epoch_two().await;
    // (standard_conforming_strings, the SET)
    for (scs, set) in [
        ("on", r"SET pgfence.epoch = E'\x32'"),
        ("on", r"SET pgfence.epoch = e'\062'"),
        ("on", r"SET pgfence.epoch = E'\u0032'"),
        ("on", r"SET pgfence.epoch = U&'\0032'"),
        ("on", r"SET pgfence.epoch = U&'!+000032' UESCAPE '!'"),
        ("on", r#"SET pgfence.epoch = U&"\0032""#),
        ("on", r#"SET U&"pgfence!002eepoch" UESCAPE E'!' = 2"#),
        ("on", r#"SET U&"pgfence!002eepoch" UESCAPE $$!$$ = 2"#),
        ("off", r"SET pgfence.epoch = '\62'"),
    ] {
        let s = f.session("-c pgfence.epoch=1").await;
        s.batch_execute(&format!("SET standard_conforming_strings = {scs}"))
            .await
            .unwrap();
        s.batch_execute(set).await.unwrap();
        assert_eq!(shown_epoch(&s).await, "2", "{set}");
        s.execute(WRITE, &[]).await.unwrap_or_else(|e| panic!("{set}: {e}"));
    }
    // What Postgres sets but pgfence does not read is refused where it stands (PF003), so
    // the two keep agreeing: a number with a signed exponent, a name whose UESCAPE string
    // pgfence does not decode.
    let s = f.session("-c pgfence.epoch=2").await;
    for unread in [
        "SET pgfence.epoch = 1e-5",
        "SET pgfence.epoch = - 2.5E+3",
        "SET U&\"pgfence!002eepoch\" UESCAPE E'\\041' = 1",
    ] {
        assert_eq!(code(&s.batch_execute(unread).await), "PF003", "{unread}");
        assert_eq!(shown_epoch(&s).await, "2", "{unread}");
    }
    s.execute(WRITE, &[]).await.unwrap();
    // And a stale one the same way is refused.
    let s = f.session("-c pgfence.epoch=2").await;
    s.batch_execute(r"SET pgfence.epoch = U&'\0031'").await.unwrap();
    assert_eq!(shown_epoch(&s).await, "1");
    assert_eq!(code(&s.execute(WRITE, &[]).await), "PF001");
}

/// A `COMMIT` of a transaction block Postgres already said failed rolls it back, and with
/// it a `SET` made in it: a write sent with that `COMMIT`, before its answer, runs at the
/// epoch declared before the block (stale here), in both protocols and for each spelling.
/// Directly, nothing refuses it (the control).
#[tokio::test]
async fn a_commit_of_a_failed_block_undoes_its_declarations_for_what_follows() {
    use crate::common::raw::{bind, execute, parse, query, sync};
    let f = Fixture::at_epoch_two().await;
    let ext = |sql: &str| [parse("", sql), bind("", "", &[]), execute("")].concat();
    for commit in ["COMMIT", "END", "COMMIT AND CHAIN"] {
        let pipelines = [
            [query(commit), query(WRITE)].concat(),
            [ext(commit), ext(WRITE), sync()].concat(),
        ];
        for pipeline in pipelines {
            for port in [f.proxy.port(), f.cluster.port()] {
                let mut s = f.raw(port, "1", &[]).await;
                for sql in ["BEGIN", "SET pgfence.epoch = 2"] {
                    assert_eq!(codes(&s.simple(sql).await), Vec::<String>::new());
                }
                assert_eq!(codes(&s.simple("SELECT 1/0").await), ["22012"]);
                s.send(&pipeline).await;
                let mut got = Vec::new();
                for _ in 0..count_ends(&pipeline) {
                    got.extend(codes(&s.read_until(|m| m.tag == b'Z').await));
                }
                let expected: &[&str] = if port == f.proxy.port() { &["PF001"] } else { &[] };
                assert_eq!(got, expected, "{commit}, port {port}");
            }
        }
    }
}

/// `DISCARD ALL` commits the implicit transaction it runs in at once (it cannot run in a
/// block), so its reset outlives a block that a `BEGIN` after it, before the Sync, opens and
/// that then rolls back: the stale startup epoch is back, and the write is refused.
/// Directly it lands (the control).
#[tokio::test]
async fn a_discard_all_is_kept_when_a_block_after_it_rolls_back() {
    use crate::common::raw::{bind, execute, parse, sync};
    let f = Fixture::at_epoch_two().await;
    let ext = |sql: &str| [parse("", sql), bind("", "", &[]), execute("")].concat();
    for port in [f.proxy.port(), f.cluster.port()] {
        let mut s = f.raw(port, "1", &[]).await;
        assert_eq!(codes(&s.simple("SET pgfence.epoch = 2").await), Vec::<String>::new());
        s.send(&[ext("DISCARD ALL"), ext("BEGIN"), sync()].concat()).await;
        assert_eq!(codes(&s.read_until(|m| m.tag == b'Z').await), Vec::<String>::new());
        assert_eq!(codes(&s.simple("SELECT 1/0").await), ["22012"]);
        assert_eq!(codes(&s.simple("ROLLBACK").await), Vec::<String>::new());
        assert_eq!(shown_epoch_raw(&mut s).await, "1");
        let expected: &[&str] = if port == f.proxy.port() { &["PF001"] } else { &[] };
        assert_eq!(codes(&s.simple(WRITE).await), expected, "port {port}");
    }
}

/// Statements Postgres refuses whatever the data, pipelined: `COMMIT AND CHAIN` outside a
/// block (no block follows it), `DISCARD ALL` inside one (nothing is reset), `ROLLBACK TO`
/// a savepoint that does not exist (the block stays failed, its `COMMIT` rolls back). The
/// write behind each runs at the stale epoch Postgres shows and is refused; directly it
/// lands (the control).
#[tokio::test]
async fn statements_postgres_refuses_in_a_pipeline_change_no_declaration() {
    let f = Fixture::at_epoch_two().await;
    // (startup epoch, answered first, then pipelined)
    let cases: [(&str, &[&str], &[&str]); 3] = [
        (
            "2",
            &[],
            &["COMMIT AND CHAIN", "SET pgfence.epoch = 1", "ROLLBACK", WRITE],
        ),
        (
            "2",
            &["SET pgfence.epoch = 1"],
            &["BEGIN", "DISCARD ALL", "ROLLBACK", WRITE],
        ),
        (
            "1",
            &["BEGIN", "SET pgfence.epoch = 2", "SELECT 1/0"],
            &["ROLLBACK TO SAVEPOINT nosuch", "COMMIT", WRITE],
        ),
    ];
    for (startup, first, pipeline) in cases {
        for port in [f.proxy.port(), f.cluster.port()] {
            let mut s = f.raw(port, startup, &[]).await;
            for sql in first {
                s.simple(sql).await;
            }
            let sent: Vec<u8> = pipeline.iter().flat_map(|sql| crate::common::raw::query(sql)).collect();
            s.send(&sent).await;
            let mut last = Vec::new();
            for _ in 0..pipeline.len() {
                last = codes(&s.read_until(|m| m.tag == b'Z').await);
            }
            assert_eq!(shown_epoch_raw(&mut s).await, "1", "{pipeline:?}");
            let expected: &[&str] = if port == f.proxy.port() { &["PF001"] } else { &[] };
            assert_eq!(last, expected, "{pipeline:?}, port {port}");
        }
    }
}

/// pgfence's own refusal of an Execute fails its batch as any error does: a `SET` after it
/// in the batch never runs, so a write pipelined behind is checked with no epoch (PF002),
/// as `SHOW` gives. Counting the `SET` passed the write at the epoch it would have
/// declared; straight to Postgres (the control) the write lands.
#[tokio::test]
async fn a_declaration_after_a_refused_execute_in_its_batch_is_not_counted() {
    use crate::common::raw::{bind, execute, parse, query, sync};
    let f = Fixture::at_epoch_two().await;
    for port in [f.proxy.port(), f.cluster.port()] {
        let params = [("user", "postgres"), ("database", f.db.as_str())];
        let (mut s, _) = Raw::startup(port, &params).await;
        let step = |sql: &str| [parse("", sql), bind("", "", &[]), execute("")].concat();
        let pipeline = [
            step("UPDATE sweep_state SET note = 'first' WHERE id = 1"),
            step("SET pgfence.epoch = 2"),
            sync(),
            query(WRITE),
        ];
        s.send(&pipeline.concat()).await;
        let first = codes(&s.read_until(|m| m.tag == b'Z').await);
        let wrote = codes(&s.read_until(|m| m.tag == b'Z').await);
        if port == f.proxy.port() {
            assert_eq!((first, wrote), (vec!["PF002".to_owned()], vec!["PF002".to_owned()]));
            assert_eq!(f.note().await.0, "init");
        } else {
            assert!(first.is_empty() && wrote.is_empty(), "{first:?} {wrote:?}");
            assert_eq!(f.note().await.0, "w");
            f.put_back().await;
        }
    }
}

/// A savepoint named with a `UESCAPE` escape character given as any string constant
/// (`E'!'`, `$$!$$`) is the savepoint Postgres names: `ROLLBACK TO` it keeps the stale
/// `SET` made before it, and the write after is refused (PF001). One pgfence cannot read
/// (an escape inside `E'…'`) is refused itself (PF004), which fails the block. Read as
/// anything else, the `ROLLBACK TO` looked like a rollback of the whole transaction and the
/// write passed at the epoch before; straight to Postgres (the control) it lands.
#[tokio::test]
async fn a_savepoint_with_an_odd_escape_character_is_followed_or_refused() {
    let f = Fixture::at_epoch_two().await;
    let names = [
        ("U&\"!0061\" UESCAPE E'!'", None),
        ("U&\"!0061\" UESCAPE $x$!$x$", None),
        ("U&\"!0061\" UESCAPE E'\\041'", Some("PF004")),
    ];
    for (name, refused) in names {
        for port in [f.proxy.port(), f.cluster.port()] {
            let through = port == f.proxy.port();
            let s = crate::common::pg::connect(port, &f.db, "-c pgfence.epoch=2").await;
            s.batch_execute("BEGIN; SET pgfence.epoch = 1; SAVEPOINT a")
                .await
                .unwrap();
            let back = s.batch_execute(&format!("ROLLBACK TO {name}")).await;
            let wrote = s.batch_execute(WRITE).await;
            let _ = s.batch_execute("COMMIT").await;
            match (through, refused) {
                (true, Some(c)) => {
                    assert_eq!(code(&back), c, "{name}");
                    assert_eq!(code(&wrote), "25P02", "{name}");
                }
                (true, None) => {
                    back.unwrap();
                    assert_eq!(code(&wrote), "PF001", "{name}");
                }
                (false, _) => {
                    back.unwrap();
                    wrote.unwrap();
                }
            }
            let note = f.note().await.0;
            assert_eq!(note == "w", !through, "{name}, through pgfence: {through}");
            f.put_back().await;
        }
    }
}
