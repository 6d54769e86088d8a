//! A small lexer that agrees with Postgres on where tokens start and end.
//!
//! sqlparser's tokenizer is thorough but slow and allocates per token; the
//! splitter, the declaration parser and the fallback classifier only need to
//! know what is code, what is a string and what is a comment. This lexer never
//! allocates, never panics on any input, and every token boundary it reports
//! falls on an ASCII byte or the end of the text, so spans are always char
//! boundaries of the input.
//!
//! It follows `scan.l` of Postgres: nested `/* */` comments, `--` comments,
//! `'…'` strings with `''` escapes (and backslash escapes when
//! `standard_conforming_strings` is off), `E'…'` strings, `U&'…'` strings,
//! `"…"` and `U&"…"` identifiers, dollar quotes (`$$…$$`, `$tag$…$tag$`) and
//! positional parameters (`$1`). Anything unterminated runs to the end of the
//! text, which is what Postgres does before it reports the syntax error.

use std::ops::Range;

/// How string literals are read; mirrors the server setting of that name.
///
/// `standard_conforming_strings` is reported by the server in a
/// ParameterStatus whenever it changes, so the session can keep this exact.
/// With it off, `'a\'b'` is one string, with it on it is `'a\'` followed by
/// `b'`: getting it wrong would let a statement hide inside a "string".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lexing {
    /// Whether backslashes in plain `'…'` strings are literal (the default
    /// since Postgres 9.1).
    pub standard_conforming_strings: bool,
}

impl Default for Lexing {
    fn default() -> Self {
        Self {
            standard_conforming_strings: true,
        }
    }
}

/// What a token is; its text is `&sql[token.span]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// An unquoted identifier or keyword (Postgres folds it to lower case).
    Word,
    /// A `"quoted identifier"`, kept as written (with `""` escapes).
    QuotedIdent,
    /// A `U&"…"` identifier: its name depends on its escapes and on a
    /// `UESCAPE` clause after it. Where a name decides what a statement may
    /// write, callers assume it could be any name; [`unicode_ident_value`]
    /// decodes it where a mistake could not hide a write (savepoint names).
    UnicodeIdent,
    /// A plain `'…'` string, or `B'…'`, `X'…'`, `N'…'`.
    String,
    /// An `E'…'` string, where backslash escapes apply.
    EscapeString,
    /// A `U&'…'` string, whose content has escapes.
    UnicodeString,
    /// A `$tag$…$tag$` string.
    DollarString,
    /// A numeric literal.
    Number,
    /// A positional parameter such as `$1`.
    Param,
    /// Any other single byte: punctuation, an operator character.
    Punct(u8),
}

/// One token and where it is in the lexed text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    /// What the token is.
    pub kind: TokenKind,
    /// Its byte range in the lexed text; always on char boundaries.
    pub span: Range<usize>,
}

impl Token {
    /// Whether this is the unquoted word `kw` (which must be lower case).
    pub fn is_word(&self, sql: &str, kw: &str) -> bool {
        self.kind == TokenKind::Word && sql.get(self.span.clone()).is_some_and(|w| w.eq_ignore_ascii_case(kw))
    }

    /// Whether this is the punctuation byte `b`.
    pub fn is_punct(&self, b: u8) -> bool {
        self.kind == TokenKind::Punct(b)
    }
}

/// Postgres truncates identifiers to `NAMEDATALEN - 1` bytes.
pub const MAX_IDENT_BYTES: usize = 63;

/// The name an identifier token denotes, as Postgres resolves it: unquoted
/// words are folded to lower case (ASCII only, as Postgres does for UTF-8),
/// quoted ones lose their quotes and `""` escapes; both are truncated to 63
/// bytes. `None` for tokens that are not identifiers or cannot be decoded
/// (`U&"…"`).
pub fn ident_value(sql: &str, token: &Token) -> Option<String> {
    let text = sql.get(token.span.clone())?;
    let mut value = match token.kind {
        TokenKind::Word => text.to_ascii_lowercase(),
        TokenKind::QuotedIdent => {
            let inner = text.strip_prefix('"')?;
            inner.strip_suffix('"').unwrap_or(inner).replace("\"\"", "\"")
        }
        _ => return None,
    };
    truncate_ident(&mut value);
    Some(value)
}

