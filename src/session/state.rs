//! Per-session state shared by the two relay directions, and the reply
//! attribution that lets pgfence inject messages invisibly.
//!
//! Every client message that Postgres answers is recorded as a [`Unit`] in
//! dispatch order. Postgres answers in the same order, so the head of the
//! queue says which request a server message belongs to: replies to units
//! pgfence injected are swallowed (except errors, which are the rejection),
//! replies to the client's own units are forwarded untouched.
//!
//! Reply shapes (protocol docs, "Message Flow"):
//! - Query: per statement `T`/`D`*/`C`, `I` (empty) or COPY; an `E` ends it; then `Z`.
//! - Parse `1`, Bind `2`, Close `3`; Describe `t`? then `T`/`n`;
//!   Execute `D`*/COPY then `C`/`I`/`s`; Sync `Z`; FunctionCall `V`, then `Z`.
//! - An error in an extended-protocol message makes Postgres skip every
//!   message up to the next Sync: those units get no reply.
//! - `N`, `A` and `S` may arrive at any time and belong to no unit.
//! - In COPY FROM STDIN (after `G`) Postgres ignores Sync and Flush until the client's
//!   CopyDone or CopyFail: such a Sync gets no reply, so it is no unit.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, LazyLock};

use bytes::BytesMut;

use super::context::DbFences;
use super::declare::{Declarations, Scope};
use super::names::{Encoding, NameMap};
use super::positions::{Count, Positions};
use crate::error::sqlstate;
use crate::fence::epoch::Epoch;
use crate::protocol::{codec, frame};
use crate::sql::FenceId;
use crate::sql::classify::{Analysis, SavepointOp, StmtKind};

/// What an injected unit was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Injected {
    /// The guard for this fence and epoch.
    Guard(FenceId, Epoch),
    /// A call that raises a rejection of a write to this fence (the first it names).
    Reject(Option<FenceId>),
    /// Preparing one of pgfence's own statements, sent at this [`Shared::own_mark`].
    Prepare(OwnStatement, u64),
    /// Bind or Close of pgfence's own portal, or a Close before a re-prepare.
    Plumbing,
    /// Preparing a client's rewrite-mode statement again for a new epoch: its errors are
    /// about the client's own statement and reach the client as they are.
    Reprepare,
}

/// pgfence's own prepared statements (extended protocol).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OwnStatement {
    /// `SELECT pgfence.guard(…)` ([`crate::fence::call::GUARD_SQL`]).
    Guard,
    /// `SELECT pgfence.reject(…)` ([`crate::fence::call::REJECT_SQL`]).
    Reject,
    /// `pgfence.reject` if a statement of that name is prepared
    /// (`fence::call::REJECT_IF_PREPARED_SQL`).
    RejectIfPrepared,
    /// The guard call for one fence and epoch, its arguments written into it: a Bind or an
    /// SQL `EXECUTE` with no parameters to evaluate, and a plan in which Postgres has already
    /// folded what depends on them alone. The extended protocol's guard; the simple
    /// protocol's once [`OwnStatement::Guard`] is there.
    ConstGuard,
}

impl OwnStatement {
    const ALL: [OwnStatement; 4] = [
        OwnStatement::Guard,
        OwnStatement::Reject,
        OwnStatement::RejectIfPrepared,
        OwnStatement::ConstGuard,
    ];

    /// The statement a client names, when it is one of pgfence's.
    pub fn named(name: &str) -> Option<OwnStatement> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The statement name used upstream, e.g. `pgfence_guard_v1_1f2e3d4c`.
    pub fn name(self) -> &'static str {
        let i = match self {
            OwnStatement::Guard => 0,
            OwnStatement::Reject => 1,
            OwnStatement::RejectIfPrepared => 2,
            OwnStatement::ConstGuard => 4,
        };
        &OWN_NAMES[i]
    }
}

/// The name of pgfence's own portal (extended protocol), e.g. `pgfence_p_1f2e3d4c`.
pub fn own_portal() -> &'static str {
    &OWN_NAMES[3]
}

/// pgfence's statement and portal names share their namespaces with the client's on the
/// same upstream session. A tag drawn once per process keeps a client's own names (a
/// statement or cursor that happens to be called `pgfence_p`) from colliding with them
/// by chance; a client that looks them up (`pg_prepared_statements`) and takes one on
/// purpose is handled as before (see [`Prepared::Unknown`]).
static OWN_NAMES: LazyLock<[String; 5]> = LazyLock::new(|| {
    use std::hash::{BuildHasher, Hasher};
    // Randomly keyed per process by the standard library; no other randomness needed.
    let tag = std::collections::hash_map::RandomState::new().build_hasher().finish() as u32;
    [
        "pgfence_guard_v1",
        "pgfence_reject_v1",
        "pgfence_reject_if_prepared_v1",
        "pgfence_p",
        "pgfence_guard_const_v1",
    ]
    .map(|name| format!("{name}_{tag:08x}"))
});

/// Whether one of pgfence's statements is prepared on the upstream session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Prepared {
    /// Not prepared (or lost to DISCARD/DEALLOCATE ALL).
    #[default]
    No,
    /// A Parse is in flight in the batch with this Sync number ([`Prepared::BY_QUERY`]:
    /// pgfence's own SQL `PREPARE`, [`Unit::OwnQuery`]).
    InFlight(u64),
    /// Prepared.
    Yes,
    /// May or may not be there: the client closed that name, or preparing it found
    /// the name taken. A Close before the next Parse settles it.
    Unknown,
}

impl Prepared {
    /// Prepared by pgfence's own SQL `PREPARE` ([`Unit::OwnQuery`]), not yet answered. No
    /// batch has this number, so the extended protocol never takes the statement for made
    /// (the PREPARE may fail while the extended messages after it run): it closes and
    /// prepares it anew.
    pub const BY_QUERY: Prepared = Prepared::InFlight(u64::MAX);
}

/// A change to apply when Postgres confirms the statement: to the declarations, or to
/// what the client's statement names stand for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// `SET [LOCAL] pgfence.epoch` (None = RESET).
    Epoch(Scope, Option<Epoch>),
    /// `SET [LOCAL] pgfence.fence` (None = RESET).
    Fence(Scope, Option<String>),
    /// `SET [LOCAL] pgfence.epoch FROM CURRENT`.
    EpochFromCurrent(Scope),
    /// `SET [LOCAL] pgfence.fence FROM CURRENT`.
    FenceFromCurrent(Scope),
    /// `RESET ALL`.
    ResetAll,
    /// `DISCARD ALL`: `RESET ALL`, and the client's statement definitions numbered up to
    /// this one are gone (those sent after it stay).
    DiscardAll(u64),
    /// `DEALLOCATE ALL`: the client's statement definitions numbered up to this one are
    /// gone (those sent after it stay).
    DeallocatedAll(u64),
    /// `SAVEPOINT`, `RELEASE` or `ROLLBACK TO` a savepoint.
    Savepoint(SavepointOp),
    /// A client's SQL `PREPARE` succeeded: only this definition of the name is left.
    Prepared(Defined),
    /// A client's `DEALLOCATE name` succeeded: the definitions up to this one are gone
    /// (and pgfence's own statement, when the name is one of its).
    Deallocated(Defined),
    /// Portals are gone: the one named (SQL `CLOSE name`), or every one (`CLOSE ALL`, the
    /// end of the transaction), bound by the client's Binds numbered up to `upto`
    /// ([`Shared::binds`]); those bound after stay.
    PortalsGone {
        /// The portal, `None` for all of them.
        portal: Option<String>,
        /// The last Bind sent before the statement.
        upto: u64,
        /// The statement is `PREPARE TRANSACTION` (see `Shared::on_command_tag`).
        two_phase: bool,
        /// The statement is a transaction's end `AND CHAIN`.
        chain: bool,
    },
}

