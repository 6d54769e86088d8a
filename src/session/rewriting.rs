//! Rewrite-mode fences in a session: the statement sent upstream is the
//! rewritten one, which carries the session's epoch as a literal.
//!
//! Simple protocol: the rewritten text replaces the statement's span in the
//! Query (after the lease guard, when the fence has a lease).
//!
//! Extended protocol: a Parse is rewritten for the session's (speculative)
//! epoch when one is declared, else forwarded as written. Because the epoch is
//! a literal, a prepared statement is only right for one epoch, so each client
//! statement remembers the last Parse pgfence sent for it and the epoch that
//! one carries. At Bind, unless Postgres is sure to hold a statement for the
//! session's epoch, `Close(S name)` + `Parse(name, rewritten, same parameter
//! types)` go upstream first (a re-prepare); their replies are swallowed.
//! Postgres is sure to hold it when that Parse was sent in the same batch as
//! the Bind (if it fails or is skipped, so is the Bind), when Postgres
//! confirmed it, or when it is the client's own and the only definition the
//! name can have (see [`Dispatcher::upstream`]). Otherwise a Parse that is still
//! in flight, or that failed or was skipped after an error, proves nothing: the
//! old statement, with an old epoch, may still be there. A statement without
//! an epoch stays as written and its Execute is refused (PF002) before it runs.
//! A portal remembers the epoch it was bound with: if the epoch changes between
//! its Bind and its Execute, the Execute is refused (PF004) instead of writing
//! with the old epoch.

use std::ops::Range;
use std::sync::Arc;

use bytes::{BufMut, BytesMut};

use super::dispatch::Dispatcher;
use super::positions::{Positions, Redo, SentText};
use super::state::{Injected, Shared, Unit};
use crate::error::sqlstate;
use crate::fence::call as guard_sql;
use crate::fence::epoch::Epoch;
use crate::fence::policy::{self, Access, Decision, Declared, Rejection};
use crate::sql::FenceId;
use crate::sql::classify::MAX_PARSE_BYTES;
use crate::sql::classify::{Analysis, StmtKind};

/// What a write that involves a rewrite-mode fence becomes.
pub(super) enum Plan {
    /// No rewrite-mode fence: reject mode's rules apply.
    NotRewrite,
    /// Refuse it: Postgres raises this error in its place.
    Reject(Rejection),
    /// Send `text` instead; run the lease guard first when the fence has a lease.
    Rewrite {
        /// The fence.
        fence: FenceId,
        /// The epoch written into the statement.
        epoch: Epoch,
        /// The rewritten statement.
        text: Arc<str>,
    },
}

/// What a simple Query sends for one statement that writes a rewrite-mode table.
pub(super) struct SimpleRewrite {
    /// What runs before the statement: the guard, or a rejection. After a rejection the
    /// client's statement stays as it is: Postgres never runs it, and a text that does not
    /// parse still fails whole, before any of its statements runs, as without pgfence.
    pub before: Option<(Injected, String)>,
    /// The rewrite sent in place of the statement, and how it was made; `None`: the
    /// statement is sent as it is.
    pub rewrite: Option<(String, Redo)>,
}

/// What a portal bound from a rewrite statement runs: the statement and the epoch its text
/// carried at the Bind (`None`: none sure). Kept with the portal (`PortalEntry::rw`), so a
/// Bind Postgres refuses leaves the portal from before, as Postgres does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RwPortal {
    pub(super) statement: String,
    /// The statement's `RwStatement::serial` at the Bind.
    pub(super) serial: u64,
    /// The fences the statement writes.
    pub(super) fences: Vec<FenceId>,
    pub(super) bound: Option<Epoch>,
}

