//! The fencing decision for one write, made by the proxy before anything is
//! sent upstream. Pure: no I/O, so it is tested exhaustively.
//!
//! The proxy decides what it can know by itself (is the statement analysable,
//! did the session declare an epoch for this fence); whether the epoch is
//! stale is decided by the guard inside the write's own transaction.

use crate::error::sqlstate;
use crate::fence::epoch::Epoch;
use crate::sql::FenceId;

/// What a statement does to fenced tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access<'a> {
    /// It may change tables of these fences.
    Write(&'a [FenceId]),
    /// It mentions tables of these fences but could not be analysed.
    Unanalysable(&'a [FenceId]),
}

/// What the session has declared, resolved against the configured fences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Declared<'a> {
    /// `pgfence.epoch`, if declared.
    pub epoch: Option<Epoch>,
    /// `pgfence.fence` as written, if declared.
    pub fence_name: Option<&'a str>,
}

/// The outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Run the guard for this fence and epoch in the write's transaction.
    Guard {
        /// The fence.
        fence: FenceId,
        /// The session's epoch.
        epoch: Epoch,
    },
    /// Refuse the write: Postgres raises this error in its place.
    Reject(Rejection),
}

/// An error the proxy has Postgres raise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// SQLSTATE.
    pub code: &'static str,
    /// Message.
    pub message: String,
    /// Hint.
    pub hint: String,
    /// The fences whose current epoch Postgres appends to the message when it raises
    /// the refusal (it reads them where the proxy cannot); empty for none.
    pub fences: Vec<FenceId>,
}

