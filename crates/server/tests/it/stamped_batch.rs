//! A connection's pipelined single-key writes while snapshots are read are
//! held back and stamped as one batch (the server's `stamped_batch.rs`):
//! they apply in order, and every reply keeps its frame's place, whatever
//! follows the held writes (a read, a frame that does not decode, bytes
//! that are not a frame).

use crate::common;

use bytes::BytesMut;
use common::snap::keep_versions;
use common::txn::{as_i64, retrying_client};
use insitu_protocol::frame::{HEADER_BYTES, check_header};
use insitu_protocol::{
    MAX_BODY_BYTES, RejectRules, Request, Response, Status, blob, decode_response, encode_request,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Pipelined single-key writes under snapshots are applied as one stamped
/// batch per run of frames (`stamped_batch.rs`): increments sent together
/// each see the one before (every value 1..=N handed out once), writes of
/// one key in flight together get distinct versions and the newest wins,
/// and a snapshot taken before reads none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_plain_writes_under_snapshots_apply_in_order() {
    const N: i64 = 64;
    let (_node, client) = retrying_client(1).await;
    let t = client.create_table("piped", 2).await.unwrap().id;
    client.write(t, "n", 0i64.to_le_bytes()).await.unwrap();
    keep_versions(&client, t, &["n"]).await;
    let before = client.snapshot().await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..N {
        let client = client.clone();
        tasks.spawn(async move {
            let key = format!("k{i:02}");
            let written = client.write(t, &key, i.to_le_bytes()).await.unwrap();
            let (n, _) = client.increment_i64(t, "n", 1).await.unwrap();
            (written, n)
        });
    }
    let mut counts = Vec::new();
    while let Some(done) = tasks.join_next().await {
        counts.push(done.unwrap().1);
    }
    counts.sort_unstable();
    assert_eq!(counts, (1..=N).collect::<Vec<_>>(), "each increment once");
    let (a, b, c) = tokio::join!(
        client.write(t, "same", b"a"),
        client.write(t, "same", b"b"),
        client.write(t, "same", b"c"),
    );
    let mut versions = [(a.unwrap(), "a"), (b.unwrap(), "b"), (c.unwrap(), "c")];
    versions.sort_unstable();
    assert!(
        versions[0].0 < versions[1].0 && versions[1].0 < versions[2].0,
        "distinct versions: {versions:?}"
    );
    let newest = client.read(t, "same").await.unwrap().unwrap();
    assert_eq!(&newest.0[..], versions[2].1.as_bytes(), "{versions:?}");
    let after = client.snapshot().await.unwrap();
    assert_eq!(as_i64(before.read(t, "n").await.unwrap()), 0);
    assert_eq!(as_i64(after.read(t, "n").await.unwrap()), N);
    for i in 0..N {
        let key = format!("k{i:02}");
        assert_eq!(before.read(t, &key).await.unwrap(), None, "{key} before");
        assert_eq!(as_i64(after.read(t, &key).await.unwrap()), i, "{key} after");
    }
}

/// One reply off a raw socket: its request id, status and body.
async fn next_reply(s: &mut TcpStream) -> (u64, Status, Vec<u8>) {
    let mut head = [0u8; HEADER_BYTES];
    s.read_exact(&mut head).await.unwrap();
    let (h, body_len) = check_header(&head, MAX_BODY_BYTES).unwrap().unwrap();
    let mut body = vec![0u8; body_len];
    s.read_exact(&mut body).await.unwrap();
    (h.request_id, h.status, body)
}

/// Frames sent in one go while snapshots are read: held writes, a read of
/// a key one of them wrote, a frame whose body does not decode, more
/// writes, one to another table between them (it ends the first table's
/// batch), then bytes that are no frame at all. Every reply comes in the
/// order of its frame, the read sees the write before it, and the held
/// writes before the bad header are applied and answered before the
/// connection closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_writes_are_answered_in_their_place() {
    let (node, client) = retrying_client(1).await;
    let t = client.create_table("order", 2).await.unwrap().id;
    let u = client.create_table("other", 2).await.unwrap().id;
    keep_versions(&client, t, &["k"]).await;
    let write_to = |table: u64, key: &'static str, value: &'static str| Request::Write {
        table,
        key: blob(key.as_bytes()),
        value: blob(value.as_bytes()),
        rules: RejectRules::default(),
        expires_at_ms: 0,
    };
    let write = |key, value| write_to(t, key, value);
    let mut out = BytesMut::new();
    encode_request(&mut out, 1, &write("k", "a")).unwrap();
    encode_request(&mut out, 2, &write("j", "x")).unwrap();
    let read = Request::Read {
        table: t,
        key: blob(b"k"),
    };
    encode_request(&mut out, 3, &read).unwrap();
    encode_request(&mut out, 4, &write("k", "b")).unwrap();
    // A frame whose body does not decode: a write's header, its body 0xFF.
    let at = out.len();
    encode_request(&mut out, 5, &write("k", "zz")).unwrap();
    out[at + HEADER_BYTES..].fill(0xFF);
    encode_request(&mut out, 6, &write("k", "c")).unwrap();
    encode_request(&mut out, 7, &write("j", "y")).unwrap();
    // Another table's write ends the batch of the first table's.
    encode_request(&mut out, 8, &write_to(u, "k", "u")).unwrap();
    encode_request(&mut out, 9, &write("k", "d")).unwrap();
    // Bytes that are not a frame header: the connection ends after them.
    out.extend_from_slice(&[0xEE; HEADER_BYTES]);
    let mut s = TcpStream::connect(node.shard(0)).await.unwrap();
    s.write_all(&out).await.unwrap();
    let mut replies = Vec::new();
    for _ in 0..10 {
        replies.push(next_reply(&mut s).await);
    }
    let order: Vec<(u64, Status)> = replies.iter().map(|(id, st, _)| (*id, *st)).collect();
    assert_eq!(
        order,
        [
            (1, Status::Ok),
            (2, Status::Ok),
            (3, Status::Ok),
            (4, Status::Ok),
            (5, Status::BadRequest),
            (6, Status::Ok),
            (7, Status::Ok),
            (8, Status::Ok),
            (9, Status::Ok),
            (0, Status::BadRequest),
        ]
    );
    match decode_response(&replies[2].2).unwrap() {
        Response::Read { value, .. } => assert_eq!(&value[..], b"a", "the write before it"),
        other => panic!("a read answered {other:?}"),
    }
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty(), "closed after the bad header: {rest:?}");
    let now = |key: &'static str| {
        let client = client.clone();
        async move { client.read(t, key).await.unwrap().map(|(v, _)| v.to_vec()) }
    };
    assert_eq!(now("k").await, Some(b"d".to_vec()));
    assert_eq!(now("j").await, Some(b"y".to_vec()));
    let other = client.read(u, "k").await.unwrap().map(|(v, _)| v.to_vec());
    assert_eq!(other, Some(b"u".to_vec()), "written to its own table");
}
