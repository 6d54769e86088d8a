//! Finding where UPDATE, DELETE, MERGE and WITH need the epoch, as text edits.
//!
//! Every edit is an insertion at a token boundary or the replacement of a
//! whole token range, so the client's text (its literals, comments, `$n`
//! parameters) is kept byte for byte; only what pgfence adds is printed.

use std::ops::Range;

use super::toks::Toks;
use super::{RewriteTarget, Unsupported};
use crate::sql::name::TableName;

/// A text edit: replace `at` (empty: insert) with `text`.
#[derive(Debug, Clone)]
pub(super) struct Edit {
    pub(super) at: Range<usize>,
    pub(super) text: String,
}

/// The state of one rewrite: the tokens, the target, the edits so far.
pub(super) struct Rw<'t, 'a> {
    pub(super) t: &'t Toks<'a>,
    pub(super) target: &'t RewriteTarget,
    /// The epoch as an SQL literal.
    pub(super) n: String,
    /// The epoch column as an SQL identifier.
    pub(super) col: String,
    pub(super) edits: Vec<Edit>,
    /// Data-modifying statements on a fenced table that were rewritten.
    pub(super) nodes: usize,
}

pub(super) type Res = Result<(), Unsupported>;

/// An [`Unsupported`] for a statement shape the rewriter does not handle.
pub(super) fn shape(what: &str) -> Unsupported {
    Unsupported::new(format!("pgfence: cannot rewrite this statement soundly: {what}"))
}

/// "a TRUNCATE statement", "an EXPLAIN statement".
fn kind_of(keyword: &str) -> String {
    let article = if keyword.starts_with(['A', 'E', 'I', 'O', 'U']) {
        "an"
    } else {
        "a"
    };
    format!("{article} {keyword} statement")
}

impl Rw<'_, '_> {
    pub(super) fn insert(&mut self, at: usize, text: String) {
        self.edits.push(Edit { at: at..at, text });
    }

    pub(super) fn replace(&mut self, at: Range<usize>, text: String) {
        self.edits.push(Edit { at, text });
    }

    /// `coalesce(q.col, 0) <= N`, the row-level check, qualified with the
    /// target's alias or name (unqualified it is ambiguous in UPDATE … FROM).
    pub(super) fn pred(&self, q: usize) -> String {
        format!("coalesce({}.{}, 0) <= {}", self.t.src(q), self.col, self.n)
    }

    /// One statement in tokens `a..b` at depth `d`.
    pub(super) fn stmt(&mut self, a: usize, b: usize, d: u32) -> Res {
        let t = self.t;
        if t.punct(a, b'(') {
            // A parenthesised query cannot hold a data-modifying statement.
            return Ok(());
        }
        match () {
            () if t.is(a, "with") => self.with(a, b, d),
            () if t.is(a, "update") => self.update(a, b, d),
            () if t.is(a, "delete") => self.delete(a, b, d),
            () if t.is(a, "insert") => self.insert_stmt(a, b, d),
            () if t.is(a, "merge") => self.merge(a, b, d),
            () if t.is(a, "select") || t.is(a, "values") || t.is(a, "table") => Ok(()),
            () => Err(shape(&kind_of(&t.src(a).to_ascii_uppercase()))),
        }
    }

    /// Reads `[db.][schema.]name` at `i`: the name, its last token, the next index.
    pub(super) fn name(&self, i: usize) -> Result<(TableName, usize, usize), Unsupported> {
        let t = self.t;
        let mut parts = vec![t.ident(i).ok_or_else(|| shape("an unreadable table name"))?];
        let mut j = i + 1;
        while t.punct(j, b'.') {
            parts.push(t.ident(j + 1).ok_or_else(|| shape("an unreadable table name"))?);
            j += 2;
        }
        let name = parts.pop().unwrap_or_default();
        Ok((
            TableName {
                schema: parts.pop(),
                name,
            },
            j - 1,
            j,
        ))
    }

    /// The target of UPDATE, DELETE FROM or MERGE INTO at `i`: `[ONLY] name`, or
    /// `ONLY (name)` as Postgres' grammar also has it. As [`Self::name`]; the next index
    /// is past the closing parenthesis.
    fn target(&self, i: usize) -> Result<(TableName, usize, usize), Unsupported> {
        let t = self.t;
        if !t.is(i, "only") {
            return self.name(i);
        }
        if !t.punct(i + 1, b'(') {
            return self.name(i + 1);
        }
        let (name, last, j) = self.name(i + 2)?;
        if !t.punct(j, b')') {
            return Err(shape("an unreadable table name"));
        }
        Ok((name, last, j + 1))
    }

    pub(super) fn fenced(&self, name: &TableName) -> bool {
        self.target.tables.iter().any(|t| name.may_refer_to(t))
    }

