//! The extended protocol's guard is a statement pgfence prepares once per session, fence and
//! epoch (`pgfence_guard_const_v1_<tag>`, the call with its arguments written in, the tag
//! drawn once per process); the simple protocol's starts from one with parameters
//! (`pgfence_guard_v1_<tag>`). What a client does to
//! prepared statements never costs a write its guard and never leaves the session failing:
//! `DEALLOCATE` (by name or ALL) answered or still in flight, a protocol Close of that name,
//! a client statement that took the name. Each test ends with its control: straight to
//! Postgres the stale write lands.

use super::{Fixture, NO_LEASE, code};
use crate::common::pg::Cluster;
use crate::common::raw::{Raw, bind, close_statement, codes, execute, message, parse, query, sync, tags};

const WRITE: &str = "UPDATE sweep_state SET note = 'w' WHERE id = 1";

/// The guard statement's name (the proxy runs in this process).
fn guard() -> &'static str {
    pgfence::session::state::OwnStatement::Guard.name()
}

/// The guard call prepared with its arguments written in (the extended protocol's, and the
/// simple protocol's once the one with parameters is there).
fn const_guard() -> &'static str {
    pgfence::session::state::OwnStatement::ConstGuard.name()
}

/// Whether the session has pgfence's guard statement, prepared with a Parse.
async fn has_guard(client: &tokio_postgres::Client) -> bool {
    client
        .query_opt(
            "SELECT 1 FROM pg_prepared_statements WHERE name = $1 AND NOT from_sql",
            &[&const_guard()],
        )
        .await
        .unwrap()
        .is_some()
}

/// The error codes of one extended-protocol write (unnamed statement and portal).
async fn raw_write(raw: &mut Raw) -> Vec<String> {
    raw.send(&[parse("", WRITE), bind("", "", &[]), execute(""), sync()].concat())
        .await;
    codes(&raw.read_until(|m| m.tag == b'Z').await)
}

/// An extended-protocol `SET pgfence.epoch` and a write after it, without their Sync.
fn set_and_write(epoch: i64) -> Vec<u8> {
    let set = format!("SET pgfence.epoch = {epoch}");
    [
        parse("", &set),
        bind("", "", &[]),
        execute(""),
        parse("", WRITE),
        bind("", "", &[]),
        execute(""),
    ]
    .concat()
}

#[tokio::test]
async fn a_write_after_the_guard_is_deallocated_is_still_guarded() {
    let f = Fixture::with(Cluster::shared(), NO_LEASE).await;
    let five = f.leader(5).await;
    five.execute(WRITE, &[]).await.unwrap();
    assert!(has_guard(&five).await);
    f.leader(6).await.execute(WRITE, &[]).await.unwrap();
    for drop in [
        format!("DEALLOCATE {}", const_guard()),
        format!("deallocate prepare {}", const_guard().to_uppercase()),
        "DEALLOCATE ALL".into(),
        "DISCARD ALL".into(),
    ] {
        five.batch_execute(&drop).await.unwrap();
        assert!(!has_guard(&five).await, "{drop}");
        // Prepared again for the write, which it refuses (not 26000 for a missing statement).
        assert_eq!(code(&five.execute(WRITE, &[]).await), "PF001", "{drop}");
        assert!(has_guard(&five).await, "{drop}");
    }
    // A DEALLOCATE of it that fails leaves it in place, and pgfence knows.
    five.batch_execute("BEGIN; SELECT 1/0").await.unwrap_err();
    five.batch_execute(&format!("DEALLOCATE {}", const_guard()))
        .await
        .unwrap_err();
    five.batch_execute("ROLLBACK").await.unwrap();
    assert!(has_guard(&five).await);
    assert_eq!(code(&five.execute(WRITE, &[]).await), "PF001");
    // Control.
    assert_eq!(f.direct().await.execute(WRITE, &[]).await.unwrap(), 1);
}

