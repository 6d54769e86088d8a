//! Verifying a rewrite: the result is parsed with sqlparser and every
//! data-modifying statement on a fenced table must carry the row check.
//!
//! This is the safety net under the text edits: whatever the token search got
//! wrong, a result is used only if its syntax tree shows, for each such
//! statement, `SET col = N` (exactly once), a WHERE / WHEN condition that is
//! `(…) AND coalesce(q.col, 0) <= N` at its top (so an OR in the client's
//! predicate cannot bypass it), and `N` in the epoch column of every inserted row.
//! Only the parts pgfence printed are compared as text.

use sqlparser::ast::{
    Assignment, AssignmentTarget, BinaryOperator, Expr, FromTable, Ident, MergeAction, MergeClauseKind,
    MergeInsertKind, MergeUpdateKind, ObjectName, OnConflictAction, OnInsert, Query, SelectItem, SetExpr, Statement,
    TableFactor, TableObject, Value,
};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

use super::dml::shape;
use super::{RewriteTarget, Unsupported};
use crate::sql::lex::truncate_ident;
use crate::sql::name::TableName;

type Res<T> = Result<T, Unsupported>;

struct Check<'a> {
    target: &'a RewriteTarget,
    n: &'a str,
    col: &'a str,
    nodes: usize,
}

/// Parses `sql` and checks it; returns how many fenced writes carry the check.
pub(super) fn verify(sql: &str, target: &RewriteTarget, n: &str, col: &str) -> Res<usize> {
    let parsed = std::panic::catch_unwind(|| {
        Parser::new(&PostgreSqlDialect {})
            .try_with_sql(sql)
            .and_then(|mut p| p.parse_statements())
    });
    let mut stmts = match parsed {
        Ok(Ok(stmts)) if stmts.len() == 1 => stmts,
        _ => return Err(shape("the statement could not be parsed")),
    };
    let stmt = stmts.pop().ok_or_else(|| shape("no statement"))?;
    let mut c = Check {
        target,
        n,
        col,
        nodes: 0,
    };
    c.statement(&stmt)?;
    Ok(c.nodes)
}

fn norm(id: &Ident) -> String {
    let mut s = if id.quote_style.is_some() {
        id.value.clone()
    } else {
        id.value.to_ascii_lowercase()
    };
    truncate_ident(&mut s);
    s
}

fn table_name(n: &ObjectName) -> Res<TableName> {
    let mut parts = n.0.iter().rev().map(|p| p.as_ident().map(norm));
    let name = parts.next().flatten().ok_or_else(|| shape("an unreadable name"))?;
    let schema = match parts.next() {
        Some(s) => Some(s.ok_or_else(|| shape("an unreadable name"))?),
        None => None,
    };
    Ok(TableName { schema, name })
}

/// The name a statement's columns are qualified with: the alias, else the
/// last part of the table name.
fn qualifier(name: &ObjectName, alias: Option<&Ident>) -> Res<String> {
    match alias {
        Some(a) => Ok(a.to_string()),
        None => name
            .0
            .last()
            .and_then(|p| p.as_ident())
            .map(ToString::to_string)
            .ok_or_else(|| shape("an unreadable name")),
    }
}