    /// After the target name at `j` (`ONLY` and `*` handled): an optional
    /// `[AS] alias`. Returns the qualifier token and the next index.
    fn alias(&self, mut j: usize, last: usize, stop: &[&str]) -> Result<(usize, usize), Unsupported> {
        let t = self.t;
        if t.punct(j, b'*') {
            j += 1;
        }
        if t.is(j, "as") {
            t.ident(j + 1).ok_or_else(|| shape("an unreadable alias"))?;
            return Ok((j + 1, j + 2));
        }
        if t.ident(j).is_some() && !stop.iter().any(|k| t.is(j, k)) {
            return Ok((j, j + 1));
        }
        Ok((last, j))
    }

    fn expect(&self, i: usize, kw: &str) -> Res {
        if self.t.is(i, kw) {
            Ok(())
        } else {
            Err(shape(&format!(
                "expected {} at {:?}",
                kw.to_ascii_uppercase(),
                self.t.src(i)
            )))
        }
    }

    fn update(&mut self, a: usize, b: usize, d: u32) -> Res {
        let t = self.t;
        let (name, last, j) = self.target(a + 1)?;
        if !self.fenced(&name) {
            return Ok(());
        }
        let (q, j) = self.alias(j, last, &["set"])?;
        self.expect(j, "set")?;
        let set_end = t.clause(j + 1, b, d, &["from", "where", "returning"]).unwrap_or(b);
        self.assignments(j + 1, set_end, d)?;
        let ret = t.clause(set_end, b, d, &["returning"]).unwrap_or(b);
        let wh = t.clause(set_end, ret, d, &["where"]);
        self.where_clause(wh, ret, q)?;
        self.nodes += 1;
        Ok(())
    }

    fn delete(&mut self, a: usize, b: usize, d: u32) -> Res {
        let t = self.t;
        self.expect(a + 1, "from")?;
        let (name, last, j) = self.target(a + 2)?;
        if !self.fenced(&name) {
            return Ok(());
        }
        let (q, j) = self.alias(j, last, &["using", "where", "returning"])?;
        let ret = t.clause(j, b, d, &["returning"]).unwrap_or(b);
        let wh = t.clause(j, ret, d, &["where"]);
        self.where_clause(wh, ret, q)?;
        self.nodes += 1;
        Ok(())
    }

    /// `WHERE cond` becomes `WHERE (cond) AND pred`; no WHERE gets `WHERE pred`
    /// after the last token before `end`.
    pub(super) fn where_clause(&mut self, wh: Option<usize>, end: usize, q: usize) -> Res {
        let t = self.t;
        let pred = self.pred(q);
        match wh {
            Some(w) if w + 1 >= end => Err(shape("an empty WHERE")),
            Some(w) if t.is(w + 1, "current") && t.is(w + 2, "of") => Err(shape("WHERE CURRENT OF")),
            Some(w) => {
                self.insert(t.start(w + 1), "(".into());
                self.insert(t.end(end - 1), format!(") AND {pred}"));
                Ok(())
            }
            None => {
                self.insert(t.end(end - 1), format!(" WHERE {pred}"));
                Ok(())
            }
        }
    }

    /// The assignments of a SET in `s..e`: the client's value for the epoch
    /// column is replaced, else `, col = N` is appended.
    pub(super) fn assignments(&mut self, s: usize, e: usize, d: u32) -> Res {
        let t = self.t;
        let mut found = 0;
        for item in t.items(s, e, d) {
            if item.is_empty() {
                return Err(shape("an empty assignment"));
            }
            if t.punct(item.start, b'(') {
                let close = t.close(item.start).ok_or_else(|| shape("an unbalanced SET"))?;
                let names_col = (item.start + 1..close).any(|k| self.is_col(k));
                if names_col {
                    return Err(shape("the epoch column in a multiple-column assignment"));
                }
            } else if self.is_col(item.start) {
                if !t.punct(item.start + 1, b'=') {
                    return Err(shape("an assignment to a part of the epoch column"));
                }
                found += 1;
                self.value(item.start + 2..item.end)?;
            }
        }
        match found {
            0 => {
                self.insert(t.end(e - 1), format!(", {} = {}", self.col, self.n));
                Ok(())
            }
            1 => Ok(()),
            _ => Err(shape("several assignments to the epoch column")),
        }
    }

    /// Whether token `k` is the epoch column's name.
    pub(super) fn is_col(&self, k: usize) -> bool {
        self.t.ident(k).is_some_and(|c| c == self.target.column)
    }

