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

use std::sync::Arc;

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
    /// The open transaction's savepoints.
    savepoints: Savepoints,
}

/// A savepoint and the declarations in force when it was defined.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Savepoint {
    name: String,
    epoch: Setting<Epoch>,
    fence: Setting<String>,
}

/// Savepoints, innermost first, as a list whose tails are shared: declarations are
/// copied before every client message (the dispatcher's speculative view), and a copy
/// must cost the same whatever the depth a client nested savepoints to. Dropped and
/// compared without recursion, so no depth can exhaust the stack either.
#[derive(Clone, Default)]
struct Savepoints(Option<Arc<Node>>);

struct Node {
    savepoint: Savepoint,
    outer: Savepoints,
}

impl Savepoints {
    fn push(&mut self, savepoint: Savepoint) {
        let outer = std::mem::take(self);
        self.0 = Some(Arc::new(Node { savepoint, outer }));
    }

    fn nodes(&self) -> impl Iterator<Item = &Arc<Node>> {
        std::iter::successors(self.0.as_ref(), |n| n.outer.0.as_ref())
    }

    /// The innermost savepoint named `name`, with the ones outside it.
    fn find(&self, name: &str) -> Option<Savepoints> {
        self.nodes()
            .find(|n| n.savepoint.name == name)
            .map(|n| Savepoints(Some(Arc::clone(n))))
    }
}

impl Drop for Savepoints {
    fn drop(&mut self) {
        // Unlinks node by node while this list is the only owner; a tail another copy
        // still holds is left to it.
        let mut next = self.0.take();
        while let Some(node) = next {
            next = match Arc::try_unwrap(node) {
                Ok(mut node) => node.outer.0.take(),
                Err(_) => None,
            };
        }
    }
}

impl PartialEq for Savepoints {
    fn eq(&self, other: &Self) -> bool {
        let (mut a, mut b) = (self.0.as_ref(), other.0.as_ref());
        loop {
            match (a, b) {
                (None, None) => return true,
                (Some(x), Some(y)) if Arc::ptr_eq(x, y) => return true,
                (Some(x), Some(y)) if x.savepoint == y.savepoint => {
                    (a, b) = (x.outer.0.as_ref(), y.outer.0.as_ref());
                }
                _ => return false,
            }
        }
    }
}

impl Eq for Savepoints {}

impl std::fmt::Debug for Savepoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.nodes().map(|n| &n.savepoint)).finish()
    }
}

impl Declarations {
    /// Declarations from the startup packet.
    pub fn from_startup(epoch: Option<Epoch>, fence: Option<String>) -> Self {
        Self {
            epoch: Setting::with_startup(epoch),
            fence: Setting::with_startup(fence),
            savepoints: Savepoints::default(),
        }
    }

    /// A savepoint command completed. As in Postgres, a name may be reused: the
    /// innermost savepoint of that name is meant. An unknown name changes nothing
    /// (Postgres refused the command).
    pub fn savepoint(&mut self, op: &SavepointOp) {
        match op {
            SavepointOp::Define(name) => self.savepoints.push(Savepoint {
                name: name.clone(),
                epoch: self.epoch.clone(),
                fence: self.fence.clone(),
            }),
            SavepointOp::Release(name) => {
                if let Some(found) = self.savepoints.find(name) {
                    let outer = found.0.as_ref().map(|n| n.outer.clone()).unwrap_or_default();
                    self.savepoints = outer;
                }
            }
            SavepointOp::RollbackTo(name) => {
                if let Some(found) = self.savepoints.find(name) {
                    // The savepoint itself stays defined.
                    if let Some(n) = &found.0 {
                        self.epoch = n.savepoint.epoch.clone();
                        self.fence = n.savepoint.fence.clone();
                    }
                    self.savepoints = found;
                }
            }
        }
    }

    /// Whether a savepoint of this name is defined.
    pub fn has_savepoint(&self, name: &str) -> bool {
        self.savepoints.find(name).is_some()
    }

    /// The transaction ended: committed or rolled back.
    pub fn end_transaction(&mut self, committed: bool) {
        self.savepoints = Savepoints::default();
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

    /// The dispatcher copies declarations before every message; a client may nest
    /// savepoints as deep as it likes. Copies share the savepoints, and neither dropping
    /// nor comparing a deep stack recurses (a test thread has a 2 MiB stack).
    #[test]
    fn a_million_savepoints_copy_compare_and_drop_without_recursion() {
        let nested = || {
            let mut d = Declarations::from_startup(e(1), None);
            for i in 0..1_000_000u64 {
                d.savepoint(&sp(SavepointOp::Define, &format!("s{i}")));
                if i == 0 {
                    d.epoch.set(Scope::Session, e(2));
                }
            }
            d
        };
        let mut d = nested();
        let copy = d.clone();
        assert!(Arc::ptr_eq(
            copy.savepoints.0.as_ref().unwrap(),
            d.savepoints.0.as_ref().unwrap()
        ));
        assert_eq!(copy, d);
        drop(copy);
        let other = nested();
        assert_eq!(other, d, "equal without sharing: compared node by node");
        drop(other);
        d.epoch.set(Scope::Session, e(3));
        let mut copy = d.clone();
        // Releasing one in the middle forgets it and every one inside it.
        d.savepoint(&sp(SavepointOp::Release, "s500000"));
        d.savepoint(&sp(SavepointOp::RollbackTo, "s999999"));
        assert_eq!(d.epoch.current(), e(3).as_ref(), "s999999 went with s500000");
        d.savepoint(&sp(SavepointOp::RollbackTo, "s499999"));
        assert_eq!(d.epoch.current(), e(2).as_ref());
        d.savepoint(&sp(SavepointOp::RollbackTo, "s0"));
        assert_eq!(d.epoch.current(), e(1).as_ref());
        // The copy taken before still has them all.
        copy.savepoint(&sp(SavepointOp::RollbackTo, "s999999"));
        assert_eq!(copy.epoch.current(), e(2).as_ref());
        assert_ne!(copy, d);
        drop(copy);
        d.end_transaction(false);
        assert_eq!(d.savepoints, Savepoints::default());
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
