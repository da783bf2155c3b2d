//! Any bytes as a request body: decoded (with the sequence limits), and a
//! decoded request encodes again and decodes to the same request.
#![no_main]

use bytes::BytesMut;
use insitu_protocol::{decode_request, encode_request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(request) = decode_request(data) else {
        return;
    };
    let mut out = BytesMut::new();
    if encode_request(&mut out, 1, &request).is_ok() {
        let body = &out[insitu_protocol::HEADER_BYTES..];
        let again = decode_request(body).expect("a request we encoded decodes");
        // NaN != NaN: compare the encodings, not the values.
        let mut out2 = BytesMut::new();
        encode_request(&mut out2, 1, &again).expect("encodes as before");
        assert_eq!(out, out2);
    }
});