/// Whether a statement that completed with tag `command` can have done what `effect` says,
/// for the effects that make pgfence forget portals: a statement read otherwise than
/// Postgres ran it must not drop portals Postgres still holds (one of them may hold a
/// write whose Execute would then go unguarded).
fn tag_carries(effect: &Effect, command: &[u8]) -> bool {
    match effect {
        Effect::PortalsGone { portal: None, .. } => {
            matches!(
                command,
                b"COMMIT" | b"ROLLBACK" | b"PREPARE TRANSACTION" | b"CLOSE CURSOR ALL"
            )
        }
        Effect::PortalsGone { portal: Some(_), .. } => command == b"CLOSE CURSOR",
        _ => true,
    }
}

/// A client statement name with the number of a definition (or of the last definition
/// before a removal); numbers grow in dispatch order (`Shared::define`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Defined {
    /// The statement name (`""` is the unnamed statement).
    pub name: String,
    /// The definition's number.
    pub id: u64,
}

/// One definition of a client statement name.
#[derive(Debug, Clone)]
pub struct Definition {
    /// Its number ([`Defined::id`]).
    pub id: u64,
    /// The dispatcher's batch it was sent in: after a Parse or `PREPARE` that fails or is
    /// skipped, Postgres runs nothing more of that batch, so within it the definition is
    /// certain.
    pub batch: u64,
    /// What it does.
    pub analysis: Arc<Analysis>,
    /// It stands for several definitions merged (`MAX_DEFINITIONS`).
    pub merged: bool,
    /// Its text opens a transaction block (a `BEGIN` or `START TRANSACTION`), or may: a
    /// portal bound from it opens one when executed, where every definition the name may
    /// hold begins ([`PortalEntry::begins`]). Merged definitions begin if any of them did.
    pub begins: bool,
}

/// At most this many unconfirmed definitions are kept per name; beyond, the name may
/// run anything ([`Shared::define`]).
const MAX_DEFINITIONS: usize = 8;

impl Effect {
    /// Applies the change to a session's declarations (confirmed or speculative).
    pub fn apply_to(self, declared: &mut Declarations) {
        match self {
            Effect::Epoch(scope, v) => declared.epoch.set(scope, v),
            Effect::Fence(scope, v) => declared.fence.set(scope, v),
            Effect::EpochFromCurrent(scope) => {
                let v = declared.epoch.current().cloned();
                declared.epoch.set(scope, v);
            }
            Effect::FenceFromCurrent(scope) => {
                let v = declared.fence.current().cloned();
                declared.fence.set(scope, v);
            }
            Effect::ResetAll => declared.reset_all(),
            // DISCARD ALL cannot run in a transaction block, and Postgres commits the
            // implicit transaction it ran in at once (in the extended protocol, before the
            // Sync, so also when a BEGIN follows it there): its reset is kept either way.
            Effect::DiscardAll(_) => {
                declared.reset_all();
                declared.end_transaction(true);
            }
            Effect::Savepoint(op) => declared.savepoint(&op),
            Effect::Prepared(_) | Effect::Deallocated(_) | Effect::DeallocatedAll(_) | Effect::PortalsGone { .. } => {}
        }
    }
}

/// How the replies to one statement of a simple Query are treated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// Set when pgfence inserted this statement.
    pub injected: Option<Injected>,
    /// Applied when the statement completes.
    pub effect: Option<Effect>,
}

/// What a portal holds, as pgfence expects Postgres to hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortalEntry {
    /// What its statement does.
    pub analysis: Arc<Analysis>,
    /// The Sync count it was bound at.
    pub sent: u64,
    /// The dispatcher's batch when bound from the one definition its statement can have
    /// (see `Dispatcher::exact_definition`).
    pub exact: Option<u64>,
    /// The number of the Bind that made it ([`Shared::binds`]).
    pub bind: u64,
    /// Bound from a rewrite statement: which, and the epoch its text carried.
    pub rw: Option<super::rewriting::RwPortal>,
    /// Its statement opens a transaction block (every definition it may have been bound
    /// from does): its Execute counts as a `BEGIN`.
    pub begins: bool,
}

/// An unanswered client Bind of a portal: the dispatcher's batch it was sent in, and what
/// the portal held before it.
pub type HeldBefore = (u64, Option<Arc<Analysis>>);

/// A client's Bind of `portal`, numbered `bind`, and the entry it replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rebind {
    /// The portal name.
    pub portal: String,
    /// The Bind's number.
    pub bind: u64,
    /// What was there before.
    pub before: Option<PortalEntry>,
}

/// A request awaiting its replies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unit {
    /// A simple Query; `parts` is empty when every statement is the client's own and has no effect.
    Query {
        /// Per statement, in order.
        parts: Vec<Part>,
        /// Statements completed so far.
        done: usize,
        /// How the text sent was made from the client's, when it is not the client's.
        positions: Option<Arc<Positions>>,
    },
    /// FunctionCall.
    FunctionCall,
    /// pgfence's own Query (SQL `PREPARE` of its statement), sent ahead of a client's Query
    /// between transactions ([`Shared::between_transactions`]): every reply to it is
    /// swallowed, its notices and ReadyForQuery included (a FATAL reaches the client).
    OwnQuery(OwnStatement),
    /// Parse; the client's carry the definition it makes, and how the text sent was made
    /// from theirs when it is not theirs.
    Parse(Option<Injected>, Option<Defined>, Option<Arc<Positions>>),
    /// Bind; of a client's rewritten statement, how its text was made; of a client's, the
    /// portal it replaces, to restore if Postgres refuses or skips it.
    Bind(Option<Injected>, Option<Arc<Positions>>, Option<Box<Rebind>>),
    /// Describe; of a rewrite statement, how its text was made (Postgres checks a prepared
    /// statement again when it describes it, and reports errors in the rewritten text),
    /// and, for a Describe of a rewrite statement, its name and serial, under which its
    /// parameter types are kept (see [`Shared::described`]).
    Describe(Option<Arc<Positions>>, Option<(String, u64)>),
    /// Execute.
    Execute(Option<Injected>, Option<Effect>),
    /// Close; the client's Close of a statement carries the last definition it removes.
    Close(Option<Injected>, Option<Defined>),
    /// The client's Close of this portal: pgfence forgets what it runs once Postgres
    /// confirms (a Close skipped after an error leaves the portal in place).
    ClosePortal(String, Option<u64>),
    /// Sync; `after_copy_data`: CopyData was sent before it while Postgres was not known
    /// to copy (see [`Shared::copy_syncs`]).
    Sync {
        /// CopyData came before it.
        after_copy_data: bool,
    },
    /// The client's CopyDone or CopyFail, sent before Postgres said it entered COPY FROM
    /// STDIN: it ends the COPY whose `G` arrives first, or Postgres drops it. No reply.
    CopyEnd,
}

/// What to do with one server message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Send it to the client as it came.
    Forward,
    /// Drop it (reply to an injected message).
    Swallow,
    /// Send this instead.
    Replace(BytesMut),
}

/// Whether an error is 42P05: a statement of that name already exists.
fn name_taken(body: Option<&[u8]>) -> bool {
    body.and_then(frame::error_code) == Some(b"42P05".as_slice())
}

/// Settings the server reports (ParameterStatus), at startup and later, that decide how
/// pgfence must read the session's texts.
#[derive(Debug, Clone, Copy)]
pub struct Reported {
    /// `standard_conforming_strings`: it decides where string literals end.
    pub standard_conforming_strings: bool,
    /// Whether `client_encoding` may hide a backslash in a multibyte character
    /// (`frame::client_encoding_hides_backslash`).
    pub encoding_hides_backslash: bool,
    /// `server_encoding`: how names are keyed; `SQL_ASCII`: Postgres counts error
    /// positions in bytes.
    pub server: Encoding,
    /// `client_encoding`: `UTF8` when texts pgfence reads are the characters Postgres counts.
    pub client: Encoding,
}

