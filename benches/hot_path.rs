//! Micro-benchmarks of the per-message hot path: header framing, the session's
//! reply attribution, and statement analysis on a cache hit and a miss.
//!
//! `cargo bench --bench hot_path` (or `make bench`). Absolute times on shared
//! machines drift; compare runs of the same machine side by side.

use std::hint::black_box;

use bytes::BytesMut;
use criterion::{Criterion, criterion_group, criterion_main};
use pgfence::protocol::frame::{Body, peek_header};
use pgfence::session::DbFences;
use pgfence::session::declare::Declarations;
use pgfence::session::dispatch::Dispatcher;
use pgfence::session::state::{Shared, Unit};
use pgfence::sql::{Analyzer, FenceId, FenceSet, TableName, analyze};

fn fences() -> FenceSet {
    FenceSet::new(vec![
        (TableName::parse_config("public.pgbench_accounts").unwrap(), FenceId(0)),
        (TableName::parse_config("billing.invoices").unwrap(), FenceId(0)),
    ])
}

/// A chunk as Postgres sends it for `pgbench -S`: RowDescription, DataRow, CommandComplete, ReadyForQuery.
fn select_reply() -> Vec<u8> {
    let mut out = Vec::new();
    for (tag, body) in [
        (
            b'T',
            &b"\0\x01abalance\0\0\0\0\0\0\0\0\0\0\x17\0\x04\xff\xff\xff\xff\0\0"[..],
        ),
        (b'D', &b"\0\x01\0\0\0\x040000"[..]),
        (b'C', &b"SELECT 1\0"[..]),
        (b'Z', &b"I"[..]),
    ] {
        out.push(tag);
        out.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        out.extend_from_slice(body);
    }
    out
}

fn framing(c: &mut Criterion) {
    let chunk = select_reply();
    c.bench_function("frame/walk 4-message reply", |b| {
        b.iter(|| {
            let mut pos = 0;
            let mut n = 0;
            while let Ok(Some(h)) = peek_header(&chunk[pos..]) {
                pos += h.total_len();
                n += 1;
            }
            black_box(n)
        })
    });
    let execute = b"E\0\0\0\x09\0\0\0\0\0";
    c.bench_function("frame/parse Execute", |b| {
        b.iter(|| {
            let mut body = Body::new(&black_box(execute)[5..]);
            black_box((body.cstr(), body.i32()))
        })
    });
}

fn attribution(c: &mut Criterion) {
    let chunk = select_reply();
    c.bench_function("state/attribute a simple-query reply", |b| {
        let mut st = Shared::new(Declarations::default());
        b.iter(|| {
            st.pending.push_back(Unit::Query {
                parts: Vec::new(),
                done: 0,
                positions: None,
            });
            let mut pos = 0;
            while let Ok(Some(h)) = peek_header(&chunk[pos..]) {
                let body = &chunk[pos + 5..pos + h.total_len()];
                black_box(st.on_server_message(h.tag, Some(body)));
                pos += h.total_len();
            }
        })
    });
}

/// One `pgbench -S -M prepared` transaction as a session of a database without fences
/// handles it: the client's Bind, Execute and Sync, then Postgres' BindComplete, DataRow,
/// CommandComplete and ReadyForQuery (the DataRow streams: only its header is seen).
fn prepared_round(c: &mut Criterion) {
    let replies: [(u8, Option<&[u8]>); 4] = [
        (b'2', Some(b"")),
        (b'D', None),
        (b'C', Some(b"SELECT 1\0")),
        (b'Z', Some(b"I")),
    ];
    c.bench_function("session/prepared select round, no fences", |b| {
        let fences = std::sync::Arc::new(DbFences::for_database(std::sync::Arc::from(Vec::new()), "bench"));
        let mut disp = Dispatcher::new(fences, Declarations::default());
        let mut st = Shared::new(Declarations::default());
        let mut out = BytesMut::new();
        // The statement pgbench prepares once per session.
        let sql = "SELECT abalance FROM pgbench_accounts WHERE aid = $1;";
        disp.resync(&st);
        assert!(disp.on_parse(&mut st, "P_1", b"P_1", sql, b"\0\0", true).is_none());
        disp.on_sync(&mut st);
        for (tag, body) in [(b'1', Some(&b""[..])), (b'Z', Some(b"I"))] {
            st.on_server_message(tag, body);
        }
        b.iter(|| {
            disp.resync(&st);
            disp.on_bind(&mut st, "", "P_1", &mut out);
            st.drop_skipped();
            disp.resync(&st);
            disp.on_execute(&mut st, "", &mut out);
            st.drop_skipped();
            disp.resync(&st);
            disp.on_sync(&mut st);
            st.drop_skipped();
            for (tag, body) in replies {
                black_box(st.on_server_message(tag, body));
            }
            assert!(out.is_empty() && st.pending.is_empty());
        })
    });
}

fn analysis(c: &mut Criterion) {
    let set = fences();
    let short_read = "SELECT abalance FROM pgbench_branches WHERE bid = 42;";
    // A plain INSERT/UPDATE/DELETE/MERGE: the lexer reads its target, no parse.
    let short_write = "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = 42;";
    let ids = (0..1500).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    let long_write = format!(
        "UPDATE pgbench_accounts SET filler = '{}' WHERE aid IN ({ids});",
        "x".repeat(10_000)
    );
    // A data-modifying WITH: sqlparser parses it (and the analyzer caches the result).
    let short_cte = "WITH u AS (UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = 42 \
                     RETURNING aid) SELECT aid FROM u;";
    let long_cte = format!(
        "WITH u AS (UPDATE pgbench_accounts SET filler = '{}' WHERE aid IN ({ids}) RETURNING aid) \
         SELECT aid FROM u;",
        "x".repeat(10_000)
    );
    assert!(long_write.len() > 16_000 && long_cte.len() > 16_000);
    c.bench_function("analyze/short read, no fenced name (pre-filter)", |b| {
        b.iter(|| black_box(analyze(black_box(short_read), &set)))
    });
    c.bench_function("analyze/short plain write (lexer)", |b| {
        b.iter(|| black_box(analyze(black_box(short_write), &set)))
    });
    c.bench_function("analyze/16 KB plain write (lexer)", |b| {
        b.iter(|| black_box(analyze(black_box(&long_write), &set)))
    });
    c.bench_function("analyze/short CTE write, miss (full parse)", |b| {
        b.iter(|| black_box(analyze(black_box(short_cte), &set)))
    });
    c.bench_function("analyze/16 KB CTE write, miss (full parse)", |b| {
        b.iter(|| black_box(analyze(black_box(&long_cte), &set)))
    });
    let mut analyzer = Analyzer::new(fences());
    analyzer.analyze(short_cte);
    c.bench_function("analyze/short CTE write, cache hit", |b| {
        b.iter(|| black_box(analyzer.analyze(black_box(short_cte))))
    });
    analyzer.analyze(&long_cte);
    c.bench_function("analyze/16 KB CTE write, cache hit", |b| {
        b.iter(|| black_box(analyzer.analyze(black_box(&long_cte))))
    });
}

criterion_group!(benches, framing, attribution, prepared_round, analysis);
criterion_main!(benches);
