//! The PostgreSQL wire protocol, as far as pgfence needs it: a header framer
//! with size limits, the startup phase, and the few messages pgfence builds.
//!
//! See <https://www.postgresql.org/docs/current/protocol-message-formats.html>.

pub mod codec;
pub mod frame;
pub mod startup;

/// Largest startup packet accepted, as in Postgres (`MAX_STARTUP_PACKET_LENGTH`): its
/// length without the 4-byte length word, so a whole packet may take 10 004 bytes.
pub const MAX_STARTUP_PACKET: usize = 10_000;