impl Default for Reported {
    /// Postgres' defaults: `standard_conforming_strings` on, `client_encoding` UTF8.
    fn default() -> Self {
        Self {
            standard_conforming_strings: true,
            encoding_hides_backslash: false,
            server: Encoding::Utf8,
            client: Encoding::Utf8,
        }
    }
}

impl Reported {
    /// Takes in one ParameterStatus body.
    pub fn note(&mut self, body: &[u8]) {
        if let Some(on) = frame::standard_conforming_strings(body) {
            self.standard_conforming_strings = on;
        }
        if let Some(hides) = frame::client_encoding_hides_backslash(body) {
            self.encoding_hides_backslash = hides;
        }
        match frame::encoding(body) {
            Some((true, name)) => self.server = Encoding::named(name),
            Some((false, name)) => self.client = Encoding::named(name),
            None => {}
        }
    }

    /// How Postgres counts error positions in the texts it gets: bytes in a `SQL_ASCII`
    /// database (no conversion), characters when the client's encoding is UTF8 (as
    /// pgfence reads texts). `None` otherwise: positions are left as Postgres gives them.
    pub fn position_count(&self) -> Option<Count> {
        if self.server == Encoding::SqlAscii {
            Some(Count::Bytes)
        } else if self.client == Encoding::Utf8 {
            Some(Count::Chars)
        } else {
            None
        }
    }
}

/// Room for pending units kept once the queue is empty.
const PENDING_KEEP: usize = 4096;

/// State shared by both directions of one session. Never held across an await.
#[derive(Debug, Default)]
pub struct Shared {
    /// Requests awaiting replies, in dispatch order.
    pub pending: VecDeque<Unit>,
    /// The fences of the session's database: their names for messages pgfence writes
    /// itself, their rewrites for error positions.
    pub fences: Option<Arc<DbFences>>,
    /// Transaction status from the last ReadyForQuery (`I`, `T`, `E`).
    pub tx_status: u8,
    /// Declarations confirmed by Postgres.
    pub declared: Declarations,
    /// The guard that passed in the open transaction (its locks are held until it ends).
    pub guarded: Option<(FenceId, Epoch)>,
    /// pgfence's own prepared statements.
    pub own: HashMap<OwnStatement, Prepared>,
    /// Counts the client messages that may have changed pgfence's statements in a way no
    /// reply tells (a Close of one of their names, a text pgfence cannot follow), each of
    /// which marks them [`Prepared::Unknown`] when sent. A Parse of pgfence's answered
    /// after such a message does not make its statement [`Prepared::Yes`]: the client's
    /// message came later and may have closed it, or put its own statement in its place.
    pub own_mark: u64,
    /// Syncs and Queries answered so far.
    pub answered: u64,
    /// What each client statement name may be: every definition Postgres may hold under
    /// it, numbered. Protocol Parse and SQL `PREPARE` share the namespace, as in Postgres.
    /// A definition is added when sent and the others are dropped only when Postgres
    /// confirms (a Parse or `PREPARE` that fails, or is skipped after an error, leaves
    /// the old one in force), so deciding on all of them never misses the real one.
    pub statements: NameMap<Vec<Definition>>,
    /// The number of the last definition.
    pub defined: u64,
    /// For each client statement name, the definition Postgres last confirmed (a Parse
    /// or `PREPARE` it accepted), while no confirmed Close, `DEALLOCATE` or `DISCARD ALL`
    /// has removed it since.
    pub confirmed: NameMap<u64>,
    /// A `DISCARD ALL` or `DEALLOCATE ALL` pgfence did not foresee made it forget every
    /// definition, also ones sent after it: `statements` may miss some since.
    pub forgot: bool,
    /// Portals: analysis, the Sync count they were bound at, and the dispatcher's batch
    /// when they were bound from the one definition their statement can have (see
    /// `Dispatcher::exact_definition`).
    pub portals: NameMap<PortalEntry>,
    /// Client Binds sent so far: each portal entry's number.
    pub binds: u64,
    /// The Sync count of the last Bind of a portal under a name pgfence cannot key
    /// (`names::UNCERTAIN`), until its transaction ends: until then a portal name that is
    /// not ASCII and that pgfence does not know may be that one.
    pub uncertain_portals: Option<u64>,
    /// Per portal name, its client Binds not yet answered, in order: the dispatcher's batch
    /// each was sent in and what the name held before it. Until one is answered, a portal
    /// run in a later batch may still be the one before it (Postgres keeps that one when
    /// it refuses the Bind, and a savepoint can bring the transaction back).
    pub rebinding: NameMap<VecDeque<HeldBefore>>,
    /// What the server reported that decides how texts are read.
    pub reported: Reported,
    /// Shutdown is draining: end the session once no transaction is open.
    pub draining: bool,
    /// An Execute was sent since the last Sync: Postgres holds an implicit transaction
    /// open until that Sync comes, even once every reply is in.
    pub unsynced: bool,
    /// CopyEnd units at the back of `pending` in a row, while the back one is a CopyEnd;
    /// maybe too high once `copy_end_taken` is set.
    pub copy_ends_at_back: usize,
    /// A CopyEnd left `pending` since `copy_ends_at_back` was last counted.
    pub copy_end_taken: bool,
    /// Postgres is skipping messages until Sync after an error.
    skipping: bool,
    /// An error happened in the open transaction.
    tx_error: bool,
    /// Postgres is in COPY FROM STDIN and the client has not sent CopyDone or CopyFail
    /// yet: Postgres ignores the client's Sync and Flush meanwhile.
    pub copy_in: bool,
    /// A COPY FROM STDIN has begun (`G`) and Postgres has not yet answered how it ended.
    copy_open: bool,
    /// Syncs the client sent during that COPY after its `G`. Postgres ignores each one it
    /// reads in COPY mode, but once the COPY failed it answers them, and where it failed
    /// among the client's messages is not visible from outside (bad data in any CopyData,
    /// a constraint checked at the end).
    /// A Sync sent before the `G` counts only when CopyData came before it
    /// (`Unit::Sync::after_copy_data`): one sent with the COPY's Execute, as libpq and
    /// tokio-postgres send one, is read before any data.
    pub copy_syncs: u64,
    /// CopyData was sent since the last Query or Execute while Postgres was not known to
    /// be copying (a client that sends rows without waiting for the `G`).
    pub copy_data_early: bool,
    /// Postgres answered CopyBothResponse and has not ended that copy: a replication
    /// stream (`START_REPLICATION`) runs, which only the client or Postgres stops. It is
    /// no transaction a drain could wait for.
    pub streaming: bool,
    /// The client broke the protocol in a way only a reply revealed: end the session.
    pub violation: Option<String>,
    /// The client side stopped reading at [`MAX_PENDING`] units in flight and waits to be
    /// woken once replies bring them down to [`RESUME_PENDING`].
    pub reader_waiting: bool,
    /// Parameter types Postgres described for rewrite statements, by name (with the
    /// statement's serial), until the dispatcher takes them: a re-prepare declares them, so
    /// the rewritten text takes the parameters as the client was told to send them. One
    /// per name, however many Describes of it are answered meanwhile.
    pub described: NameMap<(u64, Vec<u32>)>,
}

