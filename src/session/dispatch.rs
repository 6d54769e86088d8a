//! Client-side decisions: what each client message becomes upstream.
//!
//! Decisions are made at dispatch time, for the batch being sent, because
//! the epoch may change between Parse and Execute. The speculative
//! declarations assume every SET sent so far will succeed; they are re-synced
//! with what Postgres confirmed whenever nothing is in flight.

use std::fmt::Write as _;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::context::DbFences;
use super::declare::Declarations;
use super::names::{self, NameMap};
use super::positions::SentText;
use super::rewriting::RwStatement;
use super::state::{
    Defined, Definition, Effect, Injected, OwnStatement, Part, PortalEntry, Prepared, Rebind, Shared, Unit, own_portal,
};
use crate::fence::call as guard_sql;
use crate::fence::epoch::Epoch;
use crate::fence::policy::{self, Access, Decision, Declared, Rejection};
use crate::protocol::codec;
use crate::sql::Declaration;
use crate::sql::FenceId;
use crate::sql::Lexing;
use crate::sql::classify::{Analysis, StmtKind};

/// CopyDone or CopyFail units kept in a row for COPYs still to start (see
/// [`Dispatcher::on_copy_end`]).
const MAX_COPY_END_RUN: usize = 1024;

/// What a statement asks of the fence, after SQL-level PREPARE/EXECUTE are resolved.
enum Need {
    None,
    Write(Vec<FenceId>),
    /// May write these fences (none listed: any fence) and cannot be analysed.
    Unanalysable(Vec<FenceId>),
    /// SQL `EXECUTE` of a name pgfence knows no definition of. Postgres fails it (26000)
    /// unless it holds a statement of that name that pgfence never saw (prepared inside
    /// a function or `DO`), which may write any fence: refused only then.
    Missing(String),
}

impl Need {
    /// The statement name of a [`Need::Missing`]: its rejection is raised only if a
    /// statement of that name is prepared.
    fn missing_name(&self) -> Option<String> {
        match self {
            Need::Missing(name) => Some(name.clone()),
            _ => None,
        }
    }

    /// What either of two statements needs: unanalysable over both if either is.
    fn union(self, other: Need) -> Need {
        match (self, other) {
            (Need::None, n) | (n, Need::None) => n,
            (Need::Write(mut a), Need::Write(b)) => {
                a.extend(b);
                Need::Write(a)
            }
            (Need::Write(mut a) | Need::Unanalysable(mut a), Need::Write(b) | Need::Unanalysable(b))
                if !a.is_empty() && !b.is_empty() =>
            {
                a.extend(b);
                Need::Unanalysable(a)
            }
            // Either may write any fence (none listed, or a name with no known definition).
            _ => Need::Unanalysable(Vec::new()),
        }
    }
}

/// How many steps from a statement to what it runs (SQL `EXECUTE` to a prepared statement,
/// `FETCH`/`MOVE` to a portal's statement) pgfence follows; a statement further down may
/// write any fence.
const MAX_NESTING: usize = 8;

/// How many steps (an SQL `EXECUTE` or `FETCH`/`MOVE` followed) one decision may take over
/// every definition and portal a chain may reach; beyond, it may write any fence. The
/// chains branch (several unconfirmed definitions of a name, several names in one `FETCH`,
/// several unanswered Binds of a portal), so without a bound one statement could keep the
/// thread every session shares busy for hours.
const MAX_STEPS: u32 = 512;

/// The client-side half of a session.
pub struct Dispatcher {
    pub(super) fences: Arc<DbFences>,
    /// Steps taken by the decision being made ([`MAX_STEPS`]).
    steps: std::cell::Cell<u32>,
    pub(super) speculative: Declarations,
    /// Client statements that write rewrite-mode tables, by name.
    pub(super) rw_statements: NameMap<RwStatement>,
    /// The last `RwStatement::serial` given.
    pub(super) rw_serial: u64,
    /// The session's `standard_conforming_strings`, for rewriting.
    pub(super) scs: bool,
    /// Postgres is outside an explicit transaction block, as far as what was sent since it
    /// last said so tells: then a Query, or what runs up to a Sync, is an implicit
    /// transaction, and the declarations made in it are kept at its end (unless it fails).
    /// False where a `BEGIN` may have opened a block, until a `COMMIT` or `ROLLBACK`.
    outside_block: bool,
    /// Postgres said the transaction block failed, and no end of it was sent since: its
    /// `COMMIT` rolls back.
    block_failed: bool,
    /// The Query, or the batch up to the next Sync, being sent is sure to fail: a statement
    /// in it Postgres refuses whatever the data (`AND CHAIN` outside a block, `DISCARD ALL`
    /// where it cannot run).
    doomed: bool,
    /// The last Execute of this batch ended a transaction block (without `AND CHAIN`).
    tx_ended: bool,
    /// A Bind was sent since the last Sync, Query or FunctionCall: its portal lives in an
    /// implicit transaction that a Query ends, or that a client's `BEGIN` makes a block.
    bound_unsynced: bool,
    /// Syncs and Queries sent so far (batch numbers).
    pub(super) sent: u64,
    /// Numbers stretches of messages that Postgres runs or skips as a whole: each Query,
    /// and what runs up to each Sync (see `state::Definition::batch`).
    pub(super) batch: u64,
    /// The [`Shared::answered`] count at which every `DEALLOCATE` and `DISCARD ALL` sent
    /// so far is answered. Until then pgfence's prepared statements may be gone.
    dealloc_until: u64,
    /// pgfence's own Query to send before the client's Query being dispatched
    /// ([`Self::prepare_ahead`]).
    query_prefix: Option<String>,
    /// The [`Shared::answered`] count at which the last Execute sent is answered by its
    /// Sync's ReadyForQuery: until then a transaction it opened is not known (an Execute is
    /// answered, and forgotten, before that, e.g. after a Flush).
    ran_until: u64,
    /// The guard sent earlier in this batch (batch, fence, epoch), while every Execute
    /// since has been a fenced write: none of those can end the transaction, and an
    /// error skips the rest of the batch, so its locks cover the next write too. Sending
    /// it again would not only cost a statement: a completed statement makes what a
    /// suspended portal changed visible to the next one, which Postgres does not.
    batch_guard: Option<(u64, FenceId, Epoch)>,
    /// The Bind, Execute and Close of pgfence's guard statement last sent, for this fence
    /// and epoch: the same bytes every time (the statement and portal names are drawn once
    /// per process, the arguments follow from the config), so later guards copy them.
    guard_messages: Option<(FenceId, Epoch, Bytes)>,
    /// The fence and epoch written into [`OwnStatement::ConstGuard`] by the last `PREPARE`
    /// of it that pgfence sent (whether it is there is `Shared::own`'s to say).
    const_guard: Option<(FenceId, Epoch)>,
    /// Bytes of rewrite-mode statements the current client message may still have
    /// rewritten ([`super::rewriting::REWRITE_BUDGET`]).
    pub(super) rewrite_budget: std::cell::Cell<usize>,
    /// A long text's analysis made off the runtime's thread before its message was
    /// dispatched (see [`Self::analyze_apart`]): the text, as read with
    /// `standard_conforming_strings` on (true) or off, and the analysis.
    ready: Option<(String, bool, Arc<Analysis>)>,
}

/// A text longer than this is analysed off the runtime's thread (see
/// [`Dispatcher::analyze_apart`]); shorter ones take well under a millisecond.
pub const ANALYSE_APART: usize = 256 * 1024;

impl Dispatcher {
    /// Analyses the text `sql` of a message still to be dispatched on a thread of the
    /// runtime's blocking pool, so that the sessions sharing this runtime thread do not
    /// wait for it (a text of many megabytes takes a good part of a second). The result
    /// serves that message's dispatch if it is read as `standard_conforming_strings` was
    /// now (else the text is analysed again, in place).
    pub async fn analyze_apart(&mut self, sql: String, scs: bool) {
        let detached = self.fences.detached(scs);
        let work = tokio::task::spawn_blocking(move || {
            let analysis = Arc::new(detached.analyze(&sql));
            (sql, analysis)
        });
        // A failed task (the analysis never panics, but the task is cancelled when the
        // runtime shuts down) leaves the text to be analysed in place.
        self.ready = work.await.ok().map(|(sql, analysis)| (sql, scs, analysis));
    }

    /// Drops what [`Self::analyze_apart`] made, if its message did not take it.
    pub fn forget_ready(&mut self) {
        self.ready = None;
    }

    /// The analysis [`Self::analyze_apart`] made of `sql`, read with `scs`.
    fn take_ready(&mut self, sql: &str, scs: bool) -> Option<Arc<Analysis>> {
        match self.ready.take() {
            Some((text, read_with, analysis)) if read_with == scs && text == sql => Some(analysis),
            _ => None,
        }
    }

    /// A dispatcher for a session on a database with these fences.
    pub fn new(fences: Arc<DbFences>, declared: Declarations) -> Self {
        Self {
            fences,
            steps: std::cell::Cell::new(0),
            speculative: declared,
            rw_statements: NameMap::default(),
            scs: true,
            outside_block: true,
            block_failed: false,
            doomed: false,
            tx_ended: false,
            bound_unsynced: false,
            sent: 0,
            batch: 0,
            dealloc_until: 0,
            query_prefix: None,
            ran_until: 0,
            batch_guard: None,
            guard_messages: None,
            const_guard: None,
            rewrite_budget: std::cell::Cell::new(super::rewriting::REWRITE_BUDGET),
            rw_serial: 0,
            ready: None,
        }
    }

    /// Called before each client message is handled.
    pub fn resync(&mut self, shared: &Shared) {
        self.rewrite_budget.set(super::rewriting::REWRITE_BUDGET);
        if shared.pending.is_empty() {
            self.outside_block = shared.tx_status == b'I';
            self.block_failed = shared.tx_status == b'E';
            self.speculative = shared.declared.clone();
            // An error answered before its Sync (after a Flush): the transaction it
            // happened in fails, the implicit one at that Sync, a block at its end.
            if shared.skipping() {
                if self.outside_block {
                    self.doomed = true;
                } else {
                    self.block_failed = true;
                }
            }
        }
        self.scs = shared.reported.standard_conforming_strings;
    }

