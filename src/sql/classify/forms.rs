//! Statement forms read with the lexer rather than sqlparser: the ones whose
//! shape is a fixed prefix (`PREPARE`, `EXECUTE`, `DEALLOCATE`, `EXPLAIN`,
//! `COPY`) and the fallback for DML that sqlparser cannot parse.

use std::iter::Peekable;
use std::ops::Range;

use super::{Ctx, Hits, SavepointOp, StmtKind};
use crate::sql::lex::{Lexer, Lexing, Token, TokenKind, ident_value, uescape_char, unicode_ident_value};
use crate::sql::name::TableName;

/// A peekable token stream over one statement's text.
struct Cur<'a> {
    text: &'a str,
    toks: Peekable<Lexer<'a>>,
}

impl<'a> Cur<'a> {
    fn new(text: &'a str, lexing: Lexing) -> Self {
        Self {
            text,
            toks: Lexer::new(text, lexing).peekable(),
        }
    }

    fn peek_is_word(&mut self, kw: &str) -> bool {
        let text = self.text;
        self.toks.peek().is_some_and(|t| t.is_word(text, kw))
    }

    fn eat_word(&mut self, kw: &str) -> bool {
        let hit = self.peek_is_word(kw);
        if hit {
            self.toks.next();
        }
        hit
    }

    fn eat_punct(&mut self, b: u8) -> bool {
        let hit = self.toks.peek().is_some_and(|t| t.is_punct(b));
        if hit {
            self.toks.next();
        }
        hit
    }

    /// After an opening `(` was eaten: skips to just after its `)`.
    fn skip_parens(&mut self) -> bool {
        let mut depth = 1usize;
        for t in self.toks.by_ref() {
            if t.is_punct(b'(') {
                depth += 1;
            } else if t.is_punct(b')') {
                depth -= 1;
                if depth == 0 {
                    return true;
                }
            }
        }
        false
    }

    /// An identifier (statement name), normalised.
    fn ident(&mut self) -> Option<String> {
        let t = self
            .toks
            .next_if(|t| matches!(t.kind, TokenKind::Word | TokenKind::QuotedIdent))?;
        ident_value(self.text, &t)
    }

    /// An identifier, or a `U&"…"` one with its optional `UESCAPE 'c'`, decoded
    /// as Postgres does. `None` if there is none or it cannot be decoded (a
    /// `U&"…"` one may then have been consumed): a table name that cannot be
    /// read fails closed.
    fn decoded_ident(&mut self) -> Option<String> {
        let text = self.text;
        let Some(t) = self.toks.next_if(|t| t.kind == TokenKind::UnicodeIdent) else {
            return self.ident();
        };
        let mut escape = '\\';
        if self.eat_word("uescape") {
            escape = uescape_char(text, &self.toks.next()?)?;
        }
        unicode_ident_value(text, &t, escape)
    }

    /// A possibly qualified name, each part maybe `U&"…"`; `None` if absent or
    /// unreadable (see [`Self::name_part`]).
    fn name(&mut self) -> Option<TableName> {
        let mut parts = vec![self.name_part()?];
        while self.eat_punct(b'.') {
            parts.push(self.name_part()?);
        }
        let name = parts.pop()?;
        Some(TableName {
            schema: parts.pop(),
            name,
        })
    }

    /// One part of a table name: an identifier, or a `U&"…"` one that decodes to ASCII.
    /// Beyond ASCII, the name Postgres makes of the code points depends on the server
    /// encoding (some encodings give two code points one character), so it fails closed.
    fn name_part(&mut self) -> Option<String> {
        let unicode = self.toks.peek().is_some_and(|t| t.kind == TokenKind::UnicodeIdent);
        self.decoded_ident().filter(|v| !unicode || v.is_ascii())
    }

    /// Where the next token starts, relative to the text.
    fn rest(&mut self) -> Option<usize> {
        self.toks.peek().map(|t| t.span.start)
    }

    fn done(&mut self) -> bool {
        self.toks.peek().is_none()
    }
}