/// Units in flight awaiting a reply at which pgfence stops reading from the client until
/// Postgres has answered some. Postgres reads no faster than it answers, so this only
/// bounds what a client that sends without reading makes pgfence remember (tens of bytes
/// per message); its bytes wait in the kernel's buffers, as they would in front of
/// Postgres. CopyEnd units, which no reply ends, do not count (Postgres may never answer
/// anything before the client's next message): [`MAX_COPY_ENDS`] bounds them.
pub const MAX_PENDING: usize = 4096;
/// CopyEnd units in flight past which the client is refused (08P01): each stands for a
/// CopyDone or CopyFail sent before Postgres said it copies, which only a COPY still to
/// start can take. A client running COPYs has at most one per COPY in flight, and
/// [`MAX_PENDING`] bounds those.
pub const MAX_COPY_ENDS: usize = 4 * MAX_PENDING;
/// Units in flight at which reading from the client resumes. Postgres holds back at most
/// its 8 KiB output buffer of replies until a Flush or Sync, 5 bytes or more each: fewer
/// than 1 700 units, well under this, so the Flush or Sync a client sends after more than
/// [`MAX_PENDING`] messages is always read.
pub const RESUME_PENDING: usize = MAX_PENDING - 1024;

impl Shared {
    /// New state for a session with these startup declarations.
    pub fn new(declared: Declarations) -> Self {
        Self {
            tx_status: b'I',
            declared,
            ..Self::default()
        }
    }

    /// Units in flight that Postgres ends with a reply (all but CopyEnd), and the CopyEnd
    /// units. Counted, so called only with [`MAX_PENDING`] or more units in flight.
    pub fn in_flight(&self) -> (usize, usize) {
        let copy_ends = self.pending.iter().filter(|u| matches!(u, Unit::CopyEnd)).count();
        (self.pending.len() - copy_ends, copy_ends)
    }

    /// Whether a client side that stopped reading at [`MAX_PENDING`] may read again: the
    /// units awaiting a reply are down to [`RESUME_PENDING`].
    pub fn may_resume(&self) -> bool {
        self.pending.len() <= RESUME_PENDING || self.in_flight().0 <= RESUME_PENDING
    }

    /// Postgres answered an error and skips what comes until the next Sync: the
    /// transaction it happened in fails.
    pub fn skipping(&self) -> bool {
        self.skipping
    }

    /// Nothing is in flight and no transaction is open, explicit or implicit: a draining
    /// shutdown may end the session here without losing anything the client was told.
    pub fn idle(&self) -> bool {
        self.pending.is_empty() && self.tx_status == b'I' && !self.unsynced
    }

    /// A drain may end the session now: it is idle, or it streams replication, which
    /// never reaches the end of a transaction.
    pub fn drainable(&self) -> bool {
        self.idle() || self.streaming
    }

    /// No transaction is open, and none will be when what is in flight is answered: nothing
    /// in flight can run a statement (only Parse, Bind, Describe and Close, as drivers send
    /// them to drop statements they cached), and a Sync ends it. A Query sent now runs in a
    /// transaction of its own, and no error before it can make Postgres skip it.
    pub fn between_transactions(&self) -> bool {
        self.tx_status == b'I'
            && !self.unsynced
            && matches!(self.pending.back(), None | Some(Unit::Sync { .. }))
            && self.pending.iter().all(|u| {
                matches!(
                    u,
                    Unit::Parse(..)
                        | Unit::Bind(..)
                        | Unit::Describe(..)
                        | Unit::Close(..)
                        | Unit::ClosePortal(..)
                        | Unit::Sync { .. }
                )
            })
    }

    /// Whether a guard for `(fence, epoch)` already holds its locks in the
    /// open transaction, so another one would add nothing. True only when
    /// nothing in flight can end that transaction.
    pub fn guard_still_held(&self, fence: FenceId, epoch: Epoch) -> bool {
        self.tx_status == b'T'
            && self.guarded == Some((fence, epoch))
            && self.pending.iter().all(|u| {
                matches!(
                    u,
                    Unit::Parse(..) | Unit::Bind(..) | Unit::Describe(..) | Unit::Close(..) | Unit::ClosePortal(..)
                )
            })
    }

    /// Classifies one server message. `body` is given for `Z`, `C`, `E`, `S` and `t`
    /// (when not oversized). pgfence's own errors (SQLSTATE class PF), and any other
    /// error raised inside its guard (a lock timeout while a takeover holds the fence),
    /// lose their CONTEXT: it names the guard's PL/pgSQL internals, not the client's
    /// statement.
    pub fn on_server_message(&mut self, tag: u8, body: Option<&[u8]>) -> Verdict {
        let verdict = self.classify(tag, body);
        if tag == b'E'
            && matches!(verdict, Verdict::Forward)
            && let Some(body) = body
            && (frame::error_code(body).is_some_and(|c| c.starts_with(b"PF")) || frame::raised_in_guard(body))
            && let Some(out) = frame::error_without_context(body)
        {
            return Verdict::Replace(out);
        }
        verdict
    }

