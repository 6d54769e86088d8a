//! The startup-phase parser on arbitrary packet bodies (what follows the length word, capped
//! at the 10 000-byte limit as the reader caps it). Never panics; a parsed StartupMessage
//! re-encodes for the upstream without panicking either.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pgfence::protocol::MAX_STARTUP_PACKET;
use pgfence::protocol::startup::{FirstPacket, parse_first_packet};

fuzz_target!(|data: &[u8]| {
    if data.len() + 4 > MAX_STARTUP_PACKET {
        return;
    }
    if let Ok(FirstPacket::Startup(startup)) = parse_first_packet(data) {
        let _ = startup.get("user");
        let _ = startup.protocol_options();
        let _ = startup.option_settings();
        let encoded = startup.encode_for_upstream();
        assert!(encoded.len() >= 8);
    }
});