/// `AND CHAIN` (not `AND NO CHAIN`) after `COMMIT`, `ROLLBACK` and the like: a new
/// transaction block starts as the old one ends.
fn and_chain(c: &mut Cur) -> bool {
    c.eat_word("and") && !c.eat_word("no") && c.eat_word("chain")
}

fn sub(span: &Range<usize>, rel: Range<usize>) -> Range<usize> {
    span.start + rel.start..span.start + rel.end
}

impl Ctx<'_> {
    /// `PREPARE name [(types)] AS stmt`; `PREPARE TRANSACTION 'gid'` is 2PC.
    pub(super) fn prepare(&mut self, span: Range<usize>, depth: usize) -> StmtKind {
        let mut c = Cur::new(self.text(&span), self.lexing);
        c.toks.next();
        // `PREPARE TRANSACTION 'gid'` (two-phase commit) ends the transaction; without the
        // string, `transaction` is the name of an ordinary prepared statement.
        if c.peek_is_word("transaction") {
            let gid = Cur::new(self.text(&span), self.lexing).toks.nth(2).is_some_and(|t| {
                matches!(
                    t.kind,
                    TokenKind::String | TokenKind::EscapeString | TokenKind::UnicodeString | TokenKind::DollarString
                )
            });
            if gid {
                return StmtKind::EndTransaction {
                    commit: true,
                    chain: false,
                    two_phase: true,
                };
            }
        }
        let Some(name) = c.decoded_ident() else {
            return self.unanalysable_if_named(&span);
        };
        if c.eat_punct(b'(') && !c.skip_parens() {
            return self.unanalysable_if_named(&span);
        }
        match (c.eat_word("as"), c.rest()) {
            (true, Some(start)) => {
                let inner = self.classify(sub(&span, start..span.len()), depth + 1);
                StmtKind::Prepare {
                    name,
                    inner: Box::new(inner),
                }
            }
            _ => self.unanalysable_if_named(&span),
        }
    }

    /// `COMMIT`, `END` and `ABORT` (`[WORK | TRANSACTION] [AND [NO] CHAIN]`); `COMMIT
    /// PREPARED` ends no transaction of this session (it cannot run inside one).
    pub(super) fn end_transaction(&self, span: &Range<usize>, first: &str) -> StmtKind {
        let mut c = Cur::new(self.text(span), self.lexing);
        c.toks.next();
        if c.peek_is_word("prepared") {
            return StmtKind::Other;
        }
        let _ = c.eat_word("work") || c.eat_word("transaction");
        StmtKind::EndTransaction {
            commit: first != "abort",
            chain: and_chain(&mut c),
            two_phase: false,
        }
    }

    /// `SAVEPOINT name`, `RELEASE [SAVEPOINT] name` and
    /// `ROLLBACK [WORK | TRANSACTION] TO [SAVEPOINT] name`. Any other ROLLBACK ends the
    /// transaction (`ROLLBACK PREPARED` ends none of this session's); anything
    /// unreadable is `Other`, which Postgres' command tags cover.
    pub(super) fn savepoint(&self, span: &Range<usize>, first: &str) -> StmtKind {
        let mut c = Cur::new(self.text(span), self.lexing);
        c.toks.next();
        let op: fn(String) -> SavepointOp = match first {
            "savepoint" => SavepointOp::Define,
            "release" => SavepointOp::Release,
            _ => {
                if c.peek_is_word("prepared") {
                    return StmtKind::Other;
                }
                let _ = c.eat_word("work") || c.eat_word("transaction");
                if !c.eat_word("to") {
                    return StmtKind::EndTransaction {
                        commit: false,
                        chain: and_chain(&mut c),
                        two_phase: false,
                    };
                }
                SavepointOp::RollbackTo
            }
        };
        // The keyword SAVEPOINT is optional after RELEASE and TO, and is also a valid
        // savepoint name: `RELEASE savepoint` releases the one named "savepoint".
        // A name pgfence cannot read as Postgres will (a `U&"…"` whose escape character is
        // itself escaped, `UESCAPE E'\041'`) may still name a savepoint: read as anything
        // else, a `ROLLBACK TO` would look like a rollback of the whole transaction, and
        // the declarations it keeps would be lost. It may do anything (refused, PF004),
        // where there are fences.
        let unreadable = if self.fences.is_empty() {
            StmtKind::Other
        } else {
            StmtKind::Unanalysable { fences: Vec::new() }
        };
        let keyword = first != "savepoint" && c.eat_word("savepoint");
        let name = if keyword && c.done() {
            "savepoint".to_owned()
        } else if c.done() {
            // No name: a syntax error.
            return StmtKind::Other;
        } else {
            match c.decoded_ident() {
                Some(name) => name,
                None => return unreadable,
            }
        };
        if c.done() {
            StmtKind::Savepoint(op(name))
        } else {
            unreadable
        }
    }

    /// `EXECUTE name [(args)]`.
    pub(super) fn execute(&self, span: &Range<usize>) -> StmtKind {
        let mut c = Cur::new(self.text(span), self.lexing);
        c.toks.next();
        match c.decoded_ident() {
            Some(name) => StmtKind::Execute { name },
            None => self.unanalysable_if_named(span),
        }
    }

    /// SQL `FETCH` or `MOVE`: it can run a portal the client bound with the protocol,
    /// whose statement may be a fenced write (`INSERT … RETURNING` runs at its first
    /// fetch). The cursor name is the statement's last word; every identifier in it is
    /// kept, so a direction keyword read as a name only widens the check. `None` in the
    /// list stands for a name that cannot be read (a `U&"…"` one with a bad escape).
    pub(super) fn fetch(&self, span: &Range<usize>) -> StmtKind {
        let mut c = Cur::new(self.text(span), self.lexing);
        c.toks.next();
        let mut portals = Vec::new();
        while let Some(t) = c.toks.peek() {
            if matches!(
                t.kind,
                TokenKind::Word | TokenKind::QuotedIdent | TokenKind::UnicodeIdent
            ) {
                let unicode = t.kind == TokenKind::UnicodeIdent;
                match c.decoded_ident() {
                    Some(name) => portals.push(Some(name)),
                    None if unicode => portals.push(None),
                    None => {}
                }
            } else {
                c.toks.next();
            }
        }
        StmtKind::Fetch { portals }
    }

    /// `CLOSE {name | ALL}`.
    pub(super) fn close(&self, span: &Range<usize>) -> StmtKind {
        let mut c = Cur::new(self.text(span), self.lexing);
        c.toks.next();
        if c.peek_is_word("all") {
            c.toks.next();
            if c.done() {
                return StmtKind::Close { portal: None };
            }
            return StmtKind::Other;
        }
        match c.decoded_ident() {
            Some(portal) if c.done() => StmtKind::Close { portal: Some(portal) },
            _ => StmtKind::Other,
        }
    }

    /// `DEALLOCATE [PREPARE] {name | ALL}`. A name that cannot be read is
    /// refused (every fence, PF004): it could be one of pgfence's statements,
    /// which a client must not drop and replace with its own.
    pub(super) fn deallocate(&self, span: &Range<usize>) -> StmtKind {
        let mut c = Cur::new(self.text(span), self.lexing);
        c.toks.next();
        let prepare = c.peek_is_word("prepare");
        if prepare {
            c.toks.next();
            if c.done() {
                return StmtKind::Deallocate {
                    name: Some("prepare".to_owned()),
                };
            }
        }
        if c.peek_is_word("all") {
            return StmtKind::Deallocate { name: None };
        }
        match c.decoded_ident() {
            Some(name) => StmtKind::Deallocate { name: Some(name) },
            None => Hits {
                all: true,
                ..Hits::default()
            }
            .into_unanalysable(self.fences),
        }
    }

    /// `EXPLAIN [ANALYZE] [VERBOSE] stmt` / `EXPLAIN (option [value], …) stmt`:
    /// only with ANALYZE does the statement run.
    pub(super) fn explain(&mut self, span: Range<usize>, depth: usize) -> StmtKind {
        let mut c = Cur::new(self.text(&span), self.lexing);
        c.toks.next();
        let mut analyze = false;
        if c.eat_punct(b'(') {
            match explain_options(&mut c) {
                Some(a) => analyze = a,
                None => return self.unanalysable_if_named(&span),
            }
        } else {
            while c.peek_is_word("analyze") || c.peek_is_word("analyse") || c.peek_is_word("verbose") {
                analyze |= !c.peek_is_word("verbose");
                c.toks.next();
            }
        }
        let Some(start) = c.rest() else { return StmtKind::Other };
        if !analyze {
            return StmtKind::Other;
        }
        match self.classify(sub(&span, start..span.len()), depth + 1) {
            k @ (StmtKind::Write { .. } | StmtKind::Unanalysable { .. } | StmtKind::Execute { .. }) => k,
            _ => StmtKind::Other,
        }
    }

    /// `COPY table [(cols)] FROM …` writes; `COPY … TO` reads, unless it is
    /// `COPY (INSERT/UPDATE/DELETE … RETURNING) TO`.
    pub(super) fn copy(&mut self, span: Range<usize>, depth: usize) -> StmtKind {
        let text = self.text(&span);
        let mut c = Cur::new(text, self.lexing);
        c.toks.next();
        if c.eat_punct(b'(') {
            let Some(start) = c.rest() else { return StmtKind::Other };
            let mut end = None;
            let mut open = 1usize;
            for t in c.toks.by_ref() {
                if t.is_punct(b'(') {
                    open += 1;
                } else if t.is_punct(b')') {
                    open -= 1;
                    if open == 0 {
                        end = Some(t.span.start);
                        break;
                    }
                }
            }
            let Some(end) = end else {
                return self.unanalysable_if_named(&span);
            };
            return match self.classify(sub(&span, start..end), depth + 1) {
                k @ (StmtKind::Write { .. } | StmtKind::Unanalysable { .. }) => k,
                _ => StmtKind::Other,
            };
        }
        c.eat_word("binary");
        let Some(name) = c.name() else {
            return self.unanalysable_if_named(&span);
        };
        if c.eat_punct(b'(') && !c.skip_parens() {
            return self.unanalysable_if_named(&span);
        }
        if c.eat_word("to") {
            StmtKind::Other
        } else if c.eat_word("from") {
            let mut hits = Hits::default();
            hits.name(&name, self.fences);
            hits.into_write(self.fences)
        } else {
            self.unanalysable_if_named(&span)
        }
    }
}

