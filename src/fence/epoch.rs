//! The [`Epoch`] newtype: a fencing token as a session declares it.
//!
//! Epochs are compared, never computed with: there is no arithmetic on purpose, and
//! "is this write stale" is a named method so call sites read as the contract does.

use std::fmt;
use std::str::FromStr;

/// Largest epoch: Postgres' `bigint` maximum, so every epoch fits `pgfence.fence.hwm`.
const MAX_EPOCH: u64 = i64::MAX as u64;

/// Longest piece of a rejected value quoted back in an error message.
const MAX_ECHO: usize = 40;

/// A fencing token: an integer in `1 ..= 9223372036854775807` (Postgres `bigint`, at least 1).
///
/// Ordered, copyable, printed as a plain number. No arithmetic: epochs come from the
/// lease, pgfence only compares them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Epoch(u64);

/// Why a declared epoch was refused (the proxy reports it as `PF003`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EpochError {
    /// The value is empty or only whitespace (`SET pgfence.epoch = ''`).
    #[error("invalid epoch \"\": an epoch is an integer from 1 to 9223372036854775807")]
    Empty,
    /// Not a decimal integer (`abc`, `1.5`, `0x10`, `1e3`).
    #[error("invalid epoch {0:?}: not an integer; an epoch is an integer from 1 to 9223372036854775807")]
    NotAnInteger(String),
    /// An integer outside `1 ..= 9223372036854775807` (`0`, `-1`, too many digits).
    #[error("invalid epoch {0:?}: out of range; an epoch is an integer from 1 to 9223372036854775807")]
    OutOfRange(String),
}

impl Epoch {
    /// The smallest epoch, 1.
    pub const MIN: Epoch = Epoch(1);
    /// The largest epoch, 9223372036854775807 (`i64::MAX`).
    pub const MAX: Epoch = Epoch(MAX_EPOCH);

    /// An epoch from a number; `None` outside `1 ..= 9223372036854775807`.
    pub const fn new(value: u64) -> Option<Epoch> {
        if value >= 1 && value <= MAX_EPOCH {
            Some(Epoch(value))
        } else {
            None
        }
    }

    /// Reads a declared value as Postgres reads a `bigint` (`int8in`, PostgreSQL 15):
    /// surrounding whitespace is allowed, then an optional sign and decimal digits
    /// (`+5`, `05` and `' 5 '` are 5). The result must be in `1 ..= 9223372036854775807`.
    pub fn parse(input: &str) -> Result<Epoch, EpochError> {
        let trimmed = input.trim_matches(is_pg_space);
        if trimmed.is_empty() {
            return Err(EpochError::Empty);
        }
        let (negative, digits) = match trimmed.as_bytes()[0] {
            b'+' => (false, &trimmed[1..]),
            b'-' => (true, &trimmed[1..]),
            _ => (false, trimmed),
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(EpochError::NotAnInteger(echo(input)));
        }
        let out_of_range = || EpochError::OutOfRange(echo(input));
        let significant = digits.trim_start_matches('0');
        if negative && !significant.is_empty() {
            return Err(out_of_range());
        }
        // At most 19 digits fit; parse cannot fail on digits only, but stay total.
        if significant.len() > 19 {
            return Err(out_of_range());
        }
        let value = if significant.is_empty() {
            0
        } else {
            significant.parse::<u64>().map_err(|_| out_of_range())?
        };
        Epoch::new(value).ok_or_else(out_of_range)
    }

    /// The epoch as a number.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The epoch as Postgres' `bigint` (always fits: epochs are at most `i64::MAX`).
    pub const fn as_i64(self) -> i64 {
        // Lossless: the constructor caps the value at i64::MAX.
        self.0 as i64
    }

    /// Whether a write declaring `self` is stale once the fence is at `current`
    /// (strictly below it; an equal epoch is the current leader's).
    pub fn is_stale_against(self, current: Epoch) -> bool {
        self < current
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromStr for Epoch {
    type Err = EpochError;

    /// Same as [`Epoch::parse`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Epoch::parse(s)
    }
}

/// Postgres' `isspace` in the C locale: space, `\t`, `\n`, `\v`, `\f`, `\r`.
fn is_pg_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\u{b}' | '\u{c}' | '\r')
}

/// The rejected value as quoted back to the client, shortened if long.
fn echo(input: &str) -> String {
    match input.char_indices().nth(MAX_ECHO) {
        Some((cut, _)) => format!("{}...", &input[..cut]),
        None => input.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_read_as_postgres_reads_a_bigint() {
        let cases: &[(&str, u64)] = &[
            ("1", 1),
            ("7", 7),
            ("+5", 5),
            ("05", 5),
            ("000000000000000000000000042", 42),
            (" 9 ", 9),
            ("\t\n\u{b}\u{c}\r12\r\n", 12),
            ("9223372036854775807", 9_223_372_036_854_775_807),
            ("+09223372036854775807", 9_223_372_036_854_775_807),
        ];
        for &(input, expected) in cases {
            assert_eq!(Epoch::parse(input).map(Epoch::get), Ok(expected), "{input:?}");
        }
    }

    #[test]
    fn invalid_values_are_refused_with_the_reason() {
        let cases: &[(&str, &str)] = &[
            ("", "invalid epoch \"\""),
            ("   ", "invalid epoch \"\""),
            ("0", "out of range"),
            ("00", "out of range"),
            ("-0", "out of range"),
            ("-1", "out of range"),
            ("-0001", "out of range"),
            ("9223372036854775808", "out of range"),
            ("18446744073709551616", "out of range"),
            ("99999999999999999999999999", "out of range"),
            ("1.5", "not an integer"),
            ("1e3", "not an integer"),
            ("0x10", "not an integer"),
            ("1_000", "not an integer"),
            ("abc", "not an integer"),
            ("+", "not an integer"),
            ("-", "not an integer"),
            ("+-1", "not an integer"),
            ("1 2", "not an integer"),
            ("１", "not an integer"),      // full-width digit
            ("\u{a0}1", "not an integer"), // no-break space is not Postgres whitespace
        ];
        for &(input, expected) in cases {
            let err = Epoch::parse(input).expect_err(input).to_string();
            assert!(err.contains(expected), "{input:?} gave {err:?}");
            assert!(err.contains("1 to 9223372036854775807"), "{input:?} gave {err:?}");
        }
    }

    #[test]
    fn long_rejected_values_are_shortened_in_the_message() {
        let err = Epoch::parse(&"x".repeat(10_000)).expect_err("not a number").to_string();
        assert!(err.len() < 200, "{err}");
        assert!(err.contains("..."));
    }

    #[test]
    fn staleness_is_strictly_below_the_current_epoch() {
        let e = |v| Epoch::new(v).expect("valid");
        assert!(e(1).is_stale_against(e(2)));
        assert!(!e(2).is_stale_against(e(2)));
        assert!(!e(3).is_stale_against(e(2)));
        assert!(e(1) < Epoch::MAX && Epoch::MIN == e(1));
    }

    #[test]
    fn constructor_and_conversions_keep_the_range() {
        assert_eq!(Epoch::new(0), None);
        assert_eq!(Epoch::new(MAX_EPOCH + 1), None);
        assert_eq!(Epoch::MAX.as_i64(), i64::MAX);
        assert_eq!(Epoch::MAX.to_string(), "9223372036854775807");
        assert_eq!("+05".parse::<Epoch>().map(|e| e.to_string()), Ok("5".to_owned()));
    }
}
