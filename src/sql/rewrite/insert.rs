//! INSERT (VALUES, DEFAULT VALUES, a query, ON CONFLICT) and MERGE's INSERT
//! action: the epoch column is set to the epoch in every new row.
//!
//! Postgres assigns values to columns by position, so the column list is
//! required (without it the epoch column's position is unknown: PF004).

use std::ops::Range;

use super::Unsupported;
use super::dml::{Res, Rw, shape};
use crate::sql::lex::TokenKind;

/// The `(a, b, …)` column list at tokens `open..=close`.
struct Cols {
    close: usize,
    len: usize,
    /// Position of the epoch column, if listed.
    col: Option<usize>,
}

/// Words that start a query, so `INSERT INTO t (SELECT …)` is not a column list.
const QUERY_START: &[&str] = &["select", "values", "with", "table"];

/// Clause keywords that end a SELECT's output list.
const AFTER_PROJECTION: &[&str] = &[
    "from", "into", "where", "group", "having", "window", "order", "limit", "offset", "fetch", "for",
];

impl Rw<'_, '_> {
    fn cols(&self, open: usize) -> Result<Cols, Unsupported> {
        let t = self.t;
        let close = t.close(open).ok_or_else(|| shape("an unbalanced column list"))?;
        let items = t.items(open + 1, close, t.depth(open) + 1);
        let mut col = None;
        for (k, item) in items.iter().enumerate() {
            if item.len() != 1 || t.ident(item.start).is_none() {
                return Err(shape("a column list entry that is not a plain column name"));
            }
            if self.is_col(item.start) {
                if col.is_some() {
                    return Err(shape("the epoch column listed twice"));
                }
                col = Some(k);
            }
        }
        Ok(Cols {
            close,
            len: items.len(),
            col,
        })
    }

    /// Adds the epoch column to a list that lacks it.
    fn add_col(&mut self, cols: &Cols) {
        if cols.col.is_none() {
            let at = self.t.end(cols.close - 1);
            self.insert(at, format!(", {}", self.col));
        }
    }

    /// One VALUES row `(…)` at `open..=close`.
    fn row(&mut self, open: usize, close: usize, cols: &Cols) -> Res {
        let t = self.t;
        let items = t.items(open + 1, close, t.depth(open) + 1);
        if items.len() != cols.len || items.iter().any(Range::is_empty) {
            return Err(shape("a VALUES row whose length differs from the column list"));
        }
        match cols.col {
            Some(k) => {
                let item = items[k].clone();
                if item.len() == 1 && t.is(item.start, "default") {
                    self.replace(t.start(item.start)..t.end(item.start), self.n.clone());
                    Ok(())
                } else {
                    self.value(item)
                }
            }
            None => {
                self.insert(t.end(close - 1), format!(", {}", self.n));
                Ok(())
            }
        }
    }

    /// `DEFAULT VALUES` at `i` becomes `(col) VALUES (N)`.
    fn default_values(&mut self, i: usize) {
        let t = self.t;
        let text = format!("({}) VALUES ({})", self.col, self.n);
        self.replace(t.start(i)..t.end(i + 1), text);
    }

    /// `VALUES (…), (…)` from `i`; returns the index after the last row.
    fn values(&mut self, i: usize, cols: &Cols) -> Result<usize, Unsupported> {
        let t = self.t;
        let mut r = i + 1;
        loop {
            if !t.punct(r, b'(') {
                return Err(shape("a VALUES list pgfence cannot read"));
            }
            let close = t.close(r).ok_or_else(|| shape("an unbalanced VALUES row"))?;
            self.row(r, close, cols)?;
            r = close + 1;
            if !t.punct(r, b',') {
                return Ok(r);
            }
            r += 1;
        }
    }

