//! What a session has declared: its epoch and, with several fences, its fence.
//!
//! The model follows Postgres' own rules for settings, because pgfence
//! forwards every declaration upstream and `SHOW pgfence.epoch` must agree:
//!
//! - the value from the startup packet is what `RESET` returns to;
//! - a session `SET` inside a transaction takes effect at once but is undone
//!   if the transaction rolls back, and kept if it commits;
//! - `SET LOCAL` lasts until the end of the transaction either way;
//! - `RESET ALL` / `DISCARD ALL` reset both settings;
//! - `ROLLBACK TO SAVEPOINT` restores both settings as they were when the
//!   savepoint was defined (session and `SET LOCAL` values alike), `RELEASE`
//!   keeps them.

use crate::fence::epoch::Epoch;
use crate::sql::classify::SavepointOp;

/// One setting with Postgres' transactional behaviour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting<T> {
    /// Value from the startup packet (what RESET returns to).
    startup: Option<T>,
    /// Committed session value.
    session: Option<T>,
    /// Session value set in the open transaction, not yet committed.
    tentative: Option<Option<T>>,
    /// `SET LOCAL` value of the open transaction.
    local: Option<Option<T>>,
}

/// How a `SET` applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// `SET` / `SET SESSION`.
    Session,
    /// `SET LOCAL`.
    Local,
}

impl<T> Default for Setting<T> {
    fn default() -> Self {
        Self {
            startup: None,
            session: None,
            tentative: None,
            local: None,
        }
    }
}

impl<T: Clone> Setting<T> {
    /// A setting whose connection-time value is `startup`.
    pub fn with_startup(startup: Option<T>) -> Self {
        Self {
            startup: startup.clone(),
            session: startup,
            tentative: None,
            local: None,
        }
    }

    /// The value in force now.
    pub fn current(&self) -> Option<&T> {
        match (&self.local, &self.tentative) {
            (Some(v), _) | (None, Some(v)) => v.as_ref(),
            (None, None) => self.session.as_ref(),
        }
    }

    /// `SET … = value` (or `RESET` with `value = None`, meaning the startup value).
    pub fn set(&mut self, scope: Scope, value: Option<T>) {
        let value = value.or_else(|| self.startup.clone());
        match scope {
            Scope::Session => {
                self.tentative = Some(value);
                // A session SET after SET LOCAL wins for the rest of the transaction too.
                self.local = None;
            }
            Scope::Local => self.local = Some(value),
        }
    }

    /// The transaction committed.
    pub fn commit(&mut self) {
        if let Some(v) = self.tentative.take() {
            self.session = v;
        }
        self.local = None;
    }

    /// The transaction rolled back.
    pub fn rollback(&mut self) {
        self.tentative = None;
        self.local = None;
    }
}

/// A session's declarations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Declarations {
    /// `pgfence.epoch`.
    pub epoch: Setting<Epoch>,
    /// `pgfence.fence`.
    pub fence: Setting<String>,
    /// The open transaction's savepoints, innermost last.
    savepoints: Vec<Savepoint>,
}

/// A savepoint and the declarations in force when it was defined.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Savepoint {
    name: String,
    epoch: Setting<Epoch>,
    fence: Setting<String>,
}

impl Declarations {
    /// Declarations from the startup packet.
    pub fn from_startup(epoch: Option<Epoch>, fence: Option<String>) -> Self {
        Self {
            epoch: Setting::with_startup(epoch),
            fence: Setting::with_startup(fence),
            savepoints: Vec::new(),
        }
    }

    /// A savepoint command completed. As in Postgres, a name may be reused: the
    /// innermost savepoint of that name is meant. An unknown name changes nothing
    /// (Postgres refused the command).
    pub fn savepoint(&mut self, op: &SavepointOp) {
        let find = |name: &str| self.savepoints.iter().rposition(|s| s.name == name);
        match op {
            SavepointOp::Define(name) => self.savepoints.push(Savepoint {
                name: name.clone(),
                epoch: self.epoch.clone(),
                fence: self.fence.clone(),
            }),
            SavepointOp::Release(name) => {
                if let Some(i) = find(name) {
                    self.savepoints.truncate(i);
                }
            }
            SavepointOp::RollbackTo(name) => {
                if let Some(i) = find(name) {
                    // The savepoint itself stays defined.
                    self.savepoints.truncate(i + 1);
                    let s = &self.savepoints[i];
                    self.epoch = s.epoch.clone();
                    self.fence = s.fence.clone();
                }
            }
        }
    }

    /// The transaction ended: committed or rolled back.
    pub fn end_transaction(&mut self, committed: bool) {
        self.savepoints.clear();
        if committed {
            self.epoch.commit();
            self.fence.commit();
        } else {
            self.epoch.rollback();
            self.fence.rollback();
        }
    }

