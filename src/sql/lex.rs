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
//! `B'…'` and `X'…'` strings (where `''` is no escape), `"…"` and `U&"…"`
//! identifiers, dollar quotes (`$$…$$`, `$tag$…$tag$`) and positional
//! parameters (`$1`). A `'…'` literal of any kind continues over whitespace
//! that holds a newline (and may hold `--` comments) into a next `'…'`, which
//! is read by the first one's rules: `E'a'` newline `'\''` is one escape
//! string. Anything unterminated runs to the end of the text, which is what
//! Postgres does before it reports the syntax error.

use std::borrow::Cow;
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
    /// `UESCAPE` clause after it. Where a table name decides what a statement
    /// may write, callers assume it could be any name; [`unicode_ident_value`]
    /// decodes the names of savepoints, prepared statements and EXPLAIN
    /// options, whose callers fail closed where it cannot.
    UnicodeIdent,
    /// A plain `'…'` string, or `B'…'`, `X'…'`, `N'…'`. Like the other
    /// string kinds, it may be continued: `'a'` newline `'b'` is one token.
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
    let mut out = unicode_unescape(&inner, escape)?;
    if out.is_empty() {
        return None;
    }
    truncate_ident(&mut out);
    Some(out)
}

/// The text a `U&'…'` string token denotes, decoded as [`unicode_ident_value`] decodes
/// (`''` is a quote; it may be empty and is not truncated). `None` where Postgres raises
/// an error, and for a string continued over a newline, which this does not read.
pub fn unicode_string_value(sql: &str, token: &Token, escape: char) -> Option<String> {
    if token.kind != TokenKind::UnicodeString {
        return None;
    }
    let inner = sql.get(token.span.clone())?.get(3..)?.strip_suffix('\'')?;
    let unquoted = inner.replace("''", "");
    if unquoted.contains('\'') {
        return None;
    }
    unicode_unescape(&inner.replace("''", "'"), escape)
}

/// `<escape><escape>` is the escape character, `<escape>XXXX` and `<escape>+XXXXXX` code
/// points in hex (UTF-16 surrogate pairs combine). `None` for a bad escape or code point 0.
fn unicode_unescape(inner: &str, escape: char) -> Option<String> {
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
    if high.is_some() {
        return None;
    }
    Some(out)
}

/// The text of a one-piece string read with backslash escapes (`E'…'`, or `'…'` with
/// `standard_conforming_strings` off); `raw` starts at its opening quote. `\b \f \n \r
/// \t`, octal `\o`…`\ooo`, hex `\xh`/`\xhh`, `\uXXXX` and `\UXXXXXXXX` are decoded, any
/// other escaped character is itself. `None` for a continued string, and where an escape
/// gives anything but ASCII (its bytes would depend on the server's encoding) or a byte 0.
pub fn escaped_string_value(raw: &str) -> Option<String> {
    let inner = raw.strip_prefix('\'')?.strip_suffix('\'')?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars().peekable();
    let digits = |chars: &mut std::iter::Peekable<std::str::Chars>, radix: u32, max: usize, first: u32| {
        let mut v = first;
        for _ in 0..max {
            match chars.peek().and_then(|c| c.to_digit(radix)) {
                Some(d) => {
                    v = v * radix + d;
                    chars.next();
                }
                None => break,
            }
        }
        v
    };
    while let Some(c) = chars.next() {
        let decoded = match c {
            // A lone quote ends a piece: the string is continued.
            '\'' => chars.next_if_eq(&'\'').map(|_| 0x27)?,
            '\\' => match chars.next()? {
                'b' => 0x08,
                'f' => 0x0c,
                'n' => 0x0a,
                'r' => 0x0d,
                't' => 0x09,
                // Postgres keeps the low byte of a larger octal value.
                d @ '0'..='7' => digits(&mut chars, 8, 2, d.to_digit(8)?) & 0xFF,
                'x' if chars.peek().is_some_and(char::is_ascii_hexdigit) => digits(&mut chars, 16, 2, 0),
                u @ ('u' | 'U') => {
                    let n = if u == 'u' { 4 } else { 8 };
                    let mut v = 0u32;
                    for _ in 0..n {
                        v = v.checked_mul(16)? + chars.next()?.to_digit(16)?;
                    }
                    v
                }
                other => u32::from(other),
            },
            other => u32::from(other),
        };
        // Plain characters pass as they are; escapes must give ASCII.
        match char::from_u32(decoded) {
            Some(ch) if ch == c || (ch.is_ascii() && decoded != 0) => out.push(ch),
            _ => return None,
        }
    }
    Some(out)
}

