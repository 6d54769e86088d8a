//! What a session needs to know about the fences of its database.

use std::sync::{Arc, Mutex};

use crate::config::{Fence, Mode};
use crate::fence::epoch::Epoch;
use crate::sql::FenceId;
use crate::sql::classify::{Analysis, Analyzer, FenceSet};
use crate::sql::rewrite::{RewriteCache, RewriteTarget, Unsupported};

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
    /// Per fence, indexed by [`FenceId`]: its rewrite cache in rewrite mode.
    rewriters: Vec<Option<Mutex<RewriteCache>>>,
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
        let rewriters = config
            .iter()
            .map(|f| match (f.mode, &f.epoch_column) {
                (Mode::Rewrite, Some(column)) => Some(Mutex::new(RewriteCache::new(RewriteTarget {
                    tables: f.tables.clone(),
                    column: column.clone(),
                }))),
                _ => None,
            })
            .collect();
        Self {
            rewriters,
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

    /// Whether `fence` is in rewrite mode.
    pub fn is_rewrite(&self, fence: FenceId) -> bool {
        matches!(self.rewriters.get(usize::from(fence.0)), Some(Some(_)))
    }

    /// `stmt_sql` rewritten for `fence` at `epoch` (cached); `None` if the
    /// fence is not in rewrite mode.
    pub fn rewrite(&self, fence: FenceId, stmt_sql: &str, epoch: Epoch) -> Option<Result<Arc<str>, Unsupported>> {
        let cache = self.rewriters.get(usize::from(fence.0))?.as_ref()?;
        let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
        Some(cache.rewrite(stmt_sql, epoch))
    }
}
