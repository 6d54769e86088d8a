//! Property test: random UPDATE/DELETE/INSERT shapes from a small grammar are
//! rewritten and run on a real Postgres, and compared with the hand-written
//! fenced version of the same statement.

use pgfence::fence::epoch::Epoch;
use pgfence::sql::rewrite::rewrite;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};

use super::corpus::{run, target};
use crate::common::pg::Cluster;

fn atom() -> impl Strategy<Value = String> {
    prop_oneof![
        (1..8i32).prop_map(|v| format!("id = {v}")),
        (0..8i32).prop_map(|v| format!("n > {v}")),
        Just("last_epoch IS NULL".to_owned()),
        Just("note LIKE '%a%'".to_owned()),
        Just("true".to_owned()),
        (0..10i64).prop_map(|v| format!("last_epoch = {v}")),
    ]
}

fn predicate() -> impl Strategy<Value = String> {
    atom().prop_recursive(3, 8, 2, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{a} OR {b}")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{a} AND {b}")),
            inner.prop_map(|a| format!("NOT ({a})")),
        ]
    })
}

/// (client statement, hand-written version) for epoch `e`.
fn statement(e: i64) -> impl Strategy<Value = (String, String)> {
    let chk = format!("coalesce(last_epoch, 0) <= {e}");
    let (c1, c2) = (chk.clone(), chk);
    prop_oneof![
        (predicate(), any::<bool>()).prop_map(move |(p, set_epoch)| {
            let extra = if set_epoch { ", last_epoch = 0" } else { "" };
            (
                format!("UPDATE items SET note = 'p'{extra} WHERE {p}"),
                format!("UPDATE items SET note = 'p', last_epoch = {e} WHERE ({p}) AND {c1}"),
            )
        }),
        predicate().prop_map(move |p| (format!("DELETE FROM items WHERE {p}"), format!("DELETE FROM items WHERE ({p}) AND {c2}"))),
        (1..12i32, proptest::collection::vec(20..30i32, 0..3)).prop_map(move |(id, more)| {
            let mut rows = vec![id];
            // One row per key: ON CONFLICT cannot touch a row twice in one statement.
            for m in more {
                if !rows.contains(&m) {
                    rows.push(m);
                }
            }
            let client: Vec<String> = rows.iter().map(|r| format!("({r}, 'i')")).collect();
            let hand: Vec<String> = rows.iter().map(|r| format!("({r}, 'i', {e})")).collect();
            (
                format!("INSERT INTO items (id, note) VALUES {} ON CONFLICT (id) DO UPDATE SET note = 'c' WHERE items.n > 2 OR items.id = 1", client.join(", ")),
                format!("INSERT INTO items (id, note, last_epoch) VALUES {} ON CONFLICT (id) DO UPDATE SET note = 'c', last_epoch = {e} WHERE (items.n > 2 OR items.id = 1) AND coalesce(items.last_epoch, 0) <= {e}", hand.join(", ")),
            )
        }),
    ]
}

#[tokio::test]
async fn rewrite_random_statements_match_the_hand_written_version() {
    let c = super::corpus::initialised_db(Cluster::shared()).await;
    let mut runner = TestRunner::new(Config::default());
    let cases = 96;
    for i in 0..cases {
        let e = [3i64, 5, 7, 8][i % 4];
        let (client, hand) = statement(e).new_tree(&mut runner).unwrap().current();
        let out =
            rewrite(&client, &target(), Epoch::new(e as u64).unwrap()).unwrap_or_else(|u| panic!("{client}: {u:?}"));
        let got = run(&c, &out).await;
        let want = run(&c, &hand).await;
        assert_eq!(got, want, "\nclient: {client}\nrewrite: {out}\nhand: {hand}");
    }
}
