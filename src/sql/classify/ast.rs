//! Reading a sqlparser AST for the fenced tables a statement may change.
//!
//! Only the target of each data-modifying statement counts: tables in
//! `UPDATE … FROM`, `DELETE … USING`, `MERGE … USING` and `INSERT … SELECT`
//! are read. Data-modifying statements can only hide in WITH clauses (Postgres
//! rejects them anywhere else), so the walk follows CTEs and set operations
//! and does not descend into expressions.

use sqlparser::ast::{
    AlterTableOperation, CascadeOption, FromTable, Ident, ObjectName, ObjectType, Query, SetExpr, Statement,
    TableFactor, TableObject,
};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

use super::{FenceSet, Hits};
use crate::sql::lex::truncate_ident;
use crate::sql::name::TableName;

/// Parses one statement; `None` on any failure, more than one statement, or
/// a panic inside sqlparser (caught so that bad input never ends a session).
pub(super) fn parse(text: &str) -> Option<Statement> {
    let parsed = std::panic::catch_unwind(|| {
        Parser::new(&PostgreSqlDialect {})
            .try_with_sql(text)
            .and_then(|mut p| p.parse_statements())
    });
    match parsed {
        Ok(Ok(mut stmts)) if stmts.len() == 1 => stmts.pop(),
        _ => None,
    }
}

/// The fenced tables `stmt` may change; `unknown` set if it is a kind of
/// statement this module does not know to be harmless.
pub(super) fn classify(stmt: &Statement, fences: &FenceSet) -> Hits {
    let mut hits = Hits::default();
    statement(stmt, fences, &mut hits);
    hits
}

fn statement(stmt: &Statement, fences: &FenceSet, hits: &mut Hits) {
    let name = |n: &ObjectName, hits: &mut Hits| match table_name(n) {
        Some(t) => hits.name(&t, fences),
        None => hits.unknown = true,
    };
    match stmt {
        Statement::Query(q) => query(q, fences, hits),
        Statement::Insert(i) => {
            match &i.table {
                TableObject::TableName(n) => name(n, hits),
                _ => hits.unknown = true,
            }
            if let Some(q) = &i.source {
                query(q, fences, hits);
            }
        }
        Statement::Update(u) => relation(&u.table.relation, fences, hits),
        Statement::Delete(d) => {
            d.tables.iter().for_each(|n| name(n, hits));
            let (FromTable::WithFromKeyword(from) | FromTable::WithoutKeyword(from)) = &d.from;
            // Postgres deletes from the first relation only; the rest would be USING.
            from.iter().for_each(|t| relation(&t.relation, fences, hits));
        }
        Statement::Merge(m) => relation(&m.table, fences, hits),
        Statement::Truncate(t) => {
            t.table_names.iter().for_each(|t| name(&t.name, hits));
            // CASCADE also empties every table with a foreign key to these.
            hits.all |= matches!(t.cascade, Some(CascadeOption::Cascade));
        }
        Statement::AlterTable(a) => {
            name(&a.name, hits);
            // Also the other table of an inheritance or partition link: the rows of a
            // child show in its parent's scans.
            for op in &a.operations {
                match op {
                    AlterTableOperation::Inherit { parent } | AlterTableOperation::NoInherit { parent } => {
                        name(parent, hits)
                    }
                    AlterTableOperation::AttachPartitionOf { partition, .. }
                    | AlterTableOperation::DetachPartitionOf { partition, .. } => name(partition, hits),
                    _ => {}
                }
            }
        }
        Statement::Drop {
            object_type: ObjectType::Table,
            names,
            ..
        } => names.iter().for_each(|n| name(n, hits)),
        Statement::Drop {
            object_type: ObjectType::Schema,
            names,
            ..
        } => {
            names.iter().for_each(|n| schema(n, fences, hits));
        }
        Statement::AlterSchema(a) => schema(&a.name, fences, hits),
        Statement::CreateTable(c) => {
            if let Some(q) = &c.query {
                query(q, fences, hits);
            }
            // A child's rows show in its parent's scans: creating one (`INHERITS`,
            // `PARTITION OF`) changes what the parent holds from then on.
            c.inherits.iter().flatten().for_each(|n| name(n, hits));
            if let Some(n) = &c.partition_of {
                name(n, hits);
            }
        }
        // Postgres renames a table (or its columns) by these too.
        Statement::AlterIndex { name: n, .. } => name(n, hits),
        Statement::AlterView(v) => name(&v.name, hits),
        Statement::CreateTrigger(t) => name(&t.table_name, hits),
        Statement::DropTrigger(t) => {
            if let Some(n) = &t.table_name {
                name(n, hits);
            }
        }
        // Objects that are not the rows or the definition of a table.
        Statement::Drop { .. }
        | Statement::CreateIndex(_)
        | Statement::CreateView(_)
        | Statement::CreateSchema { .. }
        | Statement::CreateFunction(_)
        | Statement::CreateSequence { .. }
        | Statement::CreateType { .. }
        | Statement::CreateExtension(_)
        | Statement::CreateRole(_)
        | Statement::CreateDatabase { .. }
        | Statement::CreateDomain(_)
        | Statement::CreatePolicy(_)
        | Statement::AlterRole { .. }
        | Statement::AlterType(_)
        | Statement::AlterFunction(_)
        | Statement::AlterPolicy(_)
        | Statement::DropFunction(_)
        | Statement::DropProcedure { .. }
        | Statement::DropPolicy(_)
        | Statement::DropExtension(_)
        | Statement::DropDomain(_)
        | Statement::Comment { .. }
        | Statement::Grant(_)
        | Statement::Revoke(_)
        | Statement::StartTransaction { .. }
        | Statement::Commit { .. }
        | Statement::Rollback { .. }
        | Statement::Savepoint { .. }
        | Statement::ReleaseSavepoint { .. }
        | Statement::Declare { .. }
        | Statement::Fetch { .. }
        | Statement::Close { .. }
        | Statement::Lock(_)
        | Statement::Vacuum(_)
        | Statement::Analyze(_)
        | Statement::ShowVariable { .. } => {}
        _ => hits.unknown = true,
    }
}