/// A DEALLOCATE sent and not yet answered when the next write is dispatched (pipelined):
/// that write's guard is prepared anew.
#[tokio::test]
async fn a_deallocate_still_in_flight_does_not_cost_the_next_write_its_guard() {
    let f = Fixture::with(Cluster::shared(), NO_LEASE).await;
    let mut five = f.raw(f.proxy.port(), "5", &[]).await;
    for (expected, stale) in [("", false), ("PF001", true)] {
        if stale {
            f.leader(6).await.execute(WRITE, &[]).await.unwrap();
        }
        let by_name = format!("DEALLOCATE {}", const_guard());
        for drop in ["DEALLOCATE ALL", &by_name, "DISCARD ALL"] {
            // The guard is prepared, and pgfence has seen it answered.
            raw_write(&mut five).await;
            // The DEALLOCATE and the write in one send, nothing read in between.
            let write = [parse("", WRITE), bind("", "", &[]), execute(""), sync()].concat();
            five.send(&[query(drop), write].concat()).await;
            let dropped = five.read_until(|m| m.tag == b'Z').await;
            assert_eq!(codes(&dropped), Vec::<String>::new(), "{drop}");
            let written = codes(&five.read_until(|m| m.tag == b'Z').await);
            assert_eq!(written.join(","), expected, "{drop}, stale: {stale}");
        }
    }
    // Control.
    assert_eq!(f.direct().await.execute(WRITE, &[]).await.unwrap(), 1);
}

/// A client's protocol Close of the guard's name: the next write prepares it again.
#[tokio::test]
async fn a_client_close_of_the_guard_statement_is_survived() {
    let f = Fixture::with(Cluster::shared(), NO_LEASE).await;
    let mut five = f.raw(f.proxy.port(), "5", &[]).await;
    assert_eq!(raw_write(&mut five).await, Vec::<String>::new());
    five.send(&[close_statement(const_guard()), sync()].concat()).await;
    let closed = five.read_until(|m| m.tag == b'Z').await;
    assert_eq!(codes(&closed), Vec::<String>::new());
    assert_eq!(raw_write(&mut five).await, Vec::<String>::new());
    f.leader(6).await.execute(WRITE, &[]).await.unwrap();
    five.send(&[close_statement(const_guard()), sync()].concat()).await;
    five.read_until(|m| m.tag == b'Z').await;
    assert_eq!(raw_write(&mut five).await, ["PF001"]);
    // Control.
    assert_eq!(f.direct().await.execute(WRITE, &[]).await.unwrap(), 1);
}

/// The extended protocol's guard has the session's fence and epoch written in: made at the
/// first write, run by Bind without parameters after that, and made again (Close, Parse) for
/// a write at another epoch, also within one batch, where each write is guarded at its own.
#[tokio::test]
async fn the_extended_protocol_prepares_the_guard_for_its_epoch() {
    let f = Fixture::with(Cluster::shared(), NO_LEASE).await;
    let mut raw = f.raw(f.proxy.port(), "5", &[]).await;
    for _ in 0..3 {
        assert_eq!(raw_write(&mut raw).await, Vec::<String>::new());
    }
    // Postgres' own record of the session's statements, through the same session.
    let statements = |replies: &[crate::common::raw::Msg]| {
        replies
            .iter()
            .filter(|m| m.tag == b'D')
            .map(|m| String::from_utf8_lossy(&m.body).into_owned())
            .collect::<Vec<_>>()
    };
    let ask = format!(
        "SELECT statement || ' runs ' || (generic_plans + custom_plans) || ' sql ' || from_sql \
         FROM pg_prepared_statements WHERE name = '{}'",
        const_guard()
    );
    raw.send(&query(&ask)).await;
    let rows = statements(&raw.read_until(|m| m.tag == b'Z').await);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(
        rows[0].contains("pgfence.guard('") && rows[0].contains(", 5, NULL, true) runs 3 sql false"),
        "{rows:?}"
    );
    f.leader(6).await.execute(WRITE, &[]).await.unwrap();
    // Epoch 6 then 5 in one batch: the first write passes, the second is refused, and
    // Postgres skips the rest of the batch and rolls it back (its SETs too).
    raw.send(&[set_and_write(6), set_and_write(5), set_and_write(6), sync()].concat())
        .await;
    let replies = raw.read_until(|m| m.tag == b'Z').await;
    assert_eq!(codes(&replies), ["PF001"]);
    assert_eq!(replies.iter().filter(|m| m.tag == b'C').count(), 3, "{replies:?}");
    // The session is at epoch 5 again. The batch's last part, skipped, was to make the
    // statement for 6 (its Close skipped too): pgfence cannot tell which one is there, so
    // this write makes it again for 5.
    assert_eq!(raw_write(&mut raw).await, ["PF001"]);
    raw.send(&query(&ask)).await;
    let rows = statements(&raw.read_until(|m| m.tag == b'Z').await);
    assert!(rows[0].contains(", 5, NULL, true) runs 1 sql false"), "{rows:?}");
    // Control.
    assert_eq!(f.direct().await.execute(WRITE, &[]).await.unwrap(), 1);
}

