//! Splitting a simple-Query string into its top-level statements.
//!
//! Postgres parses a whole Query message before it runs any of it, so the
//! spans here only have to agree with its grammar on texts it accepts: a `;`
//! ends a statement unless it is inside a string, a quoted identifier, a
//! comment, parentheses (`CREATE RULE … DO (a; b)`) or the `BEGIN ATOMIC … END`
//! body of a `CREATE FUNCTION` / `CREATE PROCEDURE`. The body rule is the one
//! psql uses: in a statement that starts `CREATE [OR REPLACE] FUNCTION|PROCEDURE`,
//! `BEGIN` and `CASE` open a block and `END` closes one. A text where this
//! heuristic merges statements the server would split, or splits one it would
//! not (`begin` as a parameter name, `SELECT 1 AS end` in a body), would be
//! misread: [`split_checked`] says when the rule was used, and the classifier
//! then takes the whole text as one statement that fails closed.

use std::ops::Range;

use super::lex::{Lexer, Lexing, TokenKind};

/// Splits `sql` into statement spans, in order, with the default lexing.
///
/// Each span runs from the first to the last token of a statement: leading
/// and trailing whitespace and comments and the terminating `;` are outside
/// it. Pieces with no tokens are dropped.
pub fn split(sql: &str) -> Vec<Range<usize>> {
    split_with(sql, Lexing::default())
}

/// [`split`] with explicit lexing rules (see [`Lexing`]).
pub fn split_with(sql: &str, lexing: Lexing) -> Vec<Range<usize>> {
    split_checked(sql, lexing).0
}

/// Statements told apart in one text; a text with more is taken whole (see [`split_checked`]).
pub const MAX_STATEMENTS: usize = 100_000;

/// [`split_with`], and whether the spans may not be Postgres' statements: the
/// `BEGIN`/`CASE`/`END` rule of routine bodies decided anything, or the text has more than
/// [`MAX_STATEMENTS`] (the last span then runs to the end).
pub fn split_checked(sql: &str, lexing: Lexing) -> (Vec<Range<usize>>, bool) {
    let mut out: Vec<Range<usize>> = Vec::new();
    let mut cur = Piece::default();
    let mut uncertain = false;
    // Past MAX_STATEMENTS the rest joins the last span: one message of millions of
    // statements (`a;a;…` within max_message_size) would otherwise cost a record each.
    let push = |out: &mut Vec<Range<usize>>, span: Range<usize>| {
        if out.len() < MAX_STATEMENTS {
            out.push(span);
            false
        } else {
            if let Some(last) = out.last_mut() {
                last.end = span.end;
            }
            true
        }
    };
    for tok in Lexer::new(sql, lexing) {
        if tok.kind == TokenKind::Punct(b';') && cur.parens == 0 && cur.blocks == 0 {
            uncertain |= cur.blocky;
            if let Some(span) = cur.span.take() {
                uncertain |= push(&mut out, span);
            }
            cur = Piece::default();
            continue;
        }
        match &mut cur.span {
            Some(span) => span.end = tok.span.end,
            None => cur.span = Some(tok.span.clone()),
        }
        match tok.kind {
            TokenKind::Punct(b'(') => cur.parens += 1,
            TokenKind::Punct(b')') => cur.parens = cur.parens.saturating_sub(1),
            TokenKind::Word => cur.word(sql.get(tok.span).unwrap_or("")),
            _ => {}
        }
    }
    uncertain |= cur.blocky;
    if let Some(span) = cur.span {
        uncertain |= push(&mut out, span);
    }
    (out, uncertain)
}

/// The statement being accumulated.
#[derive(Default)]
struct Piece {
    span: Option<Range<usize>>,
    parens: usize,
    /// Open `BEGIN`/`CASE` blocks of a routine body.
    blocks: usize,
    /// A `BEGIN`, `CASE` or `END` was counted.
    blocky: bool,
    words: usize,
    starts_with_create: bool,
    routine: bool,
}

impl Piece {
    fn word(&mut self, w: &str) {
        self.words += 1;
        let is = |kw: &str| w.eq_ignore_ascii_case(kw);
        if self.words == 1 {
            self.starts_with_create = is("create");
        } else if self.starts_with_create && !self.routine && self.words <= 4 {
            self.routine = is("function") || is("procedure");
        } else if self.routine {
            if is("begin") || is("case") {
                self.blocks += 1;
                self.blocky = true;
            } else if is("end") {
                self.blocks = self.blocks.saturating_sub(1);
                self.blocky = true;
            }
        }
    }
}

/// The first keyword of a statement, lower-cased (`None` if the statement
/// does not start with a word, e.g. `(SELECT 1)`).
pub fn first_keyword(stmt: &str) -> Option<String> {
    first_word(stmt, Lexing::default()).map(str::to_ascii_lowercase)
}

