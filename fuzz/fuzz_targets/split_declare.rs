//! The statement splitter and the epoch-declaration parser on arbitrary text: spans in order,
//! inside the text, on char boundaries; each statement parses as a declaration or not without
//! panicking, and a declared epoch is in 1..=i64::MAX.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pgfence::fence::epoch::Epoch;
use pgfence::sql::declare::parse;
use pgfence::sql::split::{first_keyword, split_with};
use pgfence::sql::{Declaration, Lexing};

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
    let mut end = 0;
    for span in split_with(sql, lexing) {
        assert!(span.start >= end && span.start <= span.end, "{span:?}");
        let stmt = sql.get(span.clone()).expect("spans lie on char boundaries");
        end = span.end;
        let _ = first_keyword(stmt);
        if let Some(Declaration::Set { value: Some(v), .. }) = parse(stmt, lexing)
            && let Ok(epoch) = Epoch::parse(&v)
        {
            assert!(epoch.as_i64() >= 1, "{v:?} gave {epoch}");
        }
    }
    // A whole text that is not split is parsed too: the parser must not rely on the splitter.
    let _ = parse(sql, lexing);
});