/// The name a `U&"…"` identifier token denotes, as Postgres decodes it:
/// `""` is a quote, `<escape><escape>` the escape character itself,
/// `<escape>XXXX` and `<escape>+XXXXXX` code points in hex (UTF-16 surrogate
/// pairs combine); no case folding; truncated to 63 bytes. `escape` is `\`
/// unless a `UESCAPE` clause names another. `None` where Postgres raises an
/// error (a bad escape, code point 0, an empty name) or for other tokens.
pub fn unicode_ident_value(sql: &str, token: &Token, escape: char) -> Option<String> {
    if token.kind != TokenKind::UnicodeIdent {
        return None;
    }
    let text = sql.get(token.span.clone())?;
    let inner = text.get(3..)?.strip_suffix('"')?.replace("\"\"", "\"");
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars().peekable();
    let mut high: Option<u32> = None;
    while let Some(c) = chars.next() {
        // A doubled escape is the escape character itself.
        let code = if c != escape || chars.next_if_eq(&escape).is_some() {
            None
        } else {
            let digits = if chars.next_if_eq(&'+').is_some() { 6 } else { 4 };
            let mut v = 0u32;
            for _ in 0..digits {
                v = v * 16 + chars.next()?.to_digit(16)?;
            }
            Some(v)
        };
        match (high.take(), code) {
            (None, None) => out.push(c),
            (None, Some(v @ 0xD800..=0xDBFF)) => high = Some(v),
            (Some(h), Some(v @ 0xDC00..=0xDFFF)) => {
                out.push(char::from_u32(0x10000 + ((h - 0xD800) << 10) + (v - 0xDC00))?);
            }
            (None, Some(v)) if v != 0 => out.push(char::from_u32(v)?),
            _ => return None,
        }
    }
    if high.is_some() || out.is_empty() {
        return None;
    }
    truncate_ident(&mut out);
    Some(out)
}

/// Truncates `s` to [`MAX_IDENT_BYTES`] on a char boundary, as Postgres does
/// (with a NOTICE) for over-long identifiers.
pub fn truncate_ident(s: &mut String) {
    if s.len() > MAX_IDENT_BYTES {
        let mut end = MAX_IDENT_BYTES;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

/// Iterates over the tokens of a text, skipping whitespace and comments.
#[derive(Debug, Clone)]
pub struct Lexer<'a> {
    bytes: &'a [u8],
    pos: usize,
    lexing: Lexing,
}

impl<'a> Lexer<'a> {
    /// A lexer over `sql`.
    pub fn new(sql: &'a str, lexing: Lexing) -> Self {
        Self {
            bytes: sql.as_bytes(),
            pos: 0,
            lexing,
        }
    }

    fn at(&self, i: usize) -> Option<u8> {
        self.bytes.get(i).copied()
    }

    /// Skips whitespace and comments; returns whether anything is left.
    fn skip_trivia(&mut self) -> bool {
        loop {
            match self.at(self.pos) {
                None => return false,
                Some(b' ' | b'\t' | b'\n' | b'\r' | b'\x0b' | b'\x0c') => self.pos += 1,
                Some(b'-') if self.at(self.pos + 1) == Some(b'-') => {
                    while !matches!(self.at(self.pos), None | Some(b'\n' | b'\r')) {
                        self.pos += 1;
                    }
                }
                Some(b'/') if self.at(self.pos + 1) == Some(b'*') => self.skip_block_comment(),
                Some(_) => return true,
            }
        }
    }

    /// Skips a (possibly nested) `/* */` comment; unterminated runs to the end.
    fn skip_block_comment(&mut self) {
        let mut depth = 0usize;
        while self.pos < self.bytes.len() {
            if self.bytes[self.pos..].starts_with(b"/*") {
                depth += 1;
                self.pos += 2;
            } else if self.bytes[self.pos..].starts_with(b"*/") {
                depth -= 1;
                self.pos += 2;
                if depth == 0 {
                    return;
                }
            } else {
                self.pos += 1;
            }
        }
    }

    /// Reads a quoted run opened at `self.pos` by `quote`; `backslash` says
    /// whether a backslash escapes the next byte. Doubled quotes escape.
    fn quoted(&mut self, quote: u8, backslash: bool) {
        self.pos += 1;
        while let Some(b) = self.at(self.pos) {
            self.pos += 1;
            if b == b'\\' && backslash {
                // Skip the escaped byte only if it is ASCII, so we never stop
                // inside a multi-byte char; a non-ASCII byte is content anyway.
                if self.at(self.pos).is_some_and(|n| n.is_ascii()) {
                    self.pos += 1;
                }
            } else if b == quote {
                if self.at(self.pos) == Some(quote) {
                    self.pos += 1;
                } else {
                    return;
                }
            }
        }
    }

    /// At a `$`: a parameter, a dollar-quoted string, or a lone `$`.
    fn dollar(&mut self) -> TokenKind {
        let start = self.pos;
        if self.at(start + 1).is_some_and(|b| b.is_ascii_digit()) {
            self.pos += 1;
            while self.at(self.pos).is_some_and(|b| b.is_ascii_digit()) {
                self.pos += 1;
            }
            return TokenKind::Param;
        }
        let mut end = start + 1;
        if self.at(end).is_some_and(is_ident_start) {
            while self.at(end).is_some_and(is_ident_cont_no_dollar) {
                end += 1;
            }
        }
        if self.at(end) != Some(b'$') {
            self.pos += 1;
            return TokenKind::Punct(b'$');
        }
        let tag = &self.bytes[start..=end];
        let body = end + 1;
        self.pos = match memchr::memmem::find(&self.bytes[body..], tag) {
            Some(i) => body + i + tag.len(),
            None => self.bytes.len(),
        };
        TokenKind::DollarString
    }

    /// At an identifier start: a word, or a prefixed string / identifier.
    fn word(&mut self) -> TokenKind {
        let start = self.pos;
        while self.at(self.pos).is_some_and(is_ident_cont) {
            self.pos += 1;
        }
        let word = &self.bytes[start..self.pos];
        let next = self.at(self.pos);
        if word.len() == 1 && next == Some(b'\'') {
            match word[0].to_ascii_lowercase() {
                b'e' => {
                    self.quoted(b'\'', true);
                    return TokenKind::EscapeString;
                }
                // National strings follow the plain-string rules; bit
                // strings never process backslashes.
                b'n' => {
                    self.quoted(b'\'', !self.lexing.standard_conforming_strings);
                    return TokenKind::String;
                }
                b'b' | b'x' => {
                    self.quoted(b'\'', false);
                    return TokenKind::String;
                }
                _ => {}
            }
        }
        if word.eq_ignore_ascii_case(b"u") && next == Some(b'&') {
            match self.at(self.pos + 1) {
                Some(b'\'') => {
                    self.pos += 1;
                    self.quoted(b'\'', false);
                    return TokenKind::UnicodeString;
                }
                Some(b'"') => {
                    self.pos += 1;
                    self.quoted(b'"', false);
                    return TokenKind::UnicodeIdent;
                }
                _ => {}
            }
        }
        TokenKind::Word
    }
}

impl Iterator for Lexer<'_> {
    type Item = Token;

    fn next(&mut self) -> Option<Token> {
        if !self.skip_trivia() {
            return None;
        }
        let start = self.pos;
        let b = self.bytes[start];
        let kind = match b {
            b'\'' => {
                self.quoted(b'\'', !self.lexing.standard_conforming_strings);
                TokenKind::String
            }
            b'"' => {
                self.quoted(b'"', false);
                TokenKind::QuotedIdent
            }
            b'$' => self.dollar(),
            b'0'..=b'9' => self.number(),
            b'.' if self.at(start + 1).is_some_and(|n| n.is_ascii_digit()) => self.number(),
            _ if is_ident_start(b) => self.word(),
            _ => {
                self.pos += 1;
                TokenKind::Punct(b)
            }
        };
        Some(Token {
            kind,
            span: start..self.pos,
        })
    }
}

