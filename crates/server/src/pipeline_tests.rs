//! The keys a pipelined batch hints: point requests only, whole frames
//! only, at most `PIPELINE_BATCH`, and a bad header ends the walk.

use bytes::BytesMut;
use insitu_protocol::{
    Number, RejectRules, Request, Response, Status, blob, encode_request, encode_response,
};

use super::{PIPELINE_BATCH, point_keys};

fn push(buf: &mut BytesMut, request: &Request<'_>) {
    encode_request(buf, 1, request).expect("encodes");
}

fn keys_of(input: &[u8]) -> (usize, Vec<(u64, Vec<u8>)>) {
    let mut keys: [(u64, &[u8]); PIPELINE_BATCH] = [(0, &[]); PIPELINE_BATCH];
    let (frames, n) = point_keys(input, &mut keys);
    (
        frames,
        keys[..n].iter().map(|(t, k)| (*t, k.to_vec())).collect(),
    )
}

#[test]
fn point_requests_of_whole_frames_are_hinted_in_order() {
    let mut buf = BytesMut::new();
    let rules = RejectRules::default();
    push(
        &mut buf,
        &Request::Read {
            table: 3,
            key: blob(b"a"),
        },
    );
    push(&mut buf, &Request::Ping);
    push(
        &mut buf,
        &Request::Write {
            table: 4,
            key: blob(b"b"),
            value: blob(b"v"),
            rules,
            expires_at_ms: 0,
        },
    );
    push(
        &mut buf,
        &Request::Remove {
            table: 3,
            key: blob(b"c"),
            rules,
        },
    );
    push(
        &mut buf,
        &Request::Increment {
            table: 3,
            key: blob(b"d"),
            delta: Number::I64(1),
            rules,
        },
    );
    let whole = buf.len();
    // A frame whose body has not all arrived: not looked at.
    push(
        &mut buf,
        &Request::Read {
            table: 3,
            key: blob(b"e"),
        },
    );
    let partial = &buf[..buf.len() - 1];
    let (frames, keys) = keys_of(partial);
    assert_eq!(frames, 5);
    let want: Vec<(u64, Vec<u8>)> = vec![
        (3, b"a".to_vec()),
        (4, b"b".to_vec()),
        (3, b"c".to_vec()),
        (3, b"d".to_vec()),
    ];
    assert_eq!(keys, want);
    assert_eq!(keys_of(&buf[..whole]).0, 5);
}

#[test]
fn a_lone_frame_is_not_decoded_and_a_batch_is_bounded() {
    let mut buf = BytesMut::new();
    push(
        &mut buf,
        &Request::Read {
            table: 1,
            key: blob(b"k"),
        },
    );
    assert_eq!(keys_of(&buf), (1, vec![]));
    for i in 0..PIPELINE_BATCH as u64 + 8 {
        push(
            &mut buf,
            &Request::Read {
                table: i,
                key: blob(b"k"),
            },
        );
    }
    let (frames, keys) = keys_of(&buf);
    assert_eq!(frames, PIPELINE_BATCH);
    assert_eq!(keys.len(), PIPELINE_BATCH);
}

#[test]
fn bad_bytes_end_the_walk_and_responses_are_skipped() {
    let mut buf = BytesMut::new();
    push(
        &mut buf,
        &Request::Read {
            table: 1,
            key: blob(b"x"),
        },
    );
    encode_response(&mut buf, 7, Status::Ok, &Response::Pong).expect("encodes");
    push(
        &mut buf,
        &Request::Read {
            table: 2,
            key: blob(b"y"),
        },
    );
    let (frames, keys) = keys_of(&buf);
    assert_eq!(
        frames, 3,
        "a response frame is a whole frame, not a request"
    );
    assert_eq!(keys, vec![(1, b"x".to_vec()), (2, b"y".to_vec())]);
    // Garbage after one whole frame: the walk stops at it.
    let mut then = BytesMut::new();
    push(
        &mut then,
        &Request::Read {
            table: 9,
            key: blob(b"z"),
        },
    );
    let mut input = BytesMut::new();
    push(
        &mut input,
        &Request::Read {
            table: 1,
            key: blob(b"x"),
        },
    );
    input.extend_from_slice(&[0xff; 40]);
    input.extend_from_slice(&then);
    let (frames, keys) = keys_of(&input);
    assert_eq!(
        (frames, keys.len()),
        (1, 0),
        "one whole frame, then bytes that are no header"
    );
}
