//! The fenced tables the classifier looks for, and what it found.

use memchr::memmem::Finder;

use super::StmtKind;
use crate::sql::name::TableName;

/// Identifies a configured fence (an index chosen by the caller).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FenceId(pub u16);

/// The fenced tables the classifier looks for, with their fences.
#[derive(Debug, Clone)]
pub struct FenceSet {
    pub(super) tables: Vec<(TableName, FenceId)>,
    /// One pre-filter needle per table, parallel to `tables`.
    pub(super) needles: Vec<Finder<'static>>,
}

impl FenceSet {
    /// Builds the set from configured (schema-qualified) table names.
    pub fn new(tables: Vec<(TableName, FenceId)>) -> Self {
        let needles = tables
            .iter()
            .map(|(t, _)| Finder::new(needle(&t.name).as_bytes()).into_owned())
            .collect();
        Self { tables, needles }
    }

    /// Whether no table is fenced (then nothing is ever a fenced write).
    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }

    /// The configured tables and their fences.
    pub fn tables(&self) -> &[(TableName, FenceId)] {
        &self.tables
    }

    /// The lower-cased byte strings the pre-filter searches for, one per
    /// table: a statement whose lower-cased text contains none of them does
    /// not name a fenced table (except through `U&"…"`).
    pub fn prefilter_needles(&self) -> impl Iterator<Item = &[u8]> {
        self.needles.iter().map(Finder::needle)
    }

    /// Whether `sql` may name a fenced table anywhere, strings and comments included: a
    /// fenced name (ignoring case) or a `U&` identifier.
    pub fn named_anywhere(&self, sql: &str) -> bool {
        if self.is_empty() {
            return false;
        }
        let lower = sql.to_ascii_lowercase();
        lower.contains("u&") || self.mentioned_in(lower.as_bytes())
    }

    /// Whether lower-cased text `lower` contains any fenced name.
    pub(super) fn mentioned_in(&self, lower: &[u8]) -> bool {
        self.needles.iter().any(|f| f.find(lower).is_some())
    }
}

/// The pre-filter needle of a table name: lower-cased (a superset check, as
/// unquoted names are folded); a name with `"` appears doubled in SQL, so only
/// the longest quote-free piece is searched (empty: every text matches).
fn needle(name: &str) -> String {
    let lower = name.to_ascii_lowercase();
    lower.split('"').max_by_key(|p| p.len()).unwrap_or("").to_owned()
}

/// Fenced tables found so far, as indices into [`FenceSet::tables`].
#[derive(Debug, Default)]
pub(super) struct Hits {
    pub(super) tables: Vec<usize>,
    /// Every fenced table may be affected (`TRUNCATE … CASCADE`, unreadable names).
    pub(super) all: bool,
    /// Part of the statement was not understood.
    pub(super) unknown: bool,
}

impl Hits {
    /// Adds the fenced tables a name written in SQL may refer to.
    pub(super) fn name(&mut self, name: &TableName, fences: &FenceSet) {
        let found = fences
            .tables
            .iter()
            .enumerate()
            .filter(|(_, (t, _))| name.may_refer_to(t));
        self.tables.extend(found.map(|e| e.0));
    }

    /// Adds the fenced tables in schema `schema` (DROP / ALTER SCHEMA).
    pub(super) fn schema(&mut self, schema: &str, fences: &FenceSet) {
        let found = fences
            .tables
            .iter()
            .enumerate()
            .filter(|(_, (t, _))| t.schema.as_deref() == Some(schema));
        self.tables.extend(found.map(|e| e.0));
    }

    fn finish(mut self, fences: &FenceSet) -> (Vec<FenceId>, Vec<TableName>) {
        if self.all {
            self.tables = (0..fences.tables.len()).collect();
        }
        self.tables.sort_unstable();
        self.tables.dedup();
        let tables: Vec<TableName> = self.tables.iter().map(|&i| fences.tables[i].0.clone()).collect();
        let mut ids: Vec<FenceId> = self.tables.iter().map(|&i| fences.tables[i].1).collect();
        ids.sort_unstable();
        ids.dedup();
        (ids, tables)
    }

    pub(super) fn into_write(self, fences: &FenceSet) -> StmtKind {
        let (fences, tables) = self.finish(fences);
        if tables.is_empty() {
            StmtKind::Other
        } else {
            StmtKind::Write { fences, tables }
        }
    }

    pub(super) fn into_unanalysable(self, fences: &FenceSet) -> StmtKind {
        let (fences, _) = self.finish(fences);
        if fences.is_empty() {
            StmtKind::Other
        } else {
            StmtKind::Unanalysable { fences }
        }
    }
}