impl Lexer<'_> {
    /// Reads a number loosely: digits, `.`, letters (exponents, `0x`, `_`).
    /// `1..2` never occurs in valid SQL, so over-reading is harmless.
    fn number(&mut self) -> TokenKind {
        self.pos += 1;
        while self
            .at(self.pos)
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
        {
            self.pos += 1;
        }
        TokenKind::Number
    }
}

/// Postgres' `ident_start`: a letter, `_`, or any byte of a non-ASCII char.
fn is_ident_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b >= 0x80
}

/// Postgres' `ident_cont`: also digits and `$`.
fn is_ident_cont(b: u8) -> bool {
    is_ident_cont_no_dollar(b) || b == b'$'
}

fn is_ident_cont_no_dollar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(sql: &str) -> Vec<(TokenKind, &str)> {
        Lexer::new(sql, Lexing::default())
            .map(|t| (t.kind, &sql[t.span]))
            .collect()
    }

    #[test]
    fn tokens_follow_postgres_rules() {
        use TokenKind::*;
        assert_eq!(
            kinds("SELECT 'a''b', E'x\\'y', $q$ ; $q$, \"A\"\"b\", $1, U&\"d\" /* /* */ */ x -- c\n;"),
            vec![
                (Word, "SELECT"),
                (String, "'a''b'"),
                (Punct(b','), ","),
                (EscapeString, "E'x\\'y'"),
                (Punct(b','), ","),
                (DollarString, "$q$ ; $q$"),
                (Punct(b','), ","),
                (QuotedIdent, "\"A\"\"b\""),
                (Punct(b','), ","),
                (Param, "$1"),
                (Punct(b','), ","),
                (UnicodeIdent, "U&\"d\""),
                (Word, "x"),
                (Punct(b';'), ";"),
            ]
        );
    }

    #[test]
    fn backslash_quotes_depend_on_standard_conforming_strings() {
        let sql = r"'x\''; DELETE";
        let on: Vec<_> = Lexer::new(sql, Lexing::default()).map(|t| t.kind).collect();
        assert_eq!(on, vec![TokenKind::String]);
        let off = Lexing {
            standard_conforming_strings: false,
        };
        let off: Vec<_> = Lexer::new(sql, off).map(|t| t.kind).collect();
        assert_eq!(off, vec![TokenKind::String, TokenKind::Punct(b';'), TokenKind::Word]);
    }

    #[test]
    fn identifiers_fold_and_truncate() {
        let sql = format!("Inv \"Inv\" {}", "a".repeat(70));
        let toks: Vec<_> = Lexer::new(&sql, Lexing::default()).collect();
        assert_eq!(ident_value(&sql, &toks[0]).as_deref(), Some("inv"));
        assert_eq!(ident_value(&sql, &toks[1]).as_deref(), Some("Inv"));
        assert_eq!(ident_value(&sql, &toks[2]).map(|s| s.len()), Some(63));
    }
}
