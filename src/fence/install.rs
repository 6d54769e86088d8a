//! `pgfence init`: installs or upgrades the `pgfence` schema in one database and
//! registers the configured fences and their lease triggers there.
//!
//! Everything happens in one transaction under an advisory lock, so two concurrent
//! installs are safe and a failed one leaves nothing behind. Migrations
//! (`src/fence/sql/NNNN_*.sql`) are applied in order and recorded in
//! `pgfence.schema_version`; running `install` again is a no-op.

use tokio_postgres::{Client, Transaction};

use crate::config::{Fence, Lease, Mode};
use crate::sql::name::TableName;

pub use super::report::{EpochColumnNote, EpochColumnProblem, FenceReport, FenceStatus, InstallReport, LeaseStatus};

pub use super::call::{
    GUARD_PARAM_TYPES, GUARD_SQL, REJECT_PARAM_TYPES, REJECT_SQL, guard_call, guard_params, quote_literal, reject_call,
};

/// The schema version this build of pgfence installs.
pub const SCHEMA_VERSION: i32 = 12;

/// One migration: applied when the database's version is below `version`.
struct Migration {
    version: i32,
    name: &'static str,
    sql: &'static str,
}

/// Every migration, in order; the last one's version is [`SCHEMA_VERSION`].
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "0001_init",
        sql: include_str!("sql/0001_init.sql"),
    },
    Migration {
        version: 2,
        name: "0002_fast_guard",
        sql: include_str!("sql/0002_fast_guard.sql"),
    },
    Migration {
        version: 3,
        name: "0003_guard_locks",
        sql: include_str!("sql/0003_guard_locks.sql"),
    },
    Migration {
        version: 4,
        name: "0004_current_epoch",
        sql: include_str!("sql/0004_current_epoch.sql"),
    },
    Migration {
        version: 5,
        name: "0005_hwm_changes",
        sql: include_str!("sql/0005_hwm_changes.sql"),
    },
    Migration {
        version: 6,
        name: "0006_inline_guard",
        sql: include_str!("sql/0006_inline_guard.sql"),
    },
    Migration {
        version: 7,
        name: "0007_reject_current_epoch",
        sql: include_str!("sql/0007_reject_current_epoch.sql"),
    },
    Migration {
        version: 8,
        name: "0008_registered_lease",
        sql: include_str!("sql/0008_registered_lease.sql"),
    },
    Migration {
        version: 9,
        name: "0009_lease_steady_state",
        sql: include_str!("sql/0009_lease_steady_state.sql"),
    },
    Migration {
        version: 10,
        name: "0010_epoch_domain",
        sql: include_str!("sql/0010_epoch_domain.sql"),
    },
    Migration {
        version: 11,
        name: "0011_regrant_new_epoch",
        sql: include_str!("sql/0011_regrant_new_epoch.sql"),
    },
    Migration {
        version: 12,
        name: "0012_lease_triggers_always",
        sql: include_str!("sql/0012_lease_triggers_always.sql"),
    },
];

/// Serialises installers. The two-int key space (`'pgfe'`, 1) cannot collide with the
/// fences' bigint keys (`pgfence.lock_key`).
const INSTALL_LOCK: &str = "SELECT pg_catalog.pg_advisory_xact_lock(1885824613, 1)";

/// Run under the install lock before reading the version.
const BOOTSTRAP: &str = "CREATE SCHEMA IF NOT EXISTS pgfence; \
    CREATE TABLE IF NOT EXISTS pgfence.schema_version (version integer PRIMARY KEY, name text NOT NULL, \
    applied_at timestamptz NOT NULL DEFAULT now())";

