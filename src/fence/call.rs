//! The SQL text the proxy sends upstream to run the guard or raise a rejection.
//!
//! Literals are written so that their meaning does not depend on the session's
//! settings: plain ASCII without backslashes becomes a standard string (`'it''s'`),
//! which reads the same whether `standard_conforming_strings` is on or off; ASCII with
//! backslashes an escape string (`E'a\\b'`), whose meaning never depends on that setting.
//! A text with other characters is sent as its UTF-8 bytes, which the server converts
//! (`pg_catalog.convert_from(E'\\xc3a9'::pg_catalog.bytea, 'UTF8')`): the SQL stays pure
//! ASCII, which reads the same in every `client_encoding`, and the conversion works in every
//! database encoding that has the characters (SQL_ASCII included, where a Unicode escape
//! fails). So a literal of such a text is an expression; one of ASCII text is a constant
//! (a `DO` block's body, which pgfence writes in ASCII, must be one).

use std::fmt::Write as _;

use super::epoch::Epoch;

/// The guard with parameters, prepared once per session for the simple protocol: `$1`
/// fence, `$2` epoch (`bigint`), `$3` lease table (NULL without a lease), `$4` keep the HWM
/// (`boolean`: true in reject mode, false in rewrite mode). Parameters as [`guard_params`]
/// gives them.
///
/// Every text goes as UTF-8 in a `bytea` ([`utf8_param`]) that the statement converts: a
/// `text` parameter is read in the session's `client_encoding`, and the proxy's texts are
/// UTF-8. Sent as `text` in a LATIN1 session, a fence named `été` would be read as another
/// name, whose guard knows no epoch. The statement's own text is ASCII, so the
/// encoding cannot change it.
pub const GUARD_SQL: &str = "SELECT pgfence.guard(pg_catalog.convert_from($1, 'UTF8'), $2, \
                             pg_catalog.convert_from($3, 'UTF8'), $4)";

/// Parameter type OIDs of [`GUARD_SQL`] for a Parse message: bytea, int8, bytea, bool.
pub const GUARD_PARAM_TYPES: [u32; 4] = [BYTEA, 20, BYTEA, 16];

/// `bytea`.
const BYTEA: u32 = 17;

/// A rejection for the extended protocol: `$1` SQLSTATE, `$2` message, `$3` hint, `$4` the
/// fences whose current epochs Postgres appends to the message (a `text[]` as
/// [`fences_param`] writes it). Schema version 7. Texts go in `bytea`, as for [`GUARD_SQL`].
pub const REJECT_SQL: &str = "SELECT pgfence.reject(pg_catalog.convert_from($1, 'UTF8'), \
                              pg_catalog.convert_from($2, 'UTF8'), pg_catalog.convert_from($3, 'UTF8'), \
                              pg_catalog.convert_from($4, 'UTF8')::pg_catalog.text[])";

/// Parameter type OIDs of [`REJECT_SQL`] for a Parse message: four bytea.
pub const REJECT_PARAM_TYPES: [u32; 4] = [BYTEA; 4];

/// A rejection that Postgres raises only if the session holds a prepared statement named
/// `$4`: for SQL `EXECUTE` of a name pgfence has seen no definition of. Without one,
/// nothing is raised and the `EXECUTE` fails as Postgres fails it (26000); with one (made
/// where pgfence cannot see, inside a function or `DO`), the rejection stands.
pub const REJECT_IF_PREPARED_SQL: &str = "SELECT pgfence.reject(pg_catalog.convert_from($1, 'UTF8'), \
     pg_catalog.convert_from($2, 'UTF8'), pg_catalog.convert_from($3, 'UTF8'), \
     pg_catalog.convert_from($4, 'UTF8')::pg_catalog.text[]) FROM pg_catalog.pg_prepared_statements \
     WHERE name OPERATOR(pg_catalog.=) pg_catalog.convert_from($5, 'UTF8')";

/// Parameter type OIDs of [`REJECT_IF_PREPARED_SQL`]: five bytea.
pub const REJECT_IF_PREPARED_PARAM_TYPES: [u32; 5] = [BYTEA; 5];