/// Reads `option [value], … )` after `EXPLAIN (`; returns whether ANALYZE
/// may be on (the last ANALYZE option decides, as in Postgres). `None` if
/// unbalanced.
///
/// Option names are identifiers: `"analyze"` is ANALYZE too. A name that only
/// may be ANALYZE (`"ANALYZE"`, which Postgres refuses, or an undecodable
/// `U&"…"`) can turn it on but never off; a value counts as off only in a
/// spelling Postgres reads as false, anything else as on (fail closed).
fn explain_options(c: &mut Cur<'_>) -> Option<bool> {
    let text = c.text;
    let mut analyze = false;
    loop {
        let name = c.decoded_ident();
        let exact = name.as_deref().is_some_and(|n| n == "analyze" || n == "analyse");
        let maybe = name
            .as_deref()
            .is_none_or(|n| n.eq_ignore_ascii_case("analyze") || n.eq_ignore_ascii_case("analyse"));
        // The value: the tokens up to the next `,` or `)`; false only as one token, or as a
        // signed zero (`-0`, which Postgres' grammar reads as the integer 0).
        let (mut value, mut tokens, mut signed) = (None, 0usize, false);
        let end = loop {
            let t = c.toks.next()?;
            if t.is_punct(b',') || t.is_punct(b')') {
                break t;
            }
            if t.is_punct(b'(') {
                return None;
            }
            tokens += 1;
            if tokens == 1 {
                signed = t.is_punct(b'-') || t.is_punct(b'+');
            }
            value = Some(t);
        };
        let zero = |v: &Token| v.kind == TokenKind::Number && is_false(text, v);
        let off = match tokens {
            1 => value.as_ref().is_some_and(|v| is_false(text, v)),
            2 => signed && value.as_ref().is_some_and(zero),
            _ => false,
        };
        if exact {
            analyze = !off;
        } else if maybe && !off {
            analyze = true;
        }
        if end.is_punct(b')') {
            return Some(analyze);
        }
    }
}