/// The escape character a `UESCAPE 'c'` clause gives, from its string token: any string
/// constant Postgres reads as one character, `'!'`, `E'!'` (without backslashes) or `$$!$$`.
/// `None` where Postgres refuses it (not one byte, a hex digit, `+`, a quote or
/// whitespace), and for a string this does not read (an escape in `E'…'`, a continued
/// one), which Postgres may accept: callers must fail closed on `None`.
pub fn uescape_char(sql: &str, token: &Token) -> Option<char> {
    let text = sql.get(token.span.clone())?;
    fn quoted(t: &str) -> Option<&str> {
        t.strip_prefix('\'')?.strip_suffix('\'')
    }
    let inner = match token.kind {
        TokenKind::String => quoted(text)?,
        // The `E` (or `e`) first.
        TokenKind::EscapeString if !text.contains('\\') => quoted(text.get(1..)?)?,
        TokenKind::DollarString => {
            // `$tag$…$tag$`: the tag ends at the second `$`.
            let tag = text.get(1..)?.find('$')? + 2;
            text.get(tag..text.len().checked_sub(tag)?)?
        }
        _ => return None,
    };
    let refused = |b: u8| {
        b.is_ascii_hexdigit()
            || matches!(
                b,
                b'+' | b'\'' | b'"' | b' ' | b'\t' | b'\n' | b'\r' | b'\x0b' | b'\x0c'
            )
    };
    match inner.as_bytes() {
        &[b] if b.is_ascii() && !refused(b) => Some(char::from(b)),
        _ => None,
    }
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

/// Whether `sql` has a string literal that sqlparser's tokenizer reads as
/// other tokens than Postgres, so that its parse of `sql` cannot be trusted:
/// one continued over a newline (`E'a'` newline `'\' --'` is one escape
/// string to Postgres, two strings and a comment to sqlparser), or, with
/// `standard_conforming_strings` off, a plain string with a backslash (an
/// escape to Postgres, a literal backslash to sqlparser).
pub fn sqlparser_misreads(sql: &str, lexing: Lexing) -> bool {
    misread_literals(sql, lexing).next().is_some()
}

/// The literals of `sql` that [`sqlparser_misreads`], in order.
fn misread_literals(sql: &str, lexing: Lexing) -> impl Iterator<Item = Token> + '_ {
    let mut lexer = Lexer::new(sql, lexing);
    std::iter::from_fn(move || {
        let t = lexer.next()?;
        Some((t, std::mem::take(&mut lexer.continued)))
    })
    .filter_map(move |(t, continued)| {
        let escapes = !lexing.standard_conforming_strings
            && t.kind == TokenKind::String
            && sql.get(t.span.clone()).is_some_and(|s| s.contains('\\'));
        (continued || escapes).then_some(t)
    })
}

/// `sql` as sqlparser reads the statement Postgres reads, for checking its structure (the
/// values are lost); borrowed when nothing needs to change:
/// - each literal that [`sqlparser_misreads`] replaced by an empty literal of its kind (its
///   prefix, then `''`);
/// - an INSERT's query before `ON CONFLICT` in parentheses ([`queries_before_on_conflict`]).
pub fn for_sqlparser(sql: &str, lexing: Lexing) -> Cow<'_, str> {
    let mut out = String::new();
    let mut copied = 0;
    for t in misread_literals(sql, lexing) {
        let text = &sql[t.span.clone()];
        let prefix = text.find('\'').map_or("", |quote| &text[..quote]);
        out.push_str(&sql[copied..t.span.start]);
        out.push_str(prefix);
        out.push_str("''");
        copied = t.span.end;
    }
    let emptied = if copied == 0 {
        Cow::Borrowed(sql)
    } else {
        out.push_str(&sql[copied..]);
        Cow::Owned(out)
    };
    let queries = queries_before_on_conflict(&emptied, lexing);
    if queries.is_empty() {
        return emptied;
    }
    let mut marks: Vec<(usize, char)> = queries.iter().flat_map(|q| [(q.start, '('), (q.end, ')')]).collect();
    marks.sort_by_key(|m| m.0);
    let mut out = String::with_capacity(emptied.len() + marks.len());
    let mut copied = 0;
    for (at, c) in marks {
        out.push_str(&emptied[copied..at]);
        out.push(c);
        copied = at;
    }
    out.push_str(&emptied[copied..]);
    Cow::Owned(out)
}

