//! Texts Postgres may read differently from pgfence: a backslash that is the second byte
//! of a multibyte character in the client-only encodings (SJIS, BIG5, GBK, …), and
//! `standard_conforming_strings` or `client_encoding` changed by a request still in flight.
//! Such a text that may name a fenced table is refused (PF004); each test has its control:
//! straight to Postgres the hidden stale write lands.

use super::Fixture;
use crate::common::raw::{Raw, bind, codes, execute, message, parse, query, tags};

/// A stale session's write hidden behind what pgfence would read as a string: with SJIS,
/// 0x83 0x5C is one character (ソ) to Postgres, so the string ends there.
const SJIS_HIDDEN: &[u8] = b"SELECT E'\x83\x5c'; UPDATE sweep_state SET note = 'stale' WHERE id = 1; -- '";
/// The same with `standard_conforming_strings` on, read by pgfence with it off.
const SCS_HIDDEN: &str = "SELECT 'x\\'; UPDATE sweep_state SET note = 'stale' WHERE id = 1; -- '";

fn raw_query(sql: &[u8]) -> Vec<u8> {
    message(b'Q', &[sql, b"\0"].concat())
}

/// A raw session at the stale epoch 1 (the lease is at 2).
async fn stale(f: &Fixture, port: u16, extra: &[(&str, &str)]) -> Raw {
    f.raw(port, "1", extra).await
}

#[tokio::test]
async fn a_backslash_inside_an_sjis_character_hides_nothing() {
    let f = Fixture::at_epoch_two().await;
    let sjis = [("client_encoding", "SJIS")];
    let mut s = stale(&f, f.proxy.port(), &sjis).await;
    s.send(&raw_query(SJIS_HIDDEN)).await;
    let refused = s.read_until(|m| m.tag == b'Z').await;
    assert_eq!(codes(&refused), ["PF004"]);
    let message = refused[0].field(b'M').unwrap_or_default();
    assert!(
        message.contains("may write a table of fence \"sweeper\"; refused"),
        "{message}"
    );
    assert_eq!(f.note().await.0, "init");
    // SJIS text that cannot hide anything passes: no backslash after a multibyte character,
    // or, read as Postgres reads it, it only reads and names no fenced table.
    let fine: [&[u8]; 2] = [
        b"SELECT '\x83\x41', note FROM sweep_state",
        b"SELECT E'\x83\x5c', note FROM audit",
    ];
    for sql in fine {
        s.send(&raw_query(sql)).await;
        assert!(codes(&s.read_until(|m| m.tag == b'Z').await).is_empty(), "{sql:?}");
    }
    // Control: straight to Postgres the stale write lands.
    let mut d = stale(&f, f.cluster.port(), &sjis).await;
    d.send(&raw_query(SJIS_HIDDEN)).await;
    assert!(codes(&d.read_until(|m| m.tag == b'Z').await).is_empty());
    assert_eq!(f.note().await.0, "stale");
}

/// The SJIS backslash refused in a text that names no fenced table: after the string's
/// real end, Postgres runs an `EXECUTE` of a prepared stale write.
#[tokio::test]
async fn a_backslash_inside_an_sjis_character_hides_no_execute() {
    let f = Fixture::at_epoch_two().await;
    let sjis = [("client_encoding", "SJIS")];
    let hidden: &[u8] = b"SELECT E'\x95\x5c'; EXECUTE w; --'";
    let prepare = "PREPARE w AS UPDATE sweep_state SET note = 'stale' WHERE id = 1";
    let mut s = stale(&f, f.proxy.port(), &sjis).await;
    assert!(codes(&s.simple(prepare).await).is_empty());
    s.send(&raw_query(hidden)).await;
    assert_eq!(codes(&s.read_until(|m| m.tag == b'Z').await), ["PF004"]);
    assert_eq!(f.note().await.0, "init");
    // Control.
    let mut d = stale(&f, f.cluster.port(), &sjis).await;
    assert!(codes(&d.simple(prepare).await).is_empty());
    d.send(&raw_query(hidden)).await;
    assert!(codes(&d.read_until(|m| m.tag == b'Z').await).is_empty());
    assert_eq!(f.note().await.0, "stale");
}

