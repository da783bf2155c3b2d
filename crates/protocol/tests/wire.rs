//! The wire format: round trips, and hostile bytes never panic or over-allocate.

use bytes::BytesMut;
use insitu_protocol::*;
use proptest::prelude::*;
use tokio_util::codec::Decoder;

fn one_frame(buf: &mut BytesMut) -> Frame {
    FrameCodec::default()
        .decode(buf)
        .expect("valid frame")
        .expect("whole frame")
}

#[test]
fn request_round_trips_through_the_codec() {
    let req = Request::Write {
        expires_at_ms: 0,
        table: 7,
        key: blob(b"user:1"),
        value: blob(&[0u8, 1, 2, 255]),
        rules: RejectRules {
            exists: true,
            ..Default::default()
        },
    };
    let mut buf = BytesMut::new();
    encode_request(&mut buf, 42, &req).unwrap();
    let frame = one_frame(&mut buf);
    assert!(buf.is_empty());
    assert_eq!(frame.header.request_id, 42);
    assert_eq!(frame.header.kind, FrameKind::Request);
    assert_eq!(decode_request(&frame.body).unwrap(), req);
}

#[test]
fn error_response_carries_status_and_message() {
    let mut buf = BytesMut::new();
    encode_error(&mut buf, 9, Status::UnknownTable, "no table named x");
    let frame = one_frame(&mut buf);
    assert_eq!(frame.header.status, Status::UnknownTable);
    assert_eq!(
        decode_response(&frame.body).unwrap(),
        Response::Error {
            message: "no table named x".into()
        }
    );
}

#[test]
fn partial_frames_wait_for_more_bytes() {
    let mut whole = BytesMut::new();
    encode_request(
        &mut whole,
        1,
        &Request::Read {
            table: 1,
            key: blob(b"k"),
        },
    )
    .unwrap();
    let mut codec = FrameCodec::default();
    let mut buf = BytesMut::new();
    for (i, b) in whole.iter().enumerate() {
        buf.extend_from_slice(&[*b]);
        let got = codec.decode(&mut buf).unwrap();
        assert_eq!(
            got.is_some(),
            i == whole.len() - 1,
            "frame complete only at the last byte"
        );
    }
}

#[test]
fn huge_length_is_refused_before_allocating() {
    let mut buf = BytesMut::new();
    buf.extend_from_slice(&u32::MAX.to_le_bytes());
    buf.extend_from_slice(&frame::MAGIC.to_le_bytes());
    buf.extend_from_slice(&[0u8; 14]);
    let err = FrameCodec::default().decode(&mut buf).unwrap_err();
    assert!(matches!(err, ProtocolError::FrameTooLarge { .. }), "{err}");
    assert!(
        buf.capacity() < 1 << 20,
        "no allocation for the claimed length"
    );
}

#[test]
fn bad_magic_is_refused() {
    let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..]);
    assert!(matches!(
        FrameCodec::default().decode(&mut buf),
        Err(ProtocolError::BadMagic(_))
    ));
}

#[test]
fn oversized_message_is_refused_and_leaves_buffer_intact() {
    let big = vec![0u8; MAX_BODY_BYTES + 1];
    let mut buf = BytesMut::from(&b"prefix"[..]);
    let err = encode_request(
        &mut buf,
        1,
        &Request::Write {
            expires_at_ms: 0,
            table: 1,
            key: blob(b"k"),
            value: blob(&big),
            rules: RejectRules::default(),
        },
    )
    .unwrap_err();
    assert!(matches!(err, ProtocolError::FrameTooLarge { .. }));
    assert_eq!(&buf[..], b"prefix");
}

#[test]
fn trailing_garbage_in_a_body_is_malformed() {
    let mut buf = BytesMut::new();
    encode_request(&mut buf, 1, &Request::Ping).unwrap();
    let mut frame = one_frame(&mut buf);
    frame.body.extend_from_slice(&[1, 2, 3]);
    assert!(decode_request(&frame.body).is_err());
}

#[test]
fn status_codes_round_trip() {
    for v in 0..64u16 {
        if let Some(s) = Status::from_u16(v) {
            assert_eq!(s as u16, v);
        }
    }
    assert_eq!(Status::from_u16(18), Some(Status::StaleMap));
    assert_eq!(Status::from_u16(21), Some(Status::DataLost));
    assert_eq!(Status::from_u16(22), Some(Status::CursorExpired));
    assert_eq!(Status::from_u16(23), Some(Status::Conflict));
    assert_eq!(Status::from_u16(24), Some(Status::Unauthenticated));
    assert_eq!(Status::from_u16(25), Some(Status::Forbidden));
    assert_eq!(Status::from_u16(26), Some(Status::SnapshotTooOld));
    assert_eq!(Status::from_u16(27), None);
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut buf = BytesMut::from(&bytes[..]);
        let mut codec = FrameCodec::default();
        // Decode until error or need-more; must terminate and never panic.
        for _ in 0..64 {
            match codec.decode(&mut buf) {
                Ok(Some(frame)) => { let _ = decode_request(&frame.body); let _ = decode_response(&frame.body); }
                _ => break,
            }
        }
        let _ = decode_request(&bytes);
        let _ = decode_response(&bytes);
    }

    #[test]
    fn multi_read_round_trips(keys in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..40), 0..50)) {
        let req = Request::MultiRead { table: 3, keys: keys.iter().map(|k| blob(k)).collect() };
        let mut buf = BytesMut::new();
        encode_request(&mut buf, 5, &req).unwrap();
        let frame = one_frame(&mut buf);
        prop_assert_eq!(decode_request(&frame.body).unwrap(), req.clone());
        prop_assert_eq!(encoded_len(&req) + HEADER_BYTES, frame.body.len() + HEADER_BYTES);
    }
}

#[test]
fn timestamps_round_trip_and_are_named() {
    let req = Request::Timestamps {
        count: MAX_TIMESTAMPS,
    };
    assert_eq!(req.name(), "Timestamps");
    assert!(!req.is_point());
    let mut buf = BytesMut::new();
    encode_request(&mut buf, 3, &req).unwrap();
    let frame = one_frame(&mut buf);
    assert_eq!(decode_request(&frame.body).unwrap(), req);

    let resp = Response::Timestamps {
        first: u64::MAX - 7,
        count: 7,
    };
    let mut buf = BytesMut::new();
    encode_response(&mut buf, 3, Status::Ok, &resp).unwrap();
    let frame = one_frame(&mut buf);
    assert_eq!(frame.header.kind, FrameKind::Response);
    assert_eq!(decode_response(&frame.body).unwrap(), resp);
}

#[test]
fn snapshot_reads_round_trip_and_are_named() {
    let keys: Vec<&[u8]> = vec![b"a", b"", &[0xff; 40]];
    let req = Request::SnapshotRead {
        table: 9,
        snapshot_ts: u64::MAX - 1,
        keys: keys.iter().map(|k| blob(k)).collect(),
    };
    assert_eq!(req.name(), "SnapshotRead");
    assert!(!req.is_point(), "it may wait for the floor and for locks");
    let mut buf = BytesMut::new();
    encode_request(&mut buf, 4, &req).unwrap();
    let frame = one_frame(&mut buf);
    assert_eq!(decode_request(&frame.body).unwrap(), req);
}
