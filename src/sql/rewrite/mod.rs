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

use std::ops::Range;
use std::sync::Arc;

use crate::fence::epoch::Epoch;
use crate::sql::cache::BoundedMap;
use crate::sql::lex::{Lexer, Lexing, TokenKind};
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
                          INSERT ... ON CONFLICT; see docs/FENCING.md.";

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
    rewrite_with_edits(stmt_sql, target, epoch, lexing).map(|(out, _)| out)
}

/// Where a byte of a rewrite comes from (see [`rewrite_source`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source {
    /// The byte offset in the client's statement; for text the rewrite added, where it
    /// was added.
    pub byte: usize,
    /// Whether the byte is in text the rewrite added.
    pub added: bool,
}

/// For a byte offset in the rewrite of `stmt_sql` (found by `sent_byte` in the rewritten
/// text), where in `stmt_sql` it comes from. `None` when the statement cannot be rewritten
/// or the offset is not found.
pub fn rewrite_source(
    stmt_sql: &str,
    target: &RewriteTarget,
    epoch: Epoch,
    lexing: Lexing,
    sent_byte: impl FnOnce(&str) -> Option<usize>,
) -> Option<Source> {
    let (out, edits) = rewrite_with_edits(stmt_sql, target, epoch, lexing).ok()?;
    let mut at = sent_byte(&out)?;
    let client = |byte| Source { byte, added: false };
    // As `apply` built `out`: the client's text up to each edit, then the edit's text.
    let mut copied = 0;
    for e in &edits {
        let kept = e.at.start.saturating_sub(copied);
        if at < kept {
            return Some(client(copied + at));
        }
        at -= kept;
        if at < e.text.len() {
            return Some(Source {
                byte: e.at.start,
                added: true,
            });
        }
        at -= e.text.len();
        copied = copied.max(e.at.end);
    }
    Some(client(copied + at))
}

/// Longer statements are not rewritten: verifying one means parsing it whole with
/// sqlparser, about 2 s per MB here, and that would stall every session on the runtime's
/// thread. The classifier's limit for sqlparser, for the same reason.
pub const MAX_REWRITE_BYTES: usize = crate::sql::classify::MAX_PARSE_BYTES;

/// The rewrite and the edits that made it from `stmt_sql`, sorted by position.
fn rewrite_with_edits(
    stmt_sql: &str,
    target: &RewriteTarget,
    epoch: Epoch,
    lexing: Lexing,
) -> Result<(String, Vec<dml::Edit>), Unsupported> {
    if stmt_sql.len() > MAX_REWRITE_BYTES {
        return Err(Unsupported {
            reason: format!(
                "pgfence: a statement of {} bytes is too long to rewrite and verify (at most {} KiB)",
                stmt_sql.len(),
                MAX_REWRITE_BYTES / 1024
            ),
            hint: "Write rewrite-mode tables in shorter statements: fewer rows per INSERT, or bind parameters.",
        });
    }
    let toks = toks::Toks::new(stmt_sql, lexing).ok_or_else(|| dml::shape("unbalanced parentheses"))?;
    refuse_commands(&toks)?;
    let mut rw = dml::Rw {
        t: &toks,
        target,
        n: epoch_text(epoch),
        col: quote_ident(&target.column),
        edits: Vec::new(),
        nodes: 0,
    };
    rw.stmt(0, toks.toks.len(), 0)?;
    if rw.nodes == 0 {
        return Err(dml::shape("no INSERT, UPDATE, DELETE or MERGE on the table was found"));
    }
    let mut edits = rw.edits;
    edits.sort_by_key(|e| e.at.start);
    separate(stmt_sql, &mut edits);
    let out = apply(stmt_sql, &edits)?;
    let verified = verify::verify(&crate::sql::lex::for_sqlparser(&out, lexing), target, &rw.n, &rw.col)?;
    if verified != rw.nodes {
        return Err(dml::shape("the rewritten statement could not be verified"));
    }
    Ok((out, edits))
}