/// Why [`install`] failed; the transaction was rolled back, nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// A statement failed (connection lost, missing privilege, …). The message says all
    /// of it: as a source too, the error would be printed twice in a chain.
    #[error("{}", pg_message(.0))]
    Postgres(tokio_postgres::Error),
    /// A migration script failed.
    #[error("applying pgfence schema migration {name}: {}", pg_message(.cause))]
    Migration {
        /// The migration's name, e.g. `0001_init`.
        name: &'static str,
        /// The error (not a source, for the same reason).
        cause: tokio_postgres::Error,
    },
    /// The database was initialised by a newer pgfence.
    #[error(
        "the pgfence schema in database {database:?} is version {found}, newer than this pgfence knows \
         (up to {known}): use a newer pgfence"
    )]
    NewerSchema {
        /// `current_database()`.
        database: String,
        /// Version found.
        found: i32,
        /// [`SCHEMA_VERSION`].
        known: i32,
    },
    /// The lease table is missing from the one database of its fence, or does not have the
    /// shape the lease trigger needs.
    #[error("fence {fence:?}: lease table {table} {problem}")]
    LeaseTable {
        /// The fence.
        fence: String,
        /// The lease table.
        table: TableName,
        /// What is wrong.
        problem: String,
    },
}

impl From<tokio_postgres::Error> for InstallError {
    fn from(e: tokio_postgres::Error) -> Self {
        Self::Postgres(e)
    }
}

/// Postgres' own message (with detail and hint) when there is one.
fn pg_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut m = format!("{}: {} ({})", db.severity(), db.message(), db.code().code());
            if let Some(detail) = db.detail() {
                m.push_str(&format!("\nDETAIL: {detail}"));
            }
            if let Some(hint) = db.hint() {
                m.push_str(&format!("\nHINT: {hint}"));
            }
            m
        }
        None => e.to_string(),
    }
}

/// Installs or upgrades the `pgfence` schema in the connected database, then registers
/// each fence that applies to it (`database` unset or equal to `current_database()`):
/// its row in `pgfence.fence`, and, when its lease table is in this database, the
/// lease registration, the current lease epoch and the lease triggers.
///
/// One transaction under an advisory lock: concurrent installs are safe, a failure
/// changes nothing, and a second run changes nothing.
pub async fn install(client: &mut Client, fences: &[Fence]) -> Result<InstallReport, InstallError> {
    let tx = client.transaction().await?;
    // `IF NOT EXISTS` and `DROP … IF EXISTS` would otherwise log a NOTICE each time.
    tx.batch_execute("SET LOCAL client_min_messages = warning").await?;
    tx.batch_execute(INSTALL_LOCK).await?;
    // Only when missing: `CREATE SCHEMA IF NOT EXISTS` asks for CREATE on the database
    // first, so a role without it could not even learn that the schema is up to date.
    let bootstrapped: bool = tx
        .query_one(
            "SELECT pg_catalog.to_regclass('pgfence.schema_version') IS NOT NULL",
            &[],
        )
        .await?
        .try_get(0)?;
    if !bootstrapped {
        tx.batch_execute(BOOTSTRAP).await?;
    }
    let database: String = tx
        .query_one("SELECT pg_catalog.current_database()::text", &[])
        .await?
        .try_get(0)?;
    let version_before: i32 = tx
        .query_one("SELECT coalesce(max(version), 0) FROM pgfence.schema_version", &[])
        .await?
        .try_get(0)?;
    if version_before > SCHEMA_VERSION {
        return Err(InstallError::NewerSchema {
            database,
            found: version_before,
            known: SCHEMA_VERSION,
        });
    }
    for m in MIGRATIONS.iter().filter(|m| m.version > version_before) {
        tx.batch_execute(m.sql)
            .await
            .map_err(|cause| InstallError::Migration { name: m.name, cause })?;
        tx.execute(
            "INSERT INTO pgfence.schema_version (version, name) VALUES ($1, $2)",
            &[&m.version, &m.name],
        )
        .await?;
    }
    let mut reports = Vec::with_capacity(fences.len());
    for fence in fences {
        let status = match &fence.database {
            Some(db) if *db != database => FenceStatus::OtherDatabase { database: db.clone() },
            _ => register_fence(&tx, fence).await?,
        };
        reports.push(FenceReport {
            fence: fence.name.clone(),
            status,
        });
    }
    // Fences sharing a lease row: a later fence's lift moves the earlier ones too.
    for report in &mut reports {
        if let FenceStatus::Registered { hwm, lease, .. } = &mut report.status {
            let row = tx
                .query_one(
                    "SELECT hwm, lease_epoch FROM pgfence.fence WHERE name = $1",
                    &[&report.fence],
                )
                .await?;
            *hwm = row.try_get(0)?;
            if let LeaseStatus::Installed { lease_epoch, .. } = lease {
                *lease_epoch = row.try_get(1)?;
            }
        }
    }
    tx.commit().await?;
    Ok(InstallReport {
        database,
        version_before,
        version_after: SCHEMA_VERSION.max(version_before),
        fences: reports,
    })
}