/// A client's prepared statement that writes a rewrite-mode table.
#[derive(Debug, Clone)]
pub(super) struct RwStatement {
    /// The name as the client sent it: a re-prepare sends it again, as Postgres keys it
    /// the same however pgfence keys it.
    pub(super) wire: Vec<u8>,
    /// The Parse text as the client sent it.
    pub(super) full: String,
    /// The statement's span in `full`.
    pub(super) span: Range<usize>,
    /// The fences it writes.
    pub(super) fences: Vec<FenceId>,
    /// The Parse message's parameter-type section, resent on re-prepare unless Postgres
    /// described the statement's parameters (`described`).
    pub(super) params: Vec<u8>,
    /// The parameter types Postgres described for this statement, declared by a
    /// re-prepare: the client encodes its values for them (a driver that sends binary
    /// `int4` for an `int4` epoch column), and the rewritten text alone could make
    /// Postgres infer others (`bigint`, from the epoch it writes beside the value).
    pub(super) described: Option<Vec<u32>>,
    /// Whether `full` is the client's exact text (it was valid UTF-8).
    pub(super) exact: bool,
    /// What it does, for the definitions a re-prepare adds (`Shared::statements`).
    pub(super) analysis: Arc<Analysis>,
    /// The last Parse of the name pgfence sent upstream: the client's or a re-prepare.
    pub(super) last: LastParse,
    /// Numbers the client's Parses of rewrite statements: a portal bound from this one
    /// runs its text, whatever the name holds later.
    pub(super) serial: u64,
}

/// A Parse pgfence sent upstream for a rewrite statement.
#[derive(Debug, Clone)]
pub(super) struct LastParse {
    /// Its definition number (`Shared::define`); set by the caller of
    /// [`Dispatcher::parse_rewrite`] for the client's Parse.
    pub(super) id: u64,
    /// Its batch.
    pub(super) batch: u64,
    /// The [`Shared::answered`] count at which it is answered.
    pub(super) answered_at: u64,
    /// The epoch written into it (`None`: the client's text as written).
    pub(super) epoch: Option<Epoch>,
    /// Whether it is the client's own Parse (else a re-prepare).
    pub(super) by_client: bool,
    /// How its text was made from the client's (`None`: the client's text as written), for
    /// the positions of errors Postgres raises when it plans the statement again at Bind.
    pub(super) positions: Option<Arc<Positions>>,
}

/// What the statement behind a rewrite statement's name will be when a Bind sent
/// now runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Upstream {
    /// The last Parse pgfence sent, carrying this epoch.
    Holds(Option<Epoch>),
    /// Not known: that Parse is in flight, or a re-prepare failed (its Close may have
    /// run). A re-prepare makes it known.
    Unknown,
    /// The client's own Parse failed or was skipped, or the name lost every
    /// definition since (a `DEALLOCATE`, `DISCARD ALL`): whatever Postgres holds under
    /// the name, it is not this statement.
    NotThis,
}

/// Bytes of rewrite-mode statements rewritten for one client message. A rewrite costs
/// about 300 ns a byte on the thread the session shares with others; past this, the
/// message's statements that write rewrite-mode tables are refused (PF004) rather than
/// hold that thread for seconds.
pub(super) const REWRITE_BUDGET: usize = 4 * 1024 * 1024;

fn unanalysable(fence: FenceId, message: String, hint: &str) -> Rejection {
    Rejection {
        code: sqlstate::UNANALYSABLE,
        message,
        hint: hint.to_owned(),
        fences: vec![fence],
    }
}

impl Dispatcher {
    /// Whether any of `fences` is in rewrite mode.
    pub(super) fn any_rewrite(&self, fences: &[FenceId]) -> bool {
        fences.iter().any(|&f| self.fences.is_rewrite(f))
    }