    fn classify(&mut self, tag: u8, body: Option<&[u8]>) -> Verdict {
        if tag == b'S' {
            self.on_parameter_status(body);
            return Verdict::Forward;
        }
        if matches!(tag, b'N' | b'A') {
            // A notice while pgfence's own Query or injected message runs is its (a LOG of
            // its text under log_statement with client_min_messages = log, a DEBUG line of
            // its Bind): unseen, as its replies. Not once an error made Postgres skip
            // messages: the one running then is not at the front.
            let injected = !self.skipping
                && matches!(
                    self.pending.front(),
                    Some(
                        Unit::OwnQuery(_)
                            | Unit::Parse(Some(_), ..)
                            | Unit::Bind(Some(_), ..)
                            | Unit::Execute(Some(_), _)
                            | Unit::Close(Some(_), _)
                    )
                );
            if tag == b'N' && injected {
                return Verdict::Swallow;
            }
            return Verdict::Forward;
        }
        self.drop_skipped();
        // A CopyDone or CopyFail that no COPY took: Postgres dropped it.
        while matches!(self.pending.front(), Some(Unit::CopyEnd)) {
            self.pending.pop_front();
            self.copy_end_taken = true;
        }
        match tag {
            b'G' => self.enter_copy_in(),
            // Postgres left COPY mode with an error: the client's Syncs count again.
            b'E' => {
                self.copy_in = false;
                self.streaming = false;
                if std::mem::take(&mut self.copy_open) && self.copy_syncs > 0 {
                    // Some of the Syncs sent during the COPY may now be answered, and
                    // which ones cannot be known: replies could no longer be matched.
                    self.violation = Some(
                        "a Sync sent during a COPY FROM STDIN that then failed: which Syncs Postgres answers \
                         cannot be told"
                            .into(),
                    );
                }
            }
            b'C' => {
                self.copy_open = false;
                self.streaming = false;
            }
            b'W' => self.streaming = true,
            // A replication stream ends with CommandComplete or an error; a physical one
            // may send a result set naming the next timeline first.
            b'T' | b'Z' => self.streaming = false,
            _ => {}
        }
        let Some(front) = self.pending.front_mut() else {
            return Verdict::Forward;
        };
        match front {
            Unit::Query { parts, done, positions } => {
                let part = parts.get(*done).cloned();
                let injected = part.as_ref().and_then(|p| p.injected);
                match tag {
                    b'Z' => {
                        self.pending.pop_front();
                        self.on_ready(body);
                        Verdict::Forward
                    }
                    b'E' => {
                        self.tx_error = true;
                        // The rest of the string is not executed: its `PREPARE`s, this one's
                        // included, define nothing. (`parts` is empty when no statement has
                        // an effect, while `done` still counts the completed ones.)
                        let unmade: Vec<Defined> = parts
                            .iter()
                            .skip(*done)
                            .filter_map(|p| match &p.effect {
                                Some(Effect::Prepared(d)) => Some(d.clone()),
                                _ => None,
                            })
                            .collect();
                        *done = parts.len();
                        let positions = positions.take();
                        for d in &unmade {
                            self.forget_failed(d);
                        }
                        let verdict = self.error_verdict(injected, body);
                        self.with_client_position(verdict, positions, body, false)
                    }
                    b'C' | b'I' => {
                        *done += 1;
                        self.on_complete(tag, body, injected, part.and_then(|p| p.effect))
                    }
                    _ if injected.is_some() => Verdict::Swallow,
                    _ => Verdict::Forward,
                }
            }
            Unit::OwnQuery(own) => {
                let own = *own;
                match tag {
                    // Only the PREPARE's: a DEALLOCATE may come before it in the same Query.
                    b'C' if body.is_some_and(|b| b.starts_with(b"PREPARE")) => {
                        self.settle_query_prepare(own, Prepared::Yes)
                    }
                    // The session ends (terminated, crash, shutdown): the client is told, as
                    // it would be told during a statement of its own.
                    b'E' if body.is_some_and(frame::ends_session) => {
                        self.settle_query_prepare(own, Prepared::No);
                        return Verdict::Forward;
                    }
                    // Refused: for a name a client statement took (it may be anything), or
                    // without the schema. Not tried again before a DISCARD or DEALLOCATE ALL
                    // (every Query would fail one more PREPARE, logged as an error); the
                    // extended protocol closes the name and prepares it in its own way.
                    b'E' => self.settle_query_prepare(own, Prepared::Unknown),
                    // Not counted as answered: the dispatcher never counted it as sent.
                    b'Z' => {
                        self.pending.pop_front();
                    }
                    _ => {}
                }
                Verdict::Swallow
            }
            Unit::FunctionCall | Unit::Sync { .. } => {
                match tag {
                    b'Z' => {
                        self.pending.pop_front();
                        self.skipping = false;
                        self.on_ready(body);
                    }
                    b'E' => self.tx_error = true,
                    _ => {}
                }
                Verdict::Forward
            }
            Unit::Parse(inj, ..) | Unit::Bind(inj, ..) | Unit::Close(inj, _) => {
                let inj = *inj;
                match tag {
                    b'1' | b'2' | b'3' => {
                        match self.pending.pop_front() {
                            Some(Unit::Parse(_, Some(d), _)) => self.confirm(d),
                            Some(Unit::Close(_, Some(d))) => self.drop_upto(&d),
                            Some(Unit::Bind(_, _, Some(r))) => self.bind_answered(&r.portal),
                            _ => {}
                        }
                        if let Some(Injected::Prepare(s, mark)) = inj {
                            self.settle_parse(s, mark, Prepared::Yes);
                        }
                        if inj.is_some() {
                            Verdict::Swallow
                        } else {
                            Verdict::Forward
                        }
                    }
                    b'E' => self.extended_error(inj, body),
                    _ => Verdict::Forward,
                }
            }
            Unit::ClosePortal(..) => match tag {
                b'3' => {
                    // Unless a Bind sent after the Close has bound the name again.
                    if let Some(Unit::ClosePortal(name, Some(bind))) = self.pending.pop_front()
                        && self.portals.get(&name).is_some_and(|e| e.bind == bind)
                    {
                        self.portals.remove(&name);
                    }
                    Verdict::Forward
                }
                b'E' => self.extended_error(None, body),
                _ => Verdict::Forward,
            },
            // Dropped above before anything is attributed.
            Unit::CopyEnd => Verdict::Forward,
            Unit::Describe(_, statement) => match tag {
                b't' => {
                    if let Some((name, serial)) = statement.take()
                        && let Some(types) = body.and_then(frame::parameter_types)
                    {
                        self.described.insert(&name, (serial, types));
                    }
                    Verdict::Forward
                }
                b'T' | b'n' => {
                    self.pending.pop_front();
                    Verdict::Forward
                }
                b'E' => self.extended_error(None, body),
                _ => Verdict::Forward,
            },
            Unit::Execute(inj, effect) => {
                let (inj, effect) = (*inj, effect.take());
                match tag {
                    b'C' | b'I' | b's' => {
                        self.pending.pop_front();
                        self.on_complete(tag, body, inj, effect)
                    }
                    b'E' => self.extended_error(inj, body),
                    _ => {
                        if let Unit::Execute(_, slot) = front {
                            *slot = effect;
                        }
                        if inj.is_some() {
                            Verdict::Swallow
                        } else {
                            Verdict::Forward
                        }
                    }
                }
            }
        }
    }

    /// CopyInResponse to the unit at the front. The units the client sent after it until
    /// its CopyDone or CopyFail reach Postgres in COPY mode: Syncs there are ignored (no
    /// reply, so no unit) unless the COPY fails (see [`Shared::copy_syncs`]), and anything
    /// else breaks the protocol.
    fn enter_copy_in(&mut self) {
        self.copy_open = true;
        self.copy_syncs = 0;
        // The Syncs up to the COPY's CopyDone reach Postgres in COPY mode and are dropped:
        // the implicit transaction of a COPY run by Execute then waits for a Sync after
        // the CopyDone, unless the client sent one already.
        let copy_end = self.pending.iter().position(|u| matches!(u, Unit::CopyEnd));
        // A Query or FunctionCall ends that transaction as a Sync does.
        let later_sync = copy_end.is_some_and(|e| {
            self.pending
                .iter()
                .skip(e + 1)
                .any(|u| matches!(u, Unit::Sync { .. } | Unit::Query { .. } | Unit::FunctionCall))
        });
        if matches!(self.pending.get(1), Some(Unit::Sync { .. }))
            && matches!(self.pending.front(), Some(Unit::Execute(..)))
            && !later_sync
        {
            self.unsynced = true;
        }
        loop {
            match self.pending.get(1) {
                Some(&Unit::Sync { after_copy_data }) => {
                    self.pending.remove(1);
                    self.copy_syncs += u64::from(after_copy_data);
                    // Counted as sent when dispatched: answered now, as it never will be.
                    self.answered += 1;
                }
                Some(Unit::CopyEnd) => {
                    self.pending.remove(1);
                    self.copy_end_taken = true;
                    return;
                }
                None => {
                    self.copy_in = true;
                    return;
                }
                Some(_) => {
                    self.violation = Some(
                        "a message other than CopyData, CopyDone, CopyFail, Sync or Flush during COPY FROM STDIN"
                            .into(),
                    );
                    return;
                }
            }
        }
    }

    fn on_parameter_status(&mut self, body: Option<&[u8]>) {
        self.reported.note(body.unwrap_or_default());
    }

    /// A statement completed (`C`, `I` or `s`).
    fn on_complete(
        &mut self,
        tag: u8,
        body: Option<&[u8]>,
        injected: Option<Injected>,
        effect: Option<Effect>,
    ) -> Verdict {
        if let Some(Injected::Guard(fence, epoch)) = injected {
            self.guarded = Some((fence, epoch));
        }
        if tag == b's' && injected.is_none() {
            // A suspended portal may be a CALL that committed or rolled back inside: its
            // tag, which says so (`on_command_tag`), is not coming yet.
            self.guarded = None;
        }
        if tag == b'C' {
            let command = body.map(|b| b.strip_suffix(b"\0").unwrap_or(b)).unwrap_or_default();
            self.on_command_tag(command, effect.as_ref());
            if let Some(effect) = effect.filter(|e| tag_carries(e, command)) {
                self.apply(effect);
            }
        }
        if injected.is_some() {
            Verdict::Swallow
        } else {
            Verdict::Forward
        }
    }

