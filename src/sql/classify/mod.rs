//! Deciding which statements of a Query may change a fenced table.
//!
//! The classifier fails closed: a statement that mentions a fenced table and
//! cannot be understood is [`StmtKind::Unanalysable`] (the caller answers it
//! with PF004), never [`StmtKind::Other`]. It works in four tiers, cheapest
//! first, because almost all traffic is not a fenced write:
//!
//! 1. **Dispatch on the first keyword** with the small lexer: declarations,
//!    `PREPARE`/`EXECUTE`/`DEALLOCATE`, `EXPLAIN`, `COPY`, `DO`/`CALL` and the
//!    commands that can never write a table (`BEGIN`, `SHOW`, `VACUUM`, …).
//! 2. **Pre-filter**: the text is lower-cased once into a buffer and each
//!    fenced table name searched with `memchr::memmem`. A statement that names
//!    no fenced table (and has no `U&"…"` identifier, which could spell any
//!    name) is [`StmtKind::Other`] without parsing.
//! 3. **Plain DML** (`INSERT`, `UPDATE`, `DELETE`, `MERGE` first): the lexer
//!    reads the target, the only table such a statement can write, since
//!    Postgres allows a data-modifying WITH only at the top.
//! 4. **sqlparser** (PostgreSqlDialect) for the rest, with a token-based
//!    fallback for what it cannot parse (`WHERE CURRENT OF`, `FOR NO KEY
//!    UPDATE`, over-long statements) or would tokenize differently from
//!    Postgres (continued string literals, backslashes in plain strings with
//!    `standard_conforming_strings` off).
//!
//! Writes the statement does not name (functions, triggers, rules, foreign-key
//! cascades, updatable views) are invisible here by design; the docs say so.

mod ast;
mod fences;
mod forms;
#[cfg(test)]
mod tests;

use std::ops::Range;
use std::sync::Arc;

use super::cache::BoundedMap;
use super::declare::{self, Declaration};
use super::lex::{self, Lexer, Lexing, TokenKind, ident_value};
use super::name::TableName;
use super::split;

use fences::Hits;
pub use fences::{FenceId, FenceSet};

/// The result of analysing one Query text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Analysis {
    /// The statements, in order; empty for an empty or comment-only text.
    pub statements: Vec<Stmt>,
    /// The statement boundaries rest on psql's rule for routine bodies, which Postgres'
    /// grammar may not follow: the whole text is one statement here (unanalysable if it
    /// may name a fenced table), and what it does to session state is unknown.
    pub uncertain: bool,
}

impl Analysis {
    /// One statement of `kind` standing for a whole text whose spans do not matter: what
    /// a prepared statement name runs.
    pub fn of_kind(kind: StmtKind) -> Self {
        Self {
            statements: vec![Stmt { span: 0..0, kind }],
            uncertain: false,
        }
    }

    /// Whether every statement is [`StmtKind::Other`] or ends a transaction, so the
    /// Query can be forwarded untouched.
    pub fn is_plain(&self) -> bool {
        self.statements
            .iter()
            .all(|s| matches!(s.kind, StmtKind::Other | StmtKind::EndTransaction { .. }))
    }
}

/// One statement of a Query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stmt {
    /// Its bytes in the analysed text (no surrounding comments, no `;`); on
    /// char boundaries. Used to put a guard before it or to replace it.
    pub span: Range<usize>,
    /// What it does to fenced tables.
    pub kind: StmtKind,
}