/// With a single-byte `client_encoding` such as LATIN1 the text is not UTF-8, and pgfence
/// reads a copy where every such byte is one character: `é` and `è` are one name. A text
/// that does more than read is refused; a plain read passes.
#[tokio::test]
async fn names_in_a_text_that_is_not_utf8_are_not_confused() {
    let f = Fixture::at_epoch_two().await;
    let latin1 = [("client_encoding", "LATIN1")];
    let hidden: &[u8] = b"PREPARE \xe9 AS UPDATE sweep_state SET note = 'stale' WHERE id = 1; \
                          PREPARE \xe8 AS SELECT 1; EXECUTE \xe9";
    let mut s = stale(&f, f.proxy.port(), &latin1).await;
    s.send(&raw_query(hidden)).await;
    assert_eq!(codes(&s.read_until(|m| m.tag == b'Z').await), ["PF004"]);
    s.send(&raw_query(b"SELECT 'caf\xe9', note FROM sweep_state")).await;
    assert!(codes(&s.read_until(|m| m.tag == b'Z').await).is_empty());
    assert_eq!(f.note().await.0, "init");
    // Control.
    let mut d = stale(&f, f.cluster.port(), &latin1).await;
    d.send(&raw_query(hidden)).await;
    assert!(codes(&d.read_until(|m| m.tag == b'Z').await).is_empty());
    assert_eq!(f.note().await.0, "stale");
}

/// `SET client_encoding` and the text in one send: pgfence has not seen Postgres'
/// answer when it reads the text.
#[tokio::test]
async fn an_encoding_change_in_flight_hides_nothing() {
    let f = Fixture::at_epoch_two().await;
    let mut s = stale(&f, f.proxy.port(), &[]).await;
    s.send(&[query("SET client_encoding = 'SJIS'"), raw_query(SJIS_HIDDEN)].concat())
        .await;
    assert!(codes(&s.read_until(|m| m.tag == b'Z').await).is_empty());
    let refused = s.read_until(|m| m.tag == b'Z').await;
    assert_eq!(codes(&refused), ["PF004"]);
    // The session was in UTF8: the hint says what to do about the request in flight.
    let hint = refused.iter().find_map(|m| m.field(b'H')).unwrap_or_default();
    assert!(hint.contains("requests before it"), "{hint}");
    assert_eq!(f.note().await.0, "init");
    // A read that names no fenced table passes in flight too, in a UTF8 session.
    s.send(
        &[
            query("SET client_encoding = 'UTF8'"),
            query("SELECT 'é\\', note FROM audit"),
        ]
        .concat(),
    )
    .await;
    assert!(codes(&s.read_until(|m| m.tag == b'Z').await).is_empty());
    assert!(codes(&s.read_until(|m| m.tag == b'Z').await).is_empty());
    // Control.
    let mut d = stale(&f, f.cluster.port(), &[]).await;
    d.send(&[query("SET client_encoding = 'SJIS'"), raw_query(SJIS_HIDDEN)].concat())
        .await;
    d.read_until(|m| m.tag == b'Z').await;
    assert!(codes(&d.read_until(|m| m.tag == b'Z').await).is_empty());
    assert_eq!(f.note().await.0, "stale");
}

/// `SET standard_conforming_strings = on` and the text in one send, from a session that
/// had it off: sent one after the other, the same text gets PF001.
#[tokio::test]
async fn a_standard_conforming_strings_change_in_flight_hides_nothing() {
    let f = Fixture::at_epoch_two().await;
    let off = [("standard_conforming_strings", "off")];
    let mut s = stale(&f, f.proxy.port(), &off).await;
    s.send(&[query("SET standard_conforming_strings = on"), query(SCS_HIDDEN)].concat())
        .await;
    assert!(codes(&s.read_until(|m| m.tag == b'Z').await).is_empty());
    assert_eq!(codes(&s.read_until(|m| m.tag == b'Z').await), ["PF004"]);
    assert_eq!(codes(&s.simple(SCS_HIDDEN).await), ["PF001"]);
    assert_eq!(f.note().await.0, "init");
    // Control.
    let mut d = stale(&f, f.cluster.port(), &off).await;
    d.send(&[query("SET standard_conforming_strings = on"), query(SCS_HIDDEN)].concat())
        .await;
    d.read_until(|m| m.tag == b'Z').await;
    assert!(codes(&d.read_until(|m| m.tag == b'Z').await).is_empty());
    assert_eq!(f.note().await.0, "stale");
}

/// The same change run by Execute and followed by a Flush, not a Sync: Postgres has
/// answered it (CommandComplete) but reports the new setting only with the ReadyForQuery
/// that the Sync brings, so a text sent now is still read with it unknown.
#[tokio::test]
async fn a_standard_conforming_strings_change_waiting_for_its_sync_hides_nothing() {
    let f = Fixture::at_epoch_two().await;
    let off = [("standard_conforming_strings", "off")];
    let set_on = [
        parse("", "SET standard_conforming_strings = on"),
        bind("", "", &[]),
        execute(""),
        message(b'H', b""),
    ]
    .concat();
    let mut s = stale(&f, f.proxy.port(), &off).await;
    s.send(&set_on).await;
    assert_eq!(tags(&s.read_until(|m| m.tag == b'C').await), "12C");
    s.send(&query(SCS_HIDDEN)).await;
    assert_eq!(codes(&s.read_until(|m| m.tag == b'Z').await), ["PF004"]);
    assert_eq!(f.note().await.0, "init");
    // Control: straight to Postgres the stale write hidden this way lands.
    let mut d = stale(&f, f.cluster.port(), &off).await;
    d.send(&set_on).await;
    d.read_until(|m| m.tag == b'C').await;
    d.send(&query(SCS_HIDDEN)).await;
    assert!(codes(&d.read_until(|m| m.tag == b'Z').await).is_empty());
    assert_eq!(f.note().await.0, "stale");
}