/// How a rewrite writes `epoch`: as a constant of the type `pgfence.epoch` (schema version
/// 10), so that Postgres refuses the statement when the database has no such schema
/// (pgfence reports PF005), also when it analyses a prepared statement again after the schema
/// was dropped. The planner folds the cast.
pub fn epoch_text(epoch: Epoch) -> String {
    format!("{epoch}::{EPOCH_TYPE}")
}

/// The type of [`epoch_text`], created by `pgfence init`.
pub const EPOCH_TYPE: &str = "pgfence.epoch";

/// Commands that change a rewrite-mode table without rows to put an epoch in.
fn refuse_commands(t: &toks::Toks<'_>) -> Result<(), Unsupported> {
    let hint = "TRUNCATE, COPY ... FROM, ALTER TABLE and DROP TABLE cannot carry row epochs: use DELETE or INSERT \
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

/// Puts a space between an edit's text and a word or number it would touch: Postgres
/// reads `'x'WHERE` as a string and a keyword, but `5WHERE` as a number with trailing junk.
fn separate(sql: &str, edits: &mut [dml::Edit]) {
    let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$' || !c.is_ascii());
    for i in 0..edits.len() {
        let at = edits[i].at.clone();
        let before = match i.checked_sub(1).map(|j| &edits[j]) {
            Some(prev) if prev.at.end == at.start && !prev.text.is_empty() => prev.text.chars().next_back(),
            _ => sql.get(..at.start).and_then(|s| s.chars().next_back()),
        };
        let after = match edits.get(i + 1) {
            Some(next) if next.at.start == at.end && !next.text.is_empty() => next.text.chars().next(),
            _ => sql.get(at.end..).and_then(|s| s.chars().next()),
        };
        let text = &mut edits[i].text;
        if text.is_empty() {
            continue;
        }
        if word(text.chars().next_back()) && word(after) {
            text.push(' ');
        }
        if word(text.chars().next()) && word(before) {
            text.insert(0, ' ');
        }
    }
}

/// Applies non-overlapping edits, sorted by position; insertions at one offset
/// keep their order.
fn apply(sql: &str, edits: &[dml::Edit]) -> Result<String, Unsupported> {
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
/// The keys of each of the two maps take at most this many bytes.
const CACHE_KEY_BYTES: usize = 4 * 1024 * 1024;

/// A cached outcome: the rewritten text, or why there is none.
type Rewritten = Result<Arc<str>, Unsupported>;

/// Rewrites for one fence, cached per (statement text, epoch), bounded.
///
/// Statements that differ only in the values of plain literals (simple-protocol
/// clients that inline their values, such as `pgbench -M simple`) share one
/// **template**: the rewrite never looks inside a literal (the edits sit at
/// token boundaries, chosen by keywords, punctuation and names), so the text
/// with every plain literal replaced by a placeholder of the same kind (`0`,
/// `0.0`, `''`) is rewritten and verified once, and each statement of that shape gets
/// the template with its own literals put back. Only literals that every
/// reader tokenises alike take part: unsigned decimal numbers and `'…'` strings
/// without backslashes; anything else stays in the template's text as written.
#[derive(Debug)]
pub struct RewriteCache {
    target: RewriteTarget,
    map: BoundedMap<Vec<(Epoch, Rewritten)>>,
    templates: BoundedMap<Vec<(Epoch, Shaped)>>,
}

/// A shape's template; `None` when the shape cannot be rewritten (each text is then
/// rewritten itself, to say why).
type Shaped = Option<Arc<Template>>;

/// A rewrite with holes where the statement's plain literals go.
#[derive(Debug)]
struct Template {
    /// Text between the holes: one more than `holes`.
    segments: Vec<Box<str>>,
    /// For each hole, which of the statement's plain literals fills it (a
    /// literal the rewrite replaced, such as a client value for the epoch
    /// column, has no hole).
    holes: Vec<usize>,
}

impl Template {
    fn fill(&self, sql: &str, literals: &[Range<usize>]) -> Option<String> {
        let len = self.segments.iter().map(|s| s.len()).sum::<usize>()
            + self
                .holes
                .iter()
                .map(|&i| literals.get(i).map_or(0, |l| l.len()))
                .sum::<usize>();
        let mut out = String::with_capacity(len);
        for (segment, &hole) in self.segments.iter().zip(&self.holes) {
            out.push_str(segment);
            out.push_str(sql.get(literals.get(hole)?.clone())?);
        }
        out.push_str(self.segments.last()?);
        Some(out)
    }
}

/// The statement with its plain literals replaced by placeholders, and where
/// those literals are in the statement; `None` when it has none.
fn shape_of(sql: &str) -> Option<(String, Vec<Range<usize>>)> {
    let mut shape = String::with_capacity(sql.len());
    let mut literals = Vec::new();
    let mut copied = 0;
    for t in Lexer::new(sql, Lexing::default()) {
        let text = &sql[t.span.clone()];
        let before = sql[..t.span.start].bytes().next_back();
        let after = sql[t.span.end..].bytes().next();
        if !before.is_none_or(is_separator) || !after.is_none_or(is_separator) {
            continue;
        }
        let placeholder = match t.kind {
            TokenKind::Number if is_plain_number(text) => {
                if text.contains('.') {
                    "0.0"
                } else {
                    "0"
                }
            }
            TokenKind::String if is_plain_string(text) => "''",
            _ => continue,
        };
        shape.push_str(&sql[copied..t.span.start]);
        shape.push_str(placeholder);
        copied = t.span.end;
        literals.push(t.span);
    }
    if literals.is_empty() {
        return None;
    }
    shape.push_str(&sql[copied..]);
    Some((shape, literals))
}

/// A byte that cannot continue or prefix a literal token: not part of a word,
/// number, parameter or quote (so no reader joins it with the literal, whatever
/// the literal's value).
fn is_separator(b: u8) -> bool {
    !(b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'$' | b'\'' | b'"' | b'&' | b'\\') || b >= 0x80)
}

/// `123` or `12.5`, at most 18 digits: one token for every SQL tokeniser, and a
/// value that any reader taking it as an integer (sqlparser does, for type
/// modifiers such as `varchar(n)`) can hold, as it can the placeholder. The
/// placeholder keeps the form (`0` or `0.0`), and no epoch is written as `0`.
fn is_plain_number(text: &str) -> bool {
    let (int, frac) = text.split_once('.').unwrap_or((text, "0"));
    !int.is_empty()
        && !frac.is_empty()
        && int.len() + frac.len() <= 18
        && (int.bytes().chain(frac.bytes())).all(|b| b.is_ascii_digit())
}

/// A terminated `'…'` (not `B'…'`, `E'…'`, …) without a backslash, quotes
/// inside only doubled: no reader of standard-conforming strings could take its
/// extent differently.
fn is_plain_string(text: &str) -> bool {
    let Some(inner) = text.strip_prefix('\'').and_then(|t| t.strip_suffix('\'')) else {
        return false;
    };
    // Runs of quotes inside must be even (doubled); no allocation on this per-statement path.
    let bytes = inner.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => return false,
            b'\'' if bytes.get(i + 1) == Some(&b'\'') => i += 2,
            b'\'' => return false,
            _ => i += 1,
        }
    }
    true
}