/// The client closes the guard's name later in the batch in which pgfence prepares it again
/// (here for a new epoch), and then puts a statement of its own under that name. pgfence's
/// Parse is answered after the client's Close was sent: that answer must not make the
/// statement pgfence's again. The next write prepares it anew: a current one passes (not
/// 26000), a stale one is refused (the client's `SELECT 1` is never taken for the guard).
#[tokio::test]
async fn a_client_close_after_the_guards_parse_in_one_batch_is_not_undone() {
    let f = Fixture::with(Cluster::shared(), NO_LEASE).await;
    for hijack in [false, true] {
        let e = hwm(&f).await + 1;
        let mut raw = f.raw(f.proxy.port(), &e.to_string(), &[]).await;
        assert_eq!(raw_write(&mut raw).await, Vec::<String>::new());
        let mut batch = [set_and_write(e + 1), close_statement(const_guard())].concat();
        if hijack {
            batch.extend(parse(const_guard(), "SELECT 1"));
        }
        raw.send(&[batch, sync()].concat()).await;
        assert_eq!(
            codes(&raw.read_until(|m| m.tag == b'Z').await),
            Vec::<String>::new(),
            "hijack: {hijack}"
        );
        if !hijack {
            assert_eq!(raw_write(&mut raw).await, Vec::<String>::new());
            continue;
        }
        // A leader moves on: this session's epoch is stale, by both protocols.
        f.leader(e + 2).await.execute(WRITE, &[]).await.unwrap();
        assert_eq!(raw_write(&mut raw).await, ["PF001"]);
        raw.send(&query(WRITE)).await;
        assert_eq!(codes(&raw.read_until(|m| m.tag == b'Z').await), ["PF001"]);
        assert_eq!(hwm(&f).await, e + 2);
    }
    // Control.
    assert_eq!(f.direct().await.execute(WRITE, &[]).await.unwrap(), 1);
}

/// pgfence's Parse of the guard skipped (an error earlier in its batch), with a client's
/// Close and Parse of that name in the next batch, sent before the skip is answered: the
/// name stays in doubt, so the next write closes it before preparing the guard, instead of
/// failing with 42P05, and is guarded.
#[tokio::test]
async fn a_skipped_guard_parse_leaves_a_later_client_statement_in_doubt() {
    let f = Fixture::with(Cluster::shared(), NO_LEASE).await;
    let e = hwm(&f).await + 1;
    let mut raw = f.raw(f.proxy.port(), &e.to_string(), &[]).await;
    let failing = [parse("", "SELEC 1"), bind("", "", &[]), execute("")].concat();
    let write = [parse("", WRITE), bind("", "", &[]), execute("")].concat();
    let take = [close_statement(const_guard()), parse(const_guard(), "SELECT 1")].concat();
    raw.send(&[failing, write, sync(), take, sync()].concat()).await;
    assert_eq!(codes(&raw.read_until(|m| m.tag == b'Z').await), ["42601"]);
    assert_eq!(codes(&raw.read_until(|m| m.tag == b'Z').await), Vec::<String>::new());
    assert_eq!(f.note().await.0, "init");
    assert_eq!(raw_write(&mut raw).await, Vec::<String>::new());
    assert_eq!(f.note().await.0, "w");
    f.put_back().await;
    // A leader moves on: this session's write is refused.
    f.leader(e + 1).await.execute(WRITE, &[]).await.unwrap();
    f.put_back().await;
    assert_eq!(raw_write(&mut raw).await, ["PF001"]);
    assert_eq!(f.note().await.0, "init");
    // Control.
    assert_eq!(f.direct().await.execute(WRITE, &[]).await.unwrap(), 1);
}