/// What a statement does, as far as fencing is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StmtKind {
    /// Not a fenced write: pass it untouched.
    Other,
    /// May change these fenced tables (sorted, deduplicated).
    Write {
        /// The fences of `tables`.
        fences: Vec<FenceId>,
        /// The configured names of the fenced tables it may change.
        tables: Vec<TableName>,
    },
    /// Names a fenced table but cannot be analysed (parse failure, `CALL`,
    /// `DO`, a `U&"…"` name): refuse with PF004 whatever the epoch.
    Unanalysable {
        /// The fences it may touch (every fence when a name is unreadable).
        fences: Vec<FenceId>,
    },
    /// Changes the session's declaration.
    Declare(Declaration),
    /// SQL-level `PREPARE name [(types)] AS inner`; `name` normalised as an
    /// identifier. `EXECUTE name` later does what `inner` says.
    Prepare {
        /// The statement name.
        name: String,
        /// What executing it does.
        inner: Box<StmtKind>,
    },
    /// SQL-level `EXECUTE name [(args)]`, also `EXPLAIN ANALYZE EXECUTE name`
    /// and `CREATE TABLE … AS EXECUTE name`: runs a prepared statement.
    Execute {
        /// The statement name.
        name: String,
    },
    /// SQL-level `FETCH` or `MOVE`, which runs a portal: a cursor (`DECLARE`, which
    /// only reads) or one bound with the protocol, which may hold a fenced write. The
    /// names it may fetch from (`None`: one that cannot be read).
    Fetch {
        /// Candidate portal names, normalised as identifiers.
        portals: Vec<Option<String>>,
    },
    /// SQL `CLOSE name` (`Some`, normalised as an identifier) or `CLOSE ALL` (`None`):
    /// drops portals. A name that cannot be read is `Other` (nothing is known dropped).
    Close {
        /// The portal name, `None` for ALL.
        portal: Option<String>,
    },
    /// `DEALLOCATE [PREPARE] name` (`Some`) or `DEALLOCATE ALL` (`None`).
    Deallocate {
        /// The statement name, `None` for ALL.
        name: Option<String>,
    },
    /// `SAVEPOINT`, `RELEASE` or `ROLLBACK TO` a savepoint: a rollback to one
    /// undoes the declarations made after it, as in Postgres.
    Savepoint(SavepointOp),
    /// Ends the open transaction: `COMMIT`, `END`, `PREPARE TRANSACTION` (`commit`), or
    /// `ROLLBACK`, `ABORT` (not `commit`), each also `AND [NO] CHAIN`. Postgres' command
    /// tag says how it really ended (a COMMIT of a failed transaction rolls back).
    EndTransaction {
        /// Whether it commits, if it succeeds.
        commit: bool,
        /// `AND CHAIN`: a new transaction block starts at once.
        chain: bool,
        /// `PREPARE TRANSACTION`: where no block is open, Postgres commits the implicit
        /// transaction and answers `ROLLBACK`.
        two_phase: bool,
    },
}

/// What a savepoint command does; the name is normalised as an identifier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SavepointOp {
    /// `SAVEPOINT name`.
    Define(String),
    /// `RELEASE [SAVEPOINT] name`.
    Release(String),
    /// `ROLLBACK [WORK | TRANSACTION] TO [SAVEPOINT] name`.
    RollbackTo(String),
}

/// Analyses `sql` (one simple-Query text) with default lexing. Never panics.
pub fn analyze(sql: &str, fences: &FenceSet) -> Analysis {
    analyze_with(sql, fences, Lexing::default(), &mut Vec::new()).0
}

/// [`analyze`] with explicit lexing rules (see [`Lexing`]).
pub fn analyze_lexing(sql: &str, fences: &FenceSet, lexing: Lexing) -> Analysis {
    analyze_with(sql, fences, lexing, &mut Vec::new()).0
}

/// Analyses with explicit lexing, lower-casing into `lower` (reused between
/// calls). Also says whether sqlparser ran, i.e. whether caching pays.
fn analyze_with(sql: &str, fences: &FenceSet, lexing: Lexing, lower: &mut Vec<u8>) -> (Analysis, bool) {
    lower.clear();
    lower.extend(sql.bytes().map(|b| b.to_ascii_lowercase()));
    let mut ctx = Ctx {
        sql,
        lower,
        fences,
        lexing,
        parsed: false,
        parse_budget: PARSE_BUDGET,
    };
    let (spans, uncertain) = split::split_checked(sql, lexing);
    if uncertain && let (Some(first), Some(last)) = (spans.first(), spans.last()) {
        let span = first.start..last.end;
        let kind = ctx.whole_text_kind(&span);
        let statements = vec![Stmt { span, kind }];
        return (Analysis { statements, uncertain }, ctx.parsed);
    }
    let statements = spans
        .into_iter()
        .map(|span| Stmt {
            kind: ctx.classify(span.clone(), 0),
            span,
        })
        .collect();
    (
        Analysis {
            statements,
            uncertain: false,
        },
        ctx.parsed,
    )
}

/// Analyses statement texts for one fence configuration, caching the results of
/// texts that needed a full parse (applications repeat their statements) and, apart,
/// of short Parse texts the lexer read.
#[derive(Debug)]
pub struct Analyzer {
    fences: Arc<FenceSet>,
    lexing: Lexing,
    cache: BoundedMap<Arc<Analysis>>,
    /// Lexer-only results of [`Analyzer::analyze_repeated`]: kept apart so that a stream
    /// of one-off texts (inline values sent with Parse) cannot evict parsed results.
    repeated: BoundedMap<Arc<Analysis>>,
    lower: Vec<u8>,
}

