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

/// How a sent text was made from the client's, piece by piece, in characters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Positions {
    pieces: Vec<Piece>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    /// Characters of the client's text, sent as they are.
    Copied(usize),
    /// `sent` characters written by pgfence in place of `orig` characters of the client's
    /// text (none for an insertion): a position inside them stands for where they are.
    Replaced { sent: usize, orig: usize },
    /// A statement rewritten as `redo` says (rewrite mode), `sent` characters in place
    /// of the client's `original`.
    Rewritten {
        sent: usize,
        original: Box<str>,
        redo: Redo,
    },
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
        let n = text.chars().count();
        if n == 0 {
            return;
        }
        match self.pieces.last_mut() {
            Some(Piece::Copied(m)) => *m += n,
            _ => self.pieces.push(Piece::Copied(n)),
        }
    }

    /// pgfence's `sent` in place of the client's `original` (empty for an insertion).
    pub fn replaced(&mut self, sent: &str, original: &str) {
        self.pieces.push(Piece::Replaced {
            sent: sent.chars().count(),
            orig: original.chars().count(),
        });
    }

    /// The rewrite `sent` of the client's statement `original`.
    pub fn rewritten(&mut self, sent: &str, original: &str, redo: Redo) {
        self.pieces.push(Piece::Rewritten {
            sent: sent.chars().count(),
            original: original.into(),
            redo,
        });
    }

    /// The client's position for Postgres' 1-based position `sent` in the text sent.
    /// Positions inside text pgfence wrote point at the start of what it stands for; one
    /// past the end (Postgres' "at end of input") stays one past the end.
    pub fn client_position(&self, sent: usize, fences: Option<&DbFences>) -> usize {
        let Some(mut at) = sent.checked_sub(1) else {
            return sent;
        };
        let mut orig = 0;
        for piece in &self.pieces {
            match piece {
                Piece::Copied(n) => {
                    if at < *n {
                        return orig + at + 1;
                    }
                    at -= n;
                    orig += n;
                }
                Piece::Replaced { sent, orig: o } => {
                    if at < *sent {
                        return orig + 1;
                    }
                    at -= sent;
                    orig += o;
                }
                Piece::Rewritten { sent, original, redo } => {
                    if at < *sent {
                        let inside = fences.and_then(|f| f.rewrite_source_chars(original, *redo, at));
                        return orig + inside.unwrap_or(0) + 1;
                    }
                    at -= sent;
                    orig += original.chars().count();
                }
            }
        }
        orig + at + 1
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
            p.client_position(at, None),
            char_offset(client, client.find("'abc'").unwrap()) + 1
        );
        // Inside the guard: the statement it stands before.
        assert_eq!(p.client_position(3, None), 1);
        // One past the end.
        let end = sent.chars().count() + 1;
        assert_eq!(p.client_position(end, None), client.chars().count() + 1);
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
            p.client_position(at, None),
            char_offset(client, client.find("SELEC 2").unwrap()) + 1
        );
        assert_eq!(p.client_position(12, None), 11);
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