    /// Decides a write to `fences` of the statement `stmt_sql`, in the
    /// contract's order: PF004 (mixed modes, not rewritable) before PF002/PF003.
    pub(super) fn plan(&self, fences: &[FenceId], stmt_sql: &str, exact: bool) -> Plan {
        let Some(&first) = fences.iter().find(|&&f| self.fences.is_rewrite(f)) else {
            return Plan::NotRewrite;
        };
        let name = |f: FenceId| self.fences.names.get(usize::from(f.0)).cloned().unwrap_or_default();
        if let Some(&reject) = fences.iter().find(|&&f| !self.fences.is_rewrite(f)) {
            // Both named, as every refusal names its fences; Postgres appends the current
            // epoch of each that keeps one (a rewrite-mode fence only with a lease).
            let mut r = unanalysable(
                reject,
                format!(
                    "pgfence: statement writes tables of a reject-mode fence (\"{}\") and a rewrite-mode fence \
                     (\"{}\"); refused",
                    name(reject),
                    name(first)
                ),
                "Write each fence's tables in separate statements.",
            );
            r.fences.push(first);
            return Plan::Reject(r);
        }
        if !exact {
            return Plan::Reject(unanalysable(
                first,
                "pgfence: statement is not valid UTF-8 and writes a rewrite-mode table; refused".into(),
                "Use client_encoding UTF8 for sessions that write fenced tables.",
            ));
        }
        // A statement over the rewriter's own limit is refused below, for that, and
        // costs no budget.
        if stmt_sql.len() <= MAX_PARSE_BYTES {
            let budget = self.rewrite_budget.get();
            if stmt_sql.len() > budget {
                return Plan::Reject(unanalysable(
                    first,
                    format!(
                        "pgfence: the message holds more than {} MiB of statements that write rewrite-mode \
                         tables (fence \"{}\"); refused",
                        REWRITE_BUDGET >> 20,
                        name(first)
                    ),
                    "Send them in several messages.",
                ));
            }
            self.rewrite_budget.set(budget - stmt_sql.len());
        }
        let declared = self.declared();
        // As reject mode's PF004 says it: the fence, and the epoch when there is one.
        let refused = |u: crate::sql::rewrite::Unsupported, fence: FenceId| {
            let at = declared.epoch.map(|e| format!(" at epoch {e}")).unwrap_or_default();
            unanalysable(
                fence,
                format!("{} (fence \"{}\"); refused{at}", u.reason, name(fence)),
                u.hint,
            )
        };
        // Whether it can be rewritten does not depend on the epoch: check it first.
        let probe = declared.epoch.unwrap_or(Epoch::MIN);
        if let Some(Err(u)) = self.fences.rewrite(first, stmt_sql, probe, self.scs) {
            return Plan::Reject(refused(u, first));
        }
        let (names, applicable) = (&self.fences.names, &self.fences.applicable);
        match policy::decide(Access::Write(fences), declared, names, applicable) {
            Decision::Reject(r) => Plan::Reject(r),
            Decision::Guard { fence, epoch } => match self.fences.rewrite(fence, stmt_sql, epoch, self.scs) {
                Some(Ok(text)) => Plan::Rewrite { fence, epoch, text },
                Some(Err(u)) => Plan::Reject(refused(u, fence)),
                None => Plan::NotRewrite,
            },
        }
    }

