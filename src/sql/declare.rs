//! Reading epoch and fence declarations: `SET pgfence.epoch = 5` and kin.
//!
//! Hand-written on top of [`super::lex`] rather than sqlparser, because
//! re-serialising a sqlparser AST turns `pgfence.epoch` into `pgfence epoch`
//! and loses how the value was quoted. This module only recognises the
//! statement and returns the raw value; whether the value is a valid epoch
//! (`+5` and `05` are 5, `''` is not) is the caller's decision.
//!
//! Grammar followed (Postgres' `VariableSetStmt` / `VariableResetStmt`):
//!
//! ```text
//! SET [SESSION | LOCAL] pgfence.{epoch|fence} {= | TO} {value | DEFAULT}
//! RESET pgfence.{epoch|fence}     RESET ALL     DISCARD ALL
//! ```

use super::keywords;
use super::lex::{
    Lexer, Lexing, Token, TokenKind, escaped_string_value, ident_value, plain_string_value, uescape_char,
    unicode_ident_value, unicode_string_value,
};

/// Which pgfence setting a declaration is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Setting {
    /// `pgfence.epoch`: the session's fencing token.
    Epoch,
    /// `pgfence.fence`: which fence the epoch is for.
    Fence,
}

/// How long a `SET` lasts, as in Postgres.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// `SET` / `SET SESSION` / `RESET`: until changed (undone if the
    /// transaction rolls back).
    Session,
    /// `SET LOCAL`: until the end of the current transaction.
    Local,
}

/// A statement that changes what the session declared.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Declaration {
    /// `SET … = value` (`value: Some`) or `SET … TO DEFAULT` / `RESET …`
    /// (`value: None`, meaning back to the value given at connection time).
    Set {
        /// The setting changed.
        setting: Setting,
        /// Session or transaction-local.
        scope: Scope,
        /// The raw value without quotes (`'5'` → `5`, `+5` → `+5`); `None`
        /// for DEFAULT / RESET. Not validated here.
        value: Option<String>,
    },
    /// `SET … FROM CURRENT`: the setting, in the given scope, to the value in force
    /// when it runs (as Postgres does; a no-op but for the scope it lands in).
    FromCurrent {
        /// The setting changed.
        setting: Setting,
        /// Session or transaction-local.
        scope: Scope,
    },
    /// `RESET ALL`: every setting back to its connection-time value.
    ResetAll,
    /// `DISCARD ALL`: like `RESET ALL`, and also deallocates every prepared
    /// statement and closes cursors.
    DiscardAll,
    /// A `SET` of a pgfence setting that Postgres reads but pgfence does not accept (`SET
    /// pgfence.epoch = 1, 2`, which Postgres refuses only when it runs; a value needing
    /// escape processing): the caller should refuse it rather than guess. A statement
    /// Postgres cannot parse at all is no declaration: Postgres refuses the whole text
    /// with a syntax error before anything in it runs.
    Malformed {
        /// The setting the statement names.
        setting: Setting,
        /// What was wrong, for the error message.
        reason: &'static str,
    },
}