/// Whether a boolean option value is one Postgres' `defGetBoolean` reads as
/// false: `false` or `off` as a word, quoted identifier or plain string (any
/// case), or the integer `0`.
fn is_false(text: &str, v: &Token) -> bool {
    let raw = text.get(v.span.clone()).unwrap_or("");
    let word = match v.kind {
        // An integer zero (`0`, `00`); `0.0` is a float, which Postgres refuses here.
        TokenKind::Number => return !raw.is_empty() && raw.bytes().all(|b| b == b'0'),
        TokenKind::Word | TokenKind::QuotedIdent => ident_value(text, v),
        TokenKind::String => raw
            .strip_prefix('\'')
            .and_then(|r| r.strip_suffix('\''))
            .map(str::to_owned),
        _ => None,
    };
    word.is_some_and(|w| w.eq_ignore_ascii_case("false") || w.eq_ignore_ascii_case("off"))
}

/// How a `CREATE` statement stands to `CREATE TABLE … AS EXECUTE name`, which runs a
/// prepared statement.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum AsExecute {
    /// It is one, of this statement name.
    Is(String),
    /// It is none: the statement is read for what it is.
    No,
    /// A `CREATE … TABLE` with the words `AS EXECUTE` outside parentheses that is not
    /// in the grammar's shape: what it runs cannot be told, so it fails closed.
    Unreadable,
}