    /// A simple Query. Returns the text to send instead, if it changes.
    /// `exact` is false when the text was not UTF-8 and `sql` is a lossy copy:
    /// such a statement cannot be rewritten without corrupting it, so a fenced
    /// one is refused with PF004.
    pub fn on_query(&mut self, shared: &mut Shared, sql: &str, exact: bool) -> Option<String> {
        self.doomed = false;
        let (text, fails) = self.query(shared, sql, exact);
        let fails = fails || std::mem::take(&mut self.doomed);
        self.end_implicit(fails);
        text
    }

    /// [`Self::on_query`], saying also whether the text sent is sure to fail: pgfence
    /// replaced it, or one of its statements, by a refusal.
    fn query(&mut self, shared: &mut Shared, sql: &str, exact: bool) -> (Option<String>, bool) {
        self.prepare_ahead(shared);
        self.bound_unsynced = false;
        self.tx_ended = false;
        self.sent += 1;
        shared.copy_data_early = false;
        // Postgres ends an implicit transaction left open by an Execute with this Query.
        let unsynced = std::mem::replace(&mut shared.unsynced, false);
        // The Query is a batch of its own, and what follows it up to a Sync another.
        let batch = self.batch + 1;
        self.batch += 2;
        // A simple Query destroys the unnamed prepared statement.
        self.rw_statements.remove("");
        if let Some(r) = self.unreadable(shared, sql, unsynced) {
            shared.pending.push_back(Unit::Query {
                parts: Vec::new(),
                done: 0,
                positions: None,
            });
            return (Some(raise_block(&r, &[])), true);
        }
        let scs = shared.reported.standard_conforming_strings;
        let analysis = self
            .take_ready(sql, scs)
            .unwrap_or_else(|| self.fences.analyze(sql, scs));
        if !exact && let Some(r) = self.lossy(&analysis) {
            shared.pending.push_back(Unit::Query {
                parts: Vec::new(),
                done: 0,
                positions: None,
            });
            return (Some(raise_block(&r, &[])), true);
        }
        let analysis = self.keyed(shared, analysis, unsynced);
        // A text taken whole may hide a BEGIN among its statements.
        self.outside_block &= !analysis.uncertain;
        if analysis.uncertain {
            // What it does is unknown to pgfence, e.g. a DEALLOCATE of its guard statement
            // and a PREPARE of a fake one: close and prepare them again before use.
            for state in shared.own.values_mut() {
                if *state != Prepared::No {
                    *state = Prepared::Unknown;
                }
            }
            shared.own_mark += 1;
        }
        if analysis.is_plain() {
            // A transaction's end drops the portals bound in it, when there are any; the
            // answer to a PREPARE TRANSACTION is read by what it is (`Effect::PortalsGone`).
            let drops_portals = analysis.statements.iter().any(|s| match s.kind {
                StmtKind::EndTransaction { two_phase, .. } => two_phase || !shared.portals.is_empty(),
                _ => false,
            });
            let mut parts = Vec::new();
            for stmt in &analysis.statements {
                self.speculate_begin(sql, &stmt.span);
                self.speculate_end(&stmt.kind);
                if drops_portals {
                    parts.push(Part {
                        injected: None,
                        effect: note_portals_gone(shared, &stmt.kind),
                    });
                }
            }
            shared.pending.push_back(Unit::Query {
                parts,
                done: 0,
                positions: None,
            });
            return (None, false);
        }
        let mut parts = Vec::with_capacity(analysis.statements.len() + 1);
        // The text sent, and how it is made of the client's (for Postgres' error positions).
        let mut out = SentText::with_capacity(sql.len() + 96);
        let mut copied = 0;
        let mut changed = false;
        let mut fails = false;
        let single = analysis.statements.len() == 1;
        for stmt in &analysis.statements {
            let mut part = Part {
                injected: None,
                effect: None,
            };
            let before = &sql[copied..stmt.span.start];
            match self.need(shared, &stmt.kind, batch) {
                Need::None => {}
                Need::Write(f) if self.any_rewrite(&f) => {
                    let original = &sql[stmt.span.clone()];
                    let rw = self.simple_rewrite(shared, &f, original, exact, single);
                    if rw.before.is_some() || rw.rewrite.is_some() {
                        out.copy(before);
                        copied = stmt.span.start;
                        changed = true;
                    }
                    if let Some((injected, call)) = rw.before {
                        out.add(&call);
                        out.add(";");
                        parts.push(Part {
                            injected: Some(injected),
                            effect: None,
                        });
                    }
                    if let Some((sent, redo)) = rw.rewrite {
                        out.rewrite(&sent, original, redo);
                        copied = stmt.span.end;
                    }
                }
                need => {
                    let conditional = need.missing_name().is_some();
                    if let Some((injected, call)) = self.simple_check(shared, need, single) {
                        // A refusal raises whatever the data (but for one that asks whether
                        // a name is prepared, which may stand for a statement pgfence took
                        // for an `EXECUTE` and that runs).
                        fails |= matches!(injected, Injected::Reject(_)) && !conditional;
                        out.copy(before);
                        out.add(&call);
                        out.add(";");
                        copied = stmt.span.start;
                        changed = true;
                        parts.push(Part {
                            injected: Some(injected),
                            effect: None,
                        });
                    }
                }
            }
            self.speculate_begin(sql, &stmt.span);
            part.effect = self.note_effects(shared, &stmt.kind, batch, self.sent);
            if let StmtKind::Declare(d) = &stmt.kind {
                match super::declaration::effect(d, shared.defined, self.session_fence()) {
                    Ok(effect) => {
                        self.speculate_declaration(&effect, single && !unsynced);
                        part.effect = Some(effect);
                    }
                    Err(rejection) => {
                        // Replace the SET: Postgres raises PF003 in its place, the value stays.
                        out.copy(&sql[copied..stmt.span.start]);
                        out.replace(&self.refuse_declaration(rejection), &sql[stmt.span.clone()]);
                        copied = stmt.span.end;
                        changed = true;
                        fails = true;
                    }
                }
            }
            parts.push(part);
        }
        if changed && !exact {
            shared.pending.push_back(Unit::Query {
                parts: Vec::new(),
                done: 0,
                positions: None,
            });
            let refusal = raise_block(
                &Rejection {
                    code: crate::error::sqlstate::UNANALYSABLE,
                    message: format!(
                        "pgfence: statement is not valid UTF-8 and may write a table of fence {}; refused",
                        self.applicable_names()
                    ),
                    hint: "Use client_encoding UTF8 for sessions that write fenced tables.".into(),
                    fences: Vec::new(),
                },
                &[],
            );
            return (Some(refusal), true);
        }
        if !changed {
            shared.pending.push_back(Unit::Query {
                parts,
                done: 0,
                positions: None,
            });
            return (None, false);
        }
        out.copy(&sql[copied..]);
        shared.pending.push_back(Unit::Query {
            parts,
            done: 0,
            positions: Some(Arc::new(out.positions)),
        });
        (Some(out.text), fails)
    }

    /// What a statement does to the session's statement names, savepoints and transaction:
    /// speculated for what follows it in the same string or pipeline, and the effect to
    /// apply once Postgres confirms it. `batch` and `answered_at`: see [`Self::note_prepare`]
    /// and [`Self::note_deallocate`]. Declarations are the caller's: a refused one changes
    /// the text sent.
    fn note_effects(&mut self, shared: &mut Shared, kind: &StmtKind, batch: u64, answered_at: u64) -> Option<Effect> {
        self.speculate_end(kind);
        if let StmtKind::Savepoint(op) = kind {
            // A rollback to a savepoint it has brings a failed block back.
            if let crate::sql::classify::SavepointOp::RollbackTo(name) = op {
                self.block_failed &= !self.speculative.has_savepoint(name);
            }
            let effect = Effect::Savepoint(op.clone());
            self.speculate(&effect);
            return Some(effect);
        }
        self.note_prepare(shared, kind, batch)
            .or_else(|| self.note_deallocate(shared, kind, answered_at))
            .or_else(|| note_portals_gone(shared, kind))
    }

    /// A statement that may drop prepared statements, answered when
    /// [`Shared::answered`] reaches `answered_at`: until then pgfence's own may or may not
    /// be gone. `DEALLOCATE ALL` and `DISCARD ALL` forget every definition sent before
    /// them when they complete, and a `DEALLOCATE name` those of that name (the effect
    /// returned; `DISCARD ALL`'s is its declaration's); a failed one forgets nothing.
    /// Definitions sent after them stay.
    fn note_deallocate(&mut self, shared: &Shared, kind: &StmtKind, answered_at: u64) -> Option<Effect> {
        match kind {
            StmtKind::Deallocate { name: None } => {
                self.dealloc_until = answered_at;
                Some(Effect::DeallocatedAll(shared.defined))
            }
            // Its effect is the declaration's (`Effect::DiscardAll`).
            StmtKind::Declare(Declaration::DiscardAll) => {
                self.dealloc_until = answered_at;
                None
            }
            StmtKind::Deallocate { name: Some(name) } => {
                if OwnStatement::named(name).is_some() {
                    self.dealloc_until = answered_at;
                }
                Some(Effect::Deallocated(Defined {
                    name: name.clone(),
                    id: shared.defined,
                }))
            }
            _ => None,
        }
    }

