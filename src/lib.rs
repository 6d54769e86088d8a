//! pgfence: a PostgreSQL wire-protocol proxy that enforces fencing tokens.
//!
//! A leader elected with a lease declares its lease epoch on its connection
//! (`pgfence.epoch`). pgfence lets writes to configured *fenced tables* through
//! only together with a guard that checks the epoch against the fence's
//! durable high-water mark **inside the write's own transaction**, so a leader
//! that stalled past its lease and woke up cannot write. Everything else is
//! relayed untouched: one upstream connection per client connection, bytes
//! forwarded in the chunks they arrive in, only the few messages that matter
//! decoded.
//!
//! # Layout
//! - [`config`]: TOML + CLI overlay, validated once.
//! - [`server`]: accept loop, connection limit, cancel keys, shutdown.
//! - [`session`]: one connection: startup, auth relay, the relay loop, reply
//!   attribution (`session::state`), epoch declarations (`session::declare`).
//! - [`protocol`]: framing with size limits, startup packets, messages pgfence builds.
//! - [`sql`]: statement splitting and classification (which fenced tables a statement may write).
//! - [`fence`]: the `Epoch` type, the decision policy, the guard SQL and `pgfence init`.
//! - [`error`]: errors pgfence raises itself and their SQLSTATEs.
//! - [`lease`]: the seed's lease on a Postgres row: leader election whose epoch is the fencing token.
//! - [`demo`]: `pgfence demo`, the whole story against a throwaway Postgres.

#![forbid(unsafe_code)]

/// `println!` for the command line's reports that never panics: when stdout is closed
/// (`pgfence init … | head -1`), the text is lost, not the run (the demo still cleans up).
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stdout(), $($arg)*);
    }};
}

/// `eprintln!` that never panics: a failure report lost to a closed or full stderr
/// (`2>/dev/full`) must not turn the exit code into a panic's.
#[macro_export]
macro_rules! complain {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stderr(), $($arg)*);
    }};
}

/// [`say!`] without the newline.
#[macro_export]
macro_rules! say_part {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::write!(::std::io::stdout(), $($arg)*);
    }};
}

pub mod config;
pub mod conninfo;
pub mod demo;
pub mod error;
pub mod fence;
pub mod lease;
pub mod protocol;
pub mod server;
pub mod session;
pub mod sql;