/// Reads `CREATE [GLOBAL | LOCAL] [TEMP | TEMPORARY | UNLOGGED] TABLE [IF NOT EXISTS] name
/// [(columns)] [USING method] [WITH (options) | WITHOUT OIDS] [ON COMMIT …] [TABLESPACE ts]
/// AS EXECUTE name [(args)] [WITH [NO] DATA]`, Postgres' grammar for it, token by token
/// from the start. The words `AS EXECUTE` anywhere else are something else (a column
/// named `execute`), and taking the statement for an `EXECUTE` would leave the rest of it
/// unread: a data-modifying `WITH` before them would run unguarded.
pub(super) fn as_execute(text: &str, lexing: Lexing) -> AsExecute {
    match as_execute_strict(text, lexing) {
        Some(Some(name)) => AsExecute::Is(name),
        Some(None) => AsExecute::No,
        // Not in the shape read above: only a CREATE … TABLE that holds the words at the
        // top level might still be one, in a form this reader does not know.
        None if creates_table_with_as_execute(text, lexing) => AsExecute::Unreadable,
        None => AsExecute::No,
    }
}

/// `Some(Some(name))`: the statement is `CREATE TABLE … AS EXECUTE name`; `Some(None)`: its
/// `AS` is followed by a query, or it is no `CREATE … TABLE`; `None`: not read to its end.
fn as_execute_strict(text: &str, lexing: Lexing) -> Option<Option<String>> {
    let mut c = Cur::new(text, lexing);
    if !create_table(&mut c) {
        return Some(None);
    }
    // `if` is unreserved: without `NOT` after it, it is the table's (or schema's) name.
    let mut named = false;
    if c.eat_word("if") {
        if !c.eat_word("not") {
            named = true;
        } else if !c.eat_word("exists") {
            return None;
        }
    }
    if !named && !skip_name(&mut c) {
        return None;
    }
    while c.eat_punct(b'.') {
        if !skip_name(&mut c) {
            return None;
        }
    }
    if c.eat_punct(b'(') && !c.skip_parens() {
        return None;
    }
    if c.eat_word("using") && !skip_name(&mut c) {
        return None;
    }
    if c.eat_word("with") {
        if !(c.eat_punct(b'(') && c.skip_parens()) {
            return None;
        }
    } else if c.eat_word("without") && !c.eat_word("oids") {
        return None;
    }
    if c.eat_word("on") {
        let action = c.eat_word("commit")
            && (c.eat_word("drop") || (c.eat_word("delete") || c.eat_word("preserve")) && c.eat_word("rows"));
        if !action {
            return None;
        }
    }
    if c.eat_word("tablespace") && !skip_name(&mut c) {
        return None;
    }
    if !c.eat_word("as") {
        return None;
    }
    if !c.eat_word("execute") {
        return Some(None);
    }
    let name = c.decoded_ident()?;
    if c.eat_punct(b'(') && !c.skip_parens() {
        return None;
    }
    if c.eat_word("with") {
        let _ = c.eat_word("no");
        if !c.eat_word("data") {
            return None;
        }
    }
    c.done().then_some(Some(name))
}