async fn register_fence(tx: &Transaction<'_>, fence: &Fence) -> Result<FenceStatus, InstallError> {
    let created = tx
        .execute(
            "INSERT INTO pgfence.fence (name) VALUES ($1) ON CONFLICT (name) DO NOTHING",
            &[&fence.name],
        )
        .await?
        == 1;
    let mut missing_tables = Vec::new();
    let mut epoch_columns = Vec::new();
    for table in &fence.tables {
        match relation_oid(tx, table).await? {
            // A name fenced too only as written (`Inv` as `"Inv"`) is no news when absent.
            None if fence.as_written.iter().any(|(_, t)| t == table) => {}
            None => missing_tables.push(table.clone()),
            Some(oid) => {
                if fence.mode == Mode::Rewrite
                    && let Some(column) = &fence.epoch_column
                    && let Some(problem) = epoch_column_problem(tx, oid, column).await?
                {
                    epoch_columns.push(EpochColumnNote {
                        table: table.clone(),
                        column: column.clone(),
                        problem,
                    });
                }
            }
        }
    }
    let lease = match &fence.lease {
        // A lease taken out of the config: the guard follows the registration whoever
        // calls it (version 8), so it must go too, or the fence's writes would still be
        // checked against that lease.
        None => match tx
            .query_opt(
                "UPDATE pgfence.fence f SET lease_table = NULL, lease_row = NULL \
                 FROM pgfence.fence old WHERE f.name = $1 AND old.name = f.name AND f.lease_table IS NOT NULL \
                 RETURNING old.lease_table",
                &[&fence.name],
            )
            .await?
        {
            Some(row) => LeaseStatus::Unregistered { table: row.try_get(0)? },
            None => LeaseStatus::NotConfigured,
        },
        Some(lease) => register_lease(tx, fence, lease).await?,
    };
    let hwm: i64 = tx
        .query_one("SELECT hwm FROM pgfence.fence WHERE name = $1", &[&fence.name])
        .await?
        .try_get(0)?;
    Ok(FenceStatus::Registered {
        created,
        hwm,
        missing_tables,
        epoch_columns,
        lease,
    })
}

/// What is wrong with a rewrite table's epoch column, if anything: rewrite mode writes
/// `bigint` epochs into it, so a missing column fails every rewritten write (42703), and
/// one of another type fails epochs beyond its range (FENCING.md).
async fn epoch_column_problem(
    tx: &Transaction<'_>,
    oid: u32,
    column: &str,
) -> Result<Option<EpochColumnProblem>, InstallError> {
    let row = tx
        .query_opt(
            // A domain is read as its base type: a domain over bigint takes bigint epochs.
            "SELECT pg_catalog.format_type(CASE t.typtype WHEN 'd' THEN t.typbasetype ELSE t.oid END, NULL) \
               FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid \
              WHERE a.attrelid = $1 AND a.attname = $2 AND a.attnum > 0 AND NOT a.attisdropped",
            &[&oid, &column],
        )
        .await?;
    Ok(match row {
        None => Some(EpochColumnProblem::Missing),
        Some(row) => {
            let found: String = row.try_get(0)?;
            (found != "bigint").then_some(EpochColumnProblem::Type(found))
        }
    })
}

