//! The database side of fencing: the [`Epoch`](epoch::Epoch) newtype, the `pgfence`
//! schema (`sql/NNNN_*.sql`, installed by [`install::install`]) and the SQL text the
//! proxy sends to run the guard ([`call`]).
//!
//! # The guard
//!
//! In reject mode every fenced write is preceded, in the same transaction, by
//! `SELECT pgfence.guard(fence, epoch, lease_table, true)`. It raises `PF005` when a
//! lease is configured but `pgfence init --config` has not registered it (or its trigger
//! is gone), `PF003` when the epoch is above what the lease row granted, `PF001` when
//! the epoch is below the fence's current epoch (max of the durable high-water mark and
//! the lease epoch), and raises the high-water mark (HWM) when the epoch is above it.
//! In rewrite mode (`keep_hwm = false`) only the lease checks run: the rows carry the
//! epochs. `pgfence.reject(code, message, hint, fences)` raises PF002/PF004 for the proxy,
//! appending each named fence's current epoch (which the proxy cannot read).
//!
//! # Locking
//!
//! The guard must let writers of the same epoch run in parallel, make a takeover (an HWM
//! bump or a lease takeover) wait for every transaction already past the guard, and must
//! not let a stream of new writers starve that takeover. Each fence has an advisory lock
//! key, `pgfence.lock_key(name)`:
//!
//! 1. A plain read of the fence row chooses the path (so no lock is ever upgraded from
//!    shared to exclusive) and fails fast on a stale epoch.
//! 2. A writer at the current epoch takes `pg_advisory_xact_lock_shared(key)`, then
//!    re-reads the HWM: shared holders do not block each other, and the lock is held to
//!    the end of the transaction, so a takeover waits for the write to commit or roll back
//!    (a `PREPARE TRANSACTION` keeps it too).
//! 3. A bump takes `pg_advisory_xact_lock(key)` (exclusive), re-reads under
//!    `FOR UPDATE` and raises the HWM. The lease trigger does the same when a lease row's
//!    epoch goes up, so once a takeover commits, the old epoch is refused even before the
//!    new leader writes. A renewal (same epoch) takes no lock and writes no fence row.
//! 4. Why advisory locks rather than row locks: `SELECT … FOR SHARE` on the fence row also
//!    makes an `UPDATE` wait for the writers, but row-lock waiters are not served in order,
//!    and a new share locker got in while the update waited: continuous writers starved
//!    the takeover (`FACTS.md`). Heavyweight (advisory) locks queue fairly: a shared
//!    request that arrives behind a waiting exclusive one waits its turn, then re-reads
//!    the HWM the takeover wrote and fails with PF001.
//! 5. Why `FOR SHARE` under REPEATABLE READ and SERIALIZABLE: there the transaction's
//!    snapshot may predate a bump that committed while the writer waited for the lock, and
//!    a plain read would see the old HWM and pass. Locking the row makes Postgres raise
//!    40001 (could not serialize) for a row changed after the snapshot instead. Under READ
//!    COMMITTED each statement takes a fresh snapshot after the lock is granted, so a
//!    plain read suffices and the row is not dirtied by every writer.
//!
//! 6. The short path (`0002_fast_guard.sql`): `pgfence.guard` itself handles the steady
//!    state, a READ COMMITTED write of the epoch that is already current — shared lock,
//!    one read of the fence row (and, with a lease, of the trigger in the same query),
//!    return — and hands every other case, errors included, to `pgfence.guard_full`
//!    (steps 1–5). Both run with the installer's rights; the short path has no
//!    `search_path` of its own (a GUC save and restore per call) and qualifies every
//!    name. Without a lease the shared lock is only right once the HWM has reached the
//!    epoch (else the call must bump with the lock exclusive, and a shared holder cannot
//!    upgrade without risking a deadlock): whenever `guard_full` lets a write through, the
//!    guard records `<epoch> <fence>` in the transactional session setting
//!    `pgfence.guard_passed`, so the marker never outlives a rolled-back bump, and the
//!    short path falls through to `guard_full` if it still finds the HWM below the epoch.
//! 7. The count (`0005_hwm_changes.sql`): without a lease, the short path skips even its
//!    read of the fence row while no fence row changed since this session read HWM = epoch.
//!    Every change to a fence's HWM takes the fence's lock exclusive and then draws from the
//!    sequence `pgfence.hwm_changes` (trigger `pgfence_fence_changed`, and the full guard's
//!    bump itself), before it commits; the short path reads the sequence after taking the
//!    lock shared, and keeps the value it read before its last read of the row in
//!    `pgfence.guard_checked`. An unchanged value means no change began since that read.
//! 8. The inline guard (`0006_inline_guard.sql`): that last case is an SQL expression.
//!    `pgfence.guard` is a `LANGUAGE sql` function that Postgres inlines into pgfence's
//!    prepared guard statement (shared lock, count, return, with the caller's rights);
//!    everything else calls `pgfence.guard_slow` (version 5's guard, renamed). A change
//!    counts itself with `setval` under a short lock (`pgfence.count_change`), which leaves
//!    the session's `lastval()` alone.
//! 9. The lease steady state (`0009_lease_steady_state.sql`): a fence with a lease gets the
//!    same expression, `pgfence.guard_lease`. The count also moves with a fence row's lease
//!    columns, and `guard_slow` records it on a lease-coupled pass (`pgfence.lease_passed`,
//!    `pgfence.lease_checked`). A disabled lease trigger changes no fence row, so pgfence's
//!    guard statement looks the trigger up itself, in each transaction, and passes the
//!    answer: without the trigger, `guard_slow` decides (PF005).
//! 10. The epoch type (`0010_epoch_domain.sql`): rewrite mode writes each epoch as
//!     `N::pgfence.epoch`, so a database without the schema refuses the rewritten statement
//!     itself (PF005) and a fence without a lease runs no statement of pgfence's.
//!
//! A known cost: the first writes at a new epoch without a lease bump the HWM, and each
//! bumping transaction holds the exclusive lock until it commits, so writers of the new
//! epoch that overlap it wait for it once. With a lease the trigger has already raised the
//! HWM at takeover, and the new leader's writes all take the shared path.
//!
//! # Lease rows
//!
//! `pgfence init --config` registers a fence with its lease table and row and installs
//! two triggers there: `pgfence_lease` (BEFORE INSERT OR UPDATE OR DELETE, FOR EACH ROW)
//! and `pgfence_lease_truncate`. An epoch going up is a takeover (above); an UPDATE
//! lowering the epoch below the fence's current epoch fails; an INSERT (or a rename onto
//! the row's name, or any raise) that starts below the current epoch is lifted to it, so
//! a new leader is never born stale; DELETE, TRUNCATE and renaming away revoke the grant
//! (`lease_epoch = 0`: every epoch is then above the lease, PF003), and a row that grants
//! a revoked fence again starts above its HWM (schema version 11), so the leader cut off
//! stays cut off.

pub mod call;
pub mod epoch;
pub mod install;
pub mod policy;
mod report;
