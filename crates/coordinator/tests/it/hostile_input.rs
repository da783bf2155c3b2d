//! Hostile input to the coordinator's port: random bytes, a header that
//! announces a 4 GiB body, undecodable bodies, a half-sent frame held open;
//! each answered or closed alone while well-formed clients are served.

use crate::common;

use std::time::Duration;

use bytes::{BufMut, BytesMut};
use common::*;
use insitu_protocol::frame::MAGIC;
use insitu_protocol::{
    FrameCodec, FrameKind, HEADER_BYTES, Request, Response, Status, decode_response, encode_request,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::codec::Decoder;

/// Read everything the coordinator sends until it closes the connection.
async fn read_until_closed(stream: &mut TcpStream) -> BytesMut {
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut buf))
        .await
        .expect("the coordinator closes the connection")
        .ok();
    BytesMut::from(&buf[..])
}

/// Decode the first frame of `bytes`, expect an error reply; returns (request id, status).
fn first_error(bytes: &mut BytesMut) -> (u64, Status) {
    let frame = FrameCodec::default()
        .decode(bytes)
        .expect("a valid frame")
        .expect("a whole frame");
    assert_eq!(frame.header.kind, FrameKind::Response);
    match decode_response(&frame.body).expect("decodable") {
        Response::Error { message } => assert!(!message.is_empty()),
        other => panic!("expected an error body, got {other:?}"),
    }
    (frame.header.request_id, frame.header.status)
}

fn header(body_len: u32, kind: u8, request_id: u64) -> BytesMut {
    let mut b = BytesMut::new();
    b.put_u32_le(body_len);
    b.put_u16_le(MAGIC);
    b.put_u8(kind);
    b.put_u8(0);
    b.put_u64_le(request_id);
    b.put_u16_le(0);
    b.put_u16_le(0);
    assert_eq!(b.len(), HEADER_BYTES);
    b
}

#[tokio::test]
async fn hostile_input_does_not_stop_the_coordinator() {
    let dir = TempDir::new("hostile");
    let coord = start_coordinator(&dir).await;
    let addr = coord.addr();

    // A client that holds a half-sent frame open while everything below happens.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(&[1, 2, 3]).await.unwrap();

    // Random bytes: an error reply (when possible) and the connection is closed.
    // A fixed seed, so a failure reproduces.
    let mut rng = insitu_testkit::rng(0x6A7B_A6E5);
    let mut garbage: Vec<u8> = (0..4096).map(|_| rng.u8(..)).collect();
    if u16::from_le_bytes([garbage[4], garbage[5]]) == MAGIC {
        garbage[4] ^= 0xff;
    }
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&garbage).await.ok();
    let mut got = read_until_closed(&mut s).await;
    assert_eq!(first_error(&mut got).1, Status::BadRequest);

    // A valid header announcing a 4 GiB body: refused without waiting for it, request id echoed.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&header(u32::MAX, 0, 77)).await.unwrap();
    let mut got = read_until_closed(&mut s).await;
    assert_eq!(first_error(&mut got), (77, Status::BadRequest));

    // A well-framed but undecodable body, and a response-kind frame: an error
    // each, and the connection keeps working.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut out = header(5, 0, 5);
    out.extend_from_slice(&[0xff; 5]);
    out.extend_from_slice(&header(0, 1, 6));
    encode_request(&mut out, 7, &Request::Ping).unwrap();
    s.write_all(&out).await.unwrap();
    let mut codec = FrameCodec::default();
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    while frames.len() < 3 {
        if let Some(frame) = codec.decode(&mut buf).unwrap() {
            frames.push(frame);
            continue;
        }
        let n = tokio::time::timeout(Duration::from_secs(10), s.read_buf(&mut buf))
            .await
            .expect("reply")
            .unwrap();
        assert!(n > 0, "connection closed early");
    }
    assert_eq!(
        (frames[0].header.request_id, frames[0].header.status),
        (5, Status::BadRequest)
    );
    assert_eq!(
        (frames[1].header.request_id, frames[1].header.status),
        (6, Status::BadRequest)
    );
    assert_eq!(
        (frames[2].header.request_id, frames[2].header.status),
        (7, Status::Ok)
    );
    assert_eq!(decode_response(&frames[2].body).unwrap(), Response::Pong);

    // A well-formed client is served.
    let c = connect(&coord).await;
    assert!(matches!(
        expect_ok(&call(&c, Request::Ping).await),
        Response::Pong
    ));
    assert!(list_tables(&c).await.is_empty());
    let log = Log::default();
    let s1 = fake_server(&log, 1).await;
    enlist(&c, addrs(&s1)).await;
    create(&c, "ok", 2).await;

    // Shutdown does not wait for the idle half-frame client.
    tokio::time::timeout(Duration::from_secs(10), coord.shutdown())
        .await
        .expect("shutdown completes");
    drop(idle);
}