/// Where statement boundaries rest on psql's rule for routine bodies (`BEGIN`, `CASE`,
/// `END` inside `CREATE FUNCTION`), Postgres may split the text otherwise: `SELECT 1 AS end`
/// does not end a body, `begin` may be a parameter name. Such a text that names a fenced
/// table, or mentions pgfence, is refused whole; one that does not passes, and pgfence then
/// trusts none of its own prepared statements until it has prepared them again.
#[tokio::test]
async fn a_text_split_by_the_routine_body_rule_hides_nothing() {
    let f = Fixture::at_epoch_two().await;
    let hidden = "CREATE OR REPLACE FUNCTION pg_temp.t() RETURNS void LANGUAGE sql BEGIN ATOMIC \
                  SELECT 1 AS end; UPDATE sweep_state SET note = 'body' WHERE id = 2; END; SELECT 1";
    let mut s = stale(&f, f.proxy.port(), &[]).await;
    s.simple("BEGIN").await;
    assert_eq!(codes(&s.simple(hidden).await), ["PF004"]);
    s.simple("ROLLBACK").await;
    s.simple("BEGIN").await;
    assert_eq!(
        codes(&s.simple("UPDATE sweep_state SET note = 'stale' WHERE id = 1").await),
        ["PF001"]
    );
    s.simple("ROLLBACK").await;
    // A session at the current epoch tries to replace its guard statement by a fake
    // through such a text: refused, since it mentions pgfence; one that drops every
    // prepared statement (DEALLOCATE ALL) is refused too, as what changes the statements
    // pgfence keeps. After the takeover the write is still checked by the real guard.
    let two = f.leader(2).await;
    two.execute("UPDATE sweep_state SET note = 'two' WHERE id = 1", &[])
        .await
        .unwrap();
    let guard = pgfence::session::state::OwnStatement::Guard.name();
    let r = two
        .batch_execute(&format!(
            "CREATE FUNCTION pg_temp.m(begin int) RETURNS int LANGUAGE sql AS 'select 1'; \
             DEALLOCATE {guard}; PREPARE {guard}(text, bigint, text, boolean) AS SELECT 1"
        ))
        .await;
    assert_eq!(super::code(&r), "PF004");
    let r = two
        .batch_execute("CREATE FUNCTION pg_temp.m(begin int) RETURNS int LANGUAGE sql AS 'select 1'; DEALLOCATE ALL")
        .await;
    assert_eq!(super::code(&r), "PF004");
    // One that changes nothing pgfence keeps passes, and pgfence prepares its guard again.
    two.batch_execute("CREATE FUNCTION pg_temp.m2(begin int) RETURNS int LANGUAGE sql AS 'select 1'; SELECT 2")
        .await
        .unwrap();
    f.takeover("c").await;
    let r = two
        .execute("UPDATE sweep_state SET note = 'stale' WHERE id = 1", &[])
        .await;
    assert_eq!(super::code(&r), "PF001");
    assert_eq!(f.note().await.0, "two");
    // Control: straight to Postgres the stale write lands.
    let mut d = stale(&f, f.cluster.port(), &[]).await;
    d.simple("BEGIN").await;
    assert!(codes(&d.simple(hidden).await).is_empty());
    assert!(codes(&d.simple("UPDATE sweep_state SET note = 'stale' WHERE id = 1").await).is_empty());
    d.simple("COMMIT").await;
    assert_eq!(f.note().await.0, "stale");
}

/// pgfence's own `PREPARE`, which it sends ahead of a session's first Query once an epoch
/// is declared, changes no setting: the text after it is read at once, not refused as one
/// sent while a request was in flight. The same text, straight to Postgres, runs the same.
#[tokio::test]
async fn pgfences_own_prepare_ahead_of_a_text_is_no_request_in_flight() {
    let f = Fixture::at_epoch_two().await;
    let mut seen = Vec::new();
    for port in [f.proxy.port(), f.cluster.port()] {
        let mut s = f.raw(port, "2", &[]).await;
        let got = s.simple("SET pgfence.fence = 'x\\,y'; SELECT 'a\\'").await;
        assert!(codes(&got).is_empty(), "port {port}: {got:?}");
        seen.push(tags(&got));
    }
    assert_eq!(seen[0], "CTDCZ");
    assert_eq!(seen[0], seen[1], "as straight to Postgres");
}