/// At most this many texts are cached (see [`BoundedMap`] for which go first).
pub const CACHE_ENTRIES: usize = 1024;
/// Longer texts are not cached (statements this long are rare and parse in milliseconds).
pub const CACHE_MAX_TEXT: usize = 64 * 1024;
/// The cache's keys take at most this many bytes, whatever the mix of lengths.
pub const CACHE_BYTES: usize = 4 * 1024 * 1024;
/// Lexer-only Parse results kept, and the longest text among them: lexing a
/// longer one costs little beside its own transfer.
pub const REPEATED_ENTRIES: usize = 256;
/// See [`REPEATED_ENTRIES`].
pub const REPEATED_MAX_TEXT: usize = 4 * 1024;

impl Analyzer {
    /// An analyzer for `fences`, assuming `standard_conforming_strings = on`.
    pub fn new(fences: FenceSet) -> Self {
        Self {
            fences: Arc::new(fences),
            lexing: Lexing::default(),
            cache: BoundedMap::new(CACHE_ENTRIES, CACHE_BYTES),
            repeated: BoundedMap::new(REPEATED_ENTRIES, REPEATED_ENTRIES * REPEATED_MAX_TEXT),
            lower: Vec::new(),
        }
    }

    /// The fences this analyzer looks for.
    pub fn fences(&self) -> &FenceSet {
        &self.fences
    }

    /// What analyses a text as this analyzer does, apart from it: for a text too long
    /// to cache, whose analysis takes long and must not hold the analyzer (shared by
    /// every session of a database) meanwhile. See [`Detached::analyze`].
    pub fn detached(&self) -> Detached {
        Detached {
            fences: Arc::clone(&self.fences),
            lexing: self.lexing,
        }
    }

    /// Follows the server's `standard_conforming_strings` (from its
    /// ParameterStatus); the cache is dropped when it changes because the
    /// same text then lexes differently.
    pub fn set_standard_conforming_strings(&mut self, on: bool) {
        if self.lexing.standard_conforming_strings != on {
            self.lexing.standard_conforming_strings = on;
            self.cache.clear();
            self.repeated.clear();
        }
    }

    /// Analyses `sql`. Never panics.
    pub fn analyze(&mut self, sql: &str) -> Arc<Analysis> {
        if let Some(hit) = self.cache.get(sql) {
            return Arc::clone(hit);
        }
        self.analyze_uncached(sql).0
    }

    /// [`Self::analyze`] for a text likely to come again, such as a Parse's (drivers
    /// send the same one, often as the unnamed statement, for every execution): short
    /// ones are kept even when only the lexer ran, which then costs more than the lookup.
    pub fn analyze_repeated(&mut self, sql: &str) -> Arc<Analysis> {
        if let Some(hit) = self.repeated.get(sql) {
            return Arc::clone(hit);
        }
        if let Some(hit) = self.cache.get(sql) {
            return Arc::clone(hit);
        }
        let (analysis, kept) = self.analyze_uncached(sql);
        if !kept && sql.len() <= REPEATED_MAX_TEXT {
            self.repeated.insert(sql, Arc::clone(&analysis));
        }
        analysis
    }

    /// Analyses `sql`, keeping the result if sqlparser had to run (then also says so).
    fn analyze_uncached(&mut self, sql: &str) -> (Arc<Analysis>, bool) {
        let (analysis, parsed) = analyze_with(sql, &self.fences, self.lexing, &mut self.lower);
        if self.lower.capacity() > LOWER_KEEP {
            // One huge text must not leave its copy with the database's analyzer.
            self.lower = Vec::new();
        }
        let analysis = Arc::new(analysis);
        let keep = parsed && sql.len() <= CACHE_MAX_TEXT;
        if keep {
            self.cache.insert(sql, Arc::clone(&analysis));
        }
        (analysis, keep)
    }
}

/// An [`Analyzer`]'s fences and lexing, without its cache (see [`Analyzer::detached`]).
#[derive(Debug, Clone)]
pub struct Detached {
    fences: Arc<FenceSet>,
    /// How texts are lexed; its `standard_conforming_strings` is the analyzer's.
    lexing: Lexing,
}