/// Reads `stmt` (one statement, no trailing `;`) as a declaration. `None`
/// when it is not a SET/RESET of a pgfence setting, RESET ALL or DISCARD ALL
/// (e.g. `SET search_path = x`, `DISCARD PLANS`): such statements pass as is.
pub fn parse(stmt: &str, lexing: Lexing) -> Option<Declaration> {
    let toks: Vec<Token> = Lexer::new(stmt, lexing).take(64).collect();
    let word = |i: usize, kw: &str| toks.get(i).is_some_and(|t| t.is_word(stmt, kw));
    if word(0, "discard") {
        return (word(1, "all") && toks.len() == 2).then_some(Declaration::DiscardAll);
    }
    if word(0, "reset") {
        if word(1, "all") && toks.len() == 2 {
            return Some(Declaration::ResetAll);
        }
        let (setting, next) = match setting_name(stmt, &toks, 1) {
            Name::Ours(setting, next) => (setting, next),
            Name::Other => return None,
            Name::Unreadable => return Some(unreadable_name()),
        };
        if next != toks.len() {
            return None; // a syntax error
        }
        return Some(Declaration::Set {
            setting,
            scope: Scope::Session,
            value: None,
        });
    }
    if !word(0, "set") {
        return None;
    }
    let (scope, at) = if word(1, "local") {
        (Scope::Local, 2)
    } else if word(1, "session") {
        (Scope::Session, 2)
    } else {
        (Scope::Session, 1)
    };
    let (setting, next) = match setting_name(stmt, &toks, at) {
        Name::Ours(setting, next) => (setting, next),
        Name::Other => return None,
        Name::Unreadable => return Some(unreadable_name()),
    };
    let malformed = |reason| Some(Declaration::Malformed { setting, reason });
    if word(next, "from") && word(next + 1, "current") {
        return (next + 2 == toks.len()).then_some(Declaration::FromCurrent { setting, scope });
    }
    if !(toks.get(next).is_some_and(|t| t.is_punct(b'=')) || word(next, "to")) {
        return None; // a syntax error
    }
    let rest = &toks[(next + 1).min(toks.len())..];
    if let [t] = rest
        && t.is_word(stmt, "default")
    {
        return Some(Declaration::Set {
            setting,
            scope,
            value: None,
        });
    }
    // `SET … = $1` is a syntax error in Postgres (SET takes no parameters): it sets nothing,
    // and the client gets Postgres' own error rather than pgfence's PF003.
    if rest.iter().any(|t| t.kind == TokenKind::Param) {
        return None;
    }
    match value(stmt, rest, lexing) {
        Value::Read(value) => Some(Declaration::Set {
            setting,
            scope,
            value: Some(value),
        }),
        Value::Unsupported(reason) => malformed(reason),
        Value::SyntaxError => None,
    }
}