    pub(super) fn insert_stmt(&mut self, a: usize, b: usize, d: u32) -> Res {
        let t = self.t;
        if !t.is(a + 1, "into") {
            return Err(shape("INSERT without INTO"));
        }
        let (name, last, mut j) = self.name(a + 2)?;
        if !self.fenced(&name) {
            return Ok(());
        }
        let q = if t.is(j, "as") {
            j += 2;
            j - 1
        } else {
            last
        };
        let cols = if t.punct(j, b'(') && !QUERY_START.iter().any(|k| t.is(j + 1, k)) && !t.punct(j + 1, b'(') {
            let c = self.cols(j)?;
            j = c.close + 1;
            Some(c)
        } else {
            None
        };
        if t.is(j, "overriding") {
            j += 3;
        }
        let ret = t.clause(j, b, d, &["returning"]).unwrap_or(b);
        // `ON CONFLICT` followed by what the clause can start with: `ON conflict.id = …` of a
        // join with a table or alias named `conflict` is no upsert.
        let on = (j..ret).find(|&k| {
            t.depth(k) == d
                && t.is(k, "on")
                && t.is(k + 1, "conflict")
                && (t.punct(k + 2, b'(') || t.is(k + 2, "on") || t.is(k + 2, "do"))
        });
        let src_end = on.unwrap_or(ret);
        let need_cols =
            || shape("an INSERT without a column list (name the columns, the epoch column's position is unknown)");
        if t.is(j, "default") && t.is(j + 1, "values") {
            if cols.is_some() || j + 2 != src_end {
                return Err(shape("DEFAULT VALUES with a column list"));
            }
            self.default_values(j);
        } else if t.is(j, "values") {
            let cols = cols.ok_or_else(need_cols)?;
            if self.values(j, &cols)? != src_end {
                return Err(shape(
                    "VALUES combined with UNION, INTERSECT or EXCEPT, or followed by ORDER BY, LIMIT or OFFSET \
                     (write the rows as a SELECT)",
                ));
            }
            self.add_col(&cols);
        } else {
            let cols = cols.ok_or_else(need_cols)?;
            if j >= src_end {
                return Err(shape("an INSERT without rows"));
            }
            self.insert_query(j, src_end, d, &cols)?;
        }
        if let Some(on) = on {
            self.on_conflict(on, ret, d, q)?;
        }
        self.nodes += 1;
        Ok(())
    }

    /// `INSERT … (cols) <query>`: a plain SELECT (also in parentheses or after a WITH
    /// list, see [`Self::rows_query`]) gets `, N` appended to its output
    /// list, or its output for a listed epoch column replaced (see [`Self::own_output`]);
    /// any other query is wrapped: `SELECT q.*, N FROM (<query>) AS q` (so Postgres still
    /// refuses a query with more or fewer outputs than columns), or, when the list names
    /// the epoch column, `SELECT q.c1, …, N FROM (<query>) AS q (c1, …)`, where outputs
    /// beyond the list go unused (FENCING.md). Rewriting in place keeps Postgres' reading
    /// of the query: it types `$n` and untyped literals in a SELECT by the columns they go
    /// to, and inside the wrapper they would be text.
    fn insert_query(&mut self, s: usize, e: usize, d: u32, cols: &Cols) -> Res {
        let (qs, qe, qd) = self.rows_query(s, e, d);
        if let Some((p, end)) = self.simple_projection(qs, qe, qd) {
            match cols.col {
                None => {
                    self.insert(self.t.end(end - 1), format!(", {}", self.n));
                    self.add_col(cols);
                    return Ok(());
                }
                Some(k) => {
                    if let Some(item) = self.own_output(qs..qe, p..end, qd, cols.len, k) {
                        return self.value(item);
                    }
                }
            }
        }
        let t = self.t;
        if cols.col.is_none() {
            self.insert(t.start(s), format!("SELECT pgfence_q.*, {} FROM (", self.n));
            self.insert(t.end(e - 1), ") AS pgfence_q".to_owned());
            self.add_col(cols);
            return Ok(());
        }
        let mut outputs = Vec::with_capacity(cols.len + 1);
        for k in 0..cols.len {
            outputs.push(if cols.col == Some(k) {
                self.n.clone()
            } else {
                format!("pgfence_q.pgfence_c{}", k + 1)
            });
        }
        let aliases: Vec<String> = (1..=cols.len).map(|k| format!("pgfence_c{k}")).collect();
        self.insert(t.start(s), format!("SELECT {} FROM (", outputs.join(", ")));
        self.insert(t.end(e - 1), format!(") AS pgfence_q ({})", aliases.join(", ")));
        self.add_col(cols);
        Ok(())
    }

    /// The query that makes an INSERT's rows, `s..e` at depth `d`, with what Postgres reads
    /// around it peeled off: parentheses around the whole query, and a WITH list before its
    /// SELECT. So `(SELECT …)` and `WITH c AS (…) SELECT …` are edited in place like a plain
    /// SELECT, and keep Postgres' typing of their outputs. (A WITH list inside an INSERT's
    /// query holds no data-modifying statement: Postgres refuses one there.)
    fn rows_query(&self, mut s: usize, mut e: usize, mut d: u32) -> (usize, usize, u32) {
        let t = self.t;
        loop {
            if e > s + 1 && t.punct(s, b'(') && t.close(s) == Some(e - 1) {
                (s, e, d) = (s + 1, e - 1, d + 1);
            } else if t.is(s, "with") {
                match t.clause(s + 1, e, d, &["select"]) {
                    Some(k) => s = k,
                    None => return (s, e, d),
                }
            } else {
                return (s, e, d);
            }
        }
    }