/// The fence's high-water mark.
async fn hwm(f: &Fixture) -> i64 {
    f.admin
        .query_one("SELECT hwm FROM pgfence.fence WHERE name = 'sweeper'", &[])
        .await
        .unwrap()
        .get(0)
}

/// A client statement that took the guard's name (before pgfence prepared its own, which a
/// session with an epoch does at its first Query): the first write by the extended protocol
/// fails (Postgres' 42P05, nothing written); pgfence then closes that name before preparing
/// its own, so the session does not fail forever, and every later write is guarded.
#[tokio::test]
async fn a_client_statement_named_like_the_guard_costs_one_write() {
    let f = Fixture::with(Cluster::shared(), NO_LEASE).await;
    let five = f.session("").await;
    five.batch_execute(&format!("PREPARE {} AS SELECT 1", const_guard()))
        .await
        .unwrap();
    five.batch_execute("SET pgfence.epoch = 5").await.unwrap();
    assert_eq!(code(&five.execute(WRITE, &[]).await), "42P05");
    assert_eq!(f.note().await.0, "init");
    five.execute(WRITE, &[]).await.unwrap();
    assert!(has_guard(&five).await);
    f.leader(6).await.execute(WRITE, &[]).await.unwrap();
    assert_eq!(code(&five.execute(WRITE, &[]).await), "PF001");
    // Control.
    assert_eq!(f.direct().await.execute(WRITE, &[]).await.unwrap(), 1);
}

/// pgfence's names carry a per-process tag: a client's own statement named like the guard
/// without it, or a cursor named like pgfence's portal, is left alone and works as it would
/// straight to Postgres, while the writes around it are guarded.
#[tokio::test]
async fn a_client_name_without_the_tag_does_not_collide() {
    let f = Fixture::with(Cluster::shared(), NO_LEASE).await;
    assert!(guard().starts_with("pgfence_guard_v1_") && guard().len() > "pgfence_guard_v1_".len());
    let five = f.leader(5).await;
    five.batch_execute("PREPARE pgfence_guard_v1 AS SELECT 41 + 1")
        .await
        .unwrap();
    five.execute(WRITE, &[]).await.unwrap();
    let answer: i32 = five.query_one("EXECUTE pgfence_guard_v1", &[]).await.unwrap().get(0);
    assert_eq!(answer, 42);
    five.batch_execute("BEGIN; DECLARE pgfence_p CURSOR FOR SELECT 7")
        .await
        .unwrap();
    five.execute(WRITE, &[]).await.unwrap();
    let seven: i32 = five.query_one("FETCH pgfence_p", &[]).await.unwrap().get(0);
    assert_eq!(seven, 7);
    five.batch_execute("COMMIT").await.unwrap();
    f.leader(6).await.execute(WRITE, &[]).await.unwrap();
    assert_eq!(code(&five.execute(WRITE, &[]).await), "PF001");
    // Control.
    assert_eq!(f.direct().await.execute(WRITE, &[]).await.unwrap(), 1);
}

/// How often the session ran pgfence's guard statements (any way they were prepared).
async fn guard_runs(client: &tokio_postgres::Client) -> i64 {
    runs_of(client, &[guard(), const_guard()]).await
}

/// The text of the session's prepared statement of this name.
async fn statement_text(client: &tokio_postgres::Client, name: &str) -> String {
    client
        .query_one("SELECT statement FROM pg_prepared_statements WHERE name = $1", &[&name])
        .await
        .unwrap()
        .get(0)
}

/// How often the session ran the statements of these names.
pub(crate) async fn runs_of(client: &tokio_postgres::Client, names: &[&str]) -> i64 {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    client
        .query_one(
            "SELECT coalesce(sum(generic_plans + custom_plans), 0)::int8 FROM pg_prepared_statements \
             WHERE name = ANY($1)",
            &[&names],
        )
        .await
        .unwrap()
        .get(0)
}