    /// SQL `PREPARE name AS inner`: a definition of `name`, in force once it succeeds (the
    /// effect returned).
    fn note_prepare(&mut self, shared: &mut Shared, kind: &StmtKind, batch: u64) -> Option<Effect> {
        let StmtKind::Prepare { name, inner } = kind else {
            return None;
        };
        // The name may now be this statement: no longer re-prepared as a rewrite one.
        self.rw_statements.remove(name);
        if name == names::UNCERTAIN {
            self.poison_statements(shared);
        }
        let defined = shared.define(name, batch, Arc::new(Analysis::of_kind(inner.as_ref().clone())), false);
        Some(Effect::Prepared(defined))
    }

    /// What running client statement `name` in `batch` may do, as one analysis, over every
    /// definition Postgres may hold under it (see [`Shared::statements`]): one of them as
    /// it is, or a single statement that writes (or may write) every fence any of them
    /// may. A definition sent in the same batch is the only one that can run. A name
    /// without any known definition may write any fence. A write to a rewrite-mode table
    /// counts as unanalysable here: only statements rewritten at their Parse
    /// (`rw_statements`) run rewritten, and they do not come this way.
    fn resolve(&self, shared: &Shared, name: &str, batch: u64) -> Arc<Analysis> {
        if name == names::UNCERTAIN {
            return self.anything();
        }
        let defs = self.candidates(shared, name, batch);
        let as_is = || match defs {
            [only] => only.analysis.clone(),
            _ => Arc::default(),
        };
        // `EXECUTE other` where `other` has no known definition: looked up again when it
        // runs (`need`), where Postgres decides whether it exists.
        if let [only] = defs
            && let [stmt] = only.analysis.statements.as_slice()
            && let StmtKind::Execute { name } = &stmt.kind
            && self.missing(shared, name)
        {
            return as_is();
        }
        // The usual case, one definition that stands for itself: nothing to compute.
        if self.stands_alone(defs) {
            return as_is();
        }
        if defs.len() > 1 {
            // Several definitions, one of which looks up what it runs when it runs: what that
            // is may change before then.
            if defs.iter().any(|d| runs_by_name(&d.analysis)) {
                return self.anything();
            }
            // One of which makes a change pgfence must know of before Postgres answers:
            // taking none of the changes would lose the one Postgres makes (a `SET`, a
            // `ROLLBACK TO` that keeps what was declared before its savepoint, where its tag
            // alone reads as a rollback, a `DEALLOCATE` and a `PREPARE` that put a write under
            // a name pgfence takes for a read, a transaction's end that what is pipelined
            // behind runs after). A cursor closed unseen is only still guarded.
            if defs.iter().any(|d| changes_session(&d.analysis)) {
                let same = defs.windows(2).all(|w| same_kinds(&w[0].analysis, &w[1].analysis));
                return if same {
                    defs[0].analysis.clone()
                } else {
                    self.anything()
                };
            }
        }
        self.steps.set(0);
        match self.definitions_need(shared, defs, batch, 1) {
            // One definition writes what its own kind says.
            Need::Write(_) if defs.len() <= 1 => as_is(),
            need => self.need_analysis(need).unwrap_or_else(as_is),
        }
    }

