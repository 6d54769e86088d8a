//! COPY FROM STDIN in the extended protocol: Postgres ignores the client's Sync and Flush
//! while it copies (libpq sends a Sync after the Execute and another after CopyDone), so
//! those Syncs get no ReadyForQuery. pgfence must attribute every later reply as
//! Postgres sends it: the session reads exactly what it reads straight from Postgres, and
//! the next transaction is still checked.

use super::{Fixture, code};
use crate::common::raw::{Raw, bind, codes, execute, message, parse, query, sync, tags};

const COPY: &str = "COPY audit (note) FROM STDIN";
const WRITE: &str = "UPDATE sweep_state SET note = 'w' WHERE id = 1";

fn copy_data(row: &str) -> Vec<u8> {
    message(b'd', row.as_bytes())
}

fn copy_done() -> Vec<u8> {
    message(b'c', b"")
}

fn copy_fail(why: &str) -> Vec<u8> {
    let mut b = why.as_bytes().to_vec();
    b.push(0);
    message(b'f', &b)
}

/// A raw session at `epoch` on `port`, through pgfence or not.
async fn session(f: &Fixture, port: u16, epoch: i64) -> Raw {
    f.raw(port, &epoch.to_string(), &[]).await
}

/// The transcript of one COPY as libpq sends it, then a fenced write and a read: message
/// types and error codes, per request. `wait_for_copy`: send the rows only once Postgres
/// said it copies (libpq), else everything at once (a pipelining client).
async fn transcript(raw: &mut Raw, wait_for_copy: bool, end: Vec<u8>) -> Vec<String> {
    let start = [parse("", COPY), bind("", "", &[]), execute(""), sync()].concat();
    let rows = [copy_data("a\n"), copy_data("b\n"), end, sync()].concat();
    let mut out = Vec::new();
    if wait_for_copy {
        raw.send(&start).await;
        let head = raw.read_until(|m| m.tag == b'G').await;
        raw.send(&rows).await;
        let tail = raw.read_until(|m| m.tag == b'Z').await;
        out.push(format!("{}{} {:?}", tags(&head), tags(&tail), codes(&tail)));
    } else {
        raw.send(&[start, rows].concat()).await;
        let all = raw.read_until(|m| m.tag == b'Z').await;
        out.push(format!("{} {:?}", tags(&all), codes(&all)));
    }
    for sql in [WRITE, "SELECT 42"] {
        let r = raw.simple(sql).await;
        out.push(format!("{} {:?}", tags(&r), codes(&r)));
    }
    out
}

#[tokio::test]
async fn syncs_inside_copy_get_no_reply_through_pgfence_either() {
    let f = Fixture::new().await;
    let e = f.takeover("a").await;
    for wait in [true, false] {
        for (end, how) in [(copy_done(), "CopyDone"), (copy_fail("client gave up"), "CopyFail")] {
            let mut direct = session(&f, f.cluster.port(), e).await;
            let mut proxied = session(&f, f.proxy.port(), e).await;
            let want = transcript(&mut direct, wait, end.clone()).await;
            let got = transcript(&mut proxied, wait, end).await;
            assert_eq!(got, want, "{how}, waiting for G: {wait}");
        }
    }
    let n = f.audit_rows().await;
    assert_eq!(n, 8, "two rows per completed COPY, twice each way");
}

/// The reply misattributed after such a Sync could make pgfence believe a guard still
/// held in a later transaction. Here: a COPY with its Syncs inside a guarded transaction,
/// `COMMIT AND CHAIN`, a takeover, and the stale write in the chained transaction.
#[tokio::test]
async fn a_transaction_after_a_copy_is_still_checked() {
    let f = Fixture::new().await;
    let e = f.takeover("a").await;
    let mut s = session(&f, f.proxy.port(), e).await;
    assert_eq!(codes(&s.simple(&format!("BEGIN; {WRITE}")).await), Vec::<String>::new());
    let copy = [parse("", COPY), bind("", "", &[]), execute(""), sync()].concat();
    let rows = [copy_data("a\n"), sync(), copy_done(), sync()].concat();
    s.send(&[copy, rows, query("COMMIT AND CHAIN")].concat()).await;
    let copied = s.read_until(|m| m.tag == b'Z').await;
    assert_eq!(tags(&copied), "12GCZ");
    let chained = s.read_until(|m| m.tag == b'Z').await;
    assert_eq!(tags(&chained), "CZ");
    f.takeover("b").await;
    let stale = s.simple("UPDATE sweep_state SET note = 'stale' WHERE id = 1").await;
    assert_eq!(codes(&stale), ["PF001"]);
    s.simple("ROLLBACK").await;
    assert_ne!(f.note().await.0, "stale");
    // Control: straight to Postgres the same session's stale write lands.
    let mut d = session(&f, f.cluster.port(), e).await;
    assert!(codes(&d.simple("UPDATE sweep_state SET note = 'stale' WHERE id = 1").await).is_empty());
    assert_eq!(f.note().await.0, "stale");
}

/// Anything but CopyData, CopyDone, CopyFail, Sync or Flush while Postgres copies breaks the
/// protocol: that session ends with 08P01, the others go on.
#[tokio::test]
async fn a_query_inside_copy_ends_only_that_session() {
    let f = Fixture::new().await;
    let e = f.takeover("a").await;
    let bystander = f.leader(e).await;
    for wait in [true, false] {
        let mut s = session(&f, f.proxy.port(), e).await;
        s.send(&[parse("", COPY), bind("", "", &[]), execute(""), sync()].concat())
            .await;
        if wait {
            s.read_until(|m| m.tag == b'G').await;
        }
        s.send(&query("SELECT 1")).await;
        let rest = s.read_until(|_| false).await;
        assert_eq!(codes(&rest).last().map(String::as_str), Some("08P01"), "{rest:?}");
        assert_eq!(code(&bystander.execute(WRITE, &[]).await), "ok");
    }
}