    /// `RESET ALL` / `DISCARD ALL`.
    pub fn reset_all(&mut self) {
        self.epoch.set(Scope::Session, None);
        self.fence.set(Scope::Session, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(n: u64) -> Option<Epoch> {
        Some(Epoch::parse(&n.to_string()).unwrap())
    }

    fn sp(op: fn(String) -> SavepointOp, name: &str) -> SavepointOp {
        op(name.to_owned())
    }

    #[test]
    fn rollback_to_savepoint_restores_what_was_declared_there() {
        let mut d = Declarations::from_startup(e(1), None);
        d.savepoint(&sp(SavepointOp::Define, "a"));
        d.epoch.set(Scope::Session, e(2));
        d.savepoint(&sp(SavepointOp::Define, "b"));
        d.epoch.set(Scope::Local, e(3));
        d.fence.set(Scope::Session, Some("f".into()));
        assert_eq!(d.epoch.current(), e(3).as_ref());
        d.savepoint(&sp(SavepointOp::RollbackTo, "b"));
        assert_eq!((d.epoch.current(), d.fence.current()), (e(2).as_ref(), None));
        // "b" is still defined: a second rollback to it works too.
        d.epoch.set(Scope::Session, e(4));
        d.savepoint(&sp(SavepointOp::RollbackTo, "b"));
        assert_eq!(d.epoch.current(), e(2).as_ref());
        d.savepoint(&sp(SavepointOp::RollbackTo, "a"));
        assert_eq!(d.epoch.current(), e(1).as_ref());
        // Rolling back to "a" removed "b": an unknown name changes nothing.
        d.epoch.set(Scope::Session, e(5));
        d.savepoint(&sp(SavepointOp::RollbackTo, "b"));
        assert_eq!(d.epoch.current(), e(5).as_ref());
        d.end_transaction(true);
        assert_eq!(d.epoch.current(), e(5).as_ref());
    }

    #[test]
    fn release_keeps_the_values_and_forgets_later_savepoints() {
        let mut d = Declarations::from_startup(e(1), None);
        d.savepoint(&sp(SavepointOp::Define, "a"));
        d.savepoint(&sp(SavepointOp::Define, "b"));
        d.epoch.set(Scope::Session, e(2));
        d.savepoint(&sp(SavepointOp::Release, "a"));
        assert_eq!(d.epoch.current(), e(2).as_ref());
        d.savepoint(&sp(SavepointOp::RollbackTo, "b"));
        assert_eq!(d.epoch.current(), e(2).as_ref(), "b went with a");
        // A reused name means the innermost one.
        d.savepoint(&sp(SavepointOp::Define, "x"));
        d.epoch.set(Scope::Session, e(3));
        d.savepoint(&sp(SavepointOp::Define, "x"));
        d.epoch.set(Scope::Session, e(4));
        d.savepoint(&sp(SavepointOp::RollbackTo, "x"));
        assert_eq!(d.epoch.current(), e(3).as_ref());
        d.savepoint(&sp(SavepointOp::Release, "x"));
        d.savepoint(&sp(SavepointOp::RollbackTo, "x"));
        assert_eq!(d.epoch.current(), e(2).as_ref(), "the outer x");
        // The transaction's end forgets every savepoint.
        d.end_transaction(false);
        assert_eq!(d.epoch.current(), e(1).as_ref());
        d.epoch.set(Scope::Session, e(6));
        d.savepoint(&sp(SavepointOp::RollbackTo, "x"));
        assert_eq!(d.epoch.current(), e(6).as_ref());
    }

    #[test]
    fn session_set_is_undone_by_rollback_and_kept_by_commit() {
        let mut s = Setting::with_startup(e(1));
        s.set(Scope::Session, e(2));
        assert_eq!(s.current(), e(2).as_ref());
        s.rollback();
        assert_eq!(s.current(), e(1).as_ref());
        s.set(Scope::Session, e(3));
        s.commit();
        assert_eq!(s.current(), e(3).as_ref());
    }

    #[test]
    fn set_local_ends_with_the_transaction() {
        let mut s = Setting::with_startup(None);
        s.set(Scope::Session, e(5));
        s.commit();
        s.set(Scope::Local, e(9));
        assert_eq!(s.current(), e(9).as_ref());
        s.commit();
        assert_eq!(s.current(), e(5).as_ref());
    }

    #[test]
    fn reset_returns_to_the_startup_value() {
        let mut s = Setting::with_startup(e(4));
        s.set(Scope::Session, e(6));
        s.commit();
        s.set(Scope::Session, None);
        s.commit();
        assert_eq!(s.current(), e(4).as_ref());
        let mut d = Declarations::from_startup(None, Some("f".into()));
        d.epoch.set(Scope::Session, e(2));
        d.fence.set(Scope::Session, Some("g".into()));
        d.end_transaction(true);
        d.reset_all();
        d.end_transaction(true);
        assert_eq!(
            (d.epoch.current(), d.fence.current().map(String::as_str)),
            (None, Some("f"))
        );
    }
}