/// Skips one part of a name: an identifier, or a `U&"…"` one with its `UESCAPE 'c'`.
fn skip_name(c: &mut Cur) -> bool {
    let Some(t) = c.toks.next() else {
        return false;
    };
    match t.kind {
        TokenKind::Word | TokenKind::QuotedIdent => true,
        TokenKind::UnicodeIdent => !c.eat_word("uescape") || c.toks.next().is_some(),
        _ => false,
    }
}

/// Eats `CREATE [GLOBAL | LOCAL] [TEMP | TEMPORARY | UNLOGGED] TABLE`, if the statement
/// starts so.
fn create_table(c: &mut Cur) -> bool {
    if !c.eat_word("create") {
        return false;
    }
    let _ = c.eat_word("global") || c.eat_word("local");
    let _ = c.eat_word("temp") || c.eat_word("temporary") || c.eat_word("unlogged");
    c.eat_word("table")
}

/// Whether a statement starts as [`create_table`] reads and holds `AS EXECUTE` outside
/// parentheses.
fn creates_table_with_as_execute(text: &str, lexing: Lexing) -> bool {
    let mut c = Cur::new(text, lexing);
    if !create_table(&mut c) {
        return false;
    }
    let mut depth = 0usize;
    while let Some(t) = c.toks.next() {
        if t.is_punct(b'(') {
            depth += 1;
        } else if t.is_punct(b')') {
            depth = depth.saturating_sub(1);
        } else if depth == 0 && t.is_word(text, "as") && c.peek_is_word("execute") {
            return true;
        }
    }
    false
}

/// Whether a statement sqlparser could not parse only defines an object that reads a
/// table's rows or describes them: `CREATE [OR REPLACE] [TEMP] [RECURSIVE] VIEW` (Postgres
/// refuses a data-modifying WITH in a view), `CREATE MATERIALIZED VIEW` (likewise; pg_dump
/// writes each one `… WITH NO DATA`, which sqlparser does not read), `CREATE STATISTICS`,
/// `CREATE PUBLICATION`. Without any data-modifying keyword, for good measure.
pub(super) fn defines_a_reader(text: &str, lexing: Lexing) -> bool {
    let mut c = Cur::new(text, lexing);
    if !c.eat_word("create") {
        return false;
    }
    let defines = if c.eat_word("statistics") || c.eat_word("publication") {
        true
    } else if c.eat_word("materialized") {
        c.eat_word("view")
    } else {
        if c.eat_word("or") && !c.eat_word("replace") {
            return false;
        }
        let _ = c.eat_word("temp") || c.eat_word("temporary");
        let _ = c.eat_word("recursive");
        c.eat_word("view")
    };
    defines && !has_dml_keyword(text, lexing)
}

/// Whether a statement sqlparser could not parse only creates a new table from a column
/// list: `CREATE [GLOBAL | LOCAL] [TEMP | TEMPORARY | UNLOGGED] TABLE [IF NOT EXISTS] name
/// ( … ) …`, such as `(LIKE t INCLUDING ALL)`, which copies a table's shape and writes
/// nothing of it. Not when the new table joins another's rows (`INHERITS`; `PARTITION OF`
/// stands where the column list would), not `… AS query`, and not with any
/// data-modifying keyword.
pub(super) fn creates_a_table(text: &str, lexing: Lexing) -> bool {
    let mut c = Cur::new(text, lexing);
    if !create_table(&mut c) {
        return false;
    }
    if c.eat_word("if") && !(c.eat_word("not") && c.eat_word("exists")) {
        return false;
    }
    if c.name().is_none() || !c.eat_punct(b'(') || !c.skip_parens() {
        return false;
    }
    let after = c.toks.all(|t| !t.is_word(text, "inherits") && !t.is_word(text, "as"));
    after && !has_dml_keyword(text, lexing)
}