    /// A command completed. The tags of COMMIT (also END and `AND CHAIN`), PREPARE
    /// TRANSACTION and ROLLBACK say the transaction ended, and how, even when the next one
    /// starts before any ReadyForQuery (`COMMIT AND CHAIN`, `COMMIT; BEGIN` in one string):
    /// the guard that passed in it no longer holds anything. A COMMIT of a failed
    /// transaction answers ROLLBACK; ROLLBACK TO SAVEPOINT (known by its `effect`) also
    /// answers ROLLBACK and releases the guard's locks taken after the savepoint. `DISCARD
    /// ALL` and `DEALLOCATE ALL` drop pgfence's own statements, and the client's as their
    /// effect says (all of them when pgfence did not know the statement for one).
    fn on_command_tag(&mut self, command: &[u8], effect: Option<&Effect>) {
        let to_savepoint = matches!(effect, Some(Effect::Savepoint(SavepointOp::RollbackTo(_))));
        // A PREPARE TRANSACTION answers ROLLBACK where the block failed (it rolled back)
        // and where none was open: Postgres then warns and commits the implicit
        // transaction. A failed block was reported (`E`) before anything more ran in it.
        let committed_implicit =
            matches!(effect, Some(Effect::PortalsGone { two_phase: true, .. })) && self.tx_status != b'E';
        let ends = matches!(command, b"COMMIT" | b"PREPARE TRANSACTION" | b"ROLLBACK");
        if ends && self.tx_status == b'E' {
            // No longer aborted, though the next ReadyForQuery may be far (a Flush instead
            // of a Sync): in a transaction (a chained one, or back at a savepoint) or idle.
            self.tx_status = b'T';
        }
        // Until the next ReadyForQuery, which may be far (a Flush instead of a Sync), the
        // status follows the tags of what opens and ends a block: what is sent meanwhile
        // runs in the block a `BEGIN` opened, or after the block's end.
        match effect {
            Some(Effect::PortalsGone {
                portal: None, chain, ..
            }) if ends && !to_savepoint => self.tx_status = if *chain { b'T' } else { b'I' },
            _ if matches!(command, b"BEGIN" | b"START TRANSACTION") && self.tx_status == b'I' => self.tx_status = b'T',
            _ => {}
        }
        match command {
            b"COMMIT" | b"PREPARE TRANSACTION" => self.end_transaction(true),
            b"ROLLBACK" if to_savepoint => self.guarded = None,
            b"ROLLBACK" if committed_implicit => self.end_transaction(true),
            b"ROLLBACK" => self.end_transaction(false),
            // A procedure or DO block may have committed or rolled back inside (an Execute
            // outside a block): the guard's locks may be gone.
            b"CALL" | b"DO" => self.guarded = None,
            b"DISCARD ALL" | b"DEALLOCATE ALL" => {
                self.own.clear();
                if !matches!(effect, Some(Effect::DiscardAll(_) | Effect::DeallocatedAll(_))) {
                    // A statement pgfence did not know for one: forget the definitions sent
                    // after it too. A name without any may run anything, so forgetting too
                    // much only refuses more.
                    self.statements.clear();
                    self.confirmed.clear();
                    self.forgot = true;
                    if command == b"DISCARD ALL" {
                        self.apply(Effect::ResetAll);
                    }
                }
            }
            _ => {}
        }
    }

    fn apply(&mut self, effect: Effect) {
        match &effect {
            Effect::Prepared(d) => self.confirm(d.clone()),
            Effect::Deallocated(d) => {
                if let Some(s) = OwnStatement::named(&d.name) {
                    self.own.insert(s, Prepared::No);
                }
                self.drop_upto(d);
            }
            Effect::DiscardAll(upto) | Effect::DeallocatedAll(upto) => {
                let upto = *upto;
                self.statements.retain(|_, defs| {
                    defs.retain(|def| def.id > upto);
                    !defs.is_empty()
                });
                self.confirmed.retain(|_, id| *id > upto);
            }
            Effect::PortalsGone {
                portal: Some(name),
                upto,
                ..
            } if self.portals.get(name).is_some_and(|e| e.bind <= *upto) => {
                self.portals.remove(name);
            }
            Effect::PortalsGone { portal: None, upto, .. } => self.portals.retain(|_, e| e.bind > *upto),
            _ => {}
        }
        effect.apply_to(&mut self.declared);
    }

    /// Whether a Close of portal `name` was sent since the last Sync or Query.
    pub fn closed_in_this_batch(&self, name: &str) -> bool {
        self.pending
            .iter()
            .rev()
            .take_while(|u| !matches!(u, Unit::Sync { .. } | Unit::Query { .. }))
            .any(|u| matches!(u, Unit::ClosePortal(n, _) if n == name))
    }

    /// Whether a request sent and not yet answered may change `client_encoding` (or
    /// another reported setting): a Query, an Execute (also one still waiting for its
    /// Sync), a FunctionCall, or a Sync whose batch may hold one. Postgres reports a
    /// change just before ReadyForQuery.
    pub fn settings_may_change(&self) -> bool {
        self.unsynced
            || self.pending.iter().any(|u| {
                matches!(
                    u,
                    Unit::Query { .. } | Unit::Execute(..) | Unit::FunctionCall | Unit::Sync { .. }
                )
            })
    }

    /// A definition of a client statement name, sent now; returns its number. Past
    /// `MAX_DEFINITIONS` unconfirmed ones, the older ones become a single definition
    /// that may write any fence (`Unanalysable` with no fences listed), numbered as the
    /// newest of them so that confirming any of them keeps it. `begins`: see
    /// [`Definition::begins`].
    pub fn define(&mut self, name: &str, batch: u64, analysis: Arc<Analysis>, begins: bool) -> Defined {
        self.defined += 1;
        let id = self.defined;
        let defs = self.statements.get_or_default(name);
        if defs.len() >= MAX_DEFINITIONS
            && let Some(newest) = defs.last().map(|d| (d.id, d.batch))
        {
            let anything = StmtKind::Unanalysable { fences: Vec::new() };
            let any_begins = defs.iter().any(|d| d.begins);
            defs.clear();
            defs.push(Definition {
                id: newest.0,
                batch: newest.1,
                analysis: Arc::new(Analysis::of_kind(anything)),
                merged: true,
                begins: any_begins,
            });
        }
        defs.push(Definition {
            id,
            batch,
            analysis,
            merged: false,
            begins,
        });
        Defined {
            name: name.to_owned(),
            id,
        }
    }

    /// A Parse or `PREPARE` of definition `d` failed or was skipped: Postgres does not
    /// hold it. Later ones of the name may have been sent already (a pipeline), so it is
    /// looked for among all; one merged with others (`MAX_DEFINITIONS`) stays.
    fn forget_failed(&mut self, d: &Defined) {
        if let Some(defs) = self.statements.get_mut(&d.name) {
            defs.retain(|def| def.id != d.id || def.merged);
            if defs.is_empty() {
                self.statements.remove(&d.name);
            }
        }
    }

    /// Postgres confirmed definition `d`: the earlier ones of that name are gone, and
    /// `d` is what the name holds.
    fn confirm(&mut self, d: Defined) {
        if let Some(defs) = self.statements.get_mut(&d.name) {
            defs.retain(|def| def.id >= d.id);
        }
        self.confirmed.insert(&d.name, d.id);
    }

    /// Postgres confirmed a Close or `DEALLOCATE` sent after definition `d`: that one and
    /// the earlier ones of the name are gone.
    fn drop_upto(&mut self, d: &Defined) {
        if self.confirmed.get(&d.name).is_some_and(|&id| id <= d.id) {
            self.confirmed.remove(&d.name);
        }
        if let Some(defs) = self.statements.get_mut(&d.name) {
            defs.retain(|def| def.id > d.id);
            if defs.is_empty() {
                self.statements.remove(&d.name);
            }
        }
    }

    /// The oldest unanswered client Bind of `portal` got its answer (or was skipped).
    fn bind_answered(&mut self, portal: &str) {
        if let Some(q) = self.rebinding.get_mut(portal) {
            q.pop_front();
            if q.is_empty() {
                self.rebinding.remove(portal);
            }
        }
    }

    /// What portal `name` may run in dispatcher batch `batch`: the analysis of what it
    /// holds now (if anything), and of what it held before each of its Binds sent in an
    /// earlier batch and not yet answered.
    pub fn portal_may_run(&self, name: &str, batch: u64) -> impl Iterator<Item = &Arc<Analysis>> {
        let now = self.portals.get(name).map(|e| &e.analysis);
        now.into_iter().chain(self.held_before(name, batch))
    }

