//! Normalised table names.
//!
//! Postgres folds unquoted identifiers to lower case and keeps quoted ones as
//! written, so `Billing.Invoices`, `billing.invoices` and `"billing"."invoices"`
//! all name one table while `"Invoices"` names another. Every name pgfence
//! compares goes through [`TableName`] so that comparison is plain equality.

use std::fmt;

/// A table name as Postgres resolves it: schema (if written) and relation,
/// both already case-folded or unquoted.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableName {
    /// `None` when the statement did not qualify the name; it then matches a
    /// fenced table of that name in any schema (search_path cannot be trusted).
    pub schema: Option<String>,
    /// The relation name.
    pub name: String,
}

/// Why a configured table name could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid table name {input:?}: {reason}")]
pub struct NameError {
    input: String,
    reason: &'static str,
}

impl TableName {
    /// A name from parts that are already normalised.
    pub fn new(schema: Option<&str>, name: &str) -> Self {
        Self {
            schema: schema.map(str::to_owned),
            name: name.to_owned(),
        }
    }

    /// Reads a configured name such as `billing.invoices`, `"Odd Name"` or
    /// `invoices` (unqualified means `public`, as the contract says).
    pub fn parse_config(input: &str) -> Result<Self, NameError> {
        let err = |reason| NameError {
            input: input.to_owned(),
            reason,
        };
        Self::from_parts(split_identifiers(input, true).map_err(err)?)
            .ok_or_else(|| err("expected `table` or `schema.table`"))
    }

    /// The table a configured name means when its unquoted parts keep the case they are
    /// written in (`Inv` as `"Inv"`), if that differs from [`Self::parse_config`]'s: the
    /// spelling of a mixed-case table as `\d` lists it, which SQL would fold to another name.
    pub fn parse_config_as_written(input: &str) -> Option<Self> {
        let kept = Self::from_parts(split_identifiers(input, false).ok()?)?;
        (Self::parse_config(input).ok()? != kept).then_some(kept)
    }

    /// `[table]` (in `public`) or `[schema, table]`.
    fn from_parts(parts: Vec<String>) -> Option<Self> {
        match parts.as_slice() {
            [name] => Some(Self::new(Some("public"), name)),
            [schema, name] => Some(Self::new(Some(schema), name)),
            _ => None,
        }
    }

    /// Whether a name written in a statement (`self`, perhaps unqualified)
    /// may refer to the configured table `fenced`.
    pub fn may_refer_to(&self, fenced: &TableName) -> bool {
        self.name == fenced.name
            && match (&self.schema, &fenced.schema) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(schema) = &self.schema {
            write_ident(f, schema)?;
            f.write_str(".")?;
        }
        write_ident(f, &self.name)
    }
}

/// Writes an identifier, quoted only when Postgres would need the quotes.
fn write_ident(f: &mut fmt::Formatter<'_>, ident: &str) -> fmt::Result {
    let plain = !ident.is_empty()
        && ident.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && ident
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '$')
        && super::keywords::category(ident).is_none();
    if plain {
        f.write_str(ident)
    } else {
        write!(f, "\"{}\"", ident.replace('"', "\"\""))
    }
}

/// Splits `a.b` / `"A"."b.c"` into normalised identifiers; with `fold` false, unquoted
/// ones keep the case they are written in.
fn split_identifiers(input: &str, fold: bool) -> Result<Vec<String>, &'static str> {
    let mut parts = Vec::new();
    let mut chars = input.trim().chars().peekable();
    loop {
        let mut ident = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next() {
                    Some('"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        ident.push('"');
                    }
                    Some('"') => break,
                    Some(c) => ident.push(c),
                    None => return Err("unterminated quoted identifier"),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == '.' {
                    break;
                }
                if !(c.is_alphanumeric() || c == '_' || c == '$') {
                    return Err("unexpected character (quote the identifier)");
                }
                // Postgres folds only ASCII letters in UTF-8 databases
                // (`CAFÉ` is `cafÉ`); Unicode folding would name another table.
                ident.push(if fold { c.to_ascii_lowercase() } else { c });
                chars.next();
            }
        }
        // Postgres truncates identifiers to 63 bytes (NAMEDATALEN - 1).
        super::lex::truncate_ident(&mut ident);
        if ident.is_empty() {
            return Err("empty identifier");
        }
        parts.push(ident);
        match chars.next() {
            None => return Ok(parts),
            Some('.') => continue,
            Some(_) => return Err("unexpected character after identifier"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_names_are_normalised() {
        let cases = [
            ("invoices", "public", "invoices"),
            ("Billing.Invoices", "billing", "invoices"),
            ("\"Billing\".\"In.voices\"", "Billing", "In.voices"),
            ("public.\"a\"\"b\"", "public", "a\"b"),
            ("CAFÉ", "public", "cafÉ"),
        ];
        for (input, schema, name) in cases {
            let t = TableName::parse_config(input).unwrap();
            assert_eq!((t.schema.as_deref(), t.name.as_str()), (Some(schema), name), "{input}");
        }
    }

    #[test]
    fn config_names_as_written_keep_the_case_of_unquoted_parts() {
        let kept = |input| TableName::parse_config_as_written(input).map(|t| t.to_string());
        assert_eq!(kept("Inv").as_deref(), Some("public.\"Inv\""));
        assert_eq!(kept("Billing.Invoices").as_deref(), Some("\"Billing\".\"Invoices\""));
        assert_eq!(kept("billing.\"Inv\"").as_deref(), None);
        assert_eq!(kept("\"Billing\".invoices").as_deref(), None);
        assert_eq!(kept("Billing.\"Inv\"").as_deref(), Some("\"Billing\".\"Inv\""));
        assert_eq!(kept("invoices"), None);
        assert_eq!(kept("CAFÉ").as_deref(), Some("public.\"CAFÉ\""));
        assert_eq!(kept("a b"), None);
    }

    #[test]
    fn bad_config_names_are_refused() {
        for input in ["", "a.b.c", "a.", "\"open", "a b", "a;drop"] {
            assert!(TableName::parse_config(input).is_err(), "{input}");
        }
    }

    #[test]
    fn unqualified_names_match_any_schema() {
        let fenced = TableName::new(Some("billing"), "invoices");
        assert!(TableName::new(None, "invoices").may_refer_to(&fenced));
        assert!(TableName::new(Some("billing"), "invoices").may_refer_to(&fenced));
        assert!(!TableName::new(Some("public"), "invoices").may_refer_to(&fenced));
        assert!(!TableName::new(None, "invoice").may_refer_to(&fenced));
    }

    #[test]
    fn display_quotes_only_when_needed() {
        assert_eq!(TableName::new(Some("public"), "t1").to_string(), "public.t1");
        assert_eq!(
            TableName::new(Some("Billing"), "a\"b").to_string(),
            "\"Billing\".\"a\"\"b\""
        );
        // Key words that cannot stand for a name are quoted; others need no quotes.
        assert_eq!(TableName::new(Some("user"), "order").to_string(), "\"user\".\"order\"");
        assert_eq!(TableName::new(None, "left").to_string(), "\"left\"");
        assert_eq!(TableName::new(None, "name").to_string(), "name");
    }
}
