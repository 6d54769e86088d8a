//! Error positions in the client's own text.
//!
//! When pgfence sends Postgres a text other than the client's (a guard spliced in
//! before a fenced write, a rejection in place of a statement, a statement rewritten
//! in rewrite mode), the position Postgres gives in an ErrorResponse (`P`: a 1-based
//! count of characters into the text it received) counts in that text. [`Positions`]
//! records how the sent text was put together, so that the position can be given in
//! the client's text again, and psql's caret or a driver's error position points
//! where it would without pgfence.

use crate::fence::epoch::Epoch;
use crate::sql::FenceId;

use super::context::DbFences;

/// How Postgres counts an error's position: in characters, or in bytes in a `SQL_ASCII`
/// database (which keeps texts as it gets them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// Characters (the client's encoding is UTF8).
    Chars,
    /// Bytes (the database is `SQL_ASCII`).
    Bytes,
}

impl Count {
    /// How many of these units `s[..byte]` holds (`byte` clamped to `s`).
    pub fn at(self, s: &str, byte: usize) -> usize {
        match self {
            Count::Chars => char_offset(s, byte),
            Count::Bytes => byte.min(s.len()),
        }
    }

    /// The byte offset in `s` where unit `n` starts, or `None` past its end.
    pub fn byte(self, s: &str, n: usize) -> Option<usize> {
        match self {
            Count::Chars => byte_offset(s, n),
            Count::Bytes => (n <= s.len()).then_some(n),
        }
    }
}

/// A length in both units.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Len {
    bytes: usize,
    chars: usize,
}

impl Len {
    fn of(s: &str) -> Self {
        Self {
            bytes: s.len(),
            chars: s.chars().count(),
        }
    }

    fn get(self, count: Count) -> usize {
        match count {
            Count::Chars => self.chars,
            Count::Bytes => self.bytes,
        }
    }
}

/// How a sent text was made from the client's, piece by piece.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Positions {
    pieces: Vec<Piece>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    /// Client's text, sent as it is.
    Copied(Len),
    /// `sent` written by pgfence in place of `orig` of the client's text (nothing for an
    /// insertion): a position inside it stands for where it is.
    Replaced { sent: Len, orig: Len },
    /// A statement rewritten as `redo` says (rewrite mode), `sent` in place of the client's
    /// `original`.
    Rewritten { sent: Len, original: Box<str>, redo: Redo },
}

/// What a rewritten statement needs to be rewritten again, the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Redo {
    /// The rewrite-mode fence.
    pub fence: FenceId,
    /// The epoch it was rewritten for.
    pub epoch: Epoch,
    /// The session's `standard_conforming_strings` at the time.
    pub standard_conforming_strings: bool,
}

impl Positions {
    /// The client's `text`, sent as it is.
    pub fn copied(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        let n = Len::of(text);
        match self.pieces.last_mut() {
            Some(Piece::Copied(m)) => {
                m.bytes += n.bytes;
                m.chars += n.chars;
            }
            _ => self.pieces.push(Piece::Copied(n)),
        }
    }

    /// pgfence's `sent` in place of the client's `original` (empty for an insertion).
    pub fn replaced(&mut self, sent: &str, original: &str) {
        self.pieces.push(Piece::Replaced {
            sent: Len::of(sent),
            orig: Len::of(original),
        });
    }

    /// The rewrite `sent` of the client's statement `original`.
    pub fn rewritten(&mut self, sent: &str, original: &str, redo: Redo) {
        self.pieces.push(Piece::Rewritten {
            sent: Len::of(sent),
            original: original.into(),
            redo,
        });
    }

    /// The client's position for Postgres' 1-based position `sent` in the text sent,
    /// both counted as `count` says. Positions inside text pgfence wrote point at the start
    /// of what it stands for; one past the end (Postgres' "at end of input") stays one past
    /// the end.
    pub fn client_position(&self, sent: usize, count: Count, fences: Option<&DbFences>) -> usize {
        let Some(mut at) = sent.checked_sub(1) else {
            return sent;
        };
        let mut orig = 0;
        for piece in &self.pieces {
            match piece {
                Piece::Copied(n) => {
                    let n = n.get(count);
                    if at < n {
                        return orig + at + 1;
                    }
                    at -= n;
                    orig += n;
                }
                Piece::Replaced { sent, orig: o } => {
                    let sent = sent.get(count);
                    if at < sent {
                        return orig + 1;
                    }
                    at -= sent;
                    orig += o.get(count);
                }
                Piece::Rewritten { sent, original, redo } => {
                    let sent = sent.get(count);
                    if at < sent {
                        let inside = fences.and_then(|f| f.rewrite_source(original, *redo, at, count));
                        return orig + inside.map_or(0, |(at, _)| at) + 1;
                    }
                    at -= sent;
                    orig += Len::of(original).get(count);
                }
            }
        }
        orig + at + 1
    }

    /// The rewrite that Postgres' 1-based position `sent` (counted as `count` says) falls
    /// in text of, when that text is what the rewrite added rather than the client's.
    pub fn in_rewrite_addition(&self, sent: usize, count: Count, fences: &DbFences) -> Option<Redo> {
        let mut at = sent.checked_sub(1)?;
        for piece in &self.pieces {
            let (len, rewritten) = match piece {
                Piece::Copied(n) => (n.get(count), None),
                Piece::Replaced { sent, .. } => (sent.get(count), None),
                Piece::Rewritten { sent, original, redo } => (sent.get(count), Some((original, redo))),
            };
            if at < len {
                let (original, redo) = rewritten?;
                let (_, added) = fences.rewrite_source(original, *redo, at, count)?;
                return added.then_some(*redo);
            }
            at -= len;
        }
        None
    }

