//! Postgres' key words that limit where a bare word can stand (PostgreSQL 15's
//! `pg_get_keywords()`; a test compares them with the server's).

/// How a key word is restricted: `pg_get_keywords()`'s `catcode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    /// R: reserved, no name and no value of a `SET`.
    Reserved,
    /// T: may name a type or function, but not a column or table.
    TypeFunction,
}

use Category::{Reserved as R, TypeFunction as T};

/// Sorted by word.
#[rustfmt::skip]
const RESTRICTED: [(&str, Category); 100] = [
    ("all", R), ("analyse", R), ("analyze", R), ("and", R), ("any", R), ("array", R), ("as", R),
    ("asc", R), ("asymmetric", R), ("authorization", T), ("binary", T), ("both", R), ("case", R),
    ("cast", R), ("check", R), ("collate", R), ("collation", T), ("column", R), ("concurrently", T),
    ("constraint", R), ("create", R), ("cross", T), ("current_catalog", R), ("current_date", R),
    ("current_role", R), ("current_schema", T), ("current_time", R), ("current_timestamp", R),
    ("current_user", R), ("default", R), ("deferrable", R), ("desc", R), ("distinct", R), ("do", R),
    ("else", R), ("end", R), ("except", R), ("false", R), ("fetch", R), ("for", R), ("foreign", R),
    ("freeze", T), ("from", R), ("full", T), ("grant", R), ("group", R), ("having", R), ("ilike", T),
    ("in", R), ("initially", R), ("inner", T), ("intersect", R), ("into", R), ("is", T), ("isnull", T),
    ("join", T), ("lateral", R), ("leading", R), ("left", T), ("like", T), ("limit", R),
    ("localtime", R), ("localtimestamp", R), ("natural", T), ("not", R), ("notnull", T), ("null", R),
    ("offset", R), ("on", R), ("only", R), ("or", R), ("order", R), ("outer", T), ("overlaps", T),
    ("placing", R), ("primary", R), ("references", R), ("returning", R), ("right", T), ("select", R),
    ("session_user", R), ("similar", T), ("some", R), ("symmetric", R), ("table", R),
    ("tablesample", T), ("then", R), ("to", R), ("trailing", R), ("true", R), ("union", R),
    ("unique", R), ("user", R), ("using", R), ("variadic", R), ("verbose", T), ("when", R),
    ("where", R), ("window", R), ("with", R),
];

/// The restriction on `word` (lower case), if it is such a key word.
pub fn category(word: &str) -> Option<Category> {
    RESTRICTED
        .binary_search_by(|(w, _)| (*w).cmp(word))
        .ok()
        .map(|i| RESTRICTED[i].1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_sorted_for_binary_search() {
        assert!(RESTRICTED.is_sorted_by_key(|(w, _)| *w));
        assert_eq!(category("order"), Some(R));
        assert_eq!(category("left"), Some(T));
        assert_eq!(category("name"), None);
    }
}