/// Whether a data-modifying keyword appears outside strings. Only `FOR UPDATE`
/// and `FOR NO KEY UPDATE` are row locks: `key` alone is a legal column name,
/// and `… CYCLE n SET c USING key UPDATE t …` runs an UPDATE (`FOR` is
/// reserved, so it cannot end a WITH clause that way).
pub(super) fn has_dml_keyword(text: &str, lexing: Lexing) -> bool {
    // The three tokens before the current one, the last one last.
    let mut prev: [Option<Token>; 3] = [None, None, None];
    for t in Lexer::new(text, lexing) {
        if t.kind == TokenKind::Word {
            let is = |i: usize, kw: &str| prev[i].as_ref().is_some_and(|p| p.is_word(text, kw));
            let lock = t.is_word(text, "update") && (is(2, "for") || (is(0, "for") && is(1, "no") && is(2, "key")));
            let dml = ["insert", "update", "delete", "merge", "truncate", "copy"]
                .iter()
                .any(|k| t.is_word(text, k));
            if dml && !lock {
                return true;
            }
        }
        prev.rotate_left(1);
        prev[2] = Some(t);
    }
    false
}

/// Whether a DROP or ALTER may change fenced tables it does not name: `DROP
/// OWNED BY` drops whatever a role owns, and `CASCADE` also drops or alters
/// what depends on the objects named, such as the columns of a type or domain
/// (`DROP TYPE mood CASCADE`), a table's foreign keys or the tables of a
/// composite type (`ALTER TYPE … CASCADE`). Any word `cascade` counts: one
/// that is a name only makes the statement count as a write to every fence.
///
/// An extension's members can be tables: `DROP EXTENSION` drops them, and `ALTER EXTENSION
/// … SET SCHEMA` moves them out of their fences' names. (Its other forms add or remove
/// members, or run an update script, which pgfence sees no more than a function's body.)
pub(super) fn reaches_unnamed(text: &str, lexing: Lexing) -> bool {
    let mut c = Cur::new(text, lexing);
    let drop = c.peek_is_word("drop");
    c.toks.next();
    if c.eat_word("extension") {
        return drop || moves_extension(&mut c, text);
    }
    c.peek_is_word("owned") || c.toks.any(|t| t.is_word(text, "cascade"))
}

/// Whether the rest of an `ALTER EXTENSION`, after the word EXTENSION, is `name SET SCHEMA`.
fn moves_extension(c: &mut Cur<'_>, text: &str) -> bool {
    c.toks.next();
    c.eat_word("set") && c.toks.next().is_some_and(|t| t.is_word(text, "schema"))
}

/// Whether a CREATE or ALTER makes a subscription write: its initial copy and then its
/// apply worker write every local table of the publications' names, in transactions of
/// their own, long after this statement and whoever led when it ran (`CREATE
/// SUBSCRIPTION`, `ALTER SUBSCRIPTION … ENABLE | REFRESH PUBLICATION | SET/ADD/DROP
/// PUBLICATION`, which refresh by default). No guard can check those writes. The other
/// forms (`DISABLE`, `OWNER TO`, `RENAME TO`, `SET (slot_name = NONE)`, …) start none.
pub(super) fn starts_a_subscription(text: &str, lexing: Lexing) -> bool {
    let mut c = Cur::new(text, lexing);
    let create = c.peek_is_word("create");
    c.toks.next();
    if !c.eat_word("subscription") {
        return false;
    }
    if create {
        // pg_dump writes `WITH (connect = false)`: no slot, no copy, no worker.
        return !option_off(text, lexing, "connect") && !option_off(text, lexing, "enabled");
    }
    c.toks.next();
    c.eat_word("enable")
        || c.eat_word("refresh")
        || ((c.eat_word("set") || c.eat_word("add") || c.eat_word("drop"))
            && c.peek_is_word("publication")
            && !option_off(text, lexing, "refresh"))
}