    /// The session's declarations as pgfence expects them when what is sent now runs.
    fn declared(&self) -> Declared<'_> {
        Declared {
            epoch: self.speculative.epoch.current().copied(),
            fence_name: self.speculative.fence.current().map(String::as_str),
        }
    }

    /// How a rewrite for `fence` at `epoch` is made now, to make it again for an error's
    /// position.
    fn redo(&self, fence: FenceId, epoch: Epoch) -> Redo {
        Redo {
            fence,
            epoch,
            standard_conforming_strings: self.scs,
        }
    }

    /// The text sent for a statement that writes a rewrite-mode table in a simple
    /// Query, and the guard to run before it (see [`SimpleRewrite`]).
    pub(super) fn simple_rewrite(
        &self,
        shared: &Shared,
        fences: &[FenceId],
        stmt_sql: &str,
        exact: bool,
        single: bool,
    ) -> SimpleRewrite {
        match self.plan(fences, stmt_sql, exact) {
            Plan::Rewrite { fence, epoch, text } => {
                // The guard checks the lease (PF003) when there is one, once per transaction.
                // Without one there is nothing to check: the rewrite names the type
                // `pgfence.epoch`, so a database without the schema refuses it (PF005).
                let skip = self.unguarded(fence) || single && shared.guard_still_held(fence, epoch);
                let guard = (!skip).then(|| {
                    (
                        Injected::Guard(fence, epoch),
                        self.simple_guard_call(shared, fence, epoch),
                    )
                });
                SimpleRewrite {
                    before: guard,
                    rewrite: Some((text.to_string(), self.redo(fence, epoch))),
                }
            }
            Plan::Reject(r) => SimpleRewrite {
                before: Some((
                    Injected::Reject(r.fences.first().copied()),
                    guard_sql::reject_call(r.code, &r.message, &r.hint, &self.epoch_names(&r)),
                )),
                rewrite: None,
            },
            Plan::NotRewrite => SimpleRewrite {
                before: None,
                rewrite: None,
            },
        }
    }

    /// Parse of a statement that writes a rewrite-mode table: remembers it and
    /// returns the rewritten text (and how it was made) when the session has an epoch. The caller
    /// sets the definition number (`last.id`).
    pub(super) fn parse_rewrite(
        &mut self,
        name: &str,
        wire: &[u8],
        sql: &str,
        analysis: &Arc<Analysis>,
        params: &[u8],
        exact: bool,
    ) -> Option<(String, Arc<Positions>)> {
        self.rw_statements.remove(name);
        let [stmt] = analysis.statements.as_slice() else {
            return None;
        };
        let StmtKind::Write { fences, .. } = &stmt.kind else {
            return None;
        };
        if !self.any_rewrite(fences) {
            return None;
        }
        self.rw_serial += 1;
        let mut rw = RwStatement {
            serial: self.rw_serial,
            wire: wire.to_vec(),
            full: sql.to_owned(),
            span: stmt.span.clone(),
            fences: fences.clone(),
            params: params.to_vec(),
            described: None,
            exact,
            analysis: analysis.clone(),
            last: LastParse {
                id: 0,
                batch: self.batch,
                answered_at: self.sent + 1,
                epoch: None,
                by_client: true,
                positions: None,
            },
        };
        let text = match self.plan(&rw.fences, &sql[rw.span.clone()], exact) {
            Plan::Rewrite { fence, epoch, text } => {
                rw.last.epoch = Some(epoch);
                let (text, positions) = splice(&rw, &text, self.redo(fence, epoch));
                let positions = Arc::new(positions);
                rw.last.positions = Some(positions.clone());
                Some((text, positions))
            }
            _ => None,
        };
        self.rw_statements.insert(name, rw);
        text
    }

    /// What Postgres will hold under rewrite statement `name` when a Bind sent now
    /// runs. Sure when the last Parse pgfence sent for it is in this batch (if that
    /// one fails or is skipped, so is the Bind), or when Postgres confirmed it and no
    /// confirmed removal came since (`Shared::confirmed`; a later Parse or `PREPARE`
    /// of the name would have replaced or dropped `rw`). Otherwise: unknown while it
    /// is in flight or after a re-prepare failed or was skipped (a re-prepare sends
    /// the client's own text again); not this statement once the client's own Parse
    /// failed, or the name lost every definition it had.
    pub(super) fn upstream(&self, shared: &Shared, name: &str, rw: &RwStatement) -> Upstream {
        let last = &rw.last;
        let answered = shared.answered >= last.answered_at;
        // Removed since (a confirmed DEALLOCATE or DISCARD ALL): nothing under the name.
        let removed = !shared.statements.contains_key(name) && !shared.confirmed.contains_key(name);
        // The client's Parse in flight, the only definition the name can have: if it
        // fails, the name holds nothing and the Bind fails too. Re-preparing would run
        // a text Postgres refused.
        let only = !shared.forgot
            && shared
                .statements
                .get(name)
                .is_some_and(|defs| matches!(defs.as_slice(), [d] if d.id == last.id));
        if last.batch == self.batch || shared.confirmed.get(name) == Some(&last.id) || (last.by_client && only) {
            Upstream::Holds(last.epoch)
        } else if answered && (last.by_client || removed) {
            Upstream::NotThis
        } else {
            Upstream::Unknown
        }
    }

    /// Bind: re-prepares the statement for the session's current epoch unless
    /// Postgres is sure to hold it for that epoch (appending to `out`), and
    /// returns what the portal runs: the statement and the epoch it carries (`None` for
    /// a portal that is not bound from a rewrite statement).
    ///
    /// `rebound`: Postgres may still hold a portal of this name, and then refuses this
    /// Bind (42P03) and keeps the old one: its Execute is refused (PF004).
    pub(super) fn bind_rewrite(
        &mut self,
        shared: &mut Shared,
        statement: &str,
        rebound: bool,
        out: &mut BytesMut,
    ) -> Option<RwPortal> {
        self.take_described(shared);
        let rw = self.rw_statements.get(statement)?;
        let upstream = self.upstream(shared, statement, rw);
        if upstream == Upstream::NotThis {
            // Reject mode's rules for a name: a rewrite write run by it is refused
            // (PF004) unless Postgres refuses the Bind first.
            self.rw_statements.remove(statement);
            return None;
        }
        let plan = self.plan(&rw.fences, &rw.full[rw.span.clone()], rw.exact);
        let mut bound = match upstream {
            Upstream::Holds(epoch) => epoch,
            _ => None,
        };
        // In a transaction known to be aborted the Bind fails (25P02) whatever it
        // names; a re-prepare there would lose the statement (its Close works, its
        // Parse fails), so it waits for a later Bind.
        let aborted = shared.tx_status == b'E' && shared.pending.is_empty();
        // The client's own Parse of the name, from an earlier batch, unanswered while the
        // name may hold another statement: if Postgres refuses it (42P05) or skips it, the
        // other runs. A re-prepare would put in a text Postgres did not accept; without
        // one, the Execute is refused (`bound` stays unsure).
        let client_parse_pending =
            upstream == Upstream::Unknown && rw.last.by_client && shared.answered < rw.last.answered_at;
        if let Plan::Rewrite { fence, epoch, text } = plan
            && bound != Some(epoch)
            && !aborted
            && !client_parse_pending
        {
            let (sql, positions) = splice(rw, &text, self.redo(fence, epoch));
            let positions = Arc::new(positions);
            let params = match &rw.described {
                Some(types) => parameter_types(types),
                None => rw.params.clone(),
            };
            let analysis = rw.analysis.clone();
            close_raw(out, &rw.wire);
            shared.pending.push_back(Unit::Close(Some(Injected::Plumbing), None));
            parse_raw(out, &rw.wire, &sql, &params);
            // A definition of the name like the client's: confirming it drops the older ones.
            let defined = shared.define(statement, self.batch, analysis, false);
            let id = defined.id;
            shared.pending.push_back(Unit::Parse(
                Some(Injected::Reprepare),
                Some(defined),
                Some(positions.clone()),
            ));
            if let Some(rw) = self.rw_statements.get_mut(statement) {
                rw.last = LastParse {
                    id,
                    batch: self.batch,
                    answered_at: self.sent + 1,
                    epoch: Some(epoch),
                    by_client: false,
                    positions: Some(positions),
                };
            }
            bound = Some(epoch);
        }
        if rebound {
            bound = None;
        }
        let rw = self.rw_statements.get(statement)?;
        Some(RwPortal {
            statement: statement.to_owned(),
            serial: rw.serial,
            fences: rw.fences.clone(),
            bound,
        })
    }

    /// Execute of a portal bound from a rewrite statement: what must run
    /// before it (the lease guard or a rejection). `None` when the portal is
    /// not one of those. While a Bind of the name from an earlier batch is unanswered,
    /// Postgres may have refused it and kept the portal from before (in a transaction
    /// block, which may be open where pgfence cannot see), with another epoch or none:
    /// refused.
    pub(super) fn execute_rewrite(&self, shared: &Shared, portal: &str) -> Option<Option<Decision>> {
        let RwPortal {
            statement,
            serial,
            fences,
            bound,
        } = shared.portals.get(portal)?.rw.as_ref()?;
        let earlier = shared.held_before(portal, self.batch).next().is_some();
        let bound = if earlier { &None } else { bound };
        // The portal runs the text bound into it, whatever the name holds since (a statement
        // closed, or prepared again): its Execute is decided by the fences that text writes.
        let decided = match self.rw_statements.get(statement).filter(|rw| rw.serial == *serial) {
            Some(rw) => match self.plan(&rw.fences, &rw.full[rw.span.clone()], rw.exact) {
                Plan::NotRewrite => return Some(None),
                Plan::Reject(r) => Decision::Reject(r),
                Plan::Rewrite { fence, epoch, .. } => Decision::Guard { fence, epoch },
            },
            None => {
                let (names, applicable) = (&self.fences.names, &self.fences.applicable);
                policy::decide(Access::Write(fences), self.declared(), names, applicable)
            }
        };
        Some(Some(match decided {
            Decision::Guard { fence, epoch } if bound.is_some() && *bound != Some(epoch) => {
                Decision::Reject(unanalysable(
                    fence,
                    format!("pgfence: the session's epoch changed to {epoch} after this portal was bound; refused"),
                    "Bind the statement again after changing pgfence.epoch.",
                ))
            }
            Decision::Guard { fence, epoch } if *bound != Some(epoch) => Decision::Reject(unanalysable(
                fence,
                format!(
                    "pgfence: this portal may run a text that carries another epoch than the session's ({epoch}), \
                     or none; refused"
                ),
                "Bind the statement again once the answers to the requests before it have arrived.",
            )),
            decided => decided,
        }))
    }

    /// Keeps the parameter types Postgres described for rewrite statements with the
    /// statements they were described for (a statement prepared again since is another).
    pub(super) fn take_described(&mut self, shared: &mut Shared) {
        if shared.described.is_empty() {
            return;
        }
        for (name, (serial, types)) in std::mem::take(&mut shared.described).into_entries() {
            if let Some(rw) = self.rw_statements.get_mut(&name)
                && rw.serial == serial
            {
                rw.described = Some(types);
            }
        }
    }

    /// Close of a client statement.
    pub(super) fn close_rewrite(&mut self, kind: u8, name: &str) {
        if kind == b'S' {
            self.rw_statements.remove(name);
        }
    }
}