impl Check<'_> {
    fn fenced(&self, name: &ObjectName) -> Res<bool> {
        let t = table_name(name)?;
        Ok(self.target.tables.iter().any(|f| t.may_refer_to(f)))
    }

    fn statement(&mut self, s: &Statement) -> Res<()> {
        match s {
            Statement::Query(q) => self.query(q),
            Statement::Update(u) => {
                let TableFactor::Table { name, alias, .. } = &u.table.relation else {
                    return Err(shape("an UPDATE target that is not a table"));
                };
                if self.fenced(name)? {
                    let q = qualifier(name, alias.as_ref().map(|a| &a.name))?;
                    self.assignments(&u.assignments)?;
                    self.condition(u.selection.as_ref(), &q)?;
                    self.nodes += 1;
                }
                Ok(())
            }
            Statement::Delete(d) => {
                let (FromTable::WithFromKeyword(from) | FromTable::WithoutKeyword(from)) = &d.from;
                let [first] = from.as_slice() else {
                    return Err(shape("a DELETE with several targets"));
                };
                let TableFactor::Table { name, alias, .. } = &first.relation else {
                    return Err(shape("a DELETE target that is not a table"));
                };
                if !d.tables.is_empty() {
                    return Err(shape("a multi-table DELETE"));
                }
                if self.fenced(name)? {
                    let q = qualifier(name, alias.as_ref().map(|a| &a.name))?;
                    self.condition(d.selection.as_ref(), &q)?;
                    self.nodes += 1;
                }
                Ok(())
            }
            Statement::Insert(i) => self.insert(i),
            Statement::Merge(m) => self.merge(m),
            _ => Err(shape("a statement that is not INSERT, UPDATE, DELETE or MERGE")),
        }
    }

    fn query(&mut self, q: &Query) -> Res<()> {
        if let Some(with) = &q.with {
            for cte in &with.cte_tables {
                self.query(&cte.query)?;
            }
        }
        self.set_expr(&q.body)
    }

    fn set_expr(&mut self, body: &SetExpr) -> Res<()> {
        match body {
            SetExpr::Query(q) => self.query(q),
            SetExpr::SetOperation { left, right, .. } => {
                self.set_expr(left)?;
                self.set_expr(right)
            }
            SetExpr::Insert(s) | SetExpr::Update(s) | SetExpr::Delete(s) | SetExpr::Merge(s) => self.statement(s),
            SetExpr::Select(_) | SetExpr::Values(_) | SetExpr::Table(_) => Ok(()),
        }
    }

    /// The epoch (`N::pgfence.epoch`), or `CASE WHEN false THEN <client's value> ELSE
    /// N::pgfence.epoch::BIGINT END`.
    fn is_epoch(&self, e: &Expr) -> bool {
        match e {
            Expr::Cast { .. } => e.to_string() == self.n,
            Expr::Case {
                operand: None,
                conditions,
                else_result: Some(else_result),
                ..
            } => {
                matches!(conditions.as_slice(), [w] if matches!(&w.condition, Expr::Value(v) if v.value == Value::Boolean(false)))
                    && else_result.to_string() == format!("{}::BIGINT", self.n)
            }
            _ => false,
        }
    }

    fn is_col(&self, name: &ObjectName) -> bool {
        matches!(name.0.first().and_then(|p| p.as_ident()), Some(id) if norm(id) == self.target.column)
    }

    fn assignments(&self, list: &[Assignment]) -> Res<()> {
        let mut found = 0;
        for a in list {
            match &a.target {
                AssignmentTarget::ColumnName(n) if self.is_col(n) => {
                    if n.0.len() != 1 || !self.is_epoch(&a.value) {
                        return Err(shape("an assignment to the epoch column that is not the epoch"));
                    }
                    found += 1;
                }
                AssignmentTarget::Tuple(names) if names.iter().any(|n| self.is_col(n)) => {
                    return Err(shape("the epoch column in a multiple-column assignment"));
                }
                _ => {}
            }
        }
        if found == 1 {
            Ok(())
        } else {
            Err(shape("SET without exactly one assignment of the epoch"))
        }
    }

    /// `coalesce(q.col, 0) <= N`, or `(…) AND` it.
    fn condition(&self, cond: Option<&Expr>, q: &str) -> Res<()> {
        let pred = format!("coalesce({q}.{}, 0) <= {}", self.col, self.n);
        let ok = match cond {
            Some(Expr::BinaryOp {
                left,
                op: BinaryOperator::And,
                right,
            }) => matches!(left.as_ref(), Expr::Nested(_)) && right.to_string() == pred,
            Some(e) => e.to_string() == pred,
            None => false,
        };
        if ok {
            Ok(())
        } else {
            Err(shape("a condition without the row check"))
        }
    }

    /// The position of the epoch column in an INSERT's column list.
    fn col_position(&self, cols: &[ObjectName]) -> Res<usize> {
        let mut hits = cols.iter().enumerate().filter(|(_, c)| self.is_col(c));
        match (hits.next(), hits.next()) {
            (Some((k, c)), None) if c.0.len() == 1 => Ok(k),
            _ => Err(shape("an INSERT without exactly one epoch column")),
        }
    }

    fn insert(&mut self, i: &sqlparser::ast::Insert) -> Res<()> {
        let TableObject::TableName(name) = &i.table else {
            return Err(shape("an INSERT target that is not a table"));
        };
        if !self.fenced(name)? {
            return Ok(());
        }
        let k = self.col_position(&i.columns)?;
        let source = i.source.as_ref().ok_or_else(|| shape("an INSERT without rows"))?;
        // Parentheses around the whole query (`(SELECT …)`) make a nested query; its rows
        // are the INSERT's.
        let mut body = source.body.as_ref();
        while let SetExpr::Query(inner) = body {
            body = inner.body.as_ref();
        }
        let rows_ok = match body {
            SetExpr::Values(v) => v.rows.iter().all(|r| r.get(k).is_some_and(|e| self.is_epoch(e))),
            SetExpr::Select(s) => {
                let item_is_epoch =
                    |item: Option<&SelectItem>| matches!(item, Some(SelectItem::UnnamedExpr(e)) if self.is_epoch(e));
                let wildcard = s
                    .projection
                    .iter()
                    .any(|p| matches!(p, SelectItem::Wildcard(_) | SelectItem::QualifiedWildcard(..)));
                // Postgres refuses a query whose width differs from the column
                // list, so a last output of N goes to a last-listed epoch column.
                (k + 1 == i.columns.len() && item_is_epoch(s.projection.last()))
                    || (!wildcard && item_is_epoch(s.projection.get(k)))
            }
            _ => false,
        };
        if !rows_ok {
            return Err(shape("an INSERT whose rows do not all carry the epoch"));
        }
        if let Some(on) = &i.on {
            let OnInsert::OnConflict(c) = on else {
                return Err(shape("an unknown INSERT conflict clause"));
            };
            if let OnConflictAction::DoUpdate(u) = &c.action {
                let q = qualifier(name, i.table_alias.as_ref().map(|a| &a.alias))?;
                self.assignments(&u.assignments)?;
                self.condition(u.selection.as_ref(), &q)?;
            }
        }
        self.nodes += 1;
        Ok(())
    }

    fn merge(&mut self, m: &sqlparser::ast::Merge) -> Res<()> {
        let TableFactor::Table { name, alias, .. } = &m.table else {
            return Err(shape("a MERGE target that is not a table"));
        };
        if !self.fenced(name)? {
            return Ok(());
        }
        let q = qualifier(name, alias.as_ref().map(|a| &a.name))?;
        for clause in &m.clauses {
            let target_row = matches!(
                clause.clause_kind,
                MergeClauseKind::Matched | MergeClauseKind::NotMatchedBySource
            );
            match (&clause.action, target_row) {
                (MergeAction::DoNothing { .. }, _) => {}
                (MergeAction::Delete { .. }, true) => self.condition(clause.predicate.as_ref(), &q)?,
                (MergeAction::Update(u), true) => {
                    let MergeUpdateKind::Set(list) = &u.kind else {
                        return Err(shape("an unknown MERGE UPDATE"));
                    };
                    if u.update_predicate.is_some() || u.delete_predicate.is_some() {
                        return Err(shape("an unknown MERGE UPDATE"));
                    }
                    self.assignments(list)?;
                    self.condition(clause.predicate.as_ref(), &q)?;
                }
                (MergeAction::Insert(ins), false) => {
                    let k = self.col_position(&ins.columns)?;
                    let MergeInsertKind::Values(v) = &ins.kind else {
                        return Err(shape("an unknown MERGE INSERT"));
                    };
                    if ins.insert_predicate.is_some()
                        || !v.rows.iter().all(|r| r.get(k).is_some_and(|e| self.is_epoch(e)))
                    {
                        return Err(shape("a MERGE INSERT without the epoch"));
                    }
                }
                _ => return Err(shape("an unknown MERGE action")),
            }
        }
        self.nodes += 1;
        Ok(())
    }
}
