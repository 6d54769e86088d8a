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
    /// Analyzers for `standard_conforming_strings` on (`[0]`, the default) and off (`[1]`):
    /// the setting changes where strings end, so the two must not share a cache.
    analyzers: [Mutex<Analyzer>; 2],
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
            analyzers: [
                Mutex::new(analyzer(&tables, true)),
                Mutex::new(analyzer(&tables, false)),
            ],
        }
    }

    /// Analyses a statement (cached by text) as a session with this
    /// `standard_conforming_strings` setting reads it.
    pub fn analyze(&self, sql: &str, standard_conforming_strings: bool) -> Arc<Analysis> {
        let slot = &self.analyzers[usize::from(!standard_conforming_strings)];
        let mut analyzer = slot.lock().unwrap_or_else(|p| p.into_inner());
        analyzer.analyze(sql)
    }
}

fn analyzer(tables: &[(crate::sql::TableName, FenceId)], standard_conforming_strings: bool) -> Analyzer {
    let mut a = Analyzer::new(FenceSet::new(tables.to_vec()));
    a.set_standard_conforming_strings(standard_conforming_strings);
    a
}
