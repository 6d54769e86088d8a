//! Rewrite mode on arbitrary statements, both lexing modes, epochs from 1 to i64::MAX. Never
//! panics; whatever comes out parses again with sqlparser (Postgres dialect) and still names the
//! epoch column; the cache (which rewrites through literal-blind templates) answers exactly what
//! rewriting the text answers. Time per input is bounded by running with `-timeout=…`
//! (docs/TESTING.md).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use pgfence::fence::epoch::Epoch;
use pgfence::sql::rewrite::{RewriteCache, RewriteTarget, rewrite_lexing};
use pgfence::sql::{Lexing, TableName};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

fn target() -> &'static RewriteTarget {
    static TARGET: OnceLock<RewriteTarget> = OnceLock::new();
    TARGET.get_or_init(|| RewriteTarget {
        tables: vec![
            TableName::new(Some("public"), "sweep_state"),
            TableName::new(Some("billing"), "items"),
        ],
        column: "last_epoch".into(),
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
    let epoch = match flags >> 1 {
        0 => Epoch::MAX,
        n => Epoch::new(u64::from(n)).expect("1..=127 is a valid epoch"),
    };
    let direct = rewrite_lexing(sql, target(), epoch, lexing);
    if lexing.standard_conforming_strings {
        let cached = RewriteCache::new(target().clone()).rewrite(sql, epoch);
        assert_eq!(cached.as_deref().map_err(|u| &u.reason), direct.as_deref().map_err(|u| &u.reason), "{sql:?}");
    }
    if let Ok(out) = direct {
        if let Err(e) = Parser::parse_sql(&PostgreSqlDialect {}, &out) {
            panic!("the rewrite of {sql:?} does not parse: {e}\n{out}");
        }
        assert!(out.contains("last_epoch"), "{out}");
    }
});