    /// The definitions Postgres may hold under client statement `name` for a Bind or
    /// `EXECUTE` in `batch`: a definition sent in the same batch is the only one that can
    /// run (if it failed, so does the rest of the batch).
    fn candidates<'a>(&self, shared: &'a Shared, name: &str, batch: u64) -> &'a [Definition] {
        let defs = shared.statements.get(name).map(Vec::as_slice).unwrap_or_default();
        match defs {
            [.., last] if last.batch == batch => std::slice::from_ref(last),
            _ => defs,
        }
    }

    /// Whether `defs` is one definition that stands for itself when run by name.
    fn stands_alone(&self, defs: &[Definition]) -> bool {
        matches!(defs, [only] if !only.analysis.statements.iter().any(|s| self.widened(&s.kind)))
    }

    /// One statement that needs what `need` says, as an analysis: `None` when it needs
    /// nothing, or may write any fence on a database without any.
    fn need_analysis(&self, need: Need) -> Option<Arc<Analysis>> {
        let kind = match need {
            Need::None => return None,
            Need::Write(mut fences) => {
                fences.sort_unstable();
                fences.dedup();
                StmtKind::Write {
                    fences,
                    tables: Vec::new(),
                }
            }
            Need::Unanalysable(mut fences) => {
                // None listed: any fence of this database.
                if fences.is_empty() {
                    fences = self.fences.applicable.clone();
                }
                if fences.is_empty() {
                    return None;
                }
                fences.sort_unstable();
                fences.dedup();
                StmtKind::Unanalysable { fences }
            }
            Need::Missing(_) => return self.need_analysis(Need::Unanalysable(Vec::new())),
        };
        Some(Arc::new(Analysis::of_kind(kind)))
    }

    /// Whether a Bind of client statement `name` sent now runs exactly one known
    /// statement (if Postgres holds any under the name), which stands for itself.
    fn exact_definition(&self, shared: &Shared, name: &str) -> bool {
        self.stands_alone(self.candidates(shared, name, self.batch))
    }

    /// Whether a definition's statement needs more than its own kind says when run by
    /// name (see [`Self::run_need`]).
    fn widened(&self, kind: &StmtKind) -> bool {
        match kind {
            StmtKind::Execute { .. } | StmtKind::Fetch { .. } => true,
            StmtKind::Unanalysable { fences } => fences.is_empty(),
            StmtKind::Write { fences, .. } => self.any_rewrite(fences),
            _ => false,
        }
    }

    /// What running one of `defs` may need, `depth` steps down (see [`Self::run_need`]):
    /// the union of their needs, and any fence when there is none.
    fn definitions_need(&self, shared: &Shared, defs: &[Definition], batch: u64, depth: usize) -> Need {
        if defs.is_empty() {
            return Need::Unanalysable(Vec::new());
        }
        let mut need = Need::None;
        for def in defs {
            // Postgres refuses to prepare several statements under one name.
            if let [stmt] = def.analysis.statements.as_slice() {
                need = need.union(self.run_need(shared, &stmt.kind, batch, depth));
            }
        }
        need
    }

    /// A refusal (PF004) for a text that Postgres may read differently from pgfence and
    /// that may name a fenced table; the statement is replaced by one that raises it.
    /// - A multibyte character can end in byte 0x5C in the client-only encodings: to
    ///   Postgres it is no backslash, so where pgfence sees an escaped quote Postgres sees
    ///   a string's end. pgfence reads the text as UTF-8, so such a character followed by
    ///   `\` is suspect while the session's `client_encoding` is one of them.
    /// - `standard_conforming_strings` and `client_encoding` are known from Postgres'
    ///   reports; a request still in flight, or an Execute still waiting for its Sync
    ///   (`unsynced`), may change them. Then a text that reads differently with the setting
    ///   on and off, a backslash in a write pgfence rewrites, or the suspect sequence above,
    ///   is refused.
    fn unreadable(&self, shared: &Shared, sql: &str, unsynced: bool) -> Option<Rejection> {
        // Postgres reports a changed setting just before ReadyForQuery: after an Execute,
        // only once a Sync has come, even when every reply is in.
        // pgfence's own `PREPARE`, sent ahead of this text, changes no setting.
        let in_flight = unsynced || shared.pending.iter().any(|u| !matches!(u, Unit::OwnQuery(_)));
        // Refused if it names a fenced table anywhere, or if, read with those backslashes
        // taken into the characters before them, it does more than read: what Postgres reads
        // after a string's real end can be any statement (an EXECUTE of a prepared write, a
        // FETCH, a declaration).
        if (in_flight || shared.reported.encoding_hides_backslash)
            && hides_backslash(sql)
            && !self.fences.applicable.is_empty()
            && (self.fences.may_name_any(sql)
                || !self
                    .fences
                    .analyze(&swallow_backslashes(sql), shared.reported.standard_conforming_strings)
                    .is_plain())
        {
            let fences = self.applicable_names();
            let (message, hint) = if shared.reported.encoding_hides_backslash {
                (
                    format!(
                        "pgfence: statement has a multibyte character before a backslash, which this session's \
                         client_encoding may read differently, and may write a table of fence {fences}; refused"
                    ),
                    "Use client_encoding UTF8 for sessions that write fenced tables.",
                )
            } else {
                (
                    format!(
                        "pgfence: statement has a multibyte character before a backslash, a request in flight may \
                         change client_encoding to one that reads it differently, and it may write a table of \
                         fence {fences}; refused"
                    ),
                    "Send such a statement once the answers to the requests before it have arrived, or pass the \
                     value as a parameter.",
                )
            };
            return Some(Rejection {
                code: crate::error::sqlstate::UNANALYSABLE,
                message,
                hint: hint.into(),
                fences: Vec::new(),
            });
        }
        if in_flight && sql.contains('\\') {
            let scs = shared.reported.standard_conforming_strings;
            let (a, b) = (self.fences.analyze(sql, scs), self.fences.analyze(sql, !scs));
            // A rewrite edits inside the statement, where the two readings may place
            // string ends differently even when they agree on its span and kind.
            let rewrites = a.statements.iter().any(|s| self.rewritten(&s.kind));
            if (a != b && !(a.is_plain() && b.is_plain())) || rewrites {
                return Some(Rejection {
                    code: crate::error::sqlstate::UNANALYSABLE,
                    message: format!(
                        "pgfence: a request in flight may change standard_conforming_strings, which decides where \
                         this statement's strings end, and the statement may write a table of fence {}; refused",
                        self.applicable_names()
                    ),
                    hint: "Wait for the answer to a SET standard_conforming_strings before sending such a statement, \
                           or write backslashes in E'' strings."
                        .into(),
                    fences: Vec::new(),
                });
            }
        }
        None
    }

    /// A refusal (PF004) for a text that is not valid UTF-8 (pgfence read a lossy copy, as
    /// the client's encoding is another) on a database with fences, unless it only reads or
    /// writes tables and no fenced table's name has a non-ASCII character: in the copy every
    /// byte that is not UTF-8 is the same character, so names Postgres tells apart
    /// (statements, portals, savepoints, tables) would be one to pgfence.
    fn lossy(&self, analysis: &Analysis) -> Option<Rejection> {
        let names_nothing = analysis.statements.iter().all(|s| {
            matches!(
                s.kind,
                StmtKind::Other | StmtKind::EndTransaction { .. } | StmtKind::Write { .. }
            )
        });
        if self.fences.applicable.is_empty() || (names_nothing && !self.fences.non_ascii_tables) {
            return None;
        }
        Some(Rejection {
            code: crate::error::sqlstate::UNANALYSABLE,
            message: format!(
                "pgfence: statement is not valid UTF-8, and pgfence cannot tell the names in it apart on a database \
                 with tables of fence {}; refused",
                self.applicable_names()
            ),
            hint: "Use client_encoding UTF8 for sessions that write fenced tables.".into(),
            fences: Vec::new(),
        })
    }

    /// Whether a `BEGIN` or `START TRANSACTION` is among the statements at `spans` of `sql`.
    fn any_begins(&self, sql: &str, mut spans: impl Iterator<Item = std::ops::Range<usize>>) -> bool {
        spans.any(|span| self.begins(sql.get(span)))
    }

    /// Whether pgfence may rewrite the statement's text (a write to a rewrite-mode table,
    /// also one being prepared).
    fn rewritten(&self, kind: &StmtKind) -> bool {
        match kind {
            StmtKind::Write { fences, .. } => self.any_rewrite(fences),
            StmtKind::Prepare { inner, .. } => self.rewritten(inner),
            _ => false,
        }
    }

    /// Prepares pgfence's guard statement with an SQL `PREPARE` of its own, sent as a Query
    /// before the client's, when the session may need the guard in the simple protocol and
    /// does not have it. Only between transactions ([`Shared::between_transactions`]), so
    /// that the PREPARE runs in a transaction of its own: if it fails (a database without the
    /// `pgfence` schema, a name a client statement took), nothing of the client's is
    /// touched, and the guard is spelled out instead. A PREPARE in the client's own string
    /// would keep that whole string as the statement's text for the rest of the session.
    /// Not after a Bind still waiting for its Sync: the PREPARE would end the implicit
    /// transaction that holds its portal, which the client's `BEGIN` would have kept.
    fn prepare_ahead(&mut self, shared: &mut Shared) {
        let own = OwnStatement::Guard;
        // Cheapest first: once both are prepared, every Query stops at the second test.
        match shared.own.get(&own).copied().unwrap_or_default() {
            Prepared::No => {}
            // Where the schema is missing, or the name taken, the first PREPARE says so.
            Prepared::Yes => return self.prepare_const_ahead(shared),
            _ => return,
        }
        if self.speculative.epoch.current().is_none()
            || !self.fences.applicable.iter().any(|&f| !self.unguarded(f))
            || !self.may_prepare_now(shared)
        {
            return;
        }
        shared.own.insert(own, Prepared::BY_QUERY);
        shared.pending.push_back(Unit::OwnQuery(own));
        self.query_prefix = Some(guard_sql::guard_prepare(own.name()));
    }

    /// Once the guard statement is settled, the guard call for the session's fence and epoch
    /// with its arguments written in ([`OwnStatement::ConstGuard`]), made again when they
    /// change. Postgres evaluates an `EXECUTE`'s parameters in each transaction, about as
    /// much server CPU as the guard's own work; this statement has none.
    fn prepare_const_ahead(&mut self, shared: &mut Shared) {
        let own = OwnStatement::ConstGuard;
        let Some(wanted) = self.const_guard_wanted() else {
            return;
        };
        let state = shared.own.get(&own).copied().unwrap_or_default();
        let current = state == Prepared::Yes && self.const_guard == Some(wanted);
        // In flight, or refused (the name may be a client's) until DISCARD or DEALLOCATE ALL.
        if current || matches!(state, Prepared::InFlight(_) | Prepared::Unknown) || !self.may_prepare_now(shared) {
            return;
        }
        let (name, lease) = self.fence_args(wanted.0);
        let call = guard_sql::guard_call(name, wanted.1, lease, self.keeps_hwm(wanted.0));
        let mut sql = String::with_capacity(call.len() + 96);
        if state == Prepared::Yes {
            // Only its PREPARE's answer settles the name (`Unit::OwnQuery`): if this fails,
            // the PREPARE is skipped and the name is left for the extended protocol's way.
            let _ = write!(sql, "DEALLOCATE {}; ", own.name());
        }
        let _ = write!(sql, "PREPARE {} AS {call}", own.name());
        shared.own.insert(own, Prepared::BY_QUERY);
        shared.pending.push_back(Unit::OwnQuery(own));
        self.const_guard = Some(wanted);
        self.query_prefix = Some(sql);
    }

    /// The session's fence ([`Self::session_fence`]) among those that apply to its database.
    fn session_fence_id(&self) -> Option<FenceId> {
        let name = self.session_fence()?;
        self.fences
            .applicable
            .iter()
            .copied()
            .find(|f| self.fences.names.get(usize::from(f.0)).is_some_and(|x| x == name))
    }

    /// An invalid declaration's PF003 in place of the statement: Postgres raises it, with the
    /// current epoch of the session's fence when the database can give it.
    fn refuse_declaration(&self, mut r: Rejection) -> String {
        r.fences.extend(self.session_fence_id());
        raise_block(&r, &self.epoch_names(&r))
    }

    /// The fence and epoch the session's next fenced write would be guarded for, when pgfence
    /// can tell and the fence has a guard: reject mode, or rewrite mode with a lease.
    fn const_guard_wanted(&self) -> Option<(FenceId, Epoch)> {
        let epoch = *self.speculative.epoch.current()?;
        let fence = self.session_fence_id()?;
        (!self.unguarded(fence)).then_some((fence, epoch))
    }

    /// Whether pgfence's statement `own` is there for the simple protocol to `EXECUTE`:
    /// prepared, and no `DEALLOCATE` or `DISCARD ALL` in flight that may drop it.
    pub(super) fn own_ready(&self, shared: &Shared, own: OwnStatement) -> bool {
        shared.answered >= self.dealloc_until && shared.own.get(&own).copied().unwrap_or_default() == Prepared::Yes
    }

    /// Whether pgfence may send a Query of its own before the client's now: between
    /// transactions, with nothing of the client's that could change its statements in flight.
    fn may_prepare_now(&self, shared: &Shared) -> bool {
        shared.answered >= self.ran_until
            && shared.answered >= self.dealloc_until
            && !self.bound_unsynced
            && shared.between_transactions()
    }

    /// The Query [`Self::on_query`] wants sent before the client's, if any.
    pub fn take_query_prefix(&mut self) -> Option<String> {
        self.query_prefix.take()
    }

    /// Guard or rejection call for one fenced statement in a simple Query.
    ///
    /// Postgres parses and plans a guard call in each transaction of the simple protocol
    /// (about 20 µs of server CPU); `EXECUTE` of pgfence's prepared guard statement does
    /// neither. The statements are prepared by [`Self::prepare_ahead`] (see
    /// [`Self::simple_guard_call`]).
    fn simple_check(&self, shared: &Shared, need: Need, single: bool) -> Option<(Injected, String)> {
        let if_prepared = need.missing_name();
        match self.decide(need)? {
            Decision::Guard { fence, epoch } => {
                // Within a transaction that already passed this guard, another adds nothing.
                // Only for a lone statement: a longer string may COMMIT before its write.
                if single && shared.guard_still_held(fence, epoch) {
                    return None;
                }
                Some((
                    Injected::Guard(fence, epoch),
                    self.simple_guard_call(shared, fence, epoch),
                ))
            }
            Decision::Reject(r) => {
                let fences = self.epoch_names(&r);
                let call = match if_prepared {
                    Some(name) => guard_sql::reject_if_prepared_call(&name, r.code, &r.message, &r.hint, &fences),
                    None => guard_sql::reject_call(r.code, &r.message, &r.hint, &fences),
                };
                Some((Injected::Reject(r.fences.first().copied()), call))
            }
        }
    }

    /// The guard call for `fence` at `epoch` in a simple Query: `EXECUTE` of the constant
    /// guard when it holds them, else of the guard with parameters, else (until Postgres has
    /// answered their PREPARE, or while a DEALLOCATE or DISCARD may have dropped them, or a
    /// client statement took a name) spelled out.
    pub(super) fn simple_guard_call(&self, shared: &Shared, fence: FenceId, epoch: Epoch) -> String {
        let own = OwnStatement::Guard;
        let keep = self.keeps_hwm(fence);
        let (name, lease) = self.fence_args(fence);
        if self.const_guard == Some((fence, epoch)) && self.own_ready(shared, OwnStatement::ConstGuard) {
            format!("EXECUTE {}", OwnStatement::ConstGuard.name())
        } else if self.own_ready(shared, own) {
            guard_sql::guard_execute(own.name(), name, epoch, lease, keep)
        } else {
            guard_sql::guard_call(name, epoch, lease, keep)
        }
    }

    /// Parse: analyses the statement and records it as a definition of its name; an
    /// invalid declaration is replaced by a statement that raises PF003 when executed,
    /// a write to a rewrite-mode table by its rewrite for the session's epoch (see
    /// `rewriting`).
    /// `name` is the key of the name the client sent as `wire` (see [`names`]).
    pub fn on_parse(
        &mut self,
        shared: &mut Shared,
        name: &str,
        wire: &[u8],
        sql: &str,
        params: &[u8],
        exact: bool,
    ) -> Option<String> {
        if name == names::UNCERTAIN {
            self.poison_statements(shared);
        }
        if let Some(r) = self.unreadable(shared, sql, shared.unsynced) {
            self.rw_statements.remove(name);
            // The statement sent raises PF004 itself.
            let defined = shared.define(name, self.batch, Arc::default(), false);
            shared.pending.push_back(Unit::Parse(None, Some(defined), None));
            return Some(raise_block(&r, &[]));
        }
        let scs = shared.reported.standard_conforming_strings;
        let analysis = self
            .take_ready(sql, scs)
            .unwrap_or_else(|| self.fences.analyze_parse(sql, scs));
        if !exact && let Some(r) = self.lossy(&analysis) {
            self.rw_statements.remove(name);
            let defined = shared.define(name, self.batch, Arc::default(), false);
            shared.pending.push_back(Unit::Parse(None, Some(defined), None));
            return Some(raise_block(&r, &[]));
        }
        let analysis = self.keyed(shared, analysis, shared.unsynced);
        // A statement that opens a transaction block does so whenever it runs, maybe in a
        // later round trip: its Bind counts as a BEGIN too.
        // Its statements as Postgres splits them (`;BEGIN` is a BEGIN).
        let spans = analysis.statements.iter().map(|st| st.span.clone());
        let begins = self.any_begins(sql, spans) || analysis.uncertain;
        // Under a name pgfence cannot key, a rewrite could be re-prepared under another.
        let mut replacement = if name == names::UNCERTAIN {
            self.rw_statements.remove(name);
            None
        } else {
            self.parse_rewrite(name, wire, sql, &analysis, params, exact)
        };
        if let [stmt] = analysis.statements.as_slice() {
            if let StmtKind::Declare(d) = &stmt.kind {
                if let Err(rejection) = super::declaration::effect(d, shared.defined, self.session_fence()) {
                    // pgfence's own error, without a position.
                    replacement = Some((self.refuse_declaration(rejection), Arc::default()));
                }
            }
        }
        let defined = shared.define(name, self.batch, analysis, begins);
        if let Some(rw) = self.rw_statements.get_mut(name) {
            rw.last.id = defined.id;
        }
        let (text, positions) = replacement.unzip();
        shared.pending.push_back(Unit::Parse(None, Some(defined), positions));
        text
    }

    /// Bind: remembers which statement the portal runs; re-prepares a
    /// rewritten statement for a new epoch first (appended to `out`).
    pub fn on_bind(&mut self, shared: &mut Shared, portal: &str, statement: &str, out: &mut BytesMut) {
        self.bound_unsynced = true;
        // Whether it opens a block, over every definition Postgres may hold under the name
        // (a Parse refused or skipped leaves the one before). Where they differ, taking
        // either could lose a `ROLLBACK`'s meaning for what is pipelined behind (a `SET`
        // kept or undone unlike Postgres): its Execute is refused.
        let defs = self.candidates(shared, statement, self.batch);
        let begins = defs.iter().filter(|d| d.begins).count();
        let unsure_begin = begins > 0 && begins < defs.len();
        let begins = begins > 0 && !unsure_begin;
        // A named portal that Postgres may still hold: then it refuses this Bind (42P03)
        // and keeps the old portal, so an Execute of the name may run either. Not when
        // this batch closes it first: that Close cannot fail, and if the batch is skipped
        // so is this Bind.
        let old = (!portal.is_empty() && !shared.closed_in_this_batch(portal))
            .then(|| shared.portals.get(portal).map(|e| e.analysis.clone()))
            .flatten();
        let rw = self.bind_rewrite(shared, statement, old.is_some(), out);
        let exact = (old.is_none() && self.exact_definition(shared, statement)).then_some(self.batch);
        let mut analysis = self.resolve(shared, statement, self.batch);
        if let Some(old) = old {
            analysis = self.either(shared, &old, analysis);
        }
        if unsure_begin {
            analysis = self.anything();
        }
        shared.binds += 1;
        let bind = shared.binds;
        let entry = PortalEntry {
            analysis,
            sent: self.sent,
            exact,
            bind,
            rw,
            begins,
        };
        if portal == names::UNCERTAIN {
            self.poison_portals(shared);
            shared.uncertain_portals = Some(self.sent);
        }
        let before = shared.portals.insert(portal, entry);
        shared
            .rebinding
            .get_or_default(portal)
            .push_back((self.batch, before.as_ref().map(|e| e.analysis.clone())));
        let rebind = Box::new(Rebind {
            portal: portal.to_owned(),
            bind,
            before,
        });
        // A rewrite Postgres plans again at this Bind (a table it names changed) reports
        // its errors in the rewritten text.
        let positions = self
            .rw_statements
            .get(statement)
            .and_then(|rw| rw.last.positions.clone());
        shared.pending.push_back(Unit::Bind(None, positions, Some(rebind)));
    }

    /// Execute: appends the guard (or rejection) messages that must run
    /// before it to `out`, then records the client's Execute.
    pub fn on_execute(&mut self, shared: &mut Shared, portal: &str, out: &mut BytesMut) {
        shared.copy_data_early = false;
        let first_of_batch = !std::mem::replace(&mut shared.unsynced, true);
        // The first statement of its transaction: of the batch, or right after an end of a
        // block in it (Postgres then runs a `DISCARD ALL` as it does first in a batch).
        let fresh = first_of_batch || std::mem::take(&mut self.tx_ended);
        // Its effect on the transaction is known once the Sync after it is answered.
        self.ran_until = self.sent + 1;
        if let Some(decision) = self.execute_rewrite(shared, portal) {
            match decision {
                Some(decision) => {
                    self.doomed |= matches!(decision, Decision::Reject(_));
                    self.inject_extended(shared, decision, None, out);
                }
                None => self.batch_guard = None,
            }
            shared.pending.push_back(Unit::Execute(None, None));
            return;
        }
        let (mut analysis, mut exact) = match shared.portals.get(portal) {
            _ if portal == names::UNCERTAIN => (self.anything(), false),
            Some(e) => {
                // A statement that opens a transaction block does so when it runs, maybe in
                // a later round trip than its Bind. Bound in an earlier batch, it opens none:
                // outside a block Postgres dropped the portal at that batch's Sync, inside one
                // a `BEGIN` only warns.
                if e.begins && e.sent == self.sent {
                    self.outside_block = false;
                }
                (e.analysis.clone(), e.exact == Some(self.batch))
            }
            None if uncertain_portal(shared, portal) => (self.anything(), false),
            None => (Arc::default(), false),
        };
        // A Bind of the name from an earlier batch, not yet answered, may be refused: inside
        // an explicit transaction the portal is then still what it held before. Whether one
        // is open is not known until Postgres says so (a `BEGIN` may be run where pgfence
        // cannot see it, by SQL `EXECUTE`), so that is taken as possible.
        let earlier: Vec<Arc<Analysis>> = shared.held_before(portal, self.batch).cloned().collect();
        for before in earlier {
            analysis = self.either(shared, &before, analysis);
            exact = false;
        }
        let mut effect = None;
        // A fenced write for sure: bound in this batch from the one definition its
        // statement can have. A decision over several (`resolve`, `either`) may stand
        // for a statement that ends the transaction.
        let mut writes = false;
        if let [stmt] = analysis.statements.as_slice() {
            if let StmtKind::Declare(d) = &stmt.kind {
                if let Ok(e) = super::declaration::effect(d, shared.defined, self.session_fence()) {
                    self.speculate_declaration(&e, fresh);
                    effect = Some(e);
                }
            }
            let need = self.need(shared, &stmt.kind, self.batch);
            writes = exact && matches!(need, Need::Write(_));
            if !writes {
                self.batch_guard = None;
            }
            let if_prepared = need.missing_name();
            if let Some(decision) = self.decide(need) {
                // A refusal raises whatever the data: Postgres skips the rest of the batch.
                // Not one that asks whether a name is prepared: it stands for statements
                // pgfence may take for an `EXECUTE` that are none, which then run.
                self.doomed |= matches!(decision, Decision::Reject(_)) && if_prepared.is_none();
                self.inject_extended(shared, decision, if_prepared, out);
            }
            self.tx_ended = matches!(stmt.kind, StmtKind::EndTransaction { chain: false, .. });
            // Answered with the Sync that ends this batch.
            if let Some(e) = self.note_effects(shared, &stmt.kind, self.batch, self.sent + 1) {
                effect = Some(e);
            }
            // Portals it drops run no `BEGIN` after it (a transaction's end, `CLOSE`,
            // `DISCARD ALL`).
            let gone = match &effect {
                Some(Effect::PortalsGone { portal, .. }) => Some(portal.as_deref()),
                Some(Effect::DiscardAll(_)) => Some(None),
                _ => None,
            };
            if let Some(portal) = gone {
                for (name, e) in shared.portals.iter_mut() {
                    if portal.is_none_or(|p| p == name) {
                        e.begins = false;
                    }
                }
            }
        }
        if !writes {
            self.batch_guard = None;
        }
        shared.pending.push_back(Unit::Execute(None, effect));
    }

    /// Describe of a statement (`S`) or portal (`P`) named `name` (its key, see [`names`]).
    pub fn on_describe(&mut self, shared: &mut Shared, kind: u8, name: &str) {
        // Postgres checks a prepared statement again to describe it: a rewrite reports its
        // errors in the rewritten text, as at Bind.
        self.take_described(shared);
        let rw = if kind == b'S' {
            self.rw_statements.get(name)
        } else {
            None
        };
        let positions = rw.and_then(|rw| rw.last.positions.clone());
        let statement = rw.map(|rw| (name.to_owned(), rw.serial));
        shared.pending.push_back(Unit::Describe(positions, statement));
    }

    /// Close of a statement (`S`) or portal (`P`). What it removes goes when Postgres
    /// confirms: a Close skipped after an error leaves the statement or portal in place.
    pub fn on_close(&mut self, shared: &mut Shared, kind: u8, name: &str) {
        self.close_rewrite(kind, name);
        if kind != b'S' {
            // Closed, it runs no `BEGIN` in this batch (a Bind after makes a new entry); a
            // Close skipped after an error is in a batch that runs nothing more.
            if let Some(e) = shared.portals.get_mut(name) {
                e.begins = false;
            }
            let bind = shared.portals.get(name).map(|e| e.bind);
            shared.pending.push_back(Unit::ClosePortal(name.to_owned(), bind));
            return;
        }
        if let Some(own) = OwnStatement::named(name) {
            shared.own.insert(own, Prepared::Unknown);
            shared.own_mark += 1;
        }
        let removes = Defined {
            name: name.to_owned(),
            id: shared.defined,
        };
        shared.pending.push_back(Unit::Close(None, Some(removes)));
    }

    /// One analysis for a portal that may run either `a` or `b`: what either needs (a
    /// write to a rewrite-mode table counts as unanalysable, as in [`Self::resolve`]).
    /// Where they differ and one of them changes what pgfence follows (a declaration, the
    /// transaction's end, a savepoint, a statement prepared or deallocated, a cursor
    /// closed), pgfence cannot tell which change Postgres makes, and taking the wrong one
    /// would lose track of a write (a portal forgotten, a statement's definition dropped):
    /// it may write any fence, so it is refused.
    fn either(&self, shared: &Shared, a: &Analysis, b: Arc<Analysis>) -> Arc<Analysis> {
        // What a portal of `EXECUTE`/`FETCH` runs is looked up when it runs, not now.
        let follows = |x: &Analysis| changes_followed(x) || runs_by_name(x);
        if (follows(a) || follows(&b)) && !same_kinds(a, &b) {
            let anything = self.anything();
            if !anything.statements.is_empty() {
                return anything;
            }
        }
        // The same `EXECUTE`/`FETCH` either way: looked up when it runs. Decided now, it would
        // keep what the name runs now (a write to one fence) after the name changes.
        if runs_by_name(&b) && same_kinds(a, &b) && a.uncertain == b.uncertain {
            return b;
        }
        self.steps.set(0);
        let need = |x: &Analysis| match x.statements.as_slice() {
            [] => Need::None,
            [stmt] => self.run_need(shared, &stmt.kind, self.batch, 1),
            _ => Need::Unanalysable(Vec::new()),
        };
        self.need_analysis(need(a).union(need(&b))).unwrap_or(b)
    }

    /// Sync. In COPY FROM STDIN Postgres ignores it.
    pub fn on_sync(&mut self, shared: &mut Shared) {
        if shared.copy_in {
            shared.copy_syncs += 1;
            return;
        }
        shared.unsynced = false;
        self.bound_unsynced = false;
        self.tx_ended = false;
        self.sent += 1;
        self.batch += 1;
        // Outside a transaction block what ran up to this Sync was an implicit transaction.
        let fails = std::mem::take(&mut self.doomed);
        self.end_implicit(fails);
        shared.pending.push_back(Unit::Sync {
            after_copy_data: shared.copy_data_early,
        });
    }

    /// CopyDone or CopyFail: ends COPY FROM STDIN, or the one whose `G` is still to come.
    pub fn on_copy_end(&mut self, shared: &mut Shared) {
        shared.copy_data_early = false;
        if shared.copy_in {
            shared.copy_in = false;
            return;
        }
        // Only a COPY still to start can take it: with nothing in flight, Postgres drops it
        // without a reply, and a unit for it would wait for one (a client sending nothing
        // else would grow the queue without bound). Each COPY FROM STDIN of a string still
        // in flight takes one, so a run of them is kept, up to a bound no string reaches.
        let mut run = match shared.pending.back() {
            None => return,
            Some(Unit::CopyEnd) => shared.copy_ends_at_back,
            Some(_) => 0,
        };
        if run >= MAX_COPY_END_RUN && std::mem::take(&mut shared.copy_end_taken) {
            // The count is high when COPYs took some of the run since: count it.
            run = shared
                .pending
                .iter()
                .rev()
                .take_while(|u| matches!(u, Unit::CopyEnd))
                .count();
        }
        if run < MAX_COPY_END_RUN {
            shared.pending.push_back(Unit::CopyEnd);
            shared.copy_ends_at_back = run + 1;
        }
    }

    /// CopyData: sent before Postgres said it copies, a Sync after it is one Postgres
    /// answers if the COPY fails (see `Shared::copy_syncs`).
    pub fn on_copy_data(&mut self, shared: &mut Shared) {
        if !shared.copy_in {
            shared.copy_data_early = true;
        }
    }

    /// FunctionCall.
    pub fn on_function_call(&mut self, shared: &mut Shared) {
        shared.unsynced = false;
        self.bound_unsynced = false;
        self.sent += 1;
        self.batch += 1;
        shared.pending.push_back(Unit::FunctionCall);
    }

    /// Appends the guard or rejection to run before an Execute. `if_prepared`: the
    /// rejection is raised only if a statement of that name is prepared (`Need::Missing`).
    fn inject_extended(
        &mut self,
        shared: &mut Shared,
        decision: Decision,
        if_prepared: Option<String>,
        out: &mut BytesMut,
    ) {
        // `Some` for a guard call, whose messages are cached; `cached`, what the same fence and
        // epoch sent last.
        let mut guard = None;
        let mut cached = None;
        let (own, injected, params): (_, _, Vec<Option<String>>) = match decision {
            Decision::Guard { fence, epoch } => {
                // Rewrite mode without a lease has nothing to check: its rewrite names the
                // type `pgfence.epoch`, which a database without the schema refuses (PF005).
                if self.unguarded(fence)
                    || shared.guard_still_held(fence, epoch)
                    || self.batch_guard == Some((self.batch, fence, epoch))
                {
                    return;
                }
                self.batch_guard = Some((self.batch, fence, epoch));
                // The call with its arguments written in: no parameters for Postgres to
                // convert and evaluate in each transaction, and what depends on them alone
                // folded once, when the statement is planned. Made again (Close, Parse) when
                // the fence or epoch changes.
                guard = Some((fence, epoch));
                cached = match &self.guard_messages {
                    Some((f, e, bytes)) if (*f, *e) == (fence, epoch) => Some(bytes.clone()),
                    _ => None,
                };
                (OwnStatement::ConstGuard, Injected::Guard(fence, epoch), Vec::new())
            }
            Decision::Reject(r) => {
                let fences = guard_sql::fences_param(&self.epoch_names(&r));
                let mut params: Vec<_> = [r.code, &r.message, &r.hint, &fences]
                    .into_iter()
                    .map(|text| Some(guard_sql::utf8_param(text)))
                    .collect();
                let own = match if_prepared {
                    Some(name) => {
                        params.push(Some(guard_sql::utf8_param(&name)));
                        OwnStatement::RejectIfPrepared
                    }
                    None => OwnStatement::Reject,
                };
                (own, Injected::Reject(r.fences.first().copied()), params)
            }
        };
        let name = own.name();
        let prepared = shared.own.get(&own).copied().unwrap_or_default();
        // A DEALLOCATE or DISCARD ALL in flight may or may not drop the statement.
        let dropped = shared.answered < self.dealloc_until;
        // The constant guard holds one fence and epoch: another's is made anew.
        let other_call = guard.is_some() && self.const_guard != guard;
        let usable =
            !dropped && !other_call && (prepared == Prepared::Yes || prepared == Prepared::InFlight(self.sent));
        if !usable {
            let const_sql;
            let (sql, types) = match (own, guard) {
                (OwnStatement::ConstGuard, Some((fence, epoch))) => {
                    let (name, lease) = self.fence_args(fence);
                    const_sql = guard_sql::guard_call(name, epoch, lease, self.keeps_hwm(fence));
                    self.const_guard = guard;
                    (const_sql.as_str(), Vec::new())
                }
                // (The guard with parameters is the simple protocol's until the constant one
                // is there; never injected here.)
                (OwnStatement::Guard | OwnStatement::ConstGuard, _) => {
                    (guard_sql::GUARD_SQL, guard_sql::GUARD_PARAM_TYPES.to_vec())
                }
                (OwnStatement::Reject, _) => (guard_sql::REJECT_SQL, guard_sql::REJECT_PARAM_TYPES.to_vec()),
                (OwnStatement::RejectIfPrepared, _) => (
                    guard_sql::REJECT_IF_PREPARED_SQL,
                    guard_sql::REJECT_IF_PREPARED_PARAM_TYPES.to_vec(),
                ),
            };
            if prepared != Prepared::No {
                // It may be there or not (a Parse from an earlier batch, a DEALLOCATE in
                // flight, a name found taken): close it first, which is no error either way.
                codec::close_statement(out, name);
                shared.pending.push_back(Unit::Close(Some(Injected::Plumbing), None));
            }
            codec::parse(out, name, sql, types);
            shared
                .pending
                .push_back(Unit::Parse(Some(Injected::Prepare(own, shared.own_mark)), None, None));
            shared.own.insert(own, Prepared::InFlight(self.sent));
        }
        match cached {
            Some(bytes) => out.extend_from_slice(&bytes),
            None => {
                let start = out.len();
                let params: Vec<Option<&str>> = params.iter().map(|p| p.as_deref()).collect();
                codec::bind_text(out, own_portal(), name, &params);
                codec::execute(out, own_portal());
                codec::close_portal(out, own_portal());
                if let Some((fence, epoch)) = guard {
                    self.guard_messages = Some((fence, epoch, Bytes::copy_from_slice(&out[start..])));
                }
            }
        }
        shared
            .pending
            .push_back(Unit::Bind(Some(Injected::Plumbing), None, None));
        shared.pending.push_back(Unit::Execute(Some(injected), None));
        shared.pending.push_back(Unit::Close(Some(Injected::Plumbing), None));
    }

    /// What a statement needs, following what it runs (see [`Self::run_need`]).
    fn need(&self, shared: &Shared, kind: &StmtKind, batch: u64) -> Need {
        self.steps.set(0);
        self.run_need(shared, kind, batch, 0)
    }

    /// What running `kind` in `batch` may need once pgfence follows what it runs: SQL
    /// `EXECUTE` to every definition Postgres may hold under the name, SQL `FETCH`/`MOVE` to
    /// the statement of every portal it may name, and on from there (a prepared `EXECUTE`
    /// or `FETCH`, an `EXPLAIN ANALYZE EXECUTE`), `depth` being the steps taken so far:
    /// beyond [`MAX_NESTING`] it may write any fence, as past [`MAX_STEPS`] in all.
    /// Reached by a step, a write to a rewrite-mode table counts as unanalysable: it runs
    /// as it was prepared or bound, and pgfence rewrites only the statements run directly.
    fn run_need(&self, shared: &Shared, kind: &StmtKind, batch: u64, depth: usize) -> Need {
        if matches!(kind, StmtKind::Execute { .. } | StmtKind::Fetch { .. }) {
            let steps = self.steps.get() + 1;
            self.steps.set(steps);
            if steps > MAX_STEPS {
                return Need::Unanalysable(Vec::new());
            }
        }
        match kind {
            StmtKind::Write { fences, .. } if depth > 0 && self.any_rewrite(fences) => {
                Need::Unanalysable(fences.clone())
            }
            StmtKind::Execute { .. } | StmtKind::Fetch { .. } if depth >= MAX_NESTING => Need::Unanalysable(Vec::new()),
            StmtKind::Execute { name } if name == names::UNCERTAIN => Need::Unanalysable(Vec::new()),
            StmtKind::Execute { name } if self.missing(shared, name) => Need::Missing(name.clone()),
            StmtKind::Execute { name } => {
                let defs = self.candidates(shared, name, batch);
                // A statement that changes the session (a declaration, a statement name, a
                // savepoint, the transaction, a `BEGIN`) prepared with the protocol and run
                // by SQL `EXECUTE`: Postgres applies it, while pgfence, which sees an
                // EXECUTE, would not.
                if defs.iter().any(|d| d.begins || changes_session(&d.analysis)) {
                    return Need::Unanalysable(Vec::new());
                }
                self.definitions_need(shared, defs, batch, depth + 1)
            }
            StmtKind::Fetch { portals } => self.fetch_need(shared, portals, batch, depth),
            kind => self.kind_need(kind),
        }
    }

    /// What SQL `FETCH`/`MOVE` may run: the statement of any portal bound with the protocol
    /// that it may name (all of them for a name that cannot be read). A name pgfence never
    /// saw bound is a `DECLARE`d cursor, which only reads. Postgres runs a portal's write
    /// at its first fetch, and the portal lives on to the end of its transaction, so an
    /// Execute's guard does not cover a portal fetched this way.
    fn fetch_need(&self, shared: &Shared, portals: &[Option<String>], batch: u64, depth: usize) -> Need {
        let portal_need = |analysis: &Analysis| match analysis.statements.as_slice() {
            [] => Need::None,
            [stmt] => self.run_need(shared, &stmt.kind, batch, depth + 1),
            _ => Need::Unanalysable(Vec::new()),
        };
        let mut need = Need::None;
        if portals.iter().flatten().any(|p| p == names::UNCERTAIN) {
            return Need::Unanalysable(Vec::new());
        }
        // Out of steps: every name left may run anything (a long list of names costs its
        // length only once).
        let spent = || self.steps.get() > MAX_STEPS;
        if portals.iter().any(Option::is_none) {
            for e in shared.portals.values() {
                if spent() {
                    return Need::Unanalysable(Vec::new());
                }
                need = need.union(portal_need(&e.analysis));
            }
            return need;
        }
        for name in portals.iter().flatten() {
            if spent() || !shared.portals.contains_key(name) && uncertain_portal(shared, name) {
                return Need::Unanalysable(Vec::new());
            }
            // A FETCH runs in a batch of its own: every unanswered Bind is from before it.
            for analysis in shared.portal_may_run(name, u64::MAX) {
                need = need.union(portal_need(analysis));
            }
        }
        need
    }

    /// One statement that may write any fence of the database (or nothing, without fences).
    fn anything(&self) -> Arc<Analysis> {
        self.need_analysis(Need::Unanalysable(Vec::new())).unwrap_or_default()
    }

    /// `analysis` with every statement or cursor name that pgfence may key differently from
    /// Postgres replaced by [`names::UNCERTAIN`] (see [`names::ident_uncertain`]). `unsynced`:
    /// an Execute waits for its Sync.
    fn keyed(&self, shared: &Shared, analysis: Arc<Analysis>, unsynced: bool) -> Arc<Analysis> {
        let any_name = |pred: &dyn Fn(&str) -> bool| analysis.statements.iter().any(|s| sql_names(&s.kind).any(pred));
        if !any_name(&|n| !n.is_ascii()) {
            return analysis;
        }
        let (server, client) = (shared.reported.server, shared.reported.client);
        let in_flight = unsynced || shared.settings_may_change();
        let uncertain = |n: &str| names::ident_uncertain(n, server, client, in_flight);
        if !any_name(&uncertain) {
            return analysis;
        }
        let mut keyed = (*analysis).clone();
        for stmt in &mut keyed.statements {
            let names: Vec<&mut String> = match &mut stmt.kind {
                StmtKind::Prepare { name, .. }
                | StmtKind::Execute { name }
                | StmtKind::Deallocate { name: Some(name) }
                | StmtKind::Close { portal: Some(name) } => {
                    vec![name]
                }
                StmtKind::Fetch { portals } => portals.iter_mut().flatten().collect(),
                _ => Vec::new(),
            };
            for name in names.into_iter().filter(|n| uncertain(n)) {
                *name = names::UNCERTAIN.to_owned();
            }
        }
        Arc::new(keyed)
    }

    /// A statement defined under a name pgfence cannot key may be what Postgres now holds
    /// under any name that is not ASCII: each of those may now run anything.
    fn poison_statements(&mut self, shared: &mut Shared) {
        let anything = self.anything();
        if anything.statements.is_empty() {
            return;
        }
        let keys: Vec<String> = shared
            .statements
            .keys()
            .filter(|k| names::not_ascii(k))
            .map(str::to_owned)
            .collect();
        for key in keys {
            // What Postgres holds under the name may be a `BEGIN` too.
            shared.define(&key, self.batch, anything.clone(), true);
        }
        self.rw_statements.retain(|k, _| !names::not_ascii(k));
    }

    /// A portal bound under a name pgfence cannot key may be what Postgres now holds under
    /// any name that is not ASCII: each of those may now run anything.
    fn poison_portals(&mut self, shared: &mut Shared) {
        let anything = self.anything();
        if anything.statements.is_empty() {
            return;
        }
        for (key, e) in shared.portals.iter_mut() {
            if names::not_ascii(key) {
                e.analysis = anything.clone();
                e.exact = None;
                e.rw = None;
            }
        }
    }

    /// Whether client statement `name` has no known definition, on a database with fences.
    fn missing(&self, shared: &Shared, name: &str) -> bool {
        !self.fences.applicable.is_empty() && shared.statements.get(name).is_none_or(Vec::is_empty)
    }

    /// What a statement needs by its own kind.
    fn kind_need(&self, kind: &StmtKind) -> Need {
        match kind {
            StmtKind::Write { fences, .. } => Need::Write(fences.clone()),
            StmtKind::Unanalysable { fences } => Need::Unanalysable(fences.clone()),
            _ => Need::None,
        }
    }

    fn decide(&self, need: Need) -> Option<Decision> {
        let declared = Declared {
            epoch: self.speculative.epoch.current().copied(),
            fence_name: self.speculative.fence.current().map(String::as_str),
        };
        let (names, applicable) = (&self.fences.names, &self.fences.applicable);
        match need {
            Need::None => None,
            Need::Write(f) => Some(policy::decide(Access::Write(&f), declared, names, applicable)),
            Need::Unanalysable(f) => {
                // None listed: any fence of this database, and nothing to refuse without one.
                let fences = if f.is_empty() {
                    applicable.as_slice()
                } else {
                    f.as_slice()
                };
                (!fences.is_empty()).then(|| policy::decide(Access::Unanalysable(fences), declared, names, applicable))
            }
            Need::Missing(name) => {
                let list = self.applicable_names();
                Some(Decision::Reject(Rejection {
                    code: crate::error::sqlstate::UNANALYSABLE,
                    message: format!(
                        "pgfence: prepared statement \"{name}\" was prepared where pgfence cannot see it and may \
                         write a table of fence {list}; refused"
                    ),
                    hint: "Prepare statements that write fenced tables with PREPARE or the protocol's Parse, not \
                           inside a function or DO."
                        .into(),
                    fences: applicable.clone(),
                }))
            }
        }
    }

    fn speculate(&mut self, effect: &Effect) {
        effect.clone().apply_to(&mut self.speculative);
    }

    /// A statement that ends the transaction, for the later statements of the same string
    /// or pipeline: its settings changes commit or roll back with it, as it says (Postgres'
    /// answer settles it once nothing is in flight, see `resync`).
    fn speculate_end(&mut self, kind: &StmtKind) {
        if let StmtKind::EndTransaction { commit, chain, .. } = kind {
            if *chain && self.outside_block {
                // Refused outside a block: the implicit transaction fails with it.
                self.doomed = true;
                return;
            }
            let failed = std::mem::take(&mut self.block_failed);
            self.speculative.end_transaction(*commit && !failed);
            self.outside_block = !chain;
        }
    }

    /// The end of a Query or of a batch at its Sync: outside a transaction block it was an
    /// implicit transaction, whose declarations are kept unless it `fails`. Inside one, they
    /// wait for the COMMIT or ROLLBACK, and a failure leaves the block failed.
    fn end_implicit(&mut self, fails: bool) {
        if self.outside_block {
            self.speculative.end_transaction(!fails);
        } else if fails {
            self.block_failed = true;
        }
    }

    /// A declaration's effect, for the later statements of the string or batch. `DISCARD
    /// ALL` commits at once where it runs; where it may be refused (in a block, in a string
    /// of several statements, after an earlier Execute of the batch) its reset stays
    /// tentative, and in a block it fails it.
    fn speculate_declaration(&mut self, effect: &Effect, alone: bool) {
        if matches!(effect, Effect::DiscardAll(_)) && !(self.outside_block && alone) {
            self.doomed |= !self.outside_block;
            self.speculate(&Effect::ResetAll);
            return;
        }
        self.speculate(effect);
    }

    /// A `BEGIN` or `START TRANSACTION` at `span` of `sql` opens a transaction block (in a
    /// string, one that takes in the statements before it too).
    fn speculate_begin(&mut self, sql: &str, span: &std::ops::Range<usize>) {
        if self.outside_block && self.begins(sql.get(span.clone())) {
            self.outside_block = false;
        }
    }

    /// Whether `text` is a `BEGIN` or `START` (`TRANSACTION`).
    fn begins(&self, text: Option<&str>) -> bool {
        let lexing = Lexing {
            standard_conforming_strings: self.scs,
        };
        text.and_then(|t| crate::sql::split::first_word(t, lexing))
            .is_some_and(|w| w.eq_ignore_ascii_case("begin") || w.eq_ignore_ascii_case("start"))
    }

    pub(super) fn fence_args(&self, fence: FenceId) -> (&str, Option<&str>) {
        let f = &self.fences.config[usize::from(fence.0)];
        (
            f.name.as_str(),
            self.fences.lease_tables[usize::from(fence.0)].as_deref(),
        )
    }

    /// The fences of this database as a refusal lists them (`"a", "b"`), for a text that may
    /// write any of them.
    fn applicable_names(&self) -> String {
        let names = self
            .fences
            .applicable
            .iter()
            .filter_map(|f| self.fences.names.get(usize::from(f.0)));
        names.map(|n| format!("\"{n}\"")).collect::<Vec<_>>().join(", ")
    }

    /// The name of the fence the session's epoch is for, as far as pgfence can tell now: the
    /// one `pgfence.fence` names, or the only one that applies to this database.
    fn session_fence(&self) -> Option<&str> {
        let names = &self.fences.names;
        match self.speculative.fence.current() {
            Some(n) => names.iter().find(|x| *x == n).map(String::as_str),
            None => match self.fences.applicable.as_slice() {
                [only] => names.get(usize::from(only.0)).map(String::as_str),
                _ => None,
            },
        }
    }

    /// The names of `r`'s fences whose current epoch Postgres can give in its message: all
    /// but rewrite-mode fences without a lease, which keep no epoch (their rows do).
    pub(super) fn epoch_names(&self, r: &Rejection) -> Vec<&str> {
        r.fences
            .iter()
            .filter(|&&f| !self.unguarded(f))
            .map(|&f| self.fence_args(f).0)
            .collect()
    }

    /// Whether `fence` has no guard: rewrite mode without a lease, whose rewrites carry all
    /// there is to check (the epoch, and the type `pgfence.epoch` that proves the schema).
    pub(super) fn unguarded(&self, fence: FenceId) -> bool {
        !self.keeps_hwm(fence) && self.fences.lease_tables[usize::from(fence.0)].is_none()
    }

    fn keeps_hwm(&self, fence: FenceId) -> bool {
        self.fences.config[usize::from(fence.0)].mode == crate::config::Mode::Reject
    }
}