    /// What portal `name` held before each of its Binds sent before dispatcher batch
    /// `batch` and not yet answered. Nothing when `batch` binds the name too: if Postgres
    /// refuses that Bind, it skips the rest of the batch, so only what it binds can run.
    pub fn held_before(&self, name: &str, batch: u64) -> impl Iterator<Item = &Arc<Analysis>> {
        let binds = self.rebinding.get(name);
        let rebound_now = binds.and_then(|q| q.back()).is_some_and(|(b, _)| *b == batch);
        binds
            .into_iter()
            .filter(move |_| !rebound_now)
            .flat_map(move |q| q.iter().take_while(move |(b, _)| *b < batch))
            .filter_map(|(_, a)| a.as_ref())
    }

    /// A client's Bind that Postgres refused or skipped: the portal it would have replaced
    /// is still there (a wrong parameter count fails before the old unnamed portal goes, and
    /// a savepoint can bring the transaction back), so its statement is what the name runs.
    /// When a later Bind of the name, still unanswered, already took its place, that one
    /// replaces what this one would have: it inherits `before`, both for when it is
    /// answered and for what an Execute sent before then may run ([`Self::held_before`]:
    /// the later Bind's entry is now the first of the name's unanswered ones).
    fn unbind(&mut self, r: Rebind) {
        if self.portals.get(&r.portal).is_some_and(|e| e.bind == r.bind) {
            match r.before {
                Some(before) => self.portals.insert(&r.portal, before),
                None => self.portals.remove(&r.portal),
            };
            return;
        }
        if let Some((_, held)) = self.rebinding.get_mut(&r.portal).and_then(VecDeque::front_mut) {
            *held = r.before.as_ref().map(|e| e.analysis.clone());
        }
        let later = self.pending.iter_mut().find_map(|u| match u {
            Unit::Bind(_, _, Some(later)) if later.portal == r.portal => Some(later),
            _ => None,
        });
        if let Some(later) = later {
            later.before = r.before;
        }
    }

    /// The open transaction ended: its settings changes commit or roll back with it.
    fn end_transaction(&mut self, committed: bool) {
        self.declared.end_transaction(committed);
        self.guarded = None;
        self.tx_error = false;
    }

    /// ReadyForQuery: the batch is over. Idle means no transaction is open any more; one
    /// without a command tag (an implicit transaction) committed unless it failed.
    fn on_ready(&mut self, body: Option<&[u8]>) {
        self.answered += 1;
        self.release_pending();
        let status = body.and_then(|b| b.first().copied()).unwrap_or(b'I');
        self.tx_status = status;
        if status == b'I' {
            self.end_transaction(!self.tx_error);
            let answered = self.answered;
            self.portals.retain(|_, e| e.sent >= answered);
            self.uncertain_portals = self.uncertain_portals.filter(|&sent| sent >= answered);
        }
    }

    /// An ErrorResponse to an extended-protocol unit: Postgres now skips to Sync.
    fn extended_error(&mut self, injected: Option<Injected>, body: Option<&[u8]>) -> Verdict {
        // The guard or refusal this unit prepares or binds for (its Execute is still queued).
        let injected = match injected {
            Some(Injected::Prepare(..) | Injected::Plumbing) => self.guard_ahead().or(injected),
            Some(Injected::Reprepare) => None,
            other => other,
        };
        if let Some(&Unit::Parse(Some(Injected::Prepare(s, mark)), ..)) = self.pending.front() {
            // Not there, unless the name is taken by a statement of the client's.
            let state = if name_taken(body) {
                Prepared::Unknown
            } else {
                Prepared::No
            };
            self.settle_parse(s, mark, state);
        }
        // Whether Postgres analysed a statement prepared before (at a Bind or Describe).
        let (positions, again) = match self.pending.pop_front() {
            Some(Unit::Parse(_, defined, positions)) => {
                if let Some(d) = defined {
                    self.forget_failed(&d);
                }
                (positions, false)
            }
            Some(Unit::Bind(_, positions, rebind)) => {
                if let Some(r) = rebind {
                    self.bind_answered(&r.portal);
                    self.unbind(*r);
                }
                (positions, true)
            }
            Some(Unit::Describe(positions, _)) => (positions, true),
            _ => (None, false),
        };
        self.tx_error = true;
        self.skipping = true;
        self.drop_skipped();
        let verdict = self.error_verdict(injected, body);
        self.with_client_position(verdict, positions, body, again)
    }

    /// `verdict` for an error of the client's statement, with its position given in the
    /// client's text when pgfence sent another (`positions`). `again`: the error comes from
    /// Postgres analysing a prepared statement again (at a Bind or Describe).
    fn with_client_position(
        &self,
        verdict: Verdict,
        positions: Option<Arc<Positions>>,
        body: Option<&[u8]>,
        again: bool,
    ) -> Verdict {
        if let (Verdict::Forward, Some(positions), Some(body)) = (&verdict, &positions, body)
            && let Some(pf005) = self.rewrite_not_initialised(positions, body, again)
        {
            return Verdict::Replace(pf005);
        }
        match (verdict, positions, body) {
            (Verdict::Forward, Some(positions), Some(body)) => match self.reported.position_count() {
                Some(count) => {
                    let fences = self.fences.as_deref();
                    frame::error_with_position(body, |at| positions.client_position(at, count, fences))
                        .map_or(Verdict::Forward, Verdict::Replace)
                }
                None => Verdict::Forward,
            },
            (verdict, ..) => verdict,
        }
    }

    /// The first guard or refusal queued up to the next Sync.
    fn guard_ahead(&self) -> Option<Injected> {
        self.pending
            .iter()
            .take_while(|u| !matches!(u, Unit::Sync { .. } | Unit::Query { .. }))
            .find_map(|u| match u {
                Unit::Execute(Some(g @ (Injected::Guard(..) | Injected::Reject(_))), _) => Some(*g),
                _ => None,
            })
    }

    /// An emptied queue that grew large (a deep pipeline, a flood skipped after an
    /// error) gives its room back.
    fn release_pending(&mut self) {
        if self.pending.is_empty() && self.pending.capacity() > PENDING_KEEP {
            self.pending = VecDeque::new();
        }
    }

    /// The answer to pgfence's own SQL `PREPARE` ([`Unit::OwnQuery`]); ignored once
    /// something else (a Close and Parse, DISCARD ALL) took over the name's state since.
    fn settle_query_prepare(&mut self, own: OwnStatement, state: Prepared) {
        if self.own.get(&own) == Some(&Prepared::BY_QUERY) {
            self.own.insert(own, state);
        }
    }

    /// The answer to pgfence's own Parse, sent at `mark` ([`Shared::own_mark`]): ignored
    /// when a client message sent since may have closed the name or put its own statement
    /// under it, which left the state as that message says ([`Prepared::Unknown`]).
    fn settle_parse(&mut self, own: OwnStatement, mark: u64, state: Prepared) {
        if mark == self.own_mark {
            self.own.insert(own, state);
        }
    }