/// What the value part of a `SET` is to Postgres and to pgfence.
enum Value {
    /// One value, as Postgres reads it.
    Read(String),
    /// Postgres reads it (and sets it, or refuses it when the statement runs); pgfence
    /// does not.
    Unsupported(&'static str),
    /// Not a value to Postgres' grammar: the whole text fails to parse.
    SyntaxError,
}

/// A setting name as pgfence reads it.
enum Name {
    /// `pgfence.epoch` or `pgfence.fence`; the index after the name.
    Ours(Setting, usize),
    /// Another setting's.
    Other,
    /// A `U&"…"` part pgfence cannot decode (its `UESCAPE` string is one pgfence does not
    /// read), which may spell one of pgfence's.
    Unreadable,
}

/// A `SET` or `RESET` whose name may be pgfence's: refused rather than let through.
fn unreadable_name() -> Declaration {
    Declaration::Malformed {
        setting: Setting::Epoch,
        reason: "the setting's name has a Unicode escape pgfence does not read",
    }
}

/// Reads the setting name at `toks[at..]`. As in Postgres, the name is its identifiers
/// joined with dots, each folded to lower case unless quoted, and matched without regard
/// to case: `pgfence.epoch`, `"pgfence"."epoch"`, `"pgfence.epoch"` and `PgFence."EPOCH"`
/// all name the same setting, `pgfence.epoch.x` another one.
fn setting_name(stmt: &str, toks: &[Token], at: usize) -> Name {
    let part = |i| match name_part(stmt, toks, i) {
        Some(Ok(p)) => Ok(p),
        Some(Err(())) => Err(Name::Unreadable),
        None => Err(Name::Other),
    };
    let (mut name, mut next) = match part(at) {
        Ok(p) => p,
        Err(e) => return e,
    };
    while toks.get(next).is_some_and(|t| t.is_punct(b'.')) {
        let (p, after) = match part(next + 1) {
            Ok(p) => p,
            Err(e) => return e,
        };
        name.push('.');
        name.push_str(&p);
        next = after;
    }
    if name.eq_ignore_ascii_case("pgfence.epoch") {
        Name::Ours(Setting::Epoch, next)
    } else if name.eq_ignore_ascii_case("pgfence.fence") {
        Name::Ours(Setting::Fence, next)
    } else {
        Name::Other
    }
}

/// One identifier of a setting name at `toks[i]`, also `U&"…"` with its optional
/// `UESCAPE 'c'`; returns it and the index after it. `None` for no identifier (or one
/// Postgres refuses); `Err` for a `U&"…"` whose `UESCAPE` string pgfence does not read.
fn name_part(stmt: &str, toks: &[Token], i: usize) -> Option<Result<(String, usize), ()>> {
    let t = toks.get(i)?;
    if t.kind != TokenKind::UnicodeIdent {
        return Some(Ok((ident_value(stmt, t)?, i + 1)));
    }
    if !toks.get(i + 1).is_some_and(|u| u.is_word(stmt, "uescape")) {
        return Some(Ok((unicode_ident_value(stmt, t, '\\')?, i + 1)));
    }
    let c = toks.get(i + 2)?;
    // A plain one-character string pgfence reads; any other string kind it does not.
    let Some(escape) = uescape_char(stmt, c) else {
        let plain_refused = c.kind == TokenKind::String
            && stmt
                .get(c.span.clone())
                .is_some_and(|s| !s.contains(['\n', '\r', '\\']));
        return if plain_refused { None } else { Some(Err(())) };
    };
    Some(Ok((unicode_ident_value(stmt, t, escape)?, i + 3)))
}

/// Reads the value tokens: exactly one value, optionally signed if numeric. A list of
/// values is Postgres syntax (it refuses a list for a setting it does not know only when
/// the statement runs); anything else is a syntax error.
fn value(stmt: &str, toks: &[Token], lexing: Lexing) -> Value {
    let mut items = toks.split(|t| t.is_punct(b','));
    let first = items.next().unwrap_or_default();
    let value = one_value(stmt, first, lexing);
    if first.len() == toks.len() || matches!(value, Value::SyntaxError) {
        return value;
    }
    if items.all(|item| !matches!(one_value(stmt, item, lexing), Value::SyntaxError)) {
        Value::Unsupported("expected a single value")
    } else {
        Value::SyntaxError
    }
}

/// One item of a `SET`'s value: `var_value` in Postgres' grammar.
fn one_value(stmt: &str, toks: &[Token], lexing: Lexing) -> Value {
    let text = |t: &Token| stmt.get(t.span.clone()).unwrap_or("");
    match toks {
        [sign, num] if (sign.is_punct(b'+') || sign.is_punct(b'-')) && num.kind == TokenKind::Number => {
            Value::Read(format!("{}{}", text(sign), text(num)))
        }
        [t, uescape, c]
            if matches!(t.kind, TokenKind::UnicodeString | TokenKind::UnicodeIdent)
                && uescape.is_word(stmt, "uescape") =>
        {
            if t.kind == TokenKind::UnicodeString && !lexing.standard_conforming_strings {
                return Value::SyntaxError;
            }
            uescape_char(stmt, c).map_or(Value::Unsupported(UNICODE), |escape| unicode_value(stmt, t, escape))
        }
        [t] => single_value(text(t), t, stmt, lexing),
        // Two numbers, or two strings or words, side by side are no value in any version
        // of Postgres.
        many if many.iter().all(|t| t.kind == TokenKind::Number)
            || many.iter().all(|t| {
                matches!(
                    t.kind,
                    TokenKind::Word | TokenKind::QuotedIdent | TokenKind::EscapeString | TokenKind::DollarString
                ) || (t.kind == TokenKind::String && text(t).starts_with('\''))
            }) =>
        {
            Value::SyntaxError
        }
        // What Postgres may read as one number where pgfence's lexer sees several tokens
        // (`1e-5`: it cuts the exponent's sign out): refused.
        many if may_be_one_number(stmt, many) => Value::Unsupported("a value pgfence does not read"),
        // Anything else (`4::bigint`, `(4)`, `4 + 0`, `- - 4`, `-'5'`, `DEFAULT 4`) no
        // version of Postgres parses: its syntax error refuses the whole text, as directly.
        _ => Value::SyntaxError,
    }
}

/// Whether `toks` (two or more) may be one numeric literal to Postgres: after an optional
/// sign, the pieces pgfence's lexer cuts an exponent's sign out of (`1e`, `-`, `5`), with
/// nothing between them.
fn may_be_one_number(stmt: &str, toks: &[Token]) -> bool {
    let sign = |t: &Token| t.is_punct(b'+') || t.is_punct(b'-');
    let rest = match toks {
        [first, rest @ ..] if sign(first) => rest,
        _ => toks,
    };
    let exponent =
        |t: &Token| t.kind == TokenKind::Number && stmt.get(t.span.clone()).is_some_and(|n| n.ends_with(['e', 'E']));
    rest.first().is_some_and(|t| t.kind == TokenKind::Number)
        && rest.windows(2).all(|w| {
            w[0].span.end == w[1].span.start
                && if sign(&w[1]) {
                    exponent(&w[0])
                } else {
                    w[1].kind == TokenKind::Number && sign(&w[0])
                }
        })
}

const UNICODE: &str = "this Unicode escape in the value is not supported";

/// A `U&'…'` string or `U&"…"` identifier with escape character `escape`.
fn unicode_value(stmt: &str, t: &Token, escape: char) -> Value {
    let v = match t.kind {
        TokenKind::UnicodeString => unicode_string_value(stmt, t, escape),
        _ => unicode_ident_value(stmt, t, escape),
    };
    v.map_or(Value::Unsupported(UNICODE), Value::Read)
}

fn single_value(raw: &str, t: &Token, stmt: &str, lexing: Lexing) -> Value {
    match t.kind {
        TokenKind::Number => Value::Read(raw.to_owned()),
        TokenKind::Word => {
            // A reserved key word is no value; `true`, `false` and `on` are, by a rule of
            // their own.
            let word = raw.to_ascii_lowercase();
            let literal = matches!(word.as_str(), "true" | "false" | "on");
            if !literal && keywords::category(&word) == Some(keywords::Category::Reserved) {
                return Value::SyntaxError;
            }
            ident_value(stmt, t).map_or(Value::SyntaxError, Value::Read)
        }
        // `""` is a syntax error.
        TokenKind::QuotedIdent => ident_value(stmt, t)
            .filter(|v| !v.is_empty())
            .map_or(Value::SyntaxError, Value::Read),
        TokenKind::String if raw.starts_with('\'') => unquote(raw, !lexing.standard_conforming_strings),
        TokenKind::EscapeString => unquote(&raw[1..], true),
        TokenKind::DollarString => {
            // `$tag$body$tag$`: the tag is everything up to the second `$`.
            let Some(tag_len) = raw[1..].find('$').map(|i| i + 2) else {
                return Value::SyntaxError;
            };
            let closed = raw.len() >= 2 * tag_len && raw.ends_with(&raw[..tag_len]);
            raw.get(tag_len..raw.len() - tag_len)
                .filter(|_| closed)
                .map_or(Value::SyntaxError, |v| Value::Read(v.to_owned()))
        }
        // Postgres refuses a Unicode string outright while strings take backslashes.
        TokenKind::UnicodeString if !lexing.standard_conforming_strings => Value::SyntaxError,
        TokenKind::UnicodeString | TokenKind::UnicodeIdent => unicode_value(stmt, t, '\\'),
        // `B'…'`, `X'…'`, `N'…'`, parameters, operators.
        _ => Value::SyntaxError,
    }
}

/// `'a''b'` → `a'b`, and a literal continued over a newline joined, as Postgres reads
/// them; an unterminated string is a syntax error. With `escapes` (an `E''` string, or
/// `standard_conforming_strings` off) it refuses a backslash in the value: pieces
/// without one read the same either way, and a backslash in a comment between
/// pieces is not part of the value.
fn unquote(raw: &str, escapes: bool) -> Value {
    const ESCAPES: &str = "this backslash escape in the value is not supported";
    let escaped = || escaped_string_value(raw).map_or(Value::Unsupported(ESCAPES), Value::Read);
    match plain_string_value(raw) {
        Some(v) if escapes && v.contains('\\') => escaped(),
        Some(v) => Value::Read(v),
        // Read with backslashes taken literally, an escaped quote can end a piece early.
        None if escapes && raw.contains('\\') => escaped(),
        None => Value::SyntaxError,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Declaration::*;
    use Scope::*;
    use Setting::*;

    fn set(setting: Setting, scope: Scope, value: Option<&str>) -> Option<Declaration> {
        Some(Set {
            setting,
            scope,
            value: value.map(str::to_owned),
        })
    }

    #[test]
    fn declarations_are_recognised() {
        let cases: Vec<(&str, Option<Declaration>)> = vec![
            ("SET pgfence.epoch = 5", set(Epoch, Session, Some("5"))),
            ("set PGFENCE.EPOCH to 5", set(Epoch, Session, Some("5"))),
            ("SET SESSION pgfence.epoch TO 7", set(Epoch, Session, Some("7"))),
            ("SET LOCAL pgfence.epoch = 9", set(Epoch, Local, Some("9"))),
            ("SET pgfence.epoch = +5", set(Epoch, Session, Some("+5"))),
            ("SET pgfence.epoch = - 3", set(Epoch, Session, Some("-3"))),
            ("SET pgfence.epoch = 05", set(Epoch, Session, Some("05"))),
            ("SET pgfence.epoch = '5'", set(Epoch, Session, Some("5"))),
            ("SET pgfence.epoch = ''", set(Epoch, Session, Some(""))),
            ("SET pgfence.epoch = 'a''b'", set(Epoch, Session, Some("a'b"))),
            ("SET pgfence.epoch = E'6'", set(Epoch, Session, Some("6"))),
            ("SET pgfence.epoch = $$8$$", set(Epoch, Session, Some("8"))),
            ("SET pgfence.epoch = $x$8$x$", set(Epoch, Session, Some("8"))),
            ("SET pgfence.epoch = Abc", set(Epoch, Session, Some("abc"))),
            ("SET pgfence.epoch = \"5\"", set(Epoch, Session, Some("5"))),
            ("SET pgfence.epoch = 1.5", set(Epoch, Session, Some("1.5"))),
            ("SET \"pgfence\".\"epoch\" = 3", set(Epoch, Session, Some("3"))),
            ("SET /* c */ pgfence . epoch = 3", set(Epoch, Session, Some("3"))),
            ("SET pgfence.epoch TO DEFAULT", set(Epoch, Session, None)),
            ("SET LOCAL pgfence.epoch = default", set(Epoch, Local, None)),
            ("SET pgfence.epoch = 'default'", set(Epoch, Session, Some("default"))),
            ("RESET pgfence.epoch", set(Epoch, Session, None)),
            (
                "SET pgfence.fence = 'invoice-sweeper'",
                set(Fence, Session, Some("invoice-sweeper")),
            ),
            ("SET LOCAL pgfence.fence TO sweeper", set(Fence, Local, Some("sweeper"))),
            ("RESET pgfence.fence", set(Fence, Session, None)),
            ("RESET ALL", Some(ResetAll)),
            ("discard all", Some(DiscardAll)),
            ("DISCARD PLANS", None),
            ("RESET search_path", None),
            ("SET search_path = public", None),
            // A syntax error to Postgres (SET takes no parameters), which it answers itself.
            ("SET pgfence.epoch = $1", None),
            ("SET LOCAL pgfence.fence TO $2", None),
            ("SET pgfence.epoch.x = 1", None),
            ("SET pgfence.epochs = 1", None),
            // Names match without regard to case, as Postgres matches them, quoted or not.
            ("SET \"PGFENCE\".epoch = 1", set(Epoch, Session, Some("1"))),
            ("SET \"pgfence.epoch\" = 4", set(Epoch, Session, Some("4"))),
            ("SET LOCAL pgfence.\"EPOCH\" = 3", set(Epoch, Local, Some("3"))),
            ("RESET \"pgfence.fence\"", set(Fence, Session, None)),
            ("SET U&\"pgfence.\\0065poch\" = 4", set(Epoch, Session, Some("4"))),
            (
                "SET U&\"pgfence.!0065poch\" UESCAPE '!' = 4",
                set(Epoch, Session, Some("4")),
            ),
            // Postgres refuses an escape character that is not one byte.
            ("SET U&\"pgfence.é0065poch\" UESCAPE 'é' = 4", None),
            ("SET \"pgfence.epoch\".x = 1", None),
            ("SET \"pgfence . epoch\" = 1", None),
            ("SET SESSION AUTHORIZATION bob", None),
            ("SET TIME ZONE 'UTC'", None),
            ("SHOW pgfence.epoch", None),
            ("SELECT set_config('pgfence.epoch', '5', false)", None),
            // A literal continued over a newline (comments allowed) is one value.
            ("SET pgfence.epoch = '5'\n'0'", set(Epoch, Session, Some("50"))),
            (
                "SET pgfence.epoch = '5' -- it's\r\n  'a''b'",
                set(Epoch, Session, Some("5a'b")),
            ),
            ("SET pgfence.epoch = E'5'\n'0'", set(Epoch, Session, Some("50"))),
            // A backslash in a comment between the pieces is not in the value.
            ("SET pgfence.epoch = E'5' -- a\\b\n'0'", set(Epoch, Session, Some("50"))),
        ];
        for (sql, want) in cases {
            assert_eq!(parse(sql, Lexing::default()), want, "{sql}");
        }
    }

    /// Values Postgres reads (and sets, or refuses when the statement runs) that pgfence
    /// does not read: refused.
    #[test]
    fn odd_values_are_malformed() {
        for sql in [
            "SET pgfence.epoch = 1, 2",
            "SET pgfence.epoch = 1, 'a', +3",
            "SET pgfence.epoch = U&'5', 6",
            // Postgres reads these as one number; pgfence's lexer does not.
            "SET pgfence.epoch = 1e-5",
            "SET pgfence.epoch = +1E+3",
            "SET pgfence.epoch = .5e-1",
            "SET pgfence.epoch = - 2.5e+3",
            "SET LOCAL pgfence.epoch = -1E-0",
            // A name pgfence cannot decode may be its own.
            "SET U&\"pgfence!002eepoch\" UESCAPE E'\\041' = 12",
            "RESET U&\"pgfence!002eepoch\" UESCAPE E'\\041'",
        ] {
            assert!(matches!(parse(sql, Lexing::default()), Some(Malformed { .. })), "{sql}");
        }
        // An escape character given as any one-character string constant is read.
        let plain = parse("SET pgfence.epoch = 12", Lexing::default());
        for sql in [
            "SET U&\"pgfence!002eepoch\" UESCAPE E'!' = 12",
            "SET U&\"pgfence!002eepoch\" UESCAPE $$!$$ = 12",
        ] {
            assert_eq!(parse(sql, Lexing::default()), plain, "{sql}");
        }
    }

    /// Texts Postgres cannot parse are no declarations: Postgres refuses the whole text
    /// with its own syntax error before any statement in it runs, pgfence lets it.
    #[test]
    fn syntax_errors_are_left_to_postgres() {
        for sql in [
            "SET pgfence.epoch",
            "SET pgfence.epoch =",
            "SET pgfence.epoch TO",
            "SET pgfence.epoch 5",
            "SET pgfence.epoch FROM CURRENT 5",
            "SET pgfence.epoch FROM",
            "SET pgfence.epoch = 'open",
            "SET pgfence.epoch = '5' '0'",
            "SET pgfence.epoch = '5'\n'0",
            "SET pgfence.epoch = $$open",
            "SET pgfence.epoch = 7 8",
            "SET pgfence.epoch = 1,",
            "SET pgfence.epoch = 1, 2 3",
            "SET pgfence.epoch = b'1'",
            "SET pgfence.epoch = X'1F'",
            "SET pgfence.epoch = N'5'",
            "SET pgfence.epoch = \"\"",
            "SET pgfence.fence = user",
            "SET pgfence.fence = Select",
            "SET pgfence.fence = current_user",
            "RESET pgfence.epoch extra",
            "SET LOCAL pgfence.fence = 1 2",
            // Expressions, casts, stray signs and words: no version of Postgres reads them.
            "SET pgfence.epoch = DEFAULT 1",
            "SET pgfence.epoch TO DEFAULT 4",
            "SET pgfence.epoch = -'5'",
            "SET pgfence.epoch = +'4'",
            "SET pgfence.epoch = '5'::int",
            "SET pgfence.epoch = 4::bigint",
            "SET LOCAL pgfence.epoch = (4)",
            "SET SESSION pgfence.epoch = 4 + 0",
            "SET pgfence.epoch = 4+0",
            "SET pgfence.epoch = 1e-5-1",
            "SET pgfence.epoch = 1e- 5",
            "SET pgfence.epoch = - - 4",
            "SET pgfence.epoch = cast(4 as bigint)",
            "SET pgfence.epoch = array[4]",
            "SET pgfence.epoch = 4 \\g",
            "SET pgfence.epoch = 1, (2)",
            // UESCAPE characters Postgres refuses: no setting is named.
            "SET U&\"pgfence!002eepoch\" UESCAPE 'ab' = 1",
        ] {
            assert_eq!(parse(sql, Lexing::default()), None, "{sql}");
        }
        let off = Lexing {
            standard_conforming_strings: false,
        };
        for sql in ["SET pgfence.epoch = U&'7'", "SET pgfence.epoch = U&'!0037' UESCAPE '!'"] {
            assert_eq!(parse(sql, off), None, "{sql}: 0A000 to Postgres");
        }
        // `true`, `false` and `on` are reserved but values; other key words are values.
        for word in ["true", "FALSE", "on", "nchar", "national", "local"] {
            let sql = format!("SET pgfence.fence = {word}");
            assert_eq!(
                parse(&sql, Lexing::default()),
                set(Fence, Session, Some(&word.to_ascii_lowercase())),
                "{sql}"
            );
        }
    }

    #[test]
    fn backslash_escapes_are_read_as_postgres_reads_them() {
        let off = Lexing {
            standard_conforming_strings: false,
        };
        let on = Lexing::default();
        for (sql, lexing, want) in [
            (r"SET pgfence.epoch = 'a\'b'", off, "a'b"),
            (r"SET pgfence.epoch = 'a\''", off, "a'"),
            (r"SET pgfence.epoch = '\65'", off, "5"),
            (r"SET pgfence.epoch = '\65'", on, r"\65"),
            (r"SET pgfence.epoch = E'\x31\x38'", on, "18"),
            (r"SET pgfence.epoch = e'\61\062\063\0063'", on, "123\u{6}3"),
            (r"SET pgfence.epoch = E'\u0037\U00000038\q\\'", on, r"78q\"),
            (r"SET pgfence.epoch = E'\xg'", on, "xg"),
            (r"SET pgfence.epoch = E'\461'", on, "1"),
            (r"SET pgfence.fence = E'a\tb'", on, "a\tb"),
            (r"SET pgfence.epoch = U&'\0037'", on, "7"),
            (r"SET pgfence.epoch = u&'!0031!+000038''' UESCAPE '!'", on, "18'"),
            (r"SET pgfence.fence = U&'caf\00e9'", on, "café"),
            (r"SET pgfence.fence = U&'\D83D\DE00'", on, "\u{1f600}"),
            (r#"SET pgfence.fence = U&"s\0077eeper""#, on, "sweeper"),
            (r#"SET pgfence.fence = U&"S#0077" UESCAPE '#'"#, on, "Sw"),
            ("SET pgfence.epoch = '5' -- a\\b\n'0'", off, "50"),
        ] {
            let setting = if sql.contains("fence =") { Fence } else { Epoch };
            assert_eq!(parse(sql, lexing), set(setting, Session, Some(want)), "{sql}");
        }
        // What pgfence does not read is refused: continued escape strings, escapes that
        // give bytes outside ASCII or 0, bad Unicode escapes and escape characters.
        for sql in [
            "SET pgfence.epoch = E'\\\\'\n'5'",
            r"SET pgfence.epoch = E'\xe9'",
            r"SET pgfence.epoch = E'\351'",
            r"SET pgfence.epoch = E'\0'",
            r"SET pgfence.epoch = E'\u00e9'",
            r"SET pgfence.epoch = E'\u12'",
            r"SET pgfence.epoch = E'\é'",
            r"SET pgfence.epoch = U&'\0000'",
            r"SET pgfence.epoch = U&'\D83D'",
            r"SET pgfence.epoch = U&'\zzzz'",
            r"SET pgfence.epoch = U&'7' UESCAPE 'ab'",
            "SET pgfence.epoch = U&'7'\n'8'",
        ] {
            assert!(matches!(parse(sql, on), Some(Malformed { .. })), "{sql}");
        }
    }
}