async fn register_lease(tx: &Transaction<'_>, fence: &Fence, lease: &Lease) -> Result<LeaseStatus, InstallError> {
    let Some(oid) = relation_oid(tx, &lease.table).await? else {
        // A fence of this one database cannot work without its lease table here: every
        // write would fail with PF005. One for any database has it in one of them.
        if fence.database.is_some() {
            return Err(InstallError::LeaseTable {
                fence: fence.name.clone(),
                table: lease.table.clone(),
                problem: "does not exist in the fence's database: create it, then run init again".into(),
            });
        }
        return Ok(LeaseStatus::TableNotHere {
            table: lease.table.clone(),
        });
    };
    let quoted = quote_table(&lease.table);
    // Holds off lease changes (takeovers) until we commit: the epoch read below stays
    // current, and the trigger is in place before the next takeover.
    tx.batch_execute(&format!("LOCK TABLE {quoted} IN SHARE ROW EXCLUSIVE MODE"))
        .await?;
    let key = check_lease_table(tx, fence, lease, oid).await?;
    let registration_changed = tx
        .execute(
            "UPDATE pgfence.fence SET lease_table = $2, lease_row = $3 \
             WHERE name = $1 AND (lease_table IS DISTINCT FROM $2 OR lease_row IS DISTINCT FROM $3)",
            &[&fence.name, &key, &lease.row],
        )
        .await?
        == 1;
    let trigger_created = ensure_triggers(tx, oid, &quoted).await?;
    let (lease_epoch_changed, lifted_from) = sync_lease_epoch(tx, fence, lease, &quoted).await?;
    let lease_epoch: i64 = tx
        .query_one("SELECT lease_epoch FROM pgfence.fence WHERE name = $1", &[&fence.name])
        .await?
        .try_get(0)?;
    Ok(LeaseStatus::Installed {
        table: lease.table.clone(),
        row: lease.row.clone(),
        registration_changed,
        trigger_created,
        lease_epoch,
        lease_epoch_changed,
        lifted_from,
    })
}

/// The relation's OID, `None` when it does not exist in this database.
async fn relation_oid(tx: &Transaction<'_>, table: &TableName) -> Result<Option<u32>, InstallError> {
    let row = tx
        .query_one("SELECT pg_catalog.to_regclass($1)::oid", &[&quote_table(table)])
        .await?;
    Ok(row.try_get(0)?)
}

/// Checks the lease table's shape; returns its key as `pgfence.fence.lease_table`
/// stores it (`format('%I.%I')`, the form the lease trigger computes).
async fn check_lease_table(
    tx: &Transaction<'_>,
    fence: &Fence,
    lease: &Lease,
    oid: u32,
) -> Result<String, InstallError> {
    let problem = |problem: String| InstallError::LeaseTable {
        fence: fence.name.clone(),
        table: lease.table.clone(),
        problem,
    };
    let row = tx
        .query_one(
            "SELECT c.relkind::text, format('%I.%I', n.nspname, c.relname), \
                    (SELECT format_type(a.atttypid, NULL) FROM pg_catalog.pg_attribute a \
                      WHERE a.attrelid = c.oid AND a.attname = 'name' AND NOT a.attisdropped), \
                    (SELECT format_type(a.atttypid, NULL) FROM pg_catalog.pg_attribute a \
                      WHERE a.attrelid = c.oid AND a.attname = 'epoch' AND NOT a.attisdropped) \
               FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
              WHERE c.oid = $1",
            &[&oid],
        )
        .await?;
    let relkind: String = row.try_get(0)?;
    let key: String = row.try_get(1)?;
    let name_type: Option<String> = row.try_get(2)?;
    let epoch_type: Option<String> = row.try_get(3)?;
    if relkind != "r" {
        return Err(problem(
            "is not a plain table (the lease trigger needs one; partitioned tables are not supported)".into(),
        ));
    }
    match name_type.as_deref() {
        Some("text" | "character varying") => {}
        Some(other) => return Err(problem(format!("has column \"name\" of type {other}; expected text"))),
        None => {
            return Err(problem(
                "has no column \"name\" (expected the seed's lease shape)".into(),
            ));
        }
    }
    match epoch_type.as_deref() {
        Some("bigint" | "integer") => {}
        Some(other) => {
            return Err(problem(format!(
                "has column \"epoch\" of type {other}; expected bigint"
            )));
        }
        None => {
            return Err(problem(
                "has no column \"epoch\" (expected the seed's lease shape)".into(),
            ));
        }
    }
    Ok(key)
}