    /// Units Postgres skipped after an error get no reply. Called for every server
    /// message, and for every client message sent while Postgres is skipping: until a
    /// Sync reaches it, what the client sends gets no reply, and units for it would
    /// wait for one (a client that never sends that Sync would grow them without bound).
    pub fn drop_skipped(&mut self) {
        // The unit just dropped was one of pgfence's Closes: the one it sends before
        // preparing a statement again (never refused, so skipped with the Parse after it),
        // or its portal's after an earlier use, which only makes the state cautious.
        let mut closed_before = false;
        while self.skipping {
            let close = matches!(self.pending.front(), Some(Unit::Close(Some(Injected::Plumbing), None)));
            match self.pending.front() {
                Some(Unit::Sync { .. }) => break,
                None => {
                    self.release_pending();
                    break;
                }
                // Skipped with the Close before it, the statement is as it was before
                // them: prepared by an earlier batch, maybe. Without one, it was not.
                Some(&Unit::Parse(Some(Injected::Prepare(s, mark)), ..)) => {
                    let state = if closed_before { Prepared::Unknown } else { Prepared::No };
                    self.settle_parse(s, mark, state);
                    self.pending.pop_front();
                }
                Some(_) => match self.pending.pop_front() {
                    Some(Unit::Parse(_, Some(d), _)) => self.forget_failed(&d),
                    // Counted as sent when dispatched, as a Sync is: answered now, as it
                    // never will be.
                    Some(Unit::Query { .. } | Unit::FunctionCall) => self.answered += 1,
                    // Sent only after a Sync (see [`Unit::OwnQuery`]), so not skipped in
                    // practice; never counted as sent.
                    Some(Unit::OwnQuery(s)) => self.settle_query_prepare(s, Prepared::No),
                    Some(Unit::Bind(_, _, Some(r))) => {
                        self.bind_answered(&r.portal);
                        self.unbind(*r);
                    }
                    _ => {}
                },
            }
            closed_before = close;
        }
    }

    /// Errors are always forwarded; an error from pgfence's own guard because
    /// the schema or function is missing becomes PF005.
    fn error_verdict(&mut self, injected: Option<Injected>, body: Option<&[u8]>) -> Verdict {
        if injected.is_none() {
            return Verdict::Forward;
        }
        let code = body.and_then(frame::error_code);
        if matches!(code, Some(b"26000")) {
            // Our prepared statement is gone (DEALLOCATE by name): prepare it again next time.
            self.own.clear();
        }
        // Also at the Bind of our own prepared guard: when the schema was dropped after it was
        // prepared, re-planning it there is what fails. 42P01: the schema is there but not
        // its tables.
        match code {
            Some(code @ (b"3F000" | b"42883" | b"42P01")) => Verdict::Replace(self.not_initialised(injected, code)),
            _ => Verdict::Forward,
        }
    }

    /// PF005 in place of Postgres' error `code` for `injected`, or for a rewrite: the schema
    /// is missing (3F000, 42P01), or older than this pgfence (a function or type it lacks).
    fn not_initialised(&self, injected: Option<Injected>, code: &[u8]) -> BytesMut {
        let schema = if matches!(code, b"42883" | b"42704") {
            "the database's pgfence schema is older than this pgfence"
        } else {
            "the database has no pgfence schema"
        };
        let name = |fence: FenceId| {
            self.fences
                .as_ref()
                .and_then(|f| f.names.get(usize::from(fence.0)))
                .map_or("?", String::as_str)
        };
        let message = match injected {
            Some(Injected::Guard(fence, epoch)) => format!(
                "pgfence: {schema}, so fence \"{}\" cannot check epoch {epoch}; fenced writes are refused",
                name(fence)
            ),
            Some(Injected::Reject(Some(fence))) => {
                format!("pgfence: {schema}; writes to fence \"{}\" are refused", name(fence))
            }
            _ => format!("pgfence: {schema}; fenced writes are refused"),
        };
        let mut out = BytesMut::new();
        codec::error_response(
            &mut out,
            "ERROR",
            sqlstate::NOT_INITIALISED,
            &message,
            Some("Run `pgfence init --database-url <url of this database>` (with --config to install lease triggers)."),
        );
        out
    }

    /// PF005 for an error of a rewritten statement that Postgres raised because the type
    /// every rewrite writes its epoch as, `pgfence.epoch`, is not there: the database has no
    /// pgfence schema (3F000) or an older one (42704). Told from a client's own missing type
    /// or schema by its position, in text the rewrite added. Where pgfence cannot count the
    /// position (a client encoding other than UTF8), or Postgres gives none because it
    /// analyses a prepared statement again (`again`), by a message that names the type or
    /// the schema. Errors raised while a statement runs have no position and are never
    /// about the type.
    fn rewrite_not_initialised(&self, positions: &Positions, body: &[u8], again: bool) -> Option<BytesMut> {
        let code = frame::error_code(body)?;
        if !matches!(code, b"3F000" | b"42704") {
            return None;
        }
        let fences = self.fences.as_deref()?;
        let at = frame::error_position(body);
        let redo = match (at, self.reported.position_count()) {
            (Some(at), Some(count)) => positions.in_rewrite_addition(at, count, fences)?,
            _ if (at.is_some() || again) && names_epoch_type(code, frame::error_field(body, b'M')?) => {
                positions.first_rewrite()?
            }
            _ => return None,
        };
        Some(self.not_initialised(Some(Injected::Guard(redo.fence, redo.epoch)), code))
    }
}

/// Whether an error `message` names what a rewrite's `::pgfence.epoch` needs: the type
/// (42704) or the schema `pgfence` (3F000). Messages may be translated, but they quote the
/// name as written.
fn names_epoch_type(code: &[u8], message: &[u8]) -> bool {
    let word = |at: usize, len: usize| {
        let ident = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'$' | b'.');
        let joined_before = at > 0 && ident(&message[at - 1]);
        let joined_after = message.get(at + len).is_some_and(ident);
        !joined_before && !joined_after
    };
    let name: &[u8] = if code == b"42704" {
        crate::sql::rewrite::EPOCH_TYPE.as_bytes()
    } else {
        b"pgfence"
    };
    memchr::memmem::find_iter(message, name).any(|at| word(at, name.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_epoch_type_is_told_by_its_name() {
        assert!(names_epoch_type(b"42704", br#"type "pgfence.epoch" does not exist"#));
        assert!(names_epoch_type(b"3F000", br#"schema "pgfence" does not exist"#));
        assert!(names_epoch_type(
            b"3F000",
            "Schema \u{bb}pgfence\u{ab} existiert nicht".as_bytes()
        ));
        assert!(!names_epoch_type(b"3F000", br#"schema "pgfence_x" does not exist"#));
        assert!(!names_epoch_type(b"3F000", br#"schema "my.pgfence" does not exist"#));
        assert!(!names_epoch_type(b"42704", br#"type "pgfence.epochs" does not exist"#));
        assert!(!names_epoch_type(b"42704", br#"type "mypgfence.epoch" does not exist"#));
        assert!(!names_epoch_type(b"42704", br#"type with OID 16390 does not exist"#));
    }

    /// A portal-dropping effect is applied only on the tag of a statement that drops
    /// portals: a misread statement (here a `PREPARE` taken for a transaction's end) leaves
    /// them.
    #[test]
    fn portals_go_only_on_the_tags_that_drop_them() {
        let entry = PortalEntry {
            analysis: Arc::default(),
            sent: 0,
            exact: None,
            bind: 1,
            rw: None,
            begins: false,
        };
        let cases: [(Option<&str>, &[u8], bool); 6] = [
            (None, b"PREPARE\0", true),
            (None, b"SELECT 1\0", true),
            (Some("m"), b"CLOSE CURSOR ALL\0", true),
            (Some("m"), b"CLOSE CURSOR\0", false),
            (None, b"CLOSE CURSOR ALL\0", false),
            (None, b"COMMIT\0", false),
        ];
        for (portal, tag, kept) in cases {
            let mut st = Shared::new(Declarations::default());
            st.portals.insert("m", entry.clone());
            let gone = Effect::PortalsGone {
                portal: portal.map(str::to_owned),
                upto: 1,
                two_phase: false,
                chain: false,
            };
            st.pending.push_back(Unit::Execute(None, Some(gone)));
            st.on_server_message(b'C', Some(tag));
            assert_eq!(st.portals.contains_key("m"), kept, "{portal:?} {tag:?}");
        }
    }
}