/// The queries of INSERTs that `ON CONFLICT` follows, each from its first keyword (`SELECT`
/// or `WITH`) to the `ON`. sqlparser takes an `ON` after a select list for a column alias
/// (`INSERT … SELECT $1, $2 ON CONFLICT …`), which Postgres never does (`ON` is reserved);
/// in parentheses the query means the same to Postgres and ends where sqlparser can see it.
fn queries_before_on_conflict(sql: &str, lexing: Lexing) -> Vec<Range<usize>> {
    /// Per parenthesis level: an INSERT was seen, and where its query starts.
    #[derive(Default)]
    struct Level {
        insert: bool,
        query: Option<usize>,
    }
    let mut found = Vec::new();
    let mut levels = vec![Level::default()];
    let tokens: Vec<Token> = Lexer::new(sql, lexing).collect();
    for (i, t) in tokens.iter().enumerate() {
        if t.is_punct(b'(') {
            levels.push(Level::default());
            continue;
        }
        if t.is_punct(b')') {
            if levels.len() > 1 {
                levels.pop();
            }
            continue;
        }
        let Some(level) = levels.last_mut() else { break };
        if t.is_word(sql, "insert") {
            *level = Level {
                insert: true,
                query: None,
            };
        } else if level.insert && level.query.is_none() && (t.is_word(sql, "select") || t.is_word(sql, "with")) {
            level.query = Some(t.span.start);
        } else if t.is_word(sql, "on")
            && tokens.get(i + 1).is_some_and(|n| n.is_word(sql, "conflict"))
            // `conflict` may name a table or column (`JOIN conflict ON conflict.id = …`): the
            // clause goes on with its target or action.
            && tokens
                .get(i + 2)
                .is_some_and(|n| n.is_punct(b'(') || n.is_word(sql, "on") || n.is_word(sql, "do"))
        {
            if let Some(start) = level.query.take() {
                found.push(start..t.span.start);
            }
            level.insert = false;
        }
    }
    found
}

/// How the body of a `'…'` literal is read, as in Postgres' lexer states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    /// `''` is a quote; backslashes are content (`xq`, `xus`).
    Plain,
    /// `''` is a quote and a backslash escapes the next byte (`xe`).
    Escapes,
    /// The first `'` ends the segment (`xb`, `xh`: `B'1''0'` is `B'1'`
    /// followed by `'0'`).
    Bits,
}

/// Iterates over the tokens of a text, skipping whitespace and comments.
#[derive(Debug, Clone)]
pub struct Lexer<'a> {
    bytes: &'a [u8],
    pos: usize,
    lexing: Lexing,
    /// Whether a string literal read so far was continued.
    continued: bool,
}

