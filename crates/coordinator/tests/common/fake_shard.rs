//! Fake storage shards for the coordinator's tests: they answer control
//! requests (or fail, hang, close on demand) and log them as `Ctl`s; with
//! the log entries a test expects of them. Apart from the coordinator helpers.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use futures::StreamExt;
use insitu_protocol::{
    FrameCodec, Request, Response, Status, TableInfo, TabletState, decode_request, encode_error,
    encode_response,
};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

/// A control request as a fake shard saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ctl {
    Take {
        table: u64,
        start: u64,
        end: u64,
        version: u64,
        state: TabletState,
    },
    Drop {
        table: u64,
        start: u64,
    },
    Migrate {
        table: u64,
        start: u64,
        dest: String,
    },
    Activate {
        table: u64,
        start: u64,
        version: u64,
    },
}

impl Ctl {
    pub fn kind(&self) -> &'static str {
        match self {
            Ctl::Take { .. } => "Take",
            Ctl::Drop { .. } => "Drop",
            Ctl::Migrate { .. } => "Migrate",
            Ctl::Activate { .. } => "Activate",
        }
    }
}

/// Every control request received by any fake shard, in arrival order: (shard address, request).
pub type Log = Arc<Mutex<Vec<(String, Ctl)>>>;

pub struct FakeShard {
    pub addr: String,
    /// Request kinds ("Take", "Drop", "Migrate", "Activate") this shard refuses.
    pub fail: Arc<Mutex<HashSet<&'static str>>>,
    /// Request kinds this shard logs and never answers (a stuck or paused process).
    pub hang: Arc<Mutex<HashSet<&'static str>>>,
    /// Request kinds on which this shard closes the connection without a reply (a dead process).
    pub close: Arc<Mutex<HashSet<&'static str>>>,
    /// Set: the shard answers nothing any more, pings included (a hung or
    /// crashed process, as the failure detector sees it).
    pub silent: Arc<AtomicBool>,
    /// Server ids of the `ServerDown` notices this shard got, in order.
    pub downs: Arc<Mutex<Vec<u64>>>,
    /// How many pings this shard answered.
    pub pings: Arc<AtomicU64>,
    /// Cancelled: the process is gone (killed). The listener closes, so a
    /// connect is refused, and every open connection closes.
    pub gone: CancellationToken,
}