/// Creates the lease triggers unless both are in place exactly as pgfence defines them;
/// returns whether it created them. They are enabled ALWAYS: under
/// `session_replication_role = replica` (a logical replication worker, or a superuser's
/// session) a trigger enabled the default way does not fire, and a takeover made there would
/// leave the fence at the old epoch, letting the old leader write on.
async fn ensure_triggers(tx: &Transaction<'_>, oid: u32, quoted: &str) -> Result<bool, InstallError> {
    // tgtype 31 = ROW | BEFORE | INSERT | DELETE | UPDATE; 34 = BEFORE | TRUNCATE (statement).
    let present: bool = tx
        .query_one(
            "SELECT count(*) = 2 FROM pg_catalog.pg_trigger t WHERE t.tgrelid = $1 AND t.tgenabled = 'A' \
               AND t.tgnargs = 0 AND ((t.tgname = 'pgfence_lease' AND t.tgtype = 31 \
                    AND t.tgfoid = 'pgfence.lease_trigger()'::pg_catalog.regprocedure) \
                 OR (t.tgname = 'pgfence_lease_truncate' AND t.tgtype = 34 \
                    AND t.tgfoid = 'pgfence.lease_truncate_trigger()'::pg_catalog.regprocedure))",
            &[&oid],
        )
        .await?
        .try_get(0)?;
    if present {
        return Ok(false);
    }
    tx.batch_execute(&format!(
        "DROP TRIGGER IF EXISTS pgfence_lease ON {quoted}; \
         DROP TRIGGER IF EXISTS pgfence_lease_truncate ON {quoted}; \
         CREATE TRIGGER pgfence_lease BEFORE INSERT OR UPDATE OR DELETE ON {quoted} \
             FOR EACH ROW EXECUTE FUNCTION pgfence.lease_trigger(); \
         CREATE TRIGGER pgfence_lease_truncate BEFORE TRUNCATE ON {quoted} \
             FOR EACH STATEMENT EXECUTE FUNCTION pgfence.lease_truncate_trigger(); \
         ALTER TABLE {quoted} ENABLE ALWAYS TRIGGER pgfence_lease, ENABLE ALWAYS TRIGGER pgfence_lease_truncate"
    ))
    .await?;
    Ok(true)
}

/// Brings `pgfence.fence.lease_epoch` up to the lease row; lifts a lease row that grants a
/// stale epoch (through the trigger, now in place). Returns (lease_epoch changed, lifted from).
async fn sync_lease_epoch(
    tx: &Transaction<'_>,
    fence: &Fence,
    lease: &Lease,
    quoted: &str,
) -> Result<(bool, Option<i64>), InstallError> {
    let granted: Option<i64> = tx
        .query_opt(
            &format!("SELECT coalesce(epoch, 0)::bigint FROM {quoted} WHERE name = $1"),
            &[&lease.row],
        )
        .await?
        .map(|row| row.try_get(0))
        .transpose()?;
    let row = tx
        .query_one(
            "SELECT hwm, lease_epoch FROM pgfence.fence WHERE name = $1",
            &[&fence.name],
        )
        .await?;
    let (hwm, recorded): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
    let lifted = match granted {
        Some(epoch) => lifted_epoch(epoch, hwm, recorded)
            .map_err(|current| InstallError::LeaseTable {
                fence: fence.name.clone(),
                table: lease.table.clone(),
                problem: format!(
                    "row {:?} grants epoch {epoch}, a stale one (the fence is at {current}), \
                     and no epoch above {current} exists: this fence can grant no new epoch",
                    lease.row
                ),
            })?
            .map(|to| (epoch, to)),
        None => None,
    };
    if let Some((epoch, to)) = lifted {
        // Above the HWM: the trigger makes it a takeover, waiting for the transactions past
        // the guard, and records it.
        tx.execute(
            &format!("UPDATE {quoted} SET epoch = $2::bigint WHERE name = $1"),
            &[&lease.row, &to],
        )
        .await?;
        return Ok((true, Some(epoch)));
    }
    let target = granted.unwrap_or(0);
    if target == recorded {
        return Ok((false, None));
    }
    if target > hwm {
        // Raising the HWM is a takeover: wait for transactions past the guard, as the trigger does.
        tx.execute(
            "SELECT pg_catalog.pg_advisory_xact_lock(pgfence.lock_key($1))",
            &[&fence.name],
        )
        .await?;
    }
    tx.execute(
        "UPDATE pgfence.fence SET lease_epoch = $2, hwm = greatest(hwm, $2) WHERE name = $1",
        &[&fence.name, &target],
    )
    .await?;
    Ok((true, None))
}