    /// The first rewrite in the text.
    pub fn first_rewrite(&self) -> Option<Redo> {
        self.pieces.iter().find_map(|p| match p {
            Piece::Rewritten { redo, .. } => Some(*redo),
            _ => None,
        })
    }
}

/// A text being made from the client's, with how it was made.
#[derive(Debug, Default)]
pub struct SentText {
    /// The text so far.
    pub text: String,
    /// How it was made.
    pub positions: Positions,
}

impl SentText {
    /// An empty text with room for `capacity` bytes.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            text: String::with_capacity(capacity),
            positions: Positions::default(),
        }
    }

    /// Appends the client's `text` as it is.
    pub fn copy(&mut self, text: &str) {
        self.text.push_str(text);
        self.positions.copied(text);
    }

    /// Appends pgfence's `text`, standing for nothing of the client's.
    pub fn add(&mut self, text: &str) {
        self.replace(text, "");
    }

    /// Appends pgfence's `text` in place of the client's `original`.
    pub fn replace(&mut self, text: &str, original: &str) {
        self.text.push_str(text);
        self.positions.replaced(text, original);
    }

    /// Appends the rewrite `text` of the client's statement `original`, made as `redo` says.
    pub fn rewrite(&mut self, text: &str, original: &str, redo: Redo) {
        self.text.push_str(text);
        self.positions.rewritten(text, original, redo);
    }
}

/// The character offset in `s` of byte offset `byte` (clamped to `s`).
pub fn char_offset(s: &str, byte: usize) -> usize {
    let mut byte = byte.min(s.len());
    while !s.is_char_boundary(byte) {
        byte -= 1;
    }
    s[..byte].chars().count()
}

/// The byte offset in `s` of character offset `chars`, or `None` past its end.
pub fn byte_offset(s: &str, chars: usize) -> Option<usize> {
    s.char_indices().map(|(i, _)| i).chain([s.len()]).nth(chars)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_after_an_insertion_move_back() {
        let guard = "SELECT pgfence.guard('f', 5, NULL, true);";
        let client = "UPDATE t SET x = 'é' WHERE id = 'abc'";
        let mut p = Positions::default();
        p.replaced(guard, "");
        p.copied(client);
        let sent = format!("{guard}{client}");
        let abc = sent.find("'abc'").unwrap();
        let at = char_offset(&sent, abc) + 1;
        assert_eq!(
            p.client_position(at, Count::Chars, None),
            char_offset(client, client.find("'abc'").unwrap()) + 1
        );
        // Inside the guard: the statement it stands before.
        assert_eq!(p.client_position(3, Count::Chars, None), 1);
        // One past the end.
        let end = sent.chars().count() + 1;
        assert_eq!(p.client_position(end, Count::Chars, None), client.chars().count() + 1);
    }

    #[test]
    fn a_replacement_keeps_what_follows_in_place() {
        let mut p = Positions::default();
        p.copied("SELECT 1; ");
        p.replaced("DO $$ BEGIN RAISE … END $$", "SET pgfence.epoch = 0");
        p.copied("; SELEC 2");
        let sent = "SELECT 1; DO $$ BEGIN RAISE … END $$; SELEC 2";
        let client = "SELECT 1; SET pgfence.epoch = 0; SELEC 2";
        let at = char_offset(sent, sent.find("SELEC 2").unwrap()) + 1;
        assert_eq!(
            p.client_position(at, Count::Chars, None),
            char_offset(client, client.find("SELEC 2").unwrap()) + 1
        );
        assert_eq!(p.client_position(12, Count::Chars, None), 11);
    }

    #[test]
    fn a_sql_ascii_database_counts_bytes() {
        let client = "SELECT 'ééé', nope; UPDATE t SET x = 1";
        let guard = "SELECT pgfence.guard('f', 5, NULL, true);";
        let mut p = Positions::default();
        p.copied("SELECT 'ééé', nope; ");
        p.replaced(guard, "");
        p.copied("UPDATE t SET x = 1");
        // `nope` before the guard: its position stays, in bytes or in characters.
        let nope = client.find("nope").unwrap();
        assert_eq!(p.client_position(nope + 1, Count::Bytes, None), nope + 1);
        let nope_chars = char_offset(client, nope);
        assert_eq!(p.client_position(nope_chars + 1, Count::Chars, None), nope_chars + 1);
        // After the guard: moved back by its length in that unit.
        let x = client.find("x = 1").unwrap();
        assert_eq!(p.client_position(x + guard.len() + 1, Count::Bytes, None), x + 1);
    }

    #[test]
    fn offsets_count_characters() {
        assert_eq!(char_offset("é'x'", 2), 1);
        assert_eq!(char_offset("é'x'", 1), 0);
        assert_eq!(byte_offset("é'x'", 1), Some(2));
        assert_eq!(byte_offset("é'x'", 4), Some(5));
        assert_eq!(byte_offset("é'x'", 5), None);
    }
}
