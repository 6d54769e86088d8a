//! The framer on arbitrary client bytes: walk the buffer frame by frame as the relay does,
//! reading the bodies pgfence inspects (Query, Parse, ErrorResponse). Never panics, never
//! reads outside a frame, and a frame's length always accounts for the bytes consumed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pgfence::protocol::frame::{Body, HEADER_LEN, peek_header};

fuzz_target!(|data: &[u8]| {
    let mut buf = data;
    while let Ok(Some(header)) = peek_header(buf) {
        assert_eq!(header.total_len(), HEADER_LEN + header.body_len);
        // A frame not fully buffered yet: the relay waits for more bytes.
        let Some(frame) = buf.get(..header.total_len()) else {
            break;
        };
        let body = &frame[HEADER_LEN..];
        match header.tag {
            b'Q' => {
                let _ = Body::new(body).cstr_utf8();
            }
            b'P' => {
                let mut b = Body::new(body);
                let _ = (b.cstr(), b.cstr_utf8(), b.i16());
                while b.i32().is_some() {}
                assert!(b.rest().len() < 4);
            }
            b'E' | b'N' => {
                if let Some(code) = pgfence::protocol::frame::error_code(body) {
                    assert!(code.len() <= body.len());
                }
            }
            _ => {
                let mut b = Body::new(body);
                let _ = (b.u8(), b.i16(), b.i32(), b.cstr());
            }
        }
        buf = &buf[header.total_len()..];
    }
});
