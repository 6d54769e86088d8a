//! SQL analysis on arbitrary text, with both lexing modes and a fence set with schema-qualified,
//! unqualified and quoted names. Never panics, and every statement span lies inside the text,
//! on char boundaries, in order and without overlap (the session splices guards at these
//! offsets). Time per input is bounded by running with `-timeout=…` (docs/TESTING.md).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use pgfence::sql::{FenceId, FenceSet, Lexing, TableName, analyze_lexing};

fn fences() -> &'static FenceSet {
    static FENCES: OnceLock<FenceSet> = OnceLock::new();
    FENCES.get_or_init(|| {
        FenceSet::new(vec![
            (TableName::new(Some("public"), "sweep_state"), FenceId(0)),
            (TableName::new(Some("billing"), "invoices"), FenceId(0)),
            (TableName::new(None, "Mixed Case"), FenceId(1)),
            (TableName::new(Some("public"), "events"), FenceId(1)),
        ])
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let Ok(sql) = std::str::from_utf8(rest) else {
        return;
    };
    let lexing = Lexing {
        standard_conforming_strings: flags & 1 == 0,
    };
    let analysis = analyze_lexing(sql, fences(), lexing);
    let mut end = 0;
    for stmt in &analysis.statements {
        assert!(
            stmt.span.start >= end && stmt.span.start <= stmt.span.end,
            "{:?}",
            stmt.span
        );
        assert!(
            sql.get(stmt.span.clone()).is_some(),
            "span {:?} not on char boundaries",
            stmt.span
        );
        end = stmt.span.end;
    }
});