/// Terminate inside COPY ends the session as it does straight to Postgres, which first
/// fails the COPY on it (08P01, "unexpected message type"): the client gets those replies
/// through pgfence too, and the COPY rolls back with the session.
#[tokio::test]
async fn terminate_inside_copy_just_closes() {
    let f = Fixture::new().await;
    let e = f.takeover("a").await;
    let mut seen = Vec::new();
    for port in [f.cluster.port(), f.proxy.port()] {
        let mut s = session(&f, port, e).await;
        s.send(&[parse("", COPY), bind("", "", &[]), execute(""), sync()].concat())
            .await;
        s.read_until(|m| m.tag == b'G').await;
        s.send(&message(b'X', b"")).await;
        let rest = s.read_until(|_| false).await;
        assert!(s.closed().await);
        seen.push(codes(&rest));
        // Nothing was copied.
        assert_eq!(f.audit_rows().await, 0);
    }
    assert!(
        !seen[0].is_empty() && seen[0].iter().all(|c| c == "08P01"),
        "directly: {seen:?}"
    );
    assert_eq!(seen[1], seen[0], "through pgfence");
}

/// A Sync sent while Postgres copies is ignored while the COPY runs and answered once it
/// failed, and where it failed among the client's messages cannot be seen from outside.
/// pgfence ends that session (08P01) rather than match replies blindly: before, they slid
/// by one, pgfence took a later transaction for the guarded one, and a stale write
/// committed unguarded. Straight to Postgres (the control) the session goes on, and
/// after a takeover its stale write lands.
#[tokio::test]
async fn a_sync_sent_during_a_copy_that_fails_ends_the_session() {
    let f = Fixture::new().await;
    let e = f.takeover("a").await;
    let bystander = f.leader(e).await;
    let stale = "UPDATE sweep_state SET note = 'stale' WHERE id = 1";
    for port in [f.proxy.port(), f.cluster.port()] {
        for simple in [true, false] {
            let mut s = session(&f, port, e).await;
            assert_eq!(codes(&s.simple(&format!("BEGIN; {WRITE}")).await), Vec::<String>::new());
            let start = if simple {
                query(COPY)
            } else {
                [parse("", COPY), bind("", "", &[]), execute("")].concat()
            };
            s.send(&start).await;
            s.read_until(|m| m.tag == b'G').await;
            // Two columns for one: the COPY fails on its first row, before the Sync.
            s.send(&[copy_data("a\tb\n"), sync(), copy_done(), query("ROLLBACK")].concat())
                .await;
            if port == f.proxy.port() {
                // The COPY's own error first, as Postgres sent it, then the session ends.
                let rest = s.read_until(|_| false).await;
                assert_eq!(codes(&rest), ["22P04", "08P01"], "{rest:?}");
                assert_eq!(code(&bystander.execute(WRITE, &[]).await), "ok");
                continue;
            }
            let failed = s.read_until(|m| m.tag == b'Z').await;
            assert_eq!(codes(&failed), ["22P04"]);
            if simple {
                // The Query's ReadyForQuery came with the error; this one answers the Sync.
                assert_eq!(tags(&s.read_until(|m| m.tag == b'Z').await), "Z");
            }
            assert_eq!(tags(&s.read_until(|m| m.tag == b'Z').await), "CZ", "the ROLLBACK");
            let e2 = f.takeover("b").await;
            assert!(e2 > e);
            assert!(codes(&s.simple(stale).await).is_empty());
            assert_eq!(f.note().await.0, "stale");
            f.admin
                .batch_execute("UPDATE sweep_state SET note = 'init'")
                .await
                .unwrap();
        }
    }
    // Through pgfence the same stale epoch is refused on a new session.
    let mut s = session(&f, f.proxy.port(), e).await;
    assert_eq!(codes(&s.simple(stale).await), ["PF001"]);
    assert_eq!(f.note().await.0, "init");
}

/// The same with the rows sent before Postgres said it copies: a Sync after such a row
/// counts too. Before, it was taken for the Sync sent with the COPY (read before any
/// data), the replies slid by one, and the guard of the transaction before outlived it:
/// after a takeover a stale write committed unguarded.
#[tokio::test]
async fn a_sync_after_rows_sent_before_the_copy_began_counts_too() {
    let f = Fixture::new().await;
    for simple in [true, false] {
        f.admin
            .batch_execute("UPDATE sweep_state SET note = 'init'")
            .await
            .unwrap();
        let e = f.takeover(if simple { "a" } else { "c" }).await;
        let mut s = session(&f, f.proxy.port(), e).await;
        assert_eq!(codes(&s.simple(&format!("BEGIN; {WRITE}")).await), Vec::<String>::new());
        let start = if simple {
            query(COPY)
        } else {
            [parse("", COPY), bind("", "", &[]), execute("")].concat()
        };
        s.send(&[start, copy_data("a\tb\n"), sync(), copy_done(), query("ROLLBACK")].concat())
            .await;
        let rest = s.read_until(|_| false).await;
        assert_eq!(codes(&rest), ["22P04", "08P01"], "simple: {simple}, {rest:?}");
        f.takeover("b").await;
        let mut stale = session(&f, f.proxy.port(), e).await;
        assert_eq!(
            codes(&stale.simple("UPDATE sweep_state SET note = 'stale' WHERE id = 1").await),
            ["PF001"]
        );
        assert_eq!(f.note().await.0, "init");
    }
}