/// Whether a non-ASCII character comes right before a backslash: in the raw bytes, a byte
/// of 0x80 or above before 0x5C (a backslash is never part of a UTF-8 sequence, and an
/// invalid byte became U+FFFD in the text pgfence reads).
fn hides_backslash(sql: &str) -> bool {
    memchr::memchr_iter(b'\\', sql.as_bytes()).any(|i| i > 0 && sql.as_bytes()[i - 1] >= 0x80)
}

/// `sql` with each backslash that follows a non-ASCII character left out: how Postgres
/// reads its structure where that character ends in the byte of a backslash.
fn swallow_backslashes(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut prev_ascii = true;
    for c in sql.chars() {
        if c != '\\' || prev_ascii {
            out.push(c);
        }
        prev_ascii = c.is_ascii();
    }
    out
}

/// A statement that raises `r` without needing the pgfence schema. With `epochs_of`, the
/// current epochs of those fences are appended to the message as `pgfence.reject` (schema
/// version 7) appends them, when the database has that function; without it, or if it
/// fails otherwise, the message stays as it is.
pub(super) fn raise_block(r: &Rejection, epochs_of: &[&str]) -> String {
    let code = guard_sql::quote_literal(r.code);
    let raise = format!(
        "RAISE EXCEPTION USING ERRCODE = {code}, MESSAGE = m, HINT = {};",
        guard_sql::quote_literal(&r.hint)
    );
    let message = guard_sql::quote_literal(&r.message);
    let body = if epochs_of.is_empty() {
        format!("DECLARE m pg_catalog.text := {message}; BEGIN {raise} END")
    } else {
        format!(
            "DECLARE m pg_catalog.text := {message}; s pg_catalog.text; t pg_catalog.text; BEGIN \
             IF pg_catalog.to_regprocedure('pgfence.reject(pg_catalog.text, pg_catalog.text, pg_catalog.text, \
             pg_catalog.text[])') IS NOT NULL THEN BEGIN \
             EXECUTE 'SELECT pgfence.reject($1, $2, NULL, $3)' USING {code}, m, {}::pg_catalog.text[]; \
             EXCEPTION WHEN OTHERS THEN GET STACKED DIAGNOSTICS s = RETURNED_SQLSTATE, t = MESSAGE_TEXT; \
             IF s OPERATOR(pg_catalog.=) {code} THEN m := t; END IF; END; END IF; {raise} END",
            guard_sql::quote_literal(&guard_sql::fences_param(epochs_of))
        )
    };
    format!("DO {}", guard_sql::quote_literal(&body))
}