/// The epoch `init` lifts a lease row granting `granted` to, `None` when the row may stand.
/// The trigger keeps rows from starting below the fence's current epoch, so a row `init`
/// finds there changed where the trigger did not see it (the table dropped and created
/// again, the trigger disabled); and a row that grants a revoked fence (`recorded` 0) at
/// or below its HWM grants an epoch of a leader that was cut off. Either way, who holds
/// that epoch is unknown: the row starts a new one, above the current epoch. `Err` holds
/// the current epoch when it is the largest there is.
fn lifted_epoch(granted: i64, hwm: i64, recorded: i64) -> Result<Option<i64>, i64> {
    let current = hwm.max(recorded);
    let revoked = recorded == 0 && hwm >= 1;
    if granted < current || (revoked && granted == hwm) {
        current.checked_add(1).map(Some).ok_or(current)
    } else {
        Ok(None)
    }
}

/// `"schema"."table"`, always quoted: the parts are already normalised, and quoting
/// keeps keywords and odd characters literal.
fn quote_table(table: &TableName) -> String {
    let ident = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
    match &table.schema {
        Some(schema) => format!("{}.{}", ident(schema), ident(&table.name)),
        None => ident(&table.name),
    }
}

#[cfg(test)]
mod tests {
    use super::{MIGRATIONS, SCHEMA_VERSION, lifted_epoch};

    /// Postgres converts the text of each migration to the database's encoding, and a
    /// LATIN1 or SQL_ASCII database refuses characters it cannot hold.
    #[test]
    fn migrations_are_ascii_and_numbered_in_order() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert!(m.sql.is_ascii(), "{} holds a character outside ASCII", m.name);
            assert_eq!(m.version, i as i32 + 1, "{}", m.name);
            assert!(m.name.starts_with(&format!("{:04}_", m.version)), "{}", m.name);
        }
        assert_eq!(MIGRATIONS.last().map(|m| m.version), Some(SCHEMA_VERSION));
    }

    #[test]
    fn a_lease_row_below_the_current_epoch_starts_a_new_one() {
        // (granted, hwm, recorded) -> lifted to
        assert_eq!(lifted_epoch(0, 0, 0), Ok(None), "a fresh fence and row");
        assert_eq!(lifted_epoch(3, 0, 0), Ok(None), "a first grant");
        assert_eq!(lifted_epoch(4, 4, 4), Ok(None), "the live grant");
        assert_eq!(lifted_epoch(5, 4, 4), Ok(None), "a takeover init records");
        assert_eq!(lifted_epoch(1, 4, 4), Ok(Some(5)), "a row replaced unseen");
        assert_eq!(lifted_epoch(0, 4, 4), Ok(Some(5)), "a row replaced unseen, epoch 0");
        assert_eq!(lifted_epoch(4, 4, 0), Ok(Some(5)), "the revoked epoch granted again");
        assert_eq!(lifted_epoch(2, 4, 0), Ok(Some(5)), "below the HWM of a revoked fence");
        assert_eq!(lifted_epoch(6, 4, 0), Ok(None), "a new epoch after a revocation");
        assert_eq!(lifted_epoch(4, 7, 4), Ok(Some(8)), "a HWM from before the lease");
        assert_eq!(
            lifted_epoch(i64::MAX, i64::MAX, i64::MAX),
            Ok(None),
            "the largest, live"
        );
        assert_eq!(lifted_epoch(1, i64::MAX, i64::MAX), Err(i64::MAX), "nothing above");
    }
}
