//! SQL analysis: which statements of a Query are fenced writes, and which
//! declare an epoch. Pure code: no I/O, no tokio, never panics on any input.
//!
//! - [`lex`]: a Postgres-compatible lexer (strings, comments, dollar quotes).
//! - [`split`]: a Query string into top-level statements with byte spans.
//! - [`declare`]: `SET pgfence.epoch = …` and the other declarations.
//! - [`classify`]: per statement, whether it may change a fenced table
//!   (fail closed), with a bounded cache in [`Analyzer`].
//! - [`name`]: normalised table names.
//! - [`cache`]: the bounded, second-chance map behind both caches.
//! - [`rewrite`]: row-level fencing, the statement rewritten to carry the epoch.

pub mod cache;
pub mod classify;
pub mod declare;
pub mod keywords;
pub mod lex;
pub mod name;
pub mod rewrite;
pub mod split;

pub use classify::{Analysis, Analyzer, FenceId, FenceSet, Stmt, StmtKind, analyze, analyze_lexing};
pub use declare::{Declaration, Scope, Setting};
pub use lex::Lexing;
pub use name::TableName;