/// The guard call with its arguments written in, without a trailing semicolon, e.g.
/// `SELECT pgfence.guard('invoice-sweeper', 7, NULL, true)`: spelled out in a simple Query,
/// and the text of the statement both protocols prepare for one fence and epoch. Pure
/// ASCII, so a Parse reads it the same in every `client_encoding`.
///
/// `lease_table` is the configured lease table as [`crate::sql::name::TableName`]
/// displays it (`None` without a lease); `keep_hwm` is true in reject mode and false in
/// rewrite mode. The statement returns one row with one `void` column.
///
/// A fence with a lease calls `pgfence.guard_lease` (schema version 9), whose steady state
/// needs to know whether the lease trigger is in place: the statement looks it up in
/// `pg_trigger` itself ([`lease_trigger_exists`]), in each transaction.
pub fn guard_call(fence: &str, epoch: Epoch, lease_table: Option<&str>, keep_hwm: bool) -> String {
    let mut sql = String::with_capacity(64 + fence.len() + lease_table.map_or(0, |t| 640 + 2 * t.len()));
    sql.push_str(if lease_table.is_some() {
        "SELECT pgfence.guard_lease("
    } else {
        "SELECT pgfence.guard("
    });
    push_literal(&mut sql, fence);
    // Writing to a String cannot fail.
    let _ = write!(sql, ", {epoch}, ");
    match lease_table {
        Some(table) => push_literal(&mut sql, table),
        None => sql.push_str("NULL"),
    }
    sql.push_str(if keep_hwm { ", true" } else { ", false" });
    if let Some(table) = lease_table {
        sql.push_str(", ");
        lease_trigger_exists(&mut sql, table);
    }
    sql.push(')');
    sql
}

/// Whether the lease table `table` has both of pgfence's triggers as `init` installs them,
/// calling its functions and enabled ALWAYS: two `EXISTS` on `pg_trigger`, as
/// `pgfence.lease_triggers_on` asks for the full guard (schema version 12). ALWAYS, because
/// a trigger enabled the default way does not fire under `session_replication_role =
/// replica`, where a takeover would then leave the fence behind. The name is looked up when
/// the statement runs, so a prepared guard follows a lease table dropped or renamed (then
/// `false`: the full guard decides, and raises PF005).
fn lease_trigger_exists(out: &mut String, table: &str) {
    for (i, (trigger, function)) in [
        ("pgfence_lease", "pgfence.lease_trigger()"),
        ("pgfence_lease_truncate", "pgfence.lease_truncate_trigger()"),
    ]
    .into_iter()
    .enumerate()
    {
        if i > 0 {
            out.push_str(" AND ");
        }
        out.push_str(
            "EXISTS (SELECT FROM pg_catalog.pg_trigger t WHERE t.tgrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(",
        );
        push_literal(out, table);
        // Writing to a String cannot fail.
        let _ = write!(
            out,
            ") AND t.tgname OPERATOR(pg_catalog.=) '{trigger}' \
             AND t.tgfoid OPERATOR(pg_catalog.=) '{function}'::pg_catalog.regprocedure \
             AND t.tgenabled OPERATOR(pg_catalog.=) 'A')"
        );
    }
}

/// SQL `PREPARE` of [`GUARD_SQL`] under `name` (an unquoted lower-case identifier), for the
/// simple protocol, without a trailing semicolon. Prepared statements outlive a rolled-back
/// transaction, so one PREPARE serves the session.
pub fn guard_prepare(name: &str) -> String {
    format!("PREPARE {name} (pg_catalog.bytea, pg_catalog.int8, pg_catalog.bytea, pg_catalog.bool) AS {GUARD_SQL}")
}

/// [`guard_call`] as an SQL `EXECUTE` of the statement [`guard_prepare`] made: Postgres
/// then neither parses nor plans the guard call in each transaction. Its texts are
/// [`utf8_param`]s, written as literals that read the same whatever the session's settings.
pub fn guard_execute(name: &str, fence: &str, epoch: Epoch, lease_table: Option<&str>, keep_hwm: bool) -> String {
    let mut sql = format!("EXECUTE {name}(");
    push_literal(&mut sql, &utf8_param(fence));
    let _ = write!(sql, ", {epoch}, ");
    match lease_table {
        Some(t) => push_literal(&mut sql, &utf8_param(t)),
        None => sql.push_str("NULL"),
    }
    sql.push_str(if keep_hwm { ", true)" } else { ", false)" });
    sql
}

/// The text-format parameters of [`GUARD_SQL`], in order (`None` is SQL NULL).
pub fn guard_params(fence: &str, epoch: Epoch, lease_table: Option<&str>, keep_hwm: bool) -> [Option<String>; 4] {
    [
        Some(utf8_param(fence)),
        Some(epoch.to_string()),
        lease_table.map(utf8_param),
        Some(if keep_hwm { "t" } else { "f" }.to_owned()),
    ]
}