/// The simple protocol runs the guard as `EXECUTE` of the same statement, prepared by an SQL
/// `PREPARE` that pgfence sends as a Query of its own while the session is idle (its replies
/// unseen), so Postgres does not parse and plan the guard call in every transaction, and
/// the statement's text is pgfence's alone. Once that is there, a second one with the
/// session's fence and epoch written in (no parameters to evaluate) takes over, and is made
/// again when the epoch changes. Whatever drops the statements, or keeps them from being
/// made, the next write prepares them again (or spells the call out) and stays guarded.
#[tokio::test]
async fn the_simple_protocol_executes_the_prepared_guard() {
    let f = Fixture::with(Cluster::shared(), NO_LEASE).await;
    let five = f.leader(5).await;
    let big = format!("{WRITE} AND note <> '{}'", "x".repeat(100_000));
    five.batch_execute(&big).await.unwrap();
    for _ in 0..2 {
        five.batch_execute(WRITE).await.unwrap();
    }
    // The first write spelled the call out (the PREPARE was in flight), the second ran it,
    // the third the one with the arguments written in, prepared meanwhile.
    assert_eq!(runs_of(&five, &[guard()]).await, 1);
    assert_eq!(runs_of(&five, &[const_guard()]).await, 1);
    assert!(!has_guard(&five).await, "prepared by SQL, not by a Parse");
    let text = statement_text(&five, guard()).await;
    assert!(text.len() < 300 && text.contains("pgfence.guard"), "{text}");
    // The extended protocol uses the constant one too.
    five.execute(WRITE, &[]).await.unwrap();
    assert_eq!(runs_of(&five, &[const_guard()]).await, 2);
    f.leader(6).await.execute(WRITE, &[]).await.unwrap();
    let by_name = format!("DEALLOCATE {}; DEALLOCATE {}", guard(), const_guard());
    for drop in [by_name.as_str(), "DEALLOCATE ALL", "DISCARD ALL"] {
        five.batch_execute(drop).await.unwrap();
        assert_eq!(guard_runs(&five).await, 0, "{drop}");
        for _ in 0..2 {
            assert_eq!(code(&five.batch_execute(WRITE).await), "PF001", "{drop}");
        }
        assert_eq!(guard_runs(&five).await, 1, "prepared again after {drop}");
    }
    // A new epoch: the statement with the old one written in is made again with the new one.
    five.batch_execute("SET pgfence.epoch = 6").await.unwrap();
    for _ in 0..3 {
        five.batch_execute(WRITE).await.unwrap();
    }
    let text = statement_text(&five, const_guard()).await;
    assert!(text.contains(", 6, NULL, true)"), "{text}");
    assert_eq!(runs_of(&five, &[const_guard()]).await, 2, "{text}");
    five.batch_execute("SET pgfence.epoch = 5").await.unwrap();
    for _ in 0..2 {
        assert_eq!(code(&five.batch_execute(WRITE).await), "PF001");
    }
    assert_eq!(runs_of(&five, &[const_guard()]).await, 1, "made again for epoch 5");
    // Two Queries sent at once by a new session: the second cannot count on the PREPARE
    // yet and spells the call out; both are guarded, and the client sees only its replies.
    let mut raw = f.raw(f.proxy.port(), "5", &[]).await;
    raw.send(&[query(WRITE), query(WRITE)].concat()).await;
    for _ in 0..2 {
        let replies = raw.read_until(|m| m.tag == b'Z').await;
        assert_eq!(codes(&replies), ["PF001"]);
        assert_eq!(replies.iter().filter(|m| m.tag == b'C').count(), 0, "{replies:?}");
    }
    // A client statement that took the name first: pgfence's PREPARE fails unseen, and the
    // call is spelled out.
    let taken = f.session("").await;
    taken
        .batch_execute(&format!("PREPARE {} AS SELECT 1", guard()))
        .await
        .unwrap();
    taken.batch_execute("SET pgfence.epoch = 5").await.unwrap();
    for _ in 0..2 {
        assert_eq!(code(&taken.batch_execute(WRITE).await), "PF001");
    }
    let mine: i32 = taken
        .query_one(&format!("EXECUTE {}", guard()), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(mine, 1, "the client's statement is untouched");
    // Control.
    assert_eq!(f.direct().await.execute(WRITE, &[]).await.unwrap(), 1);
}

/// The replies to a transaction opened by an Execute answered before its Sync (a Flush),
/// then Sync, a query and COMMIT sent at once. pgfence sends its PREPARE only between
/// transactions: run inside this one, its failure (no pgfence schema here) aborted the
/// client's transaction, and COMMIT answered ROLLBACK.
#[tokio::test]
async fn the_guard_is_not_prepared_in_a_transaction_opened_before_a_flush() {
    let (cluster, db, proxy) = super::writes_without_init_get_pf005(NO_LEASE).await;
    let params = [("user", "postgres"), ("database", db.as_str()), ("pgfence.epoch", "5")];
    let mut seen = Vec::new();
    for port in [proxy.port(), cluster.port()] {
        let (mut raw, _) = Raw::startup(port, &params).await;
        let begin = [parse("", "BEGIN"), bind("", "", &[]), execute(""), message(b'H', &[])].concat();
        raw.send(&begin).await;
        raw.read_until(|m| m.tag == b'C').await;
        raw.send(&[sync(), query("SELECT 1"), query("COMMIT")].concat()).await;
        let mut replies = Vec::new();
        for _ in 0..3 {
            replies.extend(raw.read_until(|m| m.tag == b'Z').await);
        }
        assert_eq!(codes(&replies), Vec::<String>::new(), "port {port}");
        let commit = replies.iter().rev().find(|m| m.tag == b'C').map(|m| m.body.clone());
        seen.push((tags(&replies), commit));
    }
    assert_eq!(seen[0], seen[1], "through pgfence, then straight to Postgres");
}

/// A FATAL that ends the session while pgfence's own PREPARE runs reaches the client, as it
/// would during a statement of the client's.
#[tokio::test]
async fn a_fatal_during_the_guards_prepare_reaches_the_client() {
    let f = Fixture::with(Cluster::shared(), NO_LEASE).await;
    let mut raw = f.raw(f.proxy.port(), "5", &[]).await;
    // The PREPARE looks the guard up in pg_proc: a lock on it holds it. The lock holds every
    // session of this database that must read pg_proc; another database's watches.
    let locker = f.direct().await;
    locker
        .batch_execute("BEGIN; LOCK pg_catalog.pg_proc IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    raw.send(&query("SELECT 1")).await;
    let admin = f.cluster.admin("postgres").await;
    let mut pid = None;
    for _ in 0..100 {
        pid = admin
            .query_opt(
                "SELECT pid FROM pg_stat_activity WHERE query LIKE 'PREPARE pgfence_guard%' AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .map(|r| r.get::<_, i32>(0));
        if pid.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let pid = pid.expect("pgfence's PREPARE waits for the lock");
    admin.execute("SELECT pg_terminate_backend($1)", &[&pid]).await.unwrap();
    let mut got = Vec::new();
    while let Some(m) = raw.read().await {
        got.push(m);
    }
    locker.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(codes(&got), ["57P01"], "{got:?}");
}

/// pgfence's own PREPARE stays unseen even where Postgres reports every statement to the
/// client (`log_statement = all`, `client_min_messages = log`): the client sees the LOG of
/// its own statement only, as straight to Postgres.
#[tokio::test]
async fn the_guards_prepare_logs_nothing_to_the_client() {
    let f = Fixture::with(Cluster::shared(), NO_LEASE).await;
    let options = [("options", "-c client_min_messages=log -c log_statement=all")];
    let mut notices = Vec::new();
    for port in [f.proxy.port(), f.cluster.port()] {
        let mut raw = f.raw(port, "5", &options).await;
        let replies = raw.simple("SELECT 1").await;
        notices.push(replies.iter().filter(|m| m.tag == b'N').count());
    }
    assert_eq!(notices, [1, 1], "through pgfence, then straight to Postgres");
}

/// In a database without the schema the PREPARE fails once per session, not before every
/// Query (each failure is an error in the server's log).
#[tokio::test]
async fn without_the_schema_the_guard_is_prepared_once_per_session() {
    let (cluster, db, proxy) = super::writes_without_init_get_pf005(NO_LEASE).await;
    let s = crate::common::pg::connect(proxy.port(), &db, "-c pgfence.epoch=5").await;
    let pid: i32 = s.query_one("SELECT pg_backend_pid()", &[]).await.unwrap().get(0);
    // Only what is logged from here: another test's backend may have had this pid before.
    let from = cluster.server_log_bytes().len();
    for _ in 0..3 {
        s.batch_execute("SELECT 1").await.unwrap();
    }
    let log = String::from_utf8_lossy(&cluster.server_log_bytes()[from..]).into_owned();
    let tried = log
        .lines()
        .filter(|l| l.contains(&format!("[{pid}]")) && l.contains("PREPARE pgfence_guard"))
        .count();
    assert_eq!(tried, 1, "{log}");
}

/// The notices of pgfence's own messages stay unseen, as their replies do: with
/// `client_min_messages = debug2` a guarded extended-protocol write (the guard prepared,
/// bound and run first) shows the client exactly the notices it shows directly.
#[tokio::test]
async fn the_notices_of_the_guard_messages_are_not_seen() {
    let f = Fixture::with(Cluster::shared(), NO_LEASE).await;
    let notices = |msgs: &[crate::common::raw::Msg]| -> Vec<String> {
        msgs.iter()
            .filter(|m| m.tag == b'N')
            .filter_map(|m| m.field(b'M'))
            // A write that happens to start a WAL segment is told so, through pgfence or not.
            .filter(|m| !m.contains("WAL file"))
            .collect()
    };
    let mut seen = Vec::new();
    for port in [f.proxy.port(), f.cluster.port()] {
        let mut raw = f.raw(port, "1", &[("client_min_messages", "debug2")]).await;
        let mut got = Vec::new();
        // The first write prepares the guard; the second runs the prepared one.
        for _ in 0..2 {
            raw.send(&[parse("", WRITE), bind("", "", &[]), execute(""), sync()].concat())
                .await;
            let msgs = raw.read_until(|m| m.tag == b'Z').await;
            assert_eq!(
                codes(&msgs).iter().filter(|c| !c.starts_with('0')).count(),
                0,
                "{msgs:?}"
            );
            got.extend(notices(&msgs));
        }
        assert!(!got.is_empty(), "debug2 shows the client's own Parse and Bind");
        seen.push(got);
    }
    assert_eq!(seen[0], seen[1]);
    assert!(f.hwm().await >= 1);
}

/// The session's first guarded write, then in the same send a batch where an error makes
/// Postgres skip the guard's second preparation: the guard statement from the first batch
/// is still there, and the next write neither fails with 42P05 nor goes unguarded.
#[tokio::test]
async fn a_skipped_second_preparation_of_the_guard_leaves_the_first() {
    let f = Fixture::with(Cluster::shared(), NO_LEASE).await;
    let write = || [parse("", WRITE), bind("", "", &[]), execute(""), sync()].concat();
    let failing = [parse("", "SELECT 1/0"), bind("", "", &[]), execute("")].concat();
    for port in [f.proxy.port(), f.cluster.port()] {
        let mut raw = f.raw(port, "1", &[]).await;
        raw.send(&[write(), failing.clone(), write()].concat()).await;
        assert_eq!(codes(&raw.read_until(|m| m.tag == b'Z').await), Vec::<String>::new());
        assert_eq!(codes(&raw.read_until(|m| m.tag == b'Z').await), ["22012"]);
        assert_eq!(raw_write(&mut raw).await, Vec::<String>::new(), "port {port}");
        // Still guarded: a newer epoch makes epoch 1 stale (the control, after pgfence's
        // turn, writes at any epoch).
        f.leader(2).await.execute(WRITE, &[]).await.unwrap();
        let expected: &[&str] = if port == f.proxy.port() { &["PF001"] } else { &[] };
        assert_eq!(raw_write(&mut raw).await, expected, "port {port}");
    }
}