/// The template of `shape`'s rewrite: where each placeholder (at `placeholders`
/// in `shape`, sorted) lands in the rewritten text. `edits` are sorted and do
/// not overlap, as [`apply`] needs. `None` if an edit cuts into a placeholder.
fn template_of(shape: &str, placeholders: &[Range<usize>], edits: &[dml::Edit]) -> Option<Template> {
    // A placeholder an edit covers is replaced with it; one an edit reaches into
    // (or inserts into) cannot be put back.
    let mut kept = Vec::with_capacity(placeholders.len());
    for (i, p) in placeholders.iter().enumerate() {
        let mut replaced = false;
        for e in edits {
            let inside = e.at.start.max(p.start) < e.at.end.min(p.end) || (p.start < e.at.start && e.at.start < p.end);
            if !inside {
                continue;
            }
            if e.at.start <= p.start && p.end <= e.at.end {
                replaced = true;
            } else {
                return None;
            }
        }
        if !replaced {
            kept.push((i, p.clone()));
        }
    }
    let mut b = TemplateBuilder {
        shape,
        kept: &kept,
        next: 0,
        segments: Vec::with_capacity(kept.len() + 1),
        holes: Vec::with_capacity(kept.len()),
        current: String::with_capacity(shape.len() + 64 * edits.len()),
    };
    let mut copied = 0;
    for e in edits {
        b.copy(copied..e.at.start)?;
        b.current.push_str(&e.text);
        copied = copied.max(e.at.end);
    }
    b.copy(copied..shape.len())?;
    if b.next != kept.len() {
        return None;
    }
    b.segments.push(b.current.into_boxed_str());
    Some(Template {
        segments: b.segments,
        holes: b.holes,
    })
}