impl<'a> Lexer<'a> {
    /// A lexer over `sql`.
    pub fn new(sql: &'a str, lexing: Lexing) -> Self {
        Self {
            bytes: sql.as_bytes(),
            pos: 0,
            lexing,
            continued: false,
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

    /// Reads a `"…"` identifier opened at `self.pos`; `""` is a quote.
    fn quoted_ident(&mut self) {
        self.pos += 1;
        while let Some(b) = self.at(self.pos) {
            self.pos += 1;
            if b == b'"' {
                if self.at(self.pos) == Some(b'"') {
                    self.pos += 1;
                } else {
                    return;
                }
            }
        }
    }

    /// Reads a `'…'` literal opened at `self.pos`, with its continuations:
    /// Postgres reads every segment by the rules of the first (`body`).
    fn string(&mut self, body: Body) {
        self.pos += 1;
        while let Some(b) = self.at(self.pos) {
            self.pos += 1;
            if b == b'\\' && body == Body::Escapes {
                // Skip the escaped byte only if it is ASCII, so we never stop
                // inside a multi-byte char; a non-ASCII byte is content anyway.
                if self.at(self.pos).is_some_and(|n| n.is_ascii()) {
                    self.pos += 1;
                }
            } else if b == b'\'' {
                if body != Body::Bits && self.at(self.pos) == Some(b'\'') {
                    self.pos += 1;
                } else if let Some(next) = self.continuation() {
                    self.continued = true;
                    self.pos = next + 1;
                } else {
                    return;
                }
            }
        }
    }

    /// Just after a literal's closing quote: where the quote that continues it
    /// is, if one does (see [`continuation`]).
    fn continuation(&self) -> Option<usize> {
        continuation(self.bytes, self.pos)
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
                    self.string(Body::Escapes);
                    return TokenKind::EscapeString;
                }
                // National strings follow the plain-string rules.
                b'n' => {
                    self.string(self.plain_body());
                    return TokenKind::String;
                }
                b'b' | b'x' => {
                    self.string(Body::Bits);
                    return TokenKind::String;
                }
                _ => {}
            }
        }
        if word.eq_ignore_ascii_case(b"u") && next == Some(b'&') {
            match self.at(self.pos + 1) {
                Some(b'\'') => {
                    self.pos += 1;
                    self.string(Body::Plain);
                    return TokenKind::UnicodeString;
                }
                Some(b'"') => {
                    self.pos += 1;
                    self.quoted_ident();
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
                self.string(self.plain_body());
                TokenKind::String
            }
            b'"' => {
                self.quoted_ident();
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
    /// How a plain `'…'` (or `N'…'`) string is read: Postgres reads it as an
    /// escape string when `standard_conforming_strings` is off.
    fn plain_body(&self) -> Body {
        if self.lexing.standard_conforming_strings {
            Body::Plain
        } else {
            Body::Escapes
        }
    }

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

/// The value of one plain `'…'` literal as Postgres reads it with backslashes taken
/// literally: doubled quotes undone, segments continued over a newline (`'5'` newline
/// `'0'` is `50`) joined. `None` if `raw` is not exactly one such literal.
pub(crate) fn plain_string_value(raw: &str) -> Option<String> {
    let b = raw.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut pos = 0;
    loop {
        if b.get(pos) != Some(&b'\'') {
            return None;
        }
        pos += 1;
        loop {
            let c = *b.get(pos)?;
            pos += 1;
            if c == b'\'' {
                if b.get(pos) != Some(&b'\'') {
                    break;
                }
                pos += 1;
            }
            out.push(c);
        }
        if pos == b.len() {
            return String::from_utf8(out).ok();
        }
        pos = continuation(b, pos)?;
    }
}

/// At byte `pos`, just after a literal's closing quote: where the quote that continues
/// it is, if one does. Postgres' `quotecontinue`: whitespace and `--` comments with at
/// least one newline (`\n` or `\r`) between the quotes.
fn continuation(bytes: &[u8], pos: usize) -> Option<usize> {
    let at = |i: usize| bytes.get(i).copied();
    let mut i = pos;
    let mut newline = false;
    loop {
        match at(i)? {
            b' ' | b'\t' | b'\x0b' | b'\x0c' => i += 1,
            b'\n' | b'\r' => {
                newline = true;
                i += 1;
            }
            b'-' if at(i + 1) == Some(b'-') => {
                while !matches!(at(i), None | Some(b'\n' | b'\r')) {
                    i += 1;
                }
            }
            b'\'' if newline => return Some(i),
            _ => return None,
        }
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
    fn plain_string_values_join_continued_segments() {
        for (raw, want) in [
            ("'a''b'", Some("a'b")),
            ("''", Some("")),
            ("'x'\n'y'", Some("xy")),
            ("'x' -- c'\r'y'\n\t'z'", Some("xyz")),
            ("'x' 'y'", None),
            ("'x'\n", None),
            ("'abc''", None),
            ("'open", None),
            ("x'a'", None),
        ] {
            assert_eq!(plain_string_value(raw).as_deref(), want, "{raw:?}");
        }
        // Every string the lexer reads as one literal has a value.
        let sql = "'x'\n'y' -- c\n";
        let tok = Lexer::new(sql, Lexing::default()).next().unwrap();
        assert_eq!(plain_string_value(&sql[tok.span]).as_deref(), Some("xy"));
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
    fn literals_continue_over_newlines_by_the_first_segments_rules() {
        use TokenKind::*;
        let cases: &[(&str, &[(TokenKind, &str)])] = &[
            // `\'` does not end the second segment of an escape string.
            (
                "E'x'\n'\\'; SELECT 1; --' ; UPDATE",
                &[
                    (EscapeString, "E'x'\n'\\'; SELECT 1; --'"),
                    (Punct(b';'), ";"),
                    (Word, "UPDATE"),
                ],
            ),
            ("E'a'\r'b'", &[(EscapeString, "E'a'\r'b'")]),
            ("'a'\n'\\' x", &[(String, "'a'\n'\\'"), (Word, "x")]),
            ("U&'a'\n'\\' x", &[(UnicodeString, "U&'a'\n'\\'"), (Word, "x")]),
            ("x'1'\n'f' y", &[(String, "x'1'\n'f'"), (Word, "y")]),
            // Comments and any whitespace may surround the newline.
            (
                "'a' -- c\n\t-- d\r\n 'b' x",
                &[(String, "'a' -- c\n\t-- d\r\n 'b'"), (Word, "x")],
            ),
            ("'a'\x0b\n\x0c'b'", &[(String, "'a'\x0b\n\x0c'b'")]),
            ("'a'\n'''b'", &[(String, "'a'\n'''b'")]),
            ("'a'\n''", &[(String, "'a'\n''")]),
            // No newline, a block comment, or no quote after: no continuation.
            ("'a' 'b'", &[(String, "'a'"), (String, "'b'")]),
            ("'a' /* c */\n'b'", &[(String, "'a'"), (String, "'b'")]),
            ("'a'\n-", &[(String, "'a'"), (Punct(b'-'), "-")]),
            ("'a'\n-- 'b'", &[(String, "'a'")]),
            // Quoted identifiers and dollar quotes never continue.
            ("\"a\"\n\"b\"", &[(QuotedIdent, "\"a\""), (QuotedIdent, "\"b\"")]),
            ("$$a$$\n'b'", &[(DollarString, "$$a$$"), (String, "'b'")]),
            // In bit strings `''` is no quote: `B'1'` ends at its second quote.
            ("B'1''0'", &[(String, "B'1'"), (String, "'0'")]),
            ("b'1'\n'0''x'", &[(String, "b'1'\n'0'"), (String, "'x'")]),
        ];
        for (sql, want) in cases {
            assert_eq!(kinds(sql), *want, "{sql:?}");
        }
        let off = Lexing {
            standard_conforming_strings: false,
        };
        for sql in ["'a'\n'\\' x --'", "N'a'\n'\\' x --'"] {
            let toks: Vec<_> = Lexer::new(sql, off).map(|t| (t.kind, t.span)).collect();
            assert_eq!(toks, vec![(TokenKind::String, 0..sql.len())], "{sql:?}");
        }
    }

    #[test]
    fn sqlparser_misreads_continued_literals_and_escapes_it_does_not_know() {
        let off = Lexing {
            standard_conforming_strings: false,
        };
        assert!(sqlparser_misreads("SELECT 'a'\n'b'", Lexing::default()));
        assert!(sqlparser_misreads("SELECT 'a\\b'", off));
        assert!(!sqlparser_misreads("SELECT 'a\\b'", Lexing::default()));
        assert!(!sqlparser_misreads("SELECT E'a\\b', 'c'\n, 'd' -- 'e'", off));
    }

    #[test]
    fn for_sqlparser_empties_the_literals_it_misreads() {
        let off = Lexing {
            standard_conforming_strings: false,
        };
        let on = Lexing::default();
        assert!(matches!(for_sqlparser("SELECT 'a', E'\\''", off), Cow::Borrowed(_)));
        assert_eq!(for_sqlparser("SELECT 'a'\n'b', 1", on), "SELECT '', 1");
        assert_eq!(
            for_sqlparser("SELECT E'a'\n'\\' --'\n, x -- y\n, U&'c' -- z\n'd' UESCAPE '!'", on),
            "SELECT E''\n, x -- y\n, U&'' UESCAPE '!'"
        );
        assert_eq!(for_sqlparser("SELECT 'a\\\\b', 'c'", off), "SELECT '', 'c'");
        assert_eq!(for_sqlparser("SELECT 'a\\', 'b'", on), "SELECT 'a\\', 'b'");
        // What is left reads as Postgres reads it.
        for (sql, lexing) in [
            ("UPDATE t SET a = 'x'\n'y' WHERE b = E'\\''\n'z' -- c'\n", on),
            ("UPDATE t SET a = 'x\\' || ' WHERE b = 1 --'\n", off),
        ] {
            assert!(sqlparser_misreads(sql, lexing), "{sql}");
            assert!(!sqlparser_misreads(&for_sqlparser(sql, lexing), lexing), "{sql}");
        }
    }

    #[test]
    fn for_sqlparser_puts_an_insert_query_before_on_conflict_in_parentheses() {
        let on = Lexing::default();
        assert_eq!(
            for_sqlparser("INSERT INTO t (a, b) SELECT $1, $2 ON CONFLICT DO NOTHING", on),
            "INSERT INTO t (a, b) (SELECT $1, $2 )ON CONFLICT DO NOTHING"
        );
        assert_eq!(
            for_sqlparser(
                "WITH w AS (INSERT INTO t (a) WITH c AS (SELECT 1) SELECT x FROM c ON CONFLICT (a) DO NOTHING RETURNING a) \
                 INSERT INTO u SELECT a FROM w ON CONFLICT ON CONSTRAINT k DO NOTHING",
                on
            ),
            "WITH w AS (INSERT INTO t (a) (WITH c AS (SELECT 1) SELECT x FROM c )ON CONFLICT (a) DO NOTHING RETURNING a) \
             INSERT INTO u (SELECT a FROM w )ON CONFLICT ON CONSTRAINT k DO NOTHING"
        );
        // Values, a query in parentheses already, no ON CONFLICT, a comment or a literal: untouched.
        for sql in [
            "INSERT INTO t (a) VALUES (1) ON CONFLICT DO NOTHING",
            "INSERT INTO t (a) (SELECT 1) ON CONFLICT DO NOTHING",
            "INSERT INTO t (a) SELECT 1 RETURNING a",
            "INSERT INTO t (a) SELECT 'on conflict' -- on conflict",
            "SELECT 1 FROM a JOIN b ON conflict",
            "INSERT INTO t (a) SELECT s.a FROM s JOIN conflict ON conflict.id = s.id",
        ] {
            assert!(matches!(for_sqlparser(sql, on), Cow::Borrowed(_)), "{sql}");
        }
        // With a misread literal emptied first.
        assert_eq!(
            for_sqlparser("INSERT INTO t (a) SELECT 'x'\n'y' ON CONFLICT DO NOTHING", on),
            "INSERT INTO t (a) (SELECT '' )ON CONFLICT DO NOTHING"
        );
    }

    #[test]
    fn uescape_characters_are_single_bytes_postgres_accepts() {
        let escape = |sql: &str| {
            let t = Lexer::new(sql, Lexing::default()).next()?;
            uescape_char(sql, &t)
        };
        assert_eq!(escape("'!'"), Some('!'));
        assert_eq!(escape("'\\'"), Some('\\'));
        for refused in ["'é'", "'a'", "'+'", "' '", "'\"'", "'!!'", "''"] {
            assert_eq!(escape(refused), None, "{refused}");
        }
        // Any string constant of one character, as Postgres takes it.
        for read in ["E'!'", "e'!'", "$$!$$", "$x$!$x$"] {
            assert_eq!(escape(read), Some('!'), "{read}");
        }
        for refused in ["E'a'", "$$+$$", "$x$!!$x$", "$$$$"] {
            assert_eq!(escape(refused), None, "{refused}");
        }
        // Not read (Postgres takes them): the callers fail closed.
        for unread in ["E'\\041'", "'!'\n''"] {
            assert_eq!(escape(unread), None, "{unread}");
        }
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
