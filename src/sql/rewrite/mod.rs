//! Row-level fencing (`mode = "rewrite"`): a write to a rewrite-mode table is
//! rewritten so that each row carries the writer's epoch and a stale writer
//! touches no row, as in the seed design's psql transcript.
//!
//! - UPDATE: `SET col = N` (replacing any client value) and
//!   `WHERE (<client's predicate>) AND coalesce(<alias>.col, 0) <= N`, also
//!   with FROM (the column is qualified with the target's alias or name).
//! - DELETE: the predicate, also with USING.
//! - INSERT (VALUES, DEFAULT VALUES, a query): the column set to N; with
//!   `ON CONFLICT DO UPDATE`, the SET and the predicate in its WHERE.
//! - MERGE: each branch; writable CTEs: their inner statements.
//!
//! The rewrite is a set of **text edits** found with the project's lexer (the
//! client's literals, comments and `$n` parameters are kept byte for byte; only
//! what pgfence adds is printed), then **verified** by parsing the result with
//! sqlparser and checking that every data-modifying statement on a fenced
//! table carries the check (see `verify`). Anything not understood, or not
//! verified, is [`Unsupported`] (PF004): never a silent pass.

mod dml;
mod insert;
#[cfg(test)]
mod tests;
mod toks;
mod verify;

use std::collections::HashMap;
use std::sync::Arc;

use crate::fence::epoch::Epoch;
use crate::sql::lex::Lexing;
use crate::sql::name::TableName;

/// What to rewrite for: the tables of one rewrite-mode fence and its column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RewriteTarget {
    /// The fence's tables (schema-qualified); an unqualified name in SQL
    /// matches any of them by name, as the classifier does.
    pub tables: Vec<TableName>,
    /// The epoch column, normalised (folded unless it was quoted).
    pub column: String,
}

/// Why a statement cannot be rewritten; answered with PF004.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported {
    /// What pgfence could not do, for the error message.
    pub reason: String,
    /// What the client can do instead.
    pub hint: &'static str,
}

/// The hint for statement shapes the rewriter does not handle.
const SHAPE_HINT: &str = "Write rewrite-mode tables with INSERT (with a column list), UPDATE, DELETE, MERGE or \
                          INSERT … ON CONFLICT; see docs/FENCING.md.";

impl Unsupported {
    fn new(reason: String) -> Self {
        Self {
            reason,
            hint: SHAPE_HINT,
        }
    }
}

/// Rewrites one statement (no trailing `;`) for `epoch`. Pure; never panics;
/// the result parses again and carries the check on every fenced write.
pub fn rewrite(stmt_sql: &str, target: &RewriteTarget, epoch: Epoch) -> Result<String, Unsupported> {
    rewrite_lexing(stmt_sql, target, epoch, Lexing::default())
}

/// [`rewrite`] with explicit lexing rules.
pub fn rewrite_lexing(
    stmt_sql: &str,
    target: &RewriteTarget,
    epoch: Epoch,
    lexing: Lexing,
) -> Result<String, Unsupported> {
    let toks = toks::Toks::new(stmt_sql, lexing).ok_or_else(|| dml::shape("unbalanced parentheses"))?;
    refuse_commands(&toks)?;
    let mut rw = dml::Rw {
        t: &toks,
        target,
        n: epoch.to_string(),
        col: quote_ident(&target.column),
        edits: Vec::new(),
        nodes: 0,
    };
    rw.stmt(0, toks.toks.len(), 0)?;
    if rw.nodes == 0 {
        return Err(dml::shape("no INSERT, UPDATE, DELETE or MERGE on the table was found"));
    }
    let out = apply(stmt_sql, rw.edits)?;
    let verified = verify::verify(&out, target, &rw.n, &rw.col)?;
    if verified != rw.nodes {
        return Err(dml::shape("the rewritten statement could not be verified"));
    }
    Ok(out)
}

/// Commands that change a rewrite-mode table without rows to put an epoch in.
fn refuse_commands(t: &toks::Toks<'_>) -> Result<(), Unsupported> {
    let hint = "TRUNCATE, COPY … FROM, ALTER TABLE and DROP TABLE cannot carry row epochs: use DELETE or INSERT \
                through pgfence, or run the command directly against Postgres during maintenance.";
    for kw in ["truncate", "copy", "alter", "drop"] {
        if t.is(0, kw) {
            return Err(Unsupported {
                reason: format!(
                    "pgfence: {} of a rewrite-mode table cannot be fenced row by row",
                    kw.to_ascii_uppercase()
                ),
                hint,
            });
        }
    }
    Ok(())
}

/// Applies non-overlapping edits; insertions at one offset keep their order.
fn apply(sql: &str, mut edits: Vec<dml::Edit>) -> Result<String, Unsupported> {
    edits.sort_by_key(|e| e.at.start);
    let mut out = String::with_capacity(sql.len() + 64 * edits.len());
    let mut copied = 0;
    for e in edits {
        let kept = sql
            .get(copied..e.at.start)
            .ok_or_else(|| dml::shape("overlapping edits"))?;
        out.push_str(kept);
        out.push_str(&e.text);
        copied = copied.max(e.at.end);
    }
    out.push_str(sql.get(copied..).unwrap_or(""));
    Ok(out)
}

/// An identifier as SQL text, quoted only when Postgres needs the quotes.
fn quote_ident(ident: &str) -> String {
    TableName::new(None, ident).to_string()
}

/// At most this many statement texts are cached per fence.
pub const CACHE_ENTRIES: usize = 1024;
/// Epochs remembered per text: a session moves to a new epoch rarely.
const EPOCHS_PER_TEXT: usize = 4;
/// Longer texts are rewritten each time rather than cached.
pub const CACHE_MAX_TEXT: usize = 16 * 1024;

/// A cached outcome: the rewritten text, or why there is none.
type Rewritten = Result<Arc<str>, Unsupported>;

/// Rewrites for one fence, cached per (statement text, epoch), bounded.
#[derive(Debug)]
pub struct RewriteCache {
    target: RewriteTarget,
    map: HashMap<Box<str>, Vec<(Epoch, Rewritten)>>,
}

impl RewriteCache {
    /// An empty cache for `target`.
    pub fn new(target: RewriteTarget) -> Self {
        Self {
            target,
            map: HashMap::new(),
        }
    }

    /// The fence's tables and column.
    pub fn target(&self) -> &RewriteTarget {
        &self.target
    }

    /// [`rewrite`], from the cache when the same text was rewritten for the same epoch.
    pub fn rewrite(&mut self, sql: &str, epoch: Epoch) -> Result<Arc<str>, Unsupported> {
        if let Some(hit) = self.map.get(sql).and_then(|v| v.iter().find(|(e, _)| *e == epoch)) {
            return hit.1.clone();
        }
        let result = rewrite(sql, &self.target, epoch).map(Arc::from);
        if sql.len() <= CACHE_MAX_TEXT {
            if !self.map.contains_key(sql)
                && self.map.len() >= CACHE_ENTRIES
                && let Some(victim) = self.map.keys().next().cloned()
            {
                self.map.remove(&victim);
            }
            let slot = self.map.entry(sql.into()).or_default();
            if slot.len() >= EPOCHS_PER_TEXT {
                drop(slot.remove(0));
            }
            slot.push((epoch, result.clone()));
        }
        result
    }
}