/// Whether portal `name`, which pgfence does not know, may be one bound under a name it
/// could not key.
fn uncertain_portal(shared: &Shared, name: &str) -> bool {
    shared.uncertain_portals.is_some() && names::not_ascii(name)
}

/// The portals a statement drops when it completes: the one SQL `CLOSE name` names, or
/// every one Postgres holds for `CLOSE ALL` and at the end of a transaction (portals the
/// protocol binds are never holdable). Binds sent after it are not touched.
fn note_portals_gone(shared: &Shared, kind: &StmtKind) -> Option<Effect> {
    let (portal, two_phase, chain) = match kind {
        StmtKind::Close { portal: Some(name) } if name == names::UNCERTAIN => return None,
        StmtKind::Close { portal } => (portal.clone(), false, false),
        StmtKind::EndTransaction { two_phase, chain, .. } => (None, *two_phase, *chain),
        _ => return None,
    };
    Some(Effect::PortalsGone {
        portal,
        upto: shared.binds,
        two_phase,
        chain,
    })
}

/// Whether `analysis` changes what pgfence tracks of the session when it completes: a
/// declaration, a statement name, a savepoint or the transaction.
fn changes_session(analysis: &Analysis) -> bool {
    analysis.statements.iter().any(|s| {
        matches!(
            s.kind,
            StmtKind::Declare(_)
                | StmtKind::Prepare { .. }
                | StmtKind::Deallocate { .. }
                | StmtKind::Savepoint(_)
                | StmtKind::EndTransaction { .. }
        )
    })
}