    /// Replaces the client's value expression `r` for the epoch column by the
    /// epoch. The expression is kept, never evaluated (`CASE WHEN false THEN <it> ELSE
    /// N::BIGINT END`, folded away when Postgres plans the statement): the statement still
    /// has, and Postgres can infer the types of, the client's parameters, and Postgres still
    /// analyses it, so a mistake in it (a column or type that does not exist, a value that
    /// is not a number) fails the statement as it would without pgfence. `DEFAULT`, which
    /// only stands alone, is replaced.
    pub(super) fn value(&mut self, r: Range<usize>) -> Res {
        let t = self.t;
        if r.is_empty() {
            return Err(shape("an empty value for the epoch column"));
        }
        let span = t.start(r.start)..t.end(r.end - 1);
        if r.len() == 1 && t.is(r.start, "default") {
            self.replace(span, self.n.clone());
        } else {
            self.insert(span.start, "CASE WHEN false THEN ".into());
            self.insert(span.end, format!(" ELSE {}::BIGINT END", self.n));
        }
        Ok(())
    }

    fn merge(&mut self, a: usize, b: usize, d: u32) -> Res {
        let t = self.t;
        self.expect(a + 1, "into")?;
        let (name, last, j) = self.target(a + 2)?;
        if !self.fenced(&name) {
            return Ok(());
        }
        let (q, j) = self.alias(j, last, &["using"])?;
        let ret = t.clause(j, b, d, &["returning"]).unwrap_or(b);
        let whens: Vec<usize> = (j..ret).filter(|&k| t.depth(k) == d && t.is(k, "when")).collect();
        if whens.is_empty() {
            return Err(shape("a MERGE without WHEN"));
        }
        for (n, &w) in whens.iter().enumerate() {
            let end = whens.get(n + 1).copied().unwrap_or(ret);
            self.when(w, end, d, q)?;
        }
        self.nodes += 1;
        Ok(())
    }

    /// One `WHEN … THEN action` of a MERGE, tokens `w..end`.
    fn when(&mut self, w: usize, end: usize, d: u32, q: usize) -> Res {
        let t = self.t;
        let mut k = w + 1;
        // Branches that act on an existing target row need the row check.
        let target_row = if t.is(k, "matched") {
            k += 1;
            true
        } else if t.is(k, "not") && t.is(k + 1, "matched") {
            k += 2;
            let by_source = t.is(k, "by") && t.is(k + 1, "source");
            if t.is(k, "by") {
                k += 2;
            }
            by_source
        } else {
            return Err(shape("an unknown MERGE WHEN clause"));
        };
        let then = t
            .clause(k, end, d, &["then"])
            .ok_or_else(|| shape("a WHEN without THEN"))?;
        let cond = if t.is(k, "and") {
            Some(k + 1..then)
        } else if k == then {
            None
        } else {
            return Err(shape("an unknown MERGE WHEN condition"));
        };
        let act = then + 1;
        let pred = self.pred(q);
        let add_check = |rw: &mut Self| match &cond {
            Some(c) if c.is_empty() => Err(shape("an empty WHEN condition")),
            Some(c) => {
                rw.insert(t.start(c.start), "(".into());
                rw.insert(t.end(c.end - 1), format!(") AND {pred}"));
                Ok(())
            }
            None => {
                rw.insert(t.end(then - 1), format!(" AND {pred}"));
                Ok(())
            }
        };
        if t.is(act, "do") && t.is(act + 1, "nothing") {
            Ok(())
        } else if target_row && t.is(act, "update") {
            self.expect(act + 1, "set")?;
            self.assignments(act + 2, end, d)?;
            add_check(self)
        } else if target_row && t.is(act, "delete") {
            add_check(self)
        } else if !target_row && t.is(act, "insert") {
            self.merge_insert(act + 1, end, d)
        } else {
            Err(shape("an unknown MERGE action"))
        }
    }

    fn with(&mut self, a: usize, b: usize, d: u32) -> Res {
        let t = self.t;
        let mut i = a + 1 + usize::from(t.is(a + 1, "recursive"));
        loop {
            t.ident(i).ok_or_else(|| shape("an unreadable CTE name"))?;
            i += 1;
            if t.punct(i, b'(') {
                i = t.close(i).ok_or_else(|| shape("an unbalanced CTE"))? + 1;
            }
            self.expect(i, "as")?;
            i += 1;
            if t.is(i, "not") && t.is(i + 1, "materialized") {
                i += 2;
            } else if t.is(i, "materialized") {
                i += 1;
            }
            if !t.punct(i, b'(') {
                return Err(shape("an unknown CTE form"));
            }
            let close = t.close(i).ok_or_else(|| shape("an unbalanced CTE"))?;
            self.stmt(i + 1, close, d + 1)?;
            i = close + 1;
            if t.is(i, "search") || t.is(i, "cycle") {
                return Err(shape("a CTE with SEARCH or CYCLE"));
            }
            if !t.punct(i, b',') {
                break;
            }
            i += 1;
        }
        self.stmt(i, b, d)
    }
}
