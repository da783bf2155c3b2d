//! Fake insitu servers for the client's tests: a coordinator and storage
//! shards speaking the real wire protocol over loopback TCP, backed by
//! `BTreeMap`s, with knobs to inject the faults the client must survive.

#![allow(dead_code)]

mod coord;
mod shard;

use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use futures::StreamExt;
use insitu_protocol::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::task::AbortHandle;
use tokio_util::codec::FramedRead;

// The fakes by their short names, whichever of them a test binary uses.
#[allow(unused_imports)]
pub use coord::{CoordState, FakeCluster};
#[allow(unused_imports)]
pub use shard::{FakeShard, ShardState, Stored};

/// One request a fake server received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logged {
    /// Request variant name, e.g. "MultiWrite".
    pub op: &'static str,
    /// Keys / items in a multi-request (1 for point requests).
    pub items: usize,
    /// Encoded body bytes of the request.
    pub body_len: usize,
    /// Status of the reply header that was sent (Ok for dropped / hung requests).
    pub status: Status,
}

fn op_name(r: &Request<'_>) -> &'static str {
    match r {
        Request::Ping => "Ping",
        Request::Read { .. } => "Read",
        Request::Write { .. } => "Write",
        Request::Remove { .. } => "Remove",
        Request::Increment { .. } => "Increment",
        Request::MultiRead { .. } => "MultiRead",
        Request::MultiWrite { .. } => "MultiWrite",
        Request::MultiRemove { .. } => "MultiRemove",
        Request::Enumerate { .. } => "Enumerate",
        Request::ShardStats { .. } => "ShardStats",
        Request::OpenTable { .. } => "OpenTable",
        Request::TableMap { .. } => "TableMap",
        Request::CreateTable { .. } => "CreateTable",
        Request::DropTable { .. } => "DropTable",
        Request::CreateIndex { .. } => "CreateIndex",
        Request::DropIndex { .. } => "DropIndex",
        Request::ListTables => "ListTables",
        Request::ListServers => "ListServers",
        Request::MoveTablet { .. } => "MoveTablet",
        _ => "Other",
    }
}

fn item_count(r: &Request<'_>) -> usize {
    match r {
        Request::MultiRead { keys, .. } | Request::MultiRemove { keys, .. } => keys.len(),
        Request::MultiWrite { items, .. } => items.len(),
        _ => 1,
    }
}

enum Action {
    Reply,
    Close,
    Hang,
}

fn ok(out: &mut BytesMut, id: u64, r: &Response<'_>) -> Status {
    encode_response(out, id, Status::Ok, r).expect("fake reply fits");
    Status::Ok
}

fn err(out: &mut BytesMut, id: u64, s: Status, msg: &str) -> Status {
    encode_error(out, id, s, msg);
    s
}

/// Accept connections on `listener`, answering every frame with `handle`.
async fn serve<S: Send + 'static>(
    listener: TcpListener,
    state: Arc<Mutex<S>>,
    tasks: Arc<Mutex<Vec<AbortHandle>>>,
    handle: fn(&mut S, &Request<'_>, u64, &mut BytesMut) -> (Action, Status),
    log: fn(&mut S, Logged),
) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let state = state.clone();
        let conn = tokio::spawn(async move {
            let (read_half, mut write_half) = stream.into_split();
            let mut frames = FramedRead::new(read_half, FrameCodec::default());
            while let Some(Ok(frame)) = frames.next().await {
                let mut out = BytesMut::new();
                let action = {
                    let Ok(req) = decode_request(&frame.body) else {
                        return;
                    };
                    let mut st = state.lock().unwrap();
                    let (action, status) = handle(&mut st, &req, frame.header.request_id, &mut out);
                    log(
                        &mut st,
                        Logged {
                            op: op_name(&req),
                            items: item_count(&req),
                            body_len: frame.body.len(),
                            status,
                        },
                    );
                    action
                };
                match action {
                    Action::Reply => {
                        if write_half.write_all(&out).await.is_err() {
                            return;
                        }
                    }
                    Action::Close => return,
                    Action::Hang => {}
                }
            }
        });
        tasks.lock().unwrap().push(conn.abort_handle());
    }
}
