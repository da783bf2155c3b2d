//! `Client::timestamp` against a fake coordinator that answers `Timestamps`
//! from a counter and, when gated, holds each reply until the test lets it
//! go: concurrent callers share requests and get distinct timestamps, a
//! caller that arrives while a request is in flight waits for the next one,
//! a refusal reaches every caller of its request and the next call starts
//! afresh, and the blocking client takes timestamps too.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use futures::StreamExt;
use insitu_protocol::{
    FrameCodec, Request, Response, Status, decode_request, encode_error, encode_response,
};
use tokio::io::AsyncWriteExt;
use tokio::sync::Semaphore;
use tokio_util::codec::FramedRead;

use crate::{BlockingClient, Client, ClientConfig, ClientError};

/// What the fake coordinator saw and how it answers.
#[derive(Default)]
struct Fake {
    /// The `count` of every `Timestamps` request, in arrival order.
    counts: Mutex<Vec<u32>>,
    /// The next timestamp it hands out (starts at 100).
    next: AtomicU64,
    /// Gated: one permit per `Timestamps` reply.
    gate: Option<Semaphore>,
    /// Refuse the next `Timestamps` request with `Internal`.
    refuse_next: std::sync::atomic::AtomicBool,
}

impl Fake {
    fn counts(&self) -> Vec<u32> {
        self.counts.lock().unwrap().clone()
    }

    /// Wait (at most 10 s) until `n` requests arrived.
    async fn requests(&self, n: usize) {
        for _ in 0..1000 {
            if self.counts.lock().unwrap().len() >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("only {:?} arrived, expected {n} requests", self.counts());
    }
}

/// A fake coordinator on loopback: (its address, its state).
async fn fake_coordinator(gated: bool) -> (String, Arc<Fake>) {
    let fake = Arc::new(Fake {
        next: AtomicU64::new(100),
        gate: gated.then(|| Semaphore::new(0)),
        ..Fake::default()
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let state = fake.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let fake = state.clone();
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut frames = FramedRead::new(read, FrameCodec::default());
                while let Some(Ok(frame)) = frames.next().await {
                    let id = frame.header.request_id;
                    let mut out = BytesMut::new();
                    match decode_request(&frame.body) {
                        Ok(Request::Ping) => {
                            encode_response(&mut out, id, Status::Ok, &Response::Pong).unwrap()
                        }
                        Ok(Request::Timestamps { count }) => {
                            fake.counts.lock().unwrap().push(count);
                            if let Some(gate) = &fake.gate {
                                gate.acquire().await.unwrap().forget();
                            }
                            if fake.refuse_next.swap(false, Ordering::SeqCst) {
                                encode_error(&mut out, id, Status::Internal, "injected refusal");
                            } else {
                                let first = fake.next.fetch_add(count.into(), Ordering::SeqCst);
                                let reply = Response::Timestamps { first, count };
                                encode_response(&mut out, id, Status::Ok, &reply).unwrap();
                            }
                        }
                        _ => encode_error(&mut out, id, Status::BadRequest, "fake: unexpected"),
                    }
                    if write.write_all(&out).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, fake)
}

async fn client(addr: &str) -> Client {
    Client::connect_with(addr, ClientConfig::default())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_callers_share_requests_and_get_distinct_timestamps() {
    let (addr, fake) = fake_coordinator(false).await;
    let client = client(&addr).await;
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut mine = Vec::new();
                for _ in 0..50 {
                    mine.push(client.timestamp().await.unwrap());
                }
                mine
            })
        })
        .collect();
    let mut all = HashSet::new();
    for task in tasks {
        let mine = task.await.unwrap();
        // One caller's calls follow each other: increasing.
        assert!(mine.windows(2).all(|w| w[1] > w[0]), "{mine:?}");
        for ts in mine {
            assert!(ts >= 100);
            assert!(all.insert(ts), "{ts} handed out twice");
        }
    }
    let counts = fake.counts();
    assert_eq!(counts.iter().map(|&c| c as usize).sum::<usize>(), 64 * 50);
    assert!(counts.len() < 64 * 50, "no request was shared");
}

#[tokio::test]
async fn a_caller_that_arrives_during_a_request_waits_for_the_next_one() {
    let (addr, fake) = fake_coordinator(true).await;
    let client = client(&addr).await;
    let first = tokio::spawn({
        let client = client.clone();
        async move { client.timestamp().await.unwrap() }
    });
    fake.requests(1).await;
    let later: Vec<_> = (0..10)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.timestamp().await.unwrap() })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(fake.counts(), [1], "the later callers sent nothing yet");
    let gate = fake.gate.as_ref().unwrap();
    gate.add_permits(1);
    assert_eq!(first.await.unwrap(), 100);
    // The next request is sent after they all arrived, for all of them.
    fake.requests(2).await;
    gate.add_permits(1);
    let mut got = Vec::new();
    for task in later {
        got.push(task.await.unwrap());
    }
    got.sort_unstable();
    assert_eq!(got, (101..111).collect::<Vec<_>>());
    assert_eq!(fake.counts(), [1, 10]);
}

#[tokio::test]
async fn a_refusal_reaches_every_caller_of_its_request_and_the_next_call_starts_afresh() {
    let (addr, fake) = fake_coordinator(false).await;
    let client = client(&addr).await;
    fake.refuse_next.store(true, Ordering::SeqCst);
    let calls: Vec<_> = (0..5).map(|_| client.timestamp()).collect();
    for result in futures::future::join_all(calls).await {
        match result {
            Err(ClientError::Status(Status::Internal, message)) => {
                assert!(message.contains("injected"), "{message}")
            }
            other => panic!("expected the refusal, got {other:?}"),
        }
    }
    assert_eq!(client.timestamp().await.unwrap(), 100);
    assert_eq!(fake.counts(), [5, 1]);
}

#[test]
fn the_blocking_client_takes_timestamps() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (addr, _fake) = runtime.block_on(fake_coordinator(false));
    let client = BlockingClient::connect_with(&addr, ClientConfig::default()).unwrap();
    let a = client.timestamp().unwrap();
    assert!(client.timestamp().unwrap() > a);
}
