//! What `pgfence init` did, for the CLI to print (see [`InstallReport`]'s `Display`).

use std::fmt;

use crate::sql::name::TableName;

/// What [`install`](super::install::install) did, for the CLI to print (its `Display` is the human summary).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallReport {
    /// `current_database()`.
    pub database: String,
    /// Schema version found (0: not installed).
    pub version_before: i32,
    /// Schema version now.
    pub version_after: i32,
    /// One entry per configured fence, in configuration order.
    pub fences: Vec<FenceReport>,
}

/// What [`install`](super::install::install) did for one fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceReport {
    /// The fence's name.
    pub fence: String,
    /// The outcome.
    pub status: FenceStatus,
}

/// Outcome for one fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceStatus {
    /// The fence is restricted to another database: nothing done here.
    OtherDatabase {
        /// The fence's `database`.
        database: String,
    },
    /// The fence's row is in `pgfence.fence`.
    Registered {
        /// The row was created now (false: it was already there).
        created: bool,
        /// Its high-water mark after the install.
        hwm: i64,
        /// Fenced tables that do not exist in this database (yet): informational.
        missing_tables: Vec<TableName>,
        /// Rewrite mode: tables here whose epoch column is missing or not `bigint`.
        epoch_columns: Vec<EpochColumnNote>,
        /// What happened to the lease coupling.
        lease: LeaseStatus,
    },
}

/// A rewrite-mode table whose epoch column will not take the epochs pgfence writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochColumnNote {
    /// The fenced table.
    pub table: TableName,
    /// The fence's `epoch_column`.
    pub column: String,
    /// What is wrong with it.
    pub problem: EpochColumnProblem,
}

/// What is wrong with an epoch column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EpochColumnProblem {
    /// The table has no such column.
    Missing,
    /// The column's type, when it is not `bigint`.
    Type(String),
}

impl fmt::Display for EpochColumnNote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self { table, column, problem } = self;
        match problem {
            EpochColumnProblem::Missing => write!(
                f,
                "table {table} has no epoch column \"{column}\" (add it as bigint: rewrite-mode writes to the table fail without it)"
            ),
            EpochColumnProblem::Type(found) => write!(
                f,
                "epoch column \"{column}\" of table {table} is {found}, not bigint (epochs are bigint: make it bigint)"
            ),
        }
    }
}

/// Outcome for a fence's lease coupling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseStatus {
    /// The fence has no `[fence.lease]`.
    NotConfigured,
    /// The fence has no `[fence.lease]` any more: the lease table it was registered with
    /// no longer checks its epochs (its takeovers no longer raise the fence's mark).
    Unregistered {
        /// The lease table it had, as registered.
        table: String,
    },
    /// The lease table does not exist in this database: no trigger here (not an error;
    /// writes to this fence in this database fail with PF005 until it does).
    TableNotHere {
        /// The configured lease table.
        table: TableName,
    },
    /// The fence is registered with its lease table and the trigger is in place.
    Installed {
        /// The lease table.
        table: TableName,
        /// The lease row's `name`.
        row: String,
        /// The registration (table/row) was written now.
        registration_changed: bool,
        /// The lease triggers were (re)created now (false: already in place).
        trigger_created: bool,
        /// The epoch the lease row grants, as recorded in `pgfence.fence.lease_epoch`.
        lease_epoch: i64,
        /// `lease_epoch` was brought up to date now.
        lease_epoch_changed: bool,
        /// The lease row granted a stale epoch, this one, and now grants a new epoch above
        /// the fence's current one (so that no new leader is born stale).
        lifted_from: Option<i64>,
    },
}

impl fmt::Display for InstallReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let action = match (self.version_before, self.version_after) {
            (0, after) => format!("installed (version {after})"),
            (before, after) if before == after => format!("up to date (version {after})"),
            (before, after) => format!("upgraded from version {before} to {after}"),
        };
        writeln!(f, "database \"{}\": pgfence schema {action}", self.database)?;
        for report in &self.fences {
            writeln!(f, "  fence \"{}\": {}", report.fence, report.status)?;
        }
        Ok(())
    }
}

impl fmt::Display for FenceStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FenceStatus::OtherDatabase { database } => write!(f, "skipped (only for database \"{database}\")"),
            FenceStatus::Registered {
                created,
                hwm,
                missing_tables,
                epoch_columns,
                lease,
            } => {
                let verb = if *created { "registered" } else { "already registered" };
                write!(f, "{verb} (high-water mark {hwm}); {lease}")?;
                for table in missing_tables {
                    write!(f, "; note: table {table} does not exist here yet")?;
                }
                for note in epoch_columns {
                    write!(f, "; warning: {note}")?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for LeaseStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseStatus::NotConfigured => f.write_str("no lease table"),
            LeaseStatus::Unregistered { table } => {
                write!(f, "no lease table (was {table}: its registration removed)")
            }
            LeaseStatus::TableNotHere { table } => {
                write!(
                    f,
                    "lease table {table} is not in this database: trigger not installed here, so writes to the \
                     fence's tables in this database fail with PF005; create the lease table here and run init \
                     again, or give the fence `database = \"...\"` (the database that has its lease table)"
                )
            }
            LeaseStatus::Installed {
                table,
                row,
                trigger_created,
                lease_epoch,
                lifted_from,
                ..
            } => {
                let trigger = if *trigger_created {
                    "trigger installed"
                } else {
                    "trigger already in place"
                };
                write!(f, "lease {table} row \"{row}\": {trigger}, lease epoch {lease_epoch}")?;
                if let Some(from) = lifted_from {
                    write!(f, " (the row's epoch {from} was stale: lifted to a new epoch)")?;
                }
                Ok(())
            }
        }
    }
}

impl InstallReport {
    /// Whether the install changed anything (false on a second run).
    pub fn changed(&self) -> bool {
        self.version_before != self.version_after
            || self.fences.iter().any(|r| match &r.status {
                FenceStatus::OtherDatabase { .. } => false,
                FenceStatus::Registered { created, lease, .. } => {
                    *created
                        || matches!(lease, LeaseStatus::Installed { registration_changed, trigger_created,
                            lease_epoch_changed, lifted_from, .. }
                            if *registration_changed || *trigger_created || *lease_epoch_changed || lifted_from.is_some())
                }
            })
    }
}
