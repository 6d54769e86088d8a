//! A statement's tokens with their nesting depth, and the searches the
//! rewriter makes over them.
//!
//! Depth counts open `(`, `[` and `CASE … END`: a clause keyword of a
//! statement is found only at the statement's own depth, so `WHERE` inside a
//! subquery, `FROM` inside `EXTRACT(… FROM …)` or `WHEN` inside a `CASE`
//! never count as the statement's. Opening and closing tokens carry the outer
//! depth; what they enclose is one deeper.

use std::ops::Range;

use crate::sql::lex::{Lexer, Lexing, TokenKind, ident_value};

/// One token and its nesting depth.
#[derive(Debug, Clone)]
pub(super) struct Tok {
    pub(super) kind: TokenKind,
    pub(super) span: Range<usize>,
    pub(super) depth: u32,
}

/// The tokens of one text.
#[derive(Debug)]
pub(super) struct Toks<'a> {
    pub(super) text: &'a str,
    pub(super) toks: Vec<Tok>,
}

/// Words that start a clause after an expression: a `FROM` in `IS DISTINCT
/// FROM` or a keyword used as a column label (`AS from`, `t.from`) is not one.
fn is_label_position(prev: Option<&str>) -> bool {
    matches!(prev, Some(p) if p.eq_ignore_ascii_case("as") || p.eq_ignore_ascii_case("distinct") || p == ".")
}

impl<'a> Toks<'a> {
    /// Lexes `text`; `None` if parentheses, brackets or CASE/END do not balance.
    pub(super) fn new(text: &'a str, lexing: Lexing) -> Option<Self> {
        let mut depth = 0u32;
        let mut toks = Vec::new();
        let mut prev: Option<&str> = None;
        for t in Lexer::new(text, lexing) {
            // `AS end` and `t.case` are column labels, not a CASE's ends.
            let label = matches!(prev, Some(p) if p.eq_ignore_ascii_case("as") || p == ".");
            let word = |kw: &str| !label && t.is_word(text, kw);
            let (own, next) = if t.is_punct(b'(') || t.is_punct(b'[') || word("case") {
                (depth, depth + 1)
            } else if t.is_punct(b')') || t.is_punct(b']') || word("end") {
                let d = depth.checked_sub(1)?;
                (d, d)
            } else {
                (depth, depth)
            };
            prev = text.get(t.span.clone());
            toks.push(Tok {
                kind: t.kind,
                span: t.span,
                depth: own,
            });
            depth = next;
        }
        (depth == 0).then_some(Self { text, toks })
    }

    /// The token's text ("" out of range).
    pub(super) fn src(&self, i: usize) -> &'a str {
        self.toks
            .get(i)
            .and_then(|t| self.text.get(t.span.clone()))
            .unwrap_or("")
    }

    /// Whether token `i` is the unquoted keyword `kw`.
    pub(super) fn is(&self, i: usize, kw: &str) -> bool {
        self.toks.get(i).is_some_and(|t| t.kind == TokenKind::Word) && self.src(i).eq_ignore_ascii_case(kw)
    }

    /// Whether token `i` is the punctuation byte `b`.
    pub(super) fn punct(&self, i: usize, b: u8) -> bool {
        self.toks.get(i).is_some_and(|t| t.kind == TokenKind::Punct(b))
    }

    /// The depth of token `i`.
    pub(super) fn depth(&self, i: usize) -> u32 {
        self.toks.get(i).map_or(0, |t| t.depth)
    }

    /// The identifier token `i` denotes (folded, unquoted), if it is one.
    pub(super) fn ident(&self, i: usize) -> Option<String> {
        let t = self.toks.get(i)?;
        let tok = crate::sql::lex::Token {
            kind: t.kind,
            span: t.span.clone(),
        };
        ident_value(self.text, &tok)
    }

    /// Byte offset where token `i` starts.
    pub(super) fn start(&self, i: usize) -> usize {
        self.toks.get(i).map_or(self.text.len(), |t| t.span.start)
    }

    /// Byte offset where token `i` ends.
    pub(super) fn end(&self, i: usize) -> usize {
        self.toks.get(i).map_or(self.text.len(), |t| t.span.end)
    }

    /// The first token in `from..to` at `depth` that is one of the clause
    /// keywords `kws` (not in a label position).
    pub(super) fn clause(&self, from: usize, to: usize, depth: u32, kws: &[&str]) -> Option<usize> {
        (from..to.min(self.toks.len())).find(|&i| {
            self.depth(i) == depth
                && kws.iter().any(|k| self.is(i, k))
                && !is_label_position(i.checked_sub(1).map(|p| self.src(p)))
        })
    }

    /// For an opening `(` at `open`, the index of its `)`.
    pub(super) fn close(&self, open: usize) -> Option<usize> {
        let d = self.depth(open);
        (open + 1..self.toks.len()).find(|&i| self.depth(i) == d && self.punct(i, b')'))
    }

    /// The comma-separated items of `from..to` at `depth`, as index ranges
    /// (an empty range for an empty item).
    pub(super) fn items(&self, from: usize, to: usize, depth: u32) -> Vec<Range<usize>> {
        let mut out = Vec::new();
        let mut start = from;
        for i in from..to {
            if self.depth(i) == depth && self.punct(i, b',') {
                out.push(start..i);
                start = i + 1;
            }
        }
        out.push(start..to);
        out
    }
}