impl Detached {
    /// Analyses `sql` as [`Analyzer::analyze`] does, without caching it. Never panics.
    pub fn analyze(&self, sql: &str) -> Analysis {
        analyze_with(sql, &self.fences, self.lexing, &mut Vec::new()).0
    }
}

/// The lower-cased copy's buffer is kept between texts up to this size.
const LOWER_KEEP: usize = 1024 * 1024;
/// How deep `EXPLAIN`/`COPY (…)`/`PREPARE` may nest before we stop looking.
const MAX_DEPTH: usize = 8;
/// Longer statements skip sqlparser (~90 ns/byte) for the token fallback.
pub(crate) const MAX_PARSE_BYTES: usize = 64 * 1024;
/// What sqlparser reads of one text, over all its statements; the statements past it
/// take the token fallback too. Analysis runs on the session's thread, shared with
/// other sessions: a message of many large statements must not hold it for seconds.
const PARSE_BUDGET: usize = 4 * 1024 * 1024;

/// Commands that never change a table's rows or definition.
const NEVER_WRITE: &[&str] = &[
    "abort",
    "analyse",
    "analyze",
    "begin",
    "checkpoint",
    "close",
    "cluster",
    "comment",
    "commit",
    "declare",
    "end",
    "grant",
    "listen",
    "load",
    "lock",
    "notify",
    "reassign",
    "refresh",
    "reindex",
    "release",
    "revoke",
    "rollback",
    "savepoint",
    "security",
    "show",
    "start",
    "unlisten",
    "vacuum",
];

/// Query forms that cannot contain a data-modifying statement unless one of
/// the DML keywords appears (Postgres only allows them in a top-level WITH).
const READ_QUERY: &[&str] = &["select", "table", "values", "with"];

/// Per-analysis state.
struct Ctx<'a> {
    sql: &'a str,
    lower: &'a [u8],
    fences: &'a FenceSet,
    lexing: Lexing,
    parsed: bool,
    /// Bytes sqlparser may still read for this text ([`PARSE_BUDGET`]).
    parse_budget: usize,
}

