//! Turning a parsed declaration into the settings change it makes, refusing
//! invalid values where they are declared (PF003).

use super::declare::Scope;
use super::state::Effect;
use crate::error::sqlstate;
use crate::fence::epoch::Epoch;
use crate::fence::policy::Rejection;
use crate::sql::declare::{self, Declaration, Setting};

/// The change a declaration makes, or the PF003 rejection replacing it. `defined`: the
/// number of the client's last statement definition sent before it (`DISCARD ALL` drops
/// those). `fence`: the session's fence, named in the rejection of an invalid epoch.
pub fn effect(d: &Declaration, defined: u64, fence: Option<&str>) -> Result<Effect, Rejection> {
    match d {
        Declaration::ResetAll => Ok(Effect::ResetAll),
        Declaration::DiscardAll => Ok(Effect::DiscardAll(defined)),
        Declaration::Malformed { setting, reason } => Err(invalid(*setting, reason, fence)),
        Declaration::FromCurrent { setting, scope } => Ok(match setting {
            Setting::Epoch => Effect::EpochFromCurrent(scope_of(*scope)),
            Setting::Fence => Effect::FenceFromCurrent(scope_of(*scope)),
        }),
        Declaration::Set { setting, scope, value } => {
            let scope = scope_of(*scope);
            match setting {
                Setting::Epoch => match value {
                    None => Ok(Effect::Epoch(scope, None)),
                    Some(v) => match Epoch::parse(v) {
                        Ok(e) => Ok(Effect::Epoch(scope, Some(e))),
                        Err(e) => Err(invalid(Setting::Epoch, &e.to_string(), fence)),
                    },
                },
                Setting::Fence => Ok(Effect::Fence(scope, value.clone())),
            }
        }
    }
}

fn scope_of(scope: declare::Scope) -> Scope {
    match scope {
        declare::Scope::Session => Scope::Session,
        declare::Scope::Local => Scope::Local,
    }
}

fn invalid(setting: Setting, reason: &str, fence: Option<&str>) -> Rejection {
    let name = match (setting, fence) {
        (Setting::Epoch, Some(fence)) => format!("pgfence.epoch of fence \"{fence}\""),
        (Setting::Epoch, None) => "pgfence.epoch".to_owned(),
        (Setting::Fence, _) => "pgfence.fence".to_owned(),
    };
    Rejection {
        code: sqlstate::INVALID_EPOCH,
        message: format!("pgfence: invalid value for {name}: {reason}"),
        hint: match setting {
            Setting::Epoch => {
                "pgfence.epoch must be an integer between 1 and 9223372036854775807; the previous value stays in force."
            }
            Setting::Fence => {
                "pgfence.fence takes the name of a fence in pgfence's config; the previous value stays in force."
            }
        }
        .into(),
        // Raised by a DO block, which needs no schema (a SET needs none); the caller adds
        // the session's fence, whose current epoch it appends where the schema can give it.
        fences: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::Lexing;

    fn run(sql: &str) -> Result<Effect, Rejection> {
        effect(&declare::parse(sql, Lexing::default()).expect("a declaration"), 3, None)
    }

    #[test]
    fn from_current_keeps_the_scope() {
        assert_eq!(
            run("SET pgfence.epoch FROM CURRENT"),
            Ok(Effect::EpochFromCurrent(Scope::Session))
        );
        assert_eq!(
            run("set local pgfence.fence from current"),
            Ok(Effect::FenceFromCurrent(Scope::Local))
        );
        // Postgres' syntax error, not a declaration.
        assert_eq!(
            declare::parse("SET pgfence.epoch FROM CURRENT, 5", Lexing::default()),
            None
        );
    }

    #[test]
    fn reset_all_and_discard_all() {
        assert_eq!(run("RESET ALL"), Ok(Effect::ResetAll));
        // DISCARD ALL also drops the statement definitions sent before it.
        assert_eq!(run("DISCARD ALL"), Ok(Effect::DiscardAll(3)));
    }

    #[test]
    fn values_are_read_as_postgres_reads_bigint() {
        for (sql, n) in [
            ("SET pgfence.epoch = 5", 5),
            ("SET pgfence.epoch TO '+5'", 5),
            ("set pgfence.epoch = 05", 5),
        ] {
            assert_eq!(
                run(sql),
                Ok(Effect::Epoch(
                    Scope::Session,
                    Some(Epoch::parse(&n.to_string()).unwrap())
                ))
            );
        }
        assert!(matches!(
            run("SET LOCAL pgfence.epoch = 7"),
            Ok(Effect::Epoch(Scope::Local, Some(_)))
        ));
        assert_eq!(run("RESET pgfence.epoch"), Ok(Effect::Epoch(Scope::Session, None)));
        assert_eq!(
            run("SET pgfence.epoch = DEFAULT"),
            Ok(Effect::Epoch(Scope::Session, None))
        );
    }

    #[test]
    fn invalid_values_are_pf003() {
        for sql in [
            "SET pgfence.epoch = ''",
            "SET pgfence.epoch = 0",
            "SET pgfence.epoch = -1",
            "SET pgfence.epoch = 'abc'",
            "SET pgfence.epoch = 9223372036854775808",
        ] {
            let r = run(sql).unwrap_err();
            assert_eq!(r.code, "PF003", "{sql}");
        }
    }

    #[test]
    fn an_invalid_epoch_names_the_sessions_fence() {
        let parsed = declare::parse("SET pgfence.epoch = 0", Lexing::default()).expect("a declaration");
        let r = effect(&parsed, 0, Some("sweeper")).unwrap_err();
        assert!(
            r.message
                .starts_with("pgfence: invalid value for pgfence.epoch of fence \"sweeper\": "),
            "{}",
            r.message
        );
        let r = effect(&parsed, 0, None).unwrap_err();
        assert!(
            r.message.starts_with("pgfence: invalid value for pgfence.epoch: "),
            "{}",
            r.message
        );
        assert!(r.hint.starts_with("pgfence.epoch must be"), "{}", r.hint);
        // An invalid pgfence.fence gets the hint about fences.
        let r = run("SET pgfence.fence = 'a', 'b'").unwrap_err();
        assert!(
            r.message.starts_with("pgfence: invalid value for pgfence.fence: "),
            "{}",
            r.message
        );
        assert!(r.hint.starts_with("pgfence.fence takes"), "{}", r.hint);
    }
}