/// Whether `text` sets the option `name` to false in a `WITH (…)` list: `name = false`
/// (or `off`, `0`, as a word, number or string).
fn option_off(text: &str, lexing: Lexing, name: &str) -> bool {
    let toks: Vec<_> = Lexer::new(text, lexing).collect();
    toks.windows(3).any(|w| {
        let value = text
            .get(w[2].span.clone())
            .unwrap_or("")
            .trim_matches('\'')
            .to_ascii_lowercase();
        w[0].is_word(text, name) && w[1].is_punct(b'=') && matches!(value.as_str(), "false" | "off" | "0")
    })
}

/// Whether an ALTER changes an object that is not a table and cannot reach one's rows or
/// definition: `ALTER SEQUENCE … OWNED BY t.col` (which pg_dump writes for every serial
/// column) ties a sequence to a table, and `ALTER PUBLICATION … ADD TABLE t` only lists
/// it for replication. (`CASCADE` is handled before this.)
pub(super) fn alters_a_sequence_or_publication(text: &str, lexing: Lexing) -> bool {
    let mut c = Cur::new(text, lexing);
    c.eat_word("alter") && (c.eat_word("sequence") || c.eat_word("publication"))
}

/// The tables a DML/DDL statement sqlparser could not parse changes, read
/// from its fixed prefix: `INSERT INTO t`, `UPDATE [ONLY] t`, `DELETE FROM
/// [ONLY] t`, `MERGE INTO [ONLY] t`, `ALTER TABLE [IF EXISTS] [ONLY] t`,
/// `DROP TABLE [IF EXISTS] t, …`, `TRUNCATE [TABLE] [ONLY] t [*], … [CASCADE]`
/// (`ONLY (t)` too).
/// `None` when the prefix is not one of these or a name is unreadable.
pub(super) fn dml_targets(text: &str, lexing: Lexing) -> Option<(Vec<TableName>, bool)> {
    let mut c = Cur::new(text, lexing);
    let first = c.toks.next()?;
    let kw = |k: &str| first.is_word(text, k);
    let list = if kw("insert") {
        c.eat_word("into").then_some(())?;
        false
    } else if kw("update") {
        false
    } else if kw("delete") {
        c.eat_word("from").then_some(())?;
        false
    } else if kw("merge") {
        c.eat_word("into").then_some(())?;
        false
    } else if kw("alter") {
        // `INHERIT`, `ATTACH` and `DETACH PARTITION` link the target to a table this reading
        // does not follow: leave the statement to the callers' fail-closed reading.
        let mut words = Cur::new(text, lexing)
            .toks
            .filter(|t| t.kind == TokenKind::Word)
            .peekable();
        while let Some(t) = words.next() {
            let partition = words.peek().is_some_and(|n| n.is_word(text, "partition"));
            if t.is_word(text, "inherit") || (t.is_word(text, "attach") || t.is_word(text, "detach")) && partition {
                return None;
            }
        }
        c.eat_word("table").then_some(())?;
        if c.eat_word("if") && !c.eat_word("exists") {
            return None;
        }
        false
    } else if kw("drop") {
        c.eat_word("table").then_some(())?;
        if c.eat_word("if") && !c.eat_word("exists") {
            return None;
        }
        true
    } else if kw("truncate") {
        c.eat_word("table");
        true
    } else {
        return None;
    };
    let mut names = Vec::new();
    loop {
        // `ONLY (t)`: Postgres takes the name in parentheses after ONLY.
        let parenthesized = c.eat_word("only") && c.eat_punct(b'(');
        names.push(c.name()?);
        if parenthesized && !c.eat_punct(b')') {
            return None;
        }
        c.eat_punct(b'*');
        if !(list && c.eat_punct(b',')) {
            break;
        }
    }
    let cascade = kw("truncate") && c.toks.any(|t| t.is_word(text, "cascade"));
    Some((names, cascade))
}