/// A fake storage shard: answers control requests with Done (or an injected
/// error) and records them in `log`.
pub async fn fake_shard(log: Log) -> FakeShard {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind fake shard");
    let addr = listener.local_addr().expect("local addr").to_string();
    let fail: Arc<Mutex<HashSet<&'static str>>> = Arc::default();
    let hang: Arc<Mutex<HashSet<&'static str>>> = Arc::default();
    let close: Arc<Mutex<HashSet<&'static str>>> = Arc::default();
    let silent: Arc<AtomicBool> = Arc::default();
    let downs: Arc<Mutex<Vec<u64>>> = Arc::default();
    let pings: Arc<AtomicU64> = Arc::default();
    let (addr2, fail2, hang2, close2) = (addr.clone(), fail.clone(), hang.clone(), close.clone());
    let (silent2, downs2, pings2) = (silent.clone(), downs.clone(), pings.clone());
    let gone = CancellationToken::new();
    let gone2 = gone.clone();
    tokio::spawn(async move {
        // Returning drops the listener: connects are refused from then on.
        while let Some(Ok((stream, _))) = gone2.run_until_cancelled(listener.accept()).await {
            let (log, addr, fail) = (log.clone(), addr2.clone(), fail2.clone());
            let (hang, close) = (hang2.clone(), close2.clone());
            let (silent, downs, pings) = (silent2.clone(), downs2.clone(), pings2.clone());
            let gone = gone2.clone();
            // Cancelling drops the connection's future, closing its socket.
            tokio::spawn(gone.run_until_cancelled_owned(async move {
                let (read_half, mut write_half) = stream.into_split();
                let mut frames = FramedRead::new(read_half, FrameCodec::default());
                while let Some(Ok(frame)) = frames.next().await {
                    let id = frame.header.request_id;
                    let mut out = BytesMut::new();
                    if silent.load(Ordering::SeqCst) {
                        continue;
                    }
                    let request = decode_request(&frame.body);
                    if matches!(request, Ok(Request::Ping)) {
                        pings.fetch_add(1, Ordering::SeqCst);
                        encode_response(&mut out, id, Status::Ok, &Response::Pong).unwrap();
                        if write_half.write_all(&out).await.is_err() {
                            break;
                        }
                        continue;
                    }
                    // A fake shard holds no data: a recovery onto it
                    // recovers an empty tablet (held Receiving until the
                    // coordinator activates it).
                    if let Ok(Request::RecoverTablet {
                        table,
                        start_hash,
                        end_hash,
                        map_version,
                        ..
                    }) = request
                    {
                        log.lock().unwrap().push((
                            addr.clone(),
                            Ctl::Take {
                                table,
                                start: start_hash,
                                end: end_hash,
                                version: map_version,
                                state: TabletState::Receiving,
                            },
                        ));
                        // "Take" failures cover recoveries too (both place a tablet here).
                        if fail.lock().unwrap().contains("Take") {
                            encode_error(
                                &mut out,
                                id,
                                Status::Internal,
                                "fake shard: recovery refused",
                            );
                        } else {
                            let reply = Response::Recovered {
                                objects: 0,
                                segments: 0,
                                bytes: 0,
                            };
                            encode_response(&mut out, id, Status::Ok, &reply).unwrap();
                        }
                        if write_half.write_all(&out).await.is_err() {
                            break;
                        }
                        continue;
                    }
                    if let Ok(Request::ServerDown { server_id }) = request {
                        downs.lock().unwrap().push(server_id);
                        encode_response(&mut out, id, Status::Ok, &Response::Done).unwrap();
                        if write_half.write_all(&out).await.is_err() {
                            break;
                        }
                        continue;
                    }
                    let ctl = match request {
                        Ok(Request::TakeTablet {
                            table,
                            start_hash,
                            end_hash,
                            map_version,
                            state,
                            ..
                        }) => Some(Ctl::Take {
                            table,
                            start: start_hash,
                            end: end_hash,
                            version: map_version,
                            state,
                        }),
                        Ok(Request::DropTablet {
                            table, start_hash, ..
                        }) => Some(Ctl::Drop {
                            table,
                            start: start_hash,
                        }),
                        Ok(Request::MigrateTablet {
                            table,
                            start_hash,
                            dest_addr,
                            ..
                        }) => Some(Ctl::Migrate {
                            table,
                            start: start_hash,
                            dest: dest_addr,
                        }),
                        Ok(Request::ActivateTablet {
                            table,
                            start_hash,
                            map_version,
                            ..
                        }) => Some(Ctl::Activate {
                            table,
                            start: start_hash,
                            version: map_version,
                        }),
                        _ => None,
                    };
                    match ctl {
                        None => encode_error(
                            &mut out,
                            id,
                            Status::BadRequest,
                            "fake shard: unexpected request",
                        ),
                        Some(ctl) => {
                            let kind = ctl.kind();
                            let refuse = fail.lock().unwrap().contains(kind);
                            log.lock().unwrap().push((addr.clone(), ctl));
                            if hang.lock().unwrap().contains(kind) {
                                std::future::pending::<()>().await;
                            }
                            if close.lock().unwrap().contains(kind) {
                                break;
                            }
                            if refuse {
                                encode_error(
                                    &mut out,
                                    id,
                                    Status::Internal,
                                    "fake shard: injected failure",
                                );
                            } else {
                                encode_response(&mut out, id, Status::Ok, &Response::Done).unwrap();
                            }
                        }
                    }
                    if write_half.write_all(&out).await.is_err() {
                        break;
                    }
                }
            }));
        }
    });
    FakeShard {
        addr,
        fail,
        hang,
        close,
        silent,
        downs,
        pings,
        gone,
    }
}

/// A fake server: `shards` fake shards.
pub async fn fake_server(log: &Log, shards: usize) -> Vec<FakeShard> {
    let mut v = Vec::new();
    for _ in 0..shards {
        v.push(fake_shard(log.clone()).await);
    }
    v
}

pub fn addrs(server: &[FakeShard]) -> Vec<String> {
    server.iter().map(|s| s.addr.clone()).collect()
}

pub fn take_log(log: &Log) -> Vec<(String, Ctl)> {
    std::mem::take(&mut *log.lock().unwrap())
}

/// Wait (at most 10 s) until `log` holds an entry that `pred` accepts.
pub async fn wait_for_log(log: &Log, what: &str, pred: impl Fn(&(String, Ctl)) -> bool) {
    let seen = insitu_testkit::poll_until(2000, || log.lock().unwrap().iter().any(&pred)).await;
    assert!(seen, "never saw {what}: {:?}", log.lock().unwrap());
}

/// The TakeTablet a shard gets for tablet `index` of `table`, at `version` in `state`.
pub fn take_of(table: &TableInfo, index: usize, version: u64, state: TabletState) -> Ctl {
    let tablet = &table.tablets[index];
    Ctl::Take {
        table: table.id,
        start: tablet.start_hash,
        end: tablet.end_hash,
        version,
        state,
    }
}

/// The first two steps of moving tablet `index` of `table` from `src` to
/// `dest`: TakeTablet Receiving on the destination, then MigrateTablet on the source.
pub fn move_start_log(
    table: &TableInfo,
    index: usize,
    src: &str,
    dest: &str,
) -> Vec<(String, Ctl)> {
    let take = take_of(table, index, table.map_version, TabletState::Receiving);
    let migrate = Ctl::Migrate {
        table: table.id,
        start: table.tablets[index].start_hash,
        dest: dest.to_string(),
    };
    vec![(dest.to_string(), take), (src.to_string(), migrate)]
}