    /// The output (tokens) of the simple SELECT `query` (output list `outputs`) that goes
    /// to the `k`-th of `len` listed columns, when replacing it changes nothing but that
    /// column's value: one token (a `$n`, a literal or NULL, so no alias), one output per
    /// column (no `*`), and no DISTINCT, GROUP BY, HAVING or ORDER BY, which the value could
    /// change the rows (or their order) of.
    fn own_output(
        &self,
        query: Range<usize>,
        outputs: Range<usize>,
        d: u32,
        len: usize,
        k: usize,
    ) -> Option<Range<usize>> {
        let t = self.t;
        // ORDER BY may name the output by position: a constant there changes the order, and
        // with LIMIT the rows.
        let grouped = t
            .clause(outputs.end, query.end, d, &["group", "having", "order"])
            .is_some();
        if t.is(query.start + 1, "distinct") || grouped {
            return None;
        }
        let items = t.items(outputs.start, outputs.end, d);
        if items.len() != len || items.iter().any(|i| i.is_empty() || t.src(i.end - 1) == "*") {
            return None;
        }
        // A parameter, a literal or NULL: what Postgres types by the column. Anything else (a name
        // may be an ungrouped column beside an aggregate) is left to the wrapper, which keeps
        // Postgres' own error for it.
        let value = |i: usize| {
            t.is(i, "null")
                || t.toks.get(i).is_some_and(|tok| {
                    matches!(
                        tok.kind,
                        TokenKind::Param
                            | TokenKind::Number
                            | TokenKind::String
                            | TokenKind::EscapeString
                            | TokenKind::UnicodeString
                            | TokenKind::DollarString
                    )
                })
        };
        items.get(k).filter(|i| i.len() == 1 && value(i.start)).cloned()
    }

    /// For `SELECT [ALL | DISTINCT [ON (…)]] items …` with no set operation,
    /// where the output list starts and the index just after it.
    fn simple_projection(&self, s: usize, e: usize, d: u32) -> Option<(usize, usize)> {
        let t = self.t;
        if !t.is(s, "select") || t.clause(s, e, d, &["union", "intersect", "except"]).is_some() {
            return None;
        }
        let mut p = s + 1;
        if t.is(p, "all") {
            p += 1;
        } else if t.is(p, "distinct") {
            p += 1;
            if t.is(p, "on") {
                p = t.close(p + 1)? + 1;
            }
        }
        // `WITHIN GROUP (…)` of an ordered-set aggregate is in the list, not a GROUP BY.
        let mut from = p;
        let end = loop {
            match t.clause(from, e, d, AFTER_PROJECTION) {
                Some(k) if k > p && t.is(k, "group") && t.is(k - 1, "within") => from = k + 1,
                Some(k) => break k,
                None => break e,
            }
        };
        (end > p).then_some((p, end))
    }

    /// `ON CONFLICT … DO UPDATE SET … [WHERE …]`: the column set and the row check.
    fn on_conflict(&mut self, on: usize, ret: usize, d: u32, q: usize) -> Res {
        let t = self.t;
        let act = t
            .clause(on + 2, ret, d, &["do"])
            .ok_or_else(|| shape("ON CONFLICT without DO"))?;
        if t.is(act + 1, "nothing") {
            return Ok(());
        }
        if !(t.is(act + 1, "update") && t.is(act + 2, "set")) {
            return Err(shape("an unknown ON CONFLICT action"));
        }
        // A target named or aliased `excluded` shares its name with the row proposed for
        // insertion: a column qualified with it is ambiguous (42P09), and unqualified too.
        if t.ident(q).is_none_or(|name| name == "excluded") {
            return Err(shape("ON CONFLICT DO UPDATE on a target named excluded"));
        }
        let wh = t.clause(act + 3, ret, d, &["where"]);
        self.assignments(act + 3, wh.unwrap_or(ret), d)?;
        self.where_clause(wh, ret, q)
    }

    /// MERGE's `INSERT [(cols)] [OVERRIDING …] {VALUES (…) | DEFAULT VALUES}`.
    pub(super) fn merge_insert(&mut self, mut i: usize, end: usize, _d: u32) -> Res {
        let t = self.t;
        let cols = if t.punct(i, b'(') {
            let c = self.cols(i)?;
            i = c.close + 1;
            Some(c)
        } else {
            None
        };
        if t.is(i, "overriding") {
            i += 3;
        }
        if t.is(i, "default") && t.is(i + 1, "values") && cols.is_none() && i + 2 == end {
            self.default_values(i);
            return Ok(());
        }
        let cols = cols.ok_or_else(|| shape("a MERGE INSERT without a column list"))?;
        if !t.is(i, "values") || self.values(i, &cols)? != end {
            return Err(shape("a MERGE INSERT pgfence cannot read"));
        }
        self.add_col(&cols);
        Ok(())
    }
}
