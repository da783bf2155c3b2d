//! Any byte stream into the frame codec, and every frame it cuts into the
//! request and response decoders: errors are fine, panics are bugs. The
//! input is tried as is and behind a valid header (random bytes rarely
//! carry the frame magic), so the body decoders see it too.
#![no_main]

use bytes::BytesMut;
use insitu_protocol::frame::put_header;
use insitu_protocol::{FrameCodec, FrameKind, Header, Status, decode_request, decode_response};
use libfuzzer_sys::fuzz_target;
use tokio_util::codec::Decoder;

fn cut(data: BytesMut) {
    let mut codec = FrameCodec::default();
    let mut buf = data;
    // Bounded: every Ok(Some) consumes at least a header.
    for _ in 0..1024 {
        match codec.decode(&mut buf) {
            Ok(Some(frame)) => {
                let _ = decode_request(&frame.body);
                let _ = decode_response(&frame.body);
            }
            Ok(None) | Err(_) => break,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    cut(BytesMut::from(data));
    let mut framed = BytesMut::new();
    let header = Header {
        kind: FrameKind::Request,
        request_id: 7,
        status: Status::Ok,
    };
    put_header(&mut framed, &header, data.len());
    framed.extend_from_slice(data);
    cut(framed);
});