/// Whether `analysis` changes what pgfence follows of the session: what
/// [`changes_session`] counts, and a cursor closed (SQL `CLOSE`).
fn changes_followed(analysis: &Analysis) -> bool {
    changes_session(analysis)
        || analysis
            .statements
            .iter()
            .any(|s| matches!(s.kind, StmtKind::Close { .. }))
}

/// Whether `a` and `b` are the same statements.
fn same_kinds(a: &Analysis, b: &Analysis) -> bool {
    a.statements
        .iter()
        .map(|s| &s.kind)
        .eq(b.statements.iter().map(|s| &s.kind))
}

/// Whether `analysis` runs what a name holds when it runs: an SQL `EXECUTE` or `FETCH`/`MOVE`.
fn runs_by_name(analysis: &Analysis) -> bool {
    analysis
        .statements
        .iter()
        .any(|s| matches!(s.kind, StmtKind::Execute { .. } | StmtKind::Fetch { .. }))
}

/// The statement and cursor names a statement of `kind` names.
fn sql_names(kind: &StmtKind) -> impl Iterator<Item = &str> {
    let (one, many) = match kind {
        StmtKind::Prepare { name, .. }
        | StmtKind::Execute { name }
        | StmtKind::Deallocate { name: Some(name) }
        | StmtKind::Close { portal: Some(name) } => (Some(name.as_str()), &[][..]),
        StmtKind::Fetch { portals } => (None, portals.as_slice()),
        _ => (None, &[][..]),
    };
    one.into_iter().chain(many.iter().flatten().map(String::as_str))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Fence;

    /// An analysis made apart serves only the text it was made of, read as it was read,
    /// and only once; any other text is analysed in place.
    #[tokio::test]
    async fn an_analysis_made_apart_serves_only_its_own_text() {
        let fences: Arc<[Fence]> = Arc::from(Vec::new());
        let mut d = Dispatcher::new(Arc::new(DbFences::for_database(fences, "db")), Declarations::default());
        let text = "SELECT 1".to_owned();
        d.analyze_apart(text.clone(), true).await;
        assert!(d.take_ready("SELECT 2", true).is_none());
        d.analyze_apart(text.clone(), true).await;
        assert!(d.take_ready(&text, false).is_none());
        d.analyze_apart(text.clone(), true).await;
        let ready = d.take_ready(&text, true).expect("made for this text");
        assert_eq!(*ready, *d.fences.analyze(&text, true));
        assert!(d.take_ready(&text, true).is_none(), "used once");
        d.analyze_apart(text.clone(), false).await;
        d.forget_ready();
        assert!(d.take_ready(&text, false).is_none());
    }
}
