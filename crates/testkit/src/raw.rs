//! Raw protocol frames on plain sockets, for tests of how a listener treats
//! peers that misbehave (frames announced but never completed).

use bytes::BytesMut;
use insitu_protocol::frame::{FrameKind, Header, put_header};
use insitu_protocol::{MAX_BODY_BYTES, Status};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The header of a request frame (id 1) announcing a `body_len`-byte body.
pub fn request_header(body_len: usize) -> BytesMut {
    let mut b = BytesMut::new();
    let h = Header {
        kind: FrameKind::Request,
        request_id: 1,
        status: Status::Ok,
    };
    put_header(&mut b, &h, body_len);
    b
}

/// A connection to `addr` that announces a request of `announced` body
/// bytes and sends only the first `sent` of them (zeros).
pub async fn partial_frame(addr: &str, announced: usize, sent: usize) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut bytes = request_header(announced);
    bytes.extend_from_slice(&vec![0u8; sent]);
    s.write_all(&bytes).await.unwrap();
    s
}

/// `count` connections to `addr`, each announcing a max-size frame and
/// sending only its first `sent` bytes (zeros); kept open by the caller.
pub async fn stalled_frames(addr: &str, count: usize, sent: usize) -> Vec<TcpStream> {
    let mut stalled = Vec::new();
    for _ in 0..count {
        stalled.push(partial_frame(addr, MAX_BODY_BYTES, sent).await);
    }
    stalled
}

/// Everything `s` receives until its peer closes it (or a read fails):
/// what a listener sent before closing a misbehaving connection. Panics if
/// the connection is still open after 20 s.
pub async fn until_closed(s: &mut TcpStream) -> Vec<u8> {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(20), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return all,
            Ok(Ok(n)) => all.extend_from_slice(&buf[..n]),
            Err(_) => panic!("the connection was not closed"),
        }
    }
}

/// A listener's frame budget under peers that stall: 300 connections to
/// `addr` each announce a max-size frame and send 100 KiB of it. What the
/// listener buffers for them (`buffered`) fills `budget` and never passes
/// it, a fresh client (`fresh`, which must complete) is still served, and
/// closing the stalled peers gives every byte back. Shared so the
/// coordinator and the storage server are held to the same bar.
pub async fn check_frame_budget(
    addr: &str,
    budget: usize,
    buffered: impl Fn() -> usize,
    fresh: impl Future<Output = ()>,
) {
    let stalled = stalled_frames(addr, 300, 100 * 1024).await;
    // The listener takes what the budget allows and no more.
    let full = crate::poll_until(2000, || {
        let now = buffered();
        assert!(now <= budget, "{now} bytes buffered, budget {budget}");
        now == budget
    })
    .await;
    assert!(full, "the stalled frames never filled the budget");
    fresh.await;
    assert!(buffered() <= budget);
    drop(stalled);
    let freed = crate::poll_until(2000, || buffered() == 0).await;
    assert!(
        freed,
        "frame buffers were not released after the peers closed"
    );
}

/// A listener's stall and idle timeouts (both `timeout_ms`): a frame that
/// never completes gets an error reply naming the timeout, then the close;
/// a connection that never sends a byte is closed without a word.
pub async fn check_stalled_and_idle_closed(addr: &str, timeout_ms: u64) {
    let mut s = partial_frame(addr, 100, 10).await;
    let got = until_closed(&mut s).await;
    assert!(
        String::from_utf8_lossy(&got).contains(&format!("not completed within {timeout_ms} ms")),
        "{got:?}"
    );
    let mut idle = TcpStream::connect(addr).await.unwrap();
    assert!(until_closed(&mut idle).await.is_empty());
}