/// `text`'s UTF-8 bytes as the text form of a `bytea` (`\x…` in hex): plain ASCII, which
/// reads the same in every `client_encoding`.
pub fn utf8_param(text: &str) -> String {
    let mut out = String::with_capacity(2 + 2 * text.len());
    out.push_str("\\x");
    for b in text.bytes() {
        // Writing to a String cannot fail.
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// A call that makes Postgres raise `code` with `message` and `hint` (empty: no hint),
/// with the current epoch of each of `fences` appended to the message, for the simple
/// protocol, without a trailing semicolon. Used for PF002/PF004 so that a database without
/// the `pgfence` schema answers 3F000 (42883 when its schema is older than version 7),
/// reported as PF005.
pub fn reject_call(code: &str, message: &str, hint: &str, fences: &[&str]) -> String {
    let mut sql = String::with_capacity(80 + code.len() + message.len() + hint.len());
    sql.push_str("SELECT pgfence.reject(");
    push_literal(&mut sql, code);
    sql.push_str(", ");
    push_literal(&mut sql, message);
    sql.push_str(", ");
    push_literal(&mut sql, hint);
    sql.push_str(", ");
    push_literal(&mut sql, &fences_param(fences));
    sql.push_str("::pg_catalog.text[])");
    sql
}

/// `fences` as the text form of a `text[]`, the fourth parameter of [`REJECT_SQL`]: every
/// element double-quoted, with `"` and `\` escaped by a backslash (array input reads them so
/// whatever `standard_conforming_strings` says).
pub fn fences_param(fences: &[&str]) -> String {
    let mut out = String::from("{");
    for (i, fence) in fences.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('"');
        for c in fence.chars() {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
    }
    out.push('}');
    out
}

/// [`reject_call`] raised only if the session holds a prepared statement named `name`,
/// for the simple protocol (see [`REJECT_IF_PREPARED_SQL`]).
pub fn reject_if_prepared_call(name: &str, code: &str, message: &str, hint: &str, fences: &[&str]) -> String {
    let mut sql = reject_call(code, message, hint, fences);
    sql.push_str(" FROM pg_catalog.pg_prepared_statements WHERE name OPERATOR(pg_catalog.=) ");
    push_literal(&mut sql, name);
    sql
}

/// `value` as an SQL string literal whose meaning depends on no session setting
/// (see the module docs). A NUL, which no Postgres string can hold, becomes U+FFFD.
pub fn quote_literal(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    push_literal(&mut out, value);
    out
}

fn push_literal(out: &mut String, value: &str) {
    if !value.bytes().all(|b| b.is_ascii() && b != 0) {
        // The text's UTF-8 bytes, converted by the server: a Unicode escape (`E'\u00E9'`)
        // fails in a SQL_ASCII database, and the client's bytes would be read in its
        // encoding. A NUL, which no Postgres string can hold, becomes U+FFFD.
        let value = value.replace('\0', "\u{FFFD}");
        out.push_str("pg_catalog.convert_from(");
        push_literal(out, &utf8_param(&value));
        out.push_str("::pg_catalog.bytea, 'UTF8')");
        return;
    }
    let escape = value.contains('\\');
    out.push_str(if escape { "E'" } else { "'" });
    for c in value.chars() {
        match c {
            '\'' => out.push_str("''"),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('\'');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_are_quoted_independently_of_session_settings() {
        let cases = [
            ("invoice-sweeper", "'invoice-sweeper'"),
            ("", "''"),
            ("it's", "'it''s'"),
            ("'; DROP TABLE x; --", "'''; DROP TABLE x; --'"),
            ("a\\b", "E'a\\\\b'"),
            ("a\\'b", "E'a\\\\''b'"),
            (
                "été",
                "pg_catalog.convert_from(E'\\\\xc3a974c3a9'::pg_catalog.bytea, 'UTF8')",
            ),
            (
                "🦀",
                "pg_catalog.convert_from(E'\\\\xf09fa680'::pg_catalog.bytea, 'UTF8')",
            ),
            (
                "nul\0",
                "pg_catalog.convert_from(E'\\\\x6e756cefbfbd'::pg_catalog.bytea, 'UTF8')",
            ),
        ];
        for (input, expected) in cases {
            assert_eq!(quote_literal(input), expected, "{input:?}");
        }
    }

    #[test]
    fn guard_call_for_the_simple_protocol() {
        let e = Epoch::parse("7").expect("valid");
        assert_eq!(
            guard_call("invoice-sweeper", e, Some("public.leader_lease"), true),
            "SELECT pgfence.guard_lease('invoice-sweeper', 7, 'public.leader_lease', true, \
             EXISTS (SELECT FROM pg_catalog.pg_trigger t \
             WHERE t.tgrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('public.leader_lease') \
             AND t.tgname OPERATOR(pg_catalog.=) 'pgfence_lease' \
             AND t.tgfoid OPERATOR(pg_catalog.=) 'pgfence.lease_trigger()'::pg_catalog.regprocedure \
             AND t.tgenabled OPERATOR(pg_catalog.=) 'A') \
             AND EXISTS (SELECT FROM pg_catalog.pg_trigger t \
             WHERE t.tgrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('public.leader_lease') \
             AND t.tgname OPERATOR(pg_catalog.=) 'pgfence_lease_truncate' \
             AND t.tgfoid OPERATOR(pg_catalog.=) 'pgfence.lease_truncate_trigger()'::pg_catalog.regprocedure \
             AND t.tgenabled OPERATOR(pg_catalog.=) 'A'))"
        );
        assert_eq!(
            guard_call("o'neil", Epoch::MAX, None, false),
            "SELECT pgfence.guard('o''neil', 9223372036854775807, NULL, false)"
        );
    }

    #[test]
    fn guard_prepared_and_executed_for_the_simple_protocol() {
        let e = Epoch::parse("7").unwrap();
        assert_eq!(
            guard_prepare("pgfence_guard_v1_ab"),
            format!(
                "PREPARE pgfence_guard_v1_ab (pg_catalog.bytea, pg_catalog.int8, pg_catalog.bytea, pg_catalog.bool) \
                 AS {GUARD_SQL}"
            )
        );
        assert_eq!(
            guard_execute("pgfence_guard_v1_ab", "o'neil", e, Some("public.leader_lease"), true),
            r"EXECUTE pgfence_guard_v1_ab(E'\\x6f276e65696c', 7, E'\\x7075626c69632e6c65616465725f6c65617365', true)"
        );
        assert_eq!(
            guard_execute("g", "été", e, None, false),
            r"EXECUTE g(E'\\xc3a974c3a9', 7, NULL, false)"
        );
    }

    #[test]
    fn guard_params_for_the_extended_protocol() {
        let e = Epoch::parse("12").expect("valid");
        assert_eq!(
            guard_params("f", e, None, true),
            [
                Some("\\x66".to_owned()),
                Some("12".to_owned()),
                None,
                Some("t".to_owned())
            ]
        );
        assert_eq!(
            guard_params("été", e, Some("a.b"), false)[0].as_deref(),
            Some("\\xc3a974c3a9")
        );
        assert_eq!(
            guard_params("été", e, Some("a.b"), false)[2].as_deref(),
            Some("\\x612e62")
        );
    }

    #[test]
    fn reject_if_prepared_call_quotes_the_name() {
        assert_eq!(
            reject_if_prepared_call("it's", "PF004", "m", "", &[]),
            "SELECT pgfence.reject('PF004', 'm', '', '{}'::pg_catalog.text[]) FROM pg_catalog.pg_prepared_statements \
             WHERE name OPERATOR(pg_catalog.=) 'it''s'"
        );
    }

    #[test]
    fn reject_call_quotes_every_argument() {
        assert_eq!(
            reject_call(
                "PF002",
                "pgfence: no epoch for fence \"a\"",
                "SET pgfence.epoch = N",
                &["a"]
            ),
            "SELECT pgfence.reject('PF002', 'pgfence: no epoch for fence \"a\"', 'SET pgfence.epoch = N', \
             '{\"a\"}'::pg_catalog.text[])"
        );
    }

    #[test]
    fn fences_are_written_as_a_text_array() {
        assert_eq!(fences_param(&[]), "{}");
        assert_eq!(fences_param(&["a", "b c"]), r#"{"a","b c"}"#);
        assert_eq!(fences_param(&[r#"q"\,{}"#]), r#"{"q\"\\,{}"}"#);
        // In SQL the backslashes of the array text make it an escape string.
        assert_eq!(
            reject_call("PF002", "m", "", &[r"a\b"]),
            r#"SELECT pgfence.reject('PF002', 'm', '', E'{"a\\\\b"}'::pg_catalog.text[])"#
        );
    }
}