/// A query's own writes: data-modifying CTEs and DML bodies (`WITH … INSERT`).
fn query(q: &Query, fences: &FenceSet, hits: &mut Hits) {
    if let Some(with) = &q.with {
        with.cte_tables.iter().for_each(|cte| query(&cte.query, fences, hits));
    }
    set_expr(&q.body, fences, hits);
}

fn set_expr(body: &SetExpr, fences: &FenceSet, hits: &mut Hits) {
    match body {
        SetExpr::Query(q) => query(q, fences, hits),
        SetExpr::SetOperation { left, right, .. } => {
            set_expr(left, fences, hits);
            set_expr(right, fences, hits);
        }
        SetExpr::Insert(s) | SetExpr::Update(s) | SetExpr::Delete(s) | SetExpr::Merge(s) => statement(s, fences, hits),
        // SELECT … INTO creates a new table; SELECT/VALUES/TABLE only read.
        SetExpr::Select(_) | SetExpr::Values(_) | SetExpr::Table(_) => {}
    }
}

/// The target relation of UPDATE / DELETE / MERGE.
fn relation(t: &TableFactor, fences: &FenceSet, hits: &mut Hits) {
    match t {
        TableFactor::Table { name, .. } => match table_name(name) {
            Some(n) => hits.name(&n, fences),
            None => hits.unknown = true,
        },
        _ => hits.unknown = true,
    }
}

/// Fenced tables in the schema `n` names (`DROP SCHEMA`, `ALTER SCHEMA … RENAME`).
fn schema(n: &ObjectName, fences: &FenceSet, hits: &mut Hits) {
    match n.0.last().and_then(|p| p.as_ident()) {
        Some(id) => hits.schema(&ident(id), fences),
        None => hits.unknown = true,
    }
}

/// `[db.]schema.table` as Postgres resolves it; `None` for non-identifier parts.
fn table_name(n: &ObjectName) -> Option<TableName> {
    let mut parts = n.0.iter().rev().map(|p| p.as_ident().map(ident));
    let name = parts.next()??;
    let schema = match parts.next() {
        Some(s) => Some(s?),
        None => None,
    };
    Some(TableName { schema, name })
}

/// Unquoted identifiers fold to lower case (ASCII, as Postgres does for
/// UTF-8); quoted ones keep their case; both are truncated to 63 bytes.
fn ident(id: &Ident) -> String {
    let mut s = if id.quote_style.is_some() {
        id.value.clone()
    } else {
        id.value.to_ascii_lowercase()
    };
    truncate_ident(&mut s);
    s
}