/// Decides one write. `names` are the names of all configured fences, indexed
/// by [`FenceId`]; `applicable` are the fences that apply to the session's
/// database. Errors follow the contract's order: PF004 before PF002 (PF005,
/// PF003 and PF001 are raised by the guard).
pub fn decide(access: Access<'_>, declared: Declared<'_>, names: &[String], applicable: &[FenceId]) -> Decision {
    let name = |id: FenceId| names.get(usize::from(id.0)).map_or("?", String::as_str);
    let fences = match access {
        Access::Unanalysable(fences) => {
            let list = fences
                .iter()
                .map(|&f| format!("\"{}\"", name(f)))
                .collect::<Vec<_>>()
                .join(", ");
            let at = declared.epoch.map(|e| format!(" at epoch {e}")).unwrap_or_default();
            return Decision::Reject(Rejection {
                code: sqlstate::UNANALYSABLE,
                message: format!(
                    "pgfence: statement cannot be analysed and may write a table of fence {list}; refused{at}"
                ),
                hint: "pgfence cannot see inside CALL, DO or statements it cannot parse, nor follow a chain of \
                       prepared statements and portals far or one that changes the session, nor check what a \
                       subscription writes later; write fenced tables with plain INSERT/UPDATE/DELETE/MERGE."
                    .into(),
                fences: fences.to_vec(),
            });
        }
        Access::Write(fences) => fences,
    };
    let session_fence = match declared.fence_name {
        Some(n) => names
            .iter()
            .position(|x| x == n)
            .map(|i| FenceId(i as u16))
            .filter(|f| applicable.contains(f)),
        None if applicable.len() == 1 => Some(applicable[0]),
        None => None,
    };
    let no_epoch = |fence: FenceId, message: String, hint: &str| {
        Decision::Reject(Rejection {
            code: sqlstate::NO_EPOCH,
            message,
            hint: hint.to_owned(),
            fences: vec![fence],
        })
    };
    // Check every fence the statement may write before granting the guard: one
    // statement can touch tables of several fences, and the session holds one epoch.
    let Some(&first) = fences.first() else {
        return Decision::Reject(Rejection {
            code: sqlstate::UNANALYSABLE,
            message: "pgfence: statement cannot be analysed".into(),
            hint: String::new(),
            fences: Vec::new(),
        });
    };
    // Without a fence for the session, that is what to fix first, epoch or not.
    let Some(session_fence) = session_fence else {
        let detail = match declared.fence_name {
            Some(n) => format!("the session's pgfence.fence \"{n}\" is not a configured fence here"),
            None => "several fences are configured and pgfence.fence is not set".to_owned(),
        };
        return no_epoch(
            first,
            format!(
                "pgfence: write to fence \"{}\" without an epoch for it: {detail}",
                name(first)
            ),
            "Name the fence together with its epoch: SET pgfence.fence = '<fence>'; SET pgfence.epoch = <epoch> \
             (or both in the connection options).",
        );
    };
    let Some(epoch) = declared.epoch else {
        return no_epoch(
            first,
            format!("pgfence: write to fence \"{}\" without an epoch", name(first)),
            "Declare the epoch this writer holds: SET pgfence.epoch = <epoch>, or pgfence.epoch in the connection options.",
        );
    };
    if let Some(&other) = fences.iter().find(|&&f| f != session_fence) {
        return no_epoch(
            other,
            format!(
                "pgfence: write to fence \"{}\" without an epoch for it: the session's epoch {epoch} is for fence \"{}\"",
                name(other),
                name(session_fence)
            ),
            "A session holds one epoch for one fence; write each fence's tables from its own session.",
        );
    }
    Decision::Guard {
        fence: session_fence,
        epoch,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["a".into(), "b".into()]
    }

    fn epoch(n: u64) -> Option<Epoch> {
        Some(Epoch::parse(&n.to_string()).unwrap())
    }

    const A: FenceId = FenceId(0);
    const B: FenceId = FenceId(1);

    fn code(d: &Decision) -> &'static str {
        match d {
            Decision::Guard { .. } => "guard",
            Decision::Reject(r) => r.code,
        }
    }

    #[test]
    fn decision_table() {
        let one = [A];
        let both = [A, B];
        type Case<'a> = (Access<'a>, Option<u64>, Option<&'a str>, &'a [FenceId], &'a str);
        let cases: &[Case<'_>] = &[
            (Access::Write(&[A]), Some(3), None, &one, "guard"),
            (Access::Write(&[A]), None, None, &one, "PF002"),
            (Access::Unanalysable(&[A]), Some(3), None, &one, "PF004"),
            (Access::Unanalysable(&[A]), None, None, &one, "PF004"),
            (Access::Write(&[A]), Some(3), None, &both, "PF002"),
            (Access::Write(&[A]), Some(3), Some("a"), &both, "guard"),
            (Access::Write(&[B]), Some(3), Some("a"), &both, "PF002"),
            (Access::Write(&[A, B]), Some(3), Some("a"), &both, "PF002"),
            (Access::Write(&[A]), Some(3), Some("zzz"), &both, "PF002"),
            (Access::Write(&[A]), None, Some("a"), &both, "PF002"),
        ];
        for (i, (access, e, fence, applicable, expect)) in cases.iter().enumerate() {
            let declared = Declared {
                epoch: e.and_then(epoch),
                fence_name: *fence,
            };
            let d = decide(*access, declared, &names(), applicable);
            assert_eq!(code(&d), *expect, "case {i}: {d:?}");
        }
    }

    #[test]
    fn guard_carries_the_declared_epoch() {
        let d = decide(
            Access::Write(&[A]),
            Declared {
                epoch: epoch(7),
                fence_name: None,
            },
            &names(),
            &[A],
        );
        assert_eq!(
            d,
            Decision::Guard {
                fence: A,
                epoch: epoch(7).unwrap()
            }
        );
    }

    #[test]
    fn several_fences_message_says_to_set_pgfence_fence() {
        let d = decide(
            Access::Write(&[A]),
            Declared {
                epoch: epoch(1),
                fence_name: None,
            },
            &names(),
            &[A, B],
        );
        let Decision::Reject(r) = d else { panic!() };
        assert!(r.message.contains("pgfence.fence"), "{}", r.message);
    }
}