/// The client's Parse text with the statement replaced by its rewrite `text` (made as
/// `redo` says), and how positions in it map back.
fn splice(rw: &RwStatement, text: &str, redo: Redo) -> (String, Positions) {
    let (before, original, after) = (
        &rw.full[..rw.span.start],
        &rw.full[rw.span.clone()],
        &rw.full[rw.span.end..],
    );
    let mut out = SentText::with_capacity(rw.full.len() + text.len());
    out.copy(before);
    out.rewrite(text, original, redo);
    out.copy(after);
    (out.text, out.positions)
}

/// A Parse message's parameter-type section declaring `types`.
fn parameter_types(types: &[u32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + 4 * types.len());
    // At most 65 535: Postgres described them.
    out.extend_from_slice(&(types.len() as u16).to_be_bytes());
    for t in types {
        out.extend_from_slice(&t.to_be_bytes());
    }
    out
}

/// Appends a Parse with the client's raw parameter-type section.
pub(super) fn parse_raw(out: &mut BytesMut, name: &[u8], sql: &str, params: &[u8]) {
    out.put_u8(b'P');
    out.put_i32((4 + name.len() + 1 + sql.len() + 1 + params.len()) as i32);
    out.put_slice(name);
    out.put_u8(0);
    out.put_slice(sql.as_bytes());
    out.put_u8(0);
    out.put_slice(params);
}

/// Appends a Close of the statement the client named `name`.
fn close_raw(out: &mut BytesMut, name: &[u8]) {
    out.put_u8(b'C');
    out.put_i32((4 + 1 + name.len() + 1) as i32);
    out.put_u8(b'S');
    out.put_slice(name);
    out.put_u8(0);
}