impl<'a> Ctx<'a> {
    fn text(&self, span: &Range<usize>) -> &'a str {
        self.sql.get(span.clone()).unwrap_or("")
    }

    /// Classifies the statement at `span` of the whole text.
    fn classify(&mut self, span: Range<usize>, depth: usize) -> StmtKind {
        if depth > MAX_DEPTH {
            return self.unanalysable_if_named(&span);
        }
        let text = self.text(&span);
        let first = split::first_word(text, self.lexing)
            .filter(|w| w.len() <= 16)
            .map(str::to_ascii_lowercase);
        let first = first.as_deref().unwrap_or("");
        match first {
            "set" | "reset" | "discard" => declare::parse(text, self.lexing).map_or(StmtKind::Other, StmtKind::Declare),
            "prepare" => self.prepare(span, depth),
            "execute" => self.execute(&span),
            "fetch" | "move" => self.fetch(&span),
            "deallocate" => self.deallocate(&span),
            "close" => self.close(&span),
            "explain" => self.explain(span, depth),
            "copy" => self.copy(span, depth),
            "do" | "call" => self.routine_call(&span),
            "savepoint" | "release" | "rollback" => self.savepoint(&span, first),
            "commit" | "end" | "abort" => self.end_transaction(&span, first),
            _ if NEVER_WRITE.contains(&first) => StmtKind::Other,
            _ => self.general(span, first),
        }
    }

    /// INSERT, UPDATE, DELETE, MERGE, WITH, TRUNCATE, ALTER, DROP, CREATE, …
    fn general(&mut self, span: Range<usize>, first: &str) -> StmtKind {
        let text = self.text(&span);
        if first == "create" {
            match forms::as_execute(text, self.lexing) {
                forms::AsExecute::Is(name) => return StmtKind::Execute { name },
                forms::AsExecute::Unreadable => {
                    let all = Hits {
                        all: true,
                        ..Hits::default()
                    };
                    return all.into_unanalysable(self.fences);
                }
                forms::AsExecute::No => {}
            }
        }
        if matches!(first, "create" | "alter") && forms::starts_a_subscription(text, self.lexing) {
            let all = Hits {
                all: true,
                ..Hits::default()
            };
            return all.into_unanalysable(self.fences);
        }
        // TRUNCATE … CASCADE, DROP/ALTER SCHEMA and the commands below reach
        // fenced tables they do not name; they are rare, so they skip the pre-filter.
        let ddl = matches!(first, "truncate" | "drop" | "alter");
        if (!ddl || self.fences.is_empty()) && !self.may_name_fence(&span) {
            return StmtKind::Other;
        }
        if matches!(first, "drop" | "alter") && forms::reaches_unnamed(text, self.lexing) {
            let all = Hits {
                all: true,
                ..Hits::default()
            };
            return all.into_write(self.fences);
        }
        if first == "alter" && forms::alters_a_sequence_or_publication(text, self.lexing) {
            return StmtKind::Other;
        }
        if READ_QUERY.contains(&first) && !forms::has_dml_keyword(text, self.lexing) {
            return StmtKind::Other;
        }
        if let Some(kind) = self.plain_dml(&span, first) {
            return kind;
        }
        if text.len() > MAX_PARSE_BYTES.min(self.parse_budget) || lex::sqlparser_misreads(text, self.lexing) {
            return self.fallback(&span, first);
        }
        self.parse_budget -= text.len();
        self.parsed = true;
        // The copy sqlparser reads as Postgres does (an INSERT's query before ON CONFLICT in
        // parentheses; the literals it misreads went to the fallback above).
        match ast::parse(&lex::for_sqlparser(text, self.lexing)) {
            Some(stmt) => match ast::classify(&stmt, self.fences) {
                hits if hits.unknown => self.unanalysable_if_named(&span),
                hits => hits.into_write(self.fences),
            },
            None => self.fallback(&span, first),
        }
    }

    /// A statement that starts with INSERT, UPDATE, DELETE or MERGE writes
    /// only its target: Postgres refuses a data-modifying WITH anywhere but at
    /// the top of a statement (0A000), and everything after the target is read.
    /// The lexer reads that target in a fraction of a parse, and applications
    /// that inline their values send texts no cache would ever see twice.
    /// A `U&"…"` target is decoded as Postgres decodes it. `None` (parse
    /// instead) when the target cannot be read.
    fn plain_dml(&self, span: &Range<usize>, first: &str) -> Option<StmtKind> {
        if !matches!(first, "insert" | "update" | "delete" | "merge") {
            return None;
        }
        self.dml_write(self.text(span))
    }

    /// The write of a plain DML statement whose target(s) the lexer can read.
    fn dml_write(&self, text: &str) -> Option<StmtKind> {
        let (names, cascade) = forms::dml_targets(text, self.lexing)?;
        let mut hits = Hits {
            all: cascade,
            ..Hits::default()
        };
        for name in &names {
            hits.name(name, self.fences);
        }
        Some(hits.into_write(self.fences))
    }

    /// What sqlparser could not parse: read the target of a plain DML
    /// statement with the lexer, else fail closed on any fenced name.
    fn fallback(&self, span: &Range<usize>, first: &str) -> StmtKind {
        let text = self.text(span);
        if READ_QUERY.contains(&first) && !forms::has_dml_keyword(text, self.lexing) {
            return StmtKind::Other;
        }
        if first == "create"
            && (forms::defines_a_reader(text, self.lexing) || forms::creates_a_table(text, self.lexing))
        {
            return StmtKind::Other;
        }
        self.dml_write(text).unwrap_or_else(|| self.unanalysable_if_named(span))
    }

    /// Whether a `U&"…"` identifier (or `U&'…'` string) could spell any name.
    fn may_spell_any_name(&self, span: &Range<usize>) -> bool {
        let lower = self.lower.get(span.clone()).unwrap_or(&[]);
        // `&` is rare in SQL: look for it rather than build a substring finder per call.
        memchr::memchr_iter(b'&', lower).any(|i| i > 0 && lower[i - 1] == b'u')
    }

    /// The pre-filter: may the statement name a fenced table?
    fn may_name_fence(&self, span: &Range<usize>) -> bool {
        let lower = self.lower.get(span.clone()).unwrap_or(&[]);
        !self.fences.is_empty() && (self.fences.mentioned_in(lower) || self.may_spell_any_name(span))
    }

    /// A text taken whole, its statements not told apart (psql's routine-body rule
    /// decided, or there are more than `split::MAX_STATEMENTS`): refused if any part of it
    /// may write a fenced table. Beyond a name of one (read as for a `DO` or `CALL`,
    /// strings and escapes included, when the text holds one), that is whatever can write
    /// tables it does not name (`EXECUTE` of a prepared statement; `DROP`, `ALTER` or
    /// `TRUNCATE` with CASCADE, OWNED or a schema; `FETCH`/`MOVE` of a bound portal) and
    /// what changes the session state pgfence keeps without it seeing (a declaration;
    /// `PREPARE`, `DEALLOCATE`, `RESET`, `DISCARD`; a rollback or a savepoint).
    fn whole_text_kind(&self, span: &Range<usize>) -> StmtKind {
        if self.fences.is_empty() {
            return StmtKind::Other;
        }
        let text = self.text(span);
        let lower = self.lower.get(span.clone()).unwrap_or(&[]);
        let mut unnamed = memchr::memmem::find(lower, b"pgfence").is_some();
        let mut routine = false;
        // Whether the token starts a statement as Postgres may split the text: its first,
        // or the first after a `;`.
        let mut at_start = true;
        // Whether the token before was a `CREATE` that starts a statement.
        let mut created = false;
        for tok in Lexer::new(text, self.lexing) {
            if unnamed {
                break;
            }
            let start = std::mem::replace(&mut at_start, tok.kind == TokenKind::Punct(b';'));
            let after_create = std::mem::take(&mut created);
            if tok.kind == TokenKind::Word {
                match lower.get(tok.span) {
                    // Writes through what the text does not name, wherever they stand
                    // (`EXPLAIN ANALYZE EXECUTE`, `CREATE TABLE … AS EXECUTE`).
                    Some(b"execute" | b"drop" | b"alter" | b"truncate") => unnamed = true,
                    Some(b"create") => created = start,
                    // A subscription writes local tables later, where no guard runs.
                    Some(b"subscription") if after_create => unnamed = true,
                    // Commands that run a portal or change what pgfence keeps of the session
                    // (statements, declarations, savepoints), which it would not see. Only
                    // where a statement starts: the words are also clauses (`FETCH FIRST`)
                    // and column names.
                    Some(
                        b"fetch" | b"move" | b"prepare" | b"deallocate" | b"reset" | b"discard" | b"rollback"
                        | b"abort" | b"savepoint" | b"release",
                    ) if start => unnamed = true,
                    Some(b"do" | b"call") => routine = true,
                    _ => {}
                }
            }
        }
        if unnamed {
            let all = Hits {
                all: true,
                ..Hits::default()
            };
            return all.into_unanalysable(self.fences);
        }
        if routine {
            self.routine_call(span)
        } else {
            self.unanalysable_if_named(span)
        }
    }

    /// Unanalysable if an identifier in the statement may name a fenced
    /// table (or cannot be read), else Other.
    fn unanalysable_if_named(&self, span: &Range<usize>) -> StmtKind {
        if !self.may_name_fence(span) {
            return StmtKind::Other;
        }
        let text = self.text(span);
        let mut hits = Hits::default();
        for tok in Lexer::new(text, self.lexing) {
            match tok.kind {
                TokenKind::UnicodeIdent => hits.all = true,
                TokenKind::Word | TokenKind::QuotedIdent => {
                    if let Some(v) = ident_value(text, &tok) {
                        hits.tables.extend(
                            self.fences
                                .tables
                                .iter()
                                .enumerate()
                                .filter(|(_, t)| t.0.name == v)
                                .map(|e| e.0),
                        );
                    }
                }
                _ => {}
            }
        }
        hits.into_unanalysable(self.fences)
    }

    /// `DO` and `CALL`: their bodies and arguments are strings pgfence cannot
    /// see into, so any mention of a fenced name, even in a string, counts;
    /// strings with escapes (which could spell a name) count as every fence.
    fn routine_call(&self, span: &Range<usize>) -> StmtKind {
        if self.fences.is_empty() {
            return StmtKind::Other;
        }
        let lower = self.lower.get(span.clone()).unwrap_or(&[]);
        let mut hits = Hits::default();
        hits.tables.extend(
            self.fences
                .needles
                .iter()
                .enumerate()
                .filter(|(_, f)| f.find(lower).is_some())
                .map(|e| e.0),
        );
        let text = self.text(span);
        hits.all = self.may_spell_any_name(span)
            || Lexer::new(text, self.lexing).any(|t| {
                let s = text.get(t.span.clone()).unwrap_or("");
                matches!(t.kind, TokenKind::EscapeString | TokenKind::String)
                    && s.contains('\\')
                    && (t.kind == TokenKind::EscapeString || !self.lexing.standard_conforming_strings)
            });
        hits.into_unanalysable(self.fences)
    }
}