/// Builds a [`Template`] while copying the unedited parts of a shape.
struct TemplateBuilder<'a> {
    shape: &'a str,
    kept: &'a [(usize, Range<usize>)],
    next: usize,
    segments: Vec<Box<str>>,
    holes: Vec<usize>,
    current: String,
}

impl TemplateBuilder<'_> {
    /// Copies `range` of the shape, leaving a hole for each kept placeholder in it.
    fn copy(&mut self, range: Range<usize>) -> Option<()> {
        let mut from = range.start;
        while let Some((i, p)) = self.kept.get(self.next) {
            if p.start >= range.end {
                break;
            }
            self.current.push_str(self.shape.get(from..p.start)?);
            self.segments.push(std::mem::take(&mut self.current).into_boxed_str());
            self.holes.push(*i);
            from = p.end;
            self.next += 1;
        }
        self.current.push_str(self.shape.get(from..range.end)?);
        Some(())
    }
}

impl RewriteCache {
    /// An empty cache for `target`.
    pub fn new(target: RewriteTarget) -> Self {
        Self {
            target,
            map: BoundedMap::new(CACHE_ENTRIES, CACHE_KEY_BYTES),
            templates: BoundedMap::new(CACHE_ENTRIES, CACHE_KEY_BYTES),
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
        if sql.len() <= CACHE_MAX_TEXT
            && let Some(out) = self.through_template(sql, epoch)
        {
            return Ok(Arc::from(out));
        }
        let result = rewrite(sql, &self.target, epoch).map(Arc::from);
        if sql.len() <= CACHE_MAX_TEXT {
            remember(&mut self.map, sql, epoch, result.clone());
        }
        result
    }

    /// The rewrite through the statement's template (made on first use);
    /// `None` when it has no plain literal or its shape cannot be rewritten
    /// (the caller then rewrites the text itself, which reports why).
    fn through_template(&mut self, sql: &str, epoch: Epoch) -> Option<String> {
        let (shape, literals) = shape_of(sql)?;
        let cached = self
            .templates
            .get(shape.as_str())
            .and_then(|v| v.iter().find(|(e, _)| *e == epoch))
            .map(|(_, t)| t.clone());
        let template = match cached {
            Some(t) => t?,
            None => {
                let made = rewrite_with_edits(&shape, &self.target, epoch, Lexing::default())
                    .ok()
                    .and_then(|(_, edits)| {
                        let placeholders = shape_of(&shape).map(|(_, p)| p).unwrap_or_default();
                        if placeholders.len() != literals.len() {
                            return None;
                        }
                        template_of(&shape, &placeholders, &edits).map(Arc::new)
                    });
                remember(&mut self.templates, &shape, epoch, made.clone());
                made?
            }
        };
        template.fill(sql, &literals)
    }
}

/// Stores `value` for (`key`, `epoch`); the map evicts to stay within its bounds.
fn remember<V>(map: &mut BoundedMap<Vec<(Epoch, V)>>, key: &str, epoch: Epoch, value: V) {
    if let Some(slot) = map.get_mut(key) {
        if slot.len() >= EPOCHS_PER_TEXT {
            drop(slot.remove(0));
        }
        slot.push((epoch, value));
    } else {
        map.insert(key, vec![(epoch, value)]);
    }
}