/// The first word of `stmt` as written, without allocating.
pub(crate) fn first_word(stmt: &str, lexing: Lexing) -> Option<&str> {
    let tok = Lexer::new(stmt, lexing).next()?;
    if tok.kind == TokenKind::Word {
        stmt.get(tok.span)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pieces(sql: &str) -> Vec<&str> {
        split(sql).into_iter().map(|r| &sql[r]).collect()
    }

    #[test]
    fn splits_on_top_level_semicolons_only() {
        let cases: &[(&str, &[&str])] = &[
            ("", &[]),
            (" ; ;; -- x\n ; /* ; */", &[]),
            ("SELECT 1; SELECT 2;", &["SELECT 1", "SELECT 2"]),
            ("SELECT ';'; SELECT 'it''s;'", &["SELECT ';'", "SELECT 'it''s;'"]),
            ("SELECT E'\\';'; x", &["SELECT E'\\';'", "x"]),
            (
                "SELECT $$;$$; SELECT $a$ $$; $a$",
                &["SELECT $$;$$", "SELECT $a$ $$; $a$"],
            ),
            ("SELECT \";\"; x", &["SELECT \";\"", "x"]),
            ("SELECT 1 -- ;\n; x", &["SELECT 1", "x"]),
            ("SELECT /* /* ; */ ; */ 1; x", &["SELECT /* /* ; */ ; */ 1", "x"]),
            ("/* lead */ SELECT 1 /* trail */", &["SELECT 1"]),
            (
                "CREATE RULE r AS ON INSERT TO t DO (DELETE FROM a; DELETE FROM b); x",
                &["CREATE RULE r AS ON INSERT TO t DO (DELETE FROM a; DELETE FROM b)", "x"],
            ),
            ("SELECT 'open; x", &["SELECT 'open; x"]),
            ("SELECT 1; /* open ; x", &["SELECT 1"]),
            ("SELECT 'ü;'; é", &["SELECT 'ü;'", "é"]),
        ];
        for (sql, want) in cases {
            assert_eq!(&pieces(sql), want, "{sql:?}");
        }
    }

    #[test]
    fn the_routine_body_rule_is_reported_when_it_decides() {
        let uncertain = |sql: &str| split_checked(sql, Lexing::default()).1;
        // Postgres reads these otherwise: `AS end` is a column label, `begin` a parameter.
        assert!(uncertain(
            "CREATE FUNCTION f() RETURNS void LANGUAGE sql BEGIN ATOMIC SELECT 1 AS end; UPDATE t SET a = 1; END; SELECT 1"
        ));
        assert!(uncertain(
            "CREATE FUNCTION f(begin int) RETURNS int LANGUAGE sql AS 'select 1'; DEALLOCATE x"
        ));
        // Bodies in strings, and other statements, never use the rule.
        assert!(!uncertain(
            "CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$BEGIN RETURN 1; END$$; BEGIN; END"
        ));
        assert!(!uncertain("SELECT CASE WHEN true THEN 1 END; BEGIN; COMMIT"));
    }

    #[test]
    fn begin_atomic_bodies_stay_whole() {
        let f = "CREATE OR REPLACE FUNCTION f() RETURNS int LANGUAGE sql \
                 BEGIN ATOMIC SELECT CASE WHEN true THEN 1 END; SELECT 2; END";
        assert_eq!(pieces(&format!("{f}; BEGIN; COMMIT")), vec![f, "BEGIN", "COMMIT"]);
        let p = "CREATE PROCEDURE p() BEGIN ATOMIC INSERT INTO t VALUES (1); END";
        assert_eq!(pieces(&format!("{p};SELECT 1")), vec![p, "SELECT 1"]);
        // BEGIN as a transaction command is not a block.
        assert_eq!(pieces("BEGIN; SELECT 1; END;"), vec!["BEGIN", "SELECT 1", "END"]);
    }

    #[test]
    fn first_keyword_is_lowercased() {
        assert_eq!(first_keyword("  /* c */ UpDaTe t").as_deref(), Some("update"));
        assert_eq!(first_keyword("(SELECT 1)"), None);
        assert_eq!(first_keyword("-- only"), None);
    }

    proptest! {
        #[test]
        fn spans_are_ordered_in_bounds_and_nonempty(sql in any::<String>()) {
            let spans = split(&sql);
            let mut last = 0;
            for s in &spans {
                prop_assert!(s.start >= last && s.start < s.end && s.end <= sql.len());
                prop_assert!(sql.is_char_boundary(s.start) && sql.is_char_boundary(s.end));
                last = s.end;
            }
        }

        #[test]
        fn joining_statements_splits_back(
            parts in proptest::collection::vec(
                prop_oneof![
                    Just("SELECT 1".to_owned()),
                    Just("SELECT ';'".to_owned()),
                    Just("SELECT $t$ ; $t$".to_owned()),
                    Just("SELECT \"a;b\" /* ; */ FROM t".to_owned()),
                    Just("INSERT INTO t VALUES ('x'';', E'\\';')".to_owned()),
                    Just("CREATE FUNCTION f() BEGIN ATOMIC SELECT 1; END".to_owned()),
                    "[a-z]{1,8}( [a-z0-9]{1,8}){0,4}",
                ],
                0..8,
            ),
            sep in prop_oneof![Just(";"), Just(" ; "), Just(";\n-- c\n"), Just("; /* ; */ ")],
        ) {
            let sql = parts.join(sep);
            prop_assert_eq!(pieces(&sql), parts.iter().map(String::as_str).collect::<Vec<_>>());
        }

        #[test]
        fn each_piece_splits_to_itself(sql in "[a-z' ;$\"/*\\-\n()E]{0,40}") {
            for span in split(&sql) {
                let piece = &sql[span];
                // Lexing is context-free from a token start, so a piece
                // re-splits to exactly itself.
                prop_assert_eq!(split(piece), vec![0..piece.len()]);
            }
        }
    }
}
