//! What a session needs to know about the fences of its database.

use std::sync::{Arc, Mutex};

use crate::config::{Fence, Mode};
use crate::fence::epoch::Epoch;
use crate::sql::FenceId;
use crate::sql::classify::{Analysis, Analyzer, CACHE_MAX_TEXT, Detached, FenceSet};
use crate::sql::lex::Lexing;
use crate::sql::rewrite::{RewriteCache, RewriteTarget, Unsupported, rewrite_lexing, rewrite_source};

use super::positions::{Count, Redo};

/// The fences as seen from one database, shared by its sessions.
pub struct DbFences {
    /// All configured fences, indexed by [`FenceId`].
    pub config: Arc<[Fence]>,
    /// Their names, indexed by [`FenceId`].
    pub names: Arc<[String]>,
    /// The fences that apply to this database.
    pub applicable: Vec<FenceId>,
    /// Each fence's lease table as text for the guard, if it has a lease.
    pub lease_tables: Vec<Option<String>>,
    /// Whether a fenced table of this database has a non-ASCII character in its name.
    pub non_ascii_tables: bool,
    /// Analyzers for `standard_conforming_strings` on (`[0]`, the default) and off (`[1]`):
    /// the setting changes where strings end, so the two must not share a cache.
    analyzers: [Mutex<Analyzer>; 2],
    /// Per fence, indexed by [`FenceId`]: its rewrite cache in rewrite mode.
    rewriters: Vec<Option<Mutex<RewriteCache>>>,
}

impl std::fmt::Debug for DbFences {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DbFences")
            .field("names", &self.names)
            .field("applicable", &self.applicable)
            .finish_non_exhaustive()
    }
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
        let non_ascii_tables = tables
            .iter()
            .any(|(t, _)| !t.name.is_ascii() || t.schema.as_deref().is_some_and(|s| !s.is_ascii()));
        Self {
            rewriters,
            non_ascii_tables,
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
        if sql.len() > CACHE_MAX_TEXT {
            return Arc::new(self.detached(standard_conforming_strings).analyze(sql));
        }
        let slot = &self.analyzers[usize::from(!standard_conforming_strings)];
        let mut analyzer = slot.lock().unwrap_or_else(|p| p.into_inner());
        analyzer.analyze(sql)
    }

    /// What analyses texts as [`Self::analyze`] does without holding the database's
    /// analyzer (shared by its sessions) meanwhile: for texts too long to be cached, whose
    /// analysis takes long.
    pub fn detached(&self, standard_conforming_strings: bool) -> Detached {
        let slot = &self.analyzers[usize::from(!standard_conforming_strings)];
        slot.lock().unwrap_or_else(|p| p.into_inner()).detached()
    }

    /// [`Self::analyze`] for the text of a Parse, which drivers send again and again
    /// (often as the unnamed statement, once per execution), where inline-valued Query
    /// texts are mostly seen once: short ones are cached even when only the lexer ran
    /// (see [`crate::sql::classify::Analyzer::analyze_repeated`]).
    pub fn analyze_parse(&self, sql: &str, standard_conforming_strings: bool) -> Arc<Analysis> {
        if sql.len() > CACHE_MAX_TEXT {
            return Arc::new(self.detached(standard_conforming_strings).analyze(sql));
        }
        let slot = &self.analyzers[usize::from(!standard_conforming_strings)];
        let mut analyzer = slot.lock().unwrap_or_else(|p| p.into_inner());
        analyzer.analyze_repeated(sql)
    }

    /// Whether `sql` may name a fenced table of this database anywhere (see
    /// `FenceSet::named_anywhere`). For texts pgfence cannot lex as Postgres will, where
    /// only such a mention can hide a write.
    pub fn may_name_any(&self, sql: &str) -> bool {
        let analyzer = self.analyzers[0].lock().unwrap_or_else(|p| p.into_inner());
        analyzer.fences().named_anywhere(sql)
    }

    /// Whether `fence` is in rewrite mode.
    pub fn is_rewrite(&self, fence: FenceId) -> bool {
        matches!(self.rewriters.get(usize::from(fence.0)), Some(Some(_)))
    }

    /// `stmt_sql` rewritten for `fence` at `epoch`, as a session with this
    /// `standard_conforming_strings` reads it; `None` if the fence is not in
    /// rewrite mode. Cached for the default setting (the other is rare).
    pub fn rewrite(
        &self,
        fence: FenceId,
        stmt_sql: &str,
        epoch: Epoch,
        standard_conforming_strings: bool,
    ) -> Option<Result<Arc<str>, Unsupported>> {
        let cache = self.rewriters.get(usize::from(fence.0))?.as_ref()?;
        let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
        if !standard_conforming_strings {
            let lexing = Lexing {
                standard_conforming_strings,
            };
            return Some(rewrite_lexing(stmt_sql, cache.target(), epoch, lexing).map(Arc::from));
        }
        Some(cache.rewrite(stmt_sql, epoch))
    }

    /// For offset `sent` (counted as `count` says) in the rewrite of `original` that `redo`
    /// made, the offset in `original` it comes from, and whether it is in text the rewrite
    /// added (see `rewrite_source`). Rewrites again: for an error's position, not for every
    /// statement.
    pub fn rewrite_source(&self, original: &str, redo: Redo, sent: usize, count: Count) -> Option<(usize, bool)> {
        let cache = self.rewriters.get(usize::from(redo.fence.0))?.as_ref()?;
        let target = cache.lock().unwrap_or_else(|p| p.into_inner()).target().clone();
        let lexing = Lexing {
            standard_conforming_strings: redo.standard_conforming_strings,
        };
        let source = rewrite_source(original, &target, redo.epoch, lexing, |text| count.byte(text, sent))?;
        Some((count.at(original, source.byte), source.added))
    }
}

fn analyzer(tables: &[(crate::sql::TableName, FenceId)], standard_conforming_strings: bool) -> Analyzer {
    let mut a = Analyzer::new(FenceSet::new(tables.to_vec()));
    a.set_standard_conforming_strings(standard_conforming_strings);
    a
}
