//! What a session needs to know about the fences of its database.

use std::sync::{Arc, Mutex};

use crate::config::Fence;
use crate::sql::FenceId;
use crate::sql::classify::{Analysis, Analyzer, FenceSet};

/// The fences as seen from one database, shared by its sessions.
pub struct DbFences {
    /// All configured fences, indexed by [`FenceId`].
    pub config: Arc<[Fence]>,
    /// Their names, indexed by [`FenceId`].
    pub names: Vec<String>,
    /// The fences that apply to this database.
    pub applicable: Vec<FenceId>,
    /// Each fence's lease table as text for the guard, if it has a lease.
    pub lease_tables: Vec<Option<String>>,
    analyzer: Mutex<Analyzer>,
}

impl DbFences {
    /// The fences that apply to `database`.
    pub fn for_database(config: Arc<[Fence]>, database: &str) -> Self {
        let mut applicable = Vec::new();
        let mut tables = Vec::new();
        for (i, f) in config.iter().enumerate() {
            if f.database.as_deref().is_none_or(|d| d == database) {
                let id = FenceId(i as u16);
                applicable.push(id);
                tables.extend(f.tables.iter().map(|t| (t.clone(), id)));
            }
        }
        let names = config.iter().map(|f| f.name.clone()).collect();
        let lease_tables = config
            .iter()
            .map(|f| f.lease.as_ref().map(|l| l.table.to_string()))
            .collect();
        Self {
            config,
            names,
            applicable,
            lease_tables,
            analyzer: Mutex::new(Analyzer::new(FenceSet::new(tables))),
        }
    }

    /// Analyses a statement (cached by text).
    pub fn analyze(&self, sql: &str) -> Arc<Analysis> {
        let mut analyzer = self.analyzer.lock().unwrap_or_else(|p| p.into_inner());
        analyzer.analyze(sql)
    }
}
