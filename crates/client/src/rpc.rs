//! A pipelined RPC connection to one insitu endpoint (a shard or the coordinator).
//!
//! Requests get increasing ids; a reader task matches responses to callers by
//! id, so many requests can be in flight on one TCP connection. Reading and
//! writing run in separate tasks so a large request and a large response can
//! never wait on each other.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use insitu_auth::Credentials;
use insitu_protocol::{
    FrameCodec, FrameKind, HEADER_BYTES, MAX_BODY_BYTES, ProtocolError, Request, Response, Status,
    blob, decode_response, encode_request, encode_request_parts, encoded_len,
};
use insitu_tls::{ClientTls, Stream};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::FramedRead;

/// Queued frames are coalesced into one write up to this many bytes: small
/// pipelined requests share a syscall, large ones are written as they are.
const COALESCE_BYTES: usize = 64 * 1024;

/// A frame for the writer task.
enum Outgoing {
    /// Encoded whole (small ones are coalesced into one write).
    Whole(BytesMut),
    /// Encoded in parts that share the big byte strings of the caller
    /// (`encode_request_parts`): written part by part, never copied here.
    Parts(Vec<Bytes>),
}

/// A reply whose body is still encoded; `decode` borrows from it.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status from the frame header.
    pub status: Status,
    /// The still-encoded body (`decode` borrows from it, values share it).
    pub body: Bytes,
}

impl Reply {
    pub fn decode(&self) -> Result<Response<'_>, RpcError> {
        decode_response(&self.body).map_err(RpcError::Protocol)
    }

    /// The error message of a non-Ok reply (empty if the body is not an error).
    pub fn error_message(&self) -> String {
        match self.decode() {
            Ok(Response::Error { message }) => message,
            _ => String::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("connection to {0} closed")]
    Closed(String),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("protocol: {0}")]
    Protocol(#[from] ProtocolError),
    #[error("unexpected reply: {0}")]
    Unexpected(String),
    /// The peer refused the connection's `Hello` (wrong or missing token).
    #[error("{addr} refused the connection: {status}: {message}")]
    Refused {
        addr: String,
        status: Status,
        message: String,
    },
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Reply>>>>;

/// One connection. Cheap to clone; clones share the socket.
#[derive(Clone)]
pub struct RpcConn {
    /// Shared by clones: one socket, one id counter, one pending map.
    inner: Arc<Inner>,
}

struct Inner {
    /// The peer's address, for errors.
    addr: String,
    /// Request id of the next call; replies are matched by it.
    next_id: AtomicU64,
    /// Callers waiting for a reply, by request id.
    pending: Pending,
    /// Encoded frames to the writer task.
    tx: mpsc::UnboundedSender<Outgoing>,
    /// Set by the reader or writer task when the socket is done.
    closed: Arc<AtomicBool>,
}

impl RpcConn {
    /// A plain connection that presents no token: for clusters without
    /// authentication or TLS (and tests of what an anonymous peer is refused).
    pub async fn connect(addr: &str) -> Result<RpcConn, RpcError> {
        RpcConn::open(addr, &Credentials::none()).await
    }

    /// A connection over TLS if `credentials.tls` is set (the handshake
    /// verifies the peer's certificate), which then presents the token (if
    /// any) in a `Hello` and waits for the peer to accept it, so a wrong
    /// token or certificate is reported here, not as a later request's
    /// closed connection.
    pub async fn open(addr: &str, credentials: &Credentials) -> Result<RpcConn, RpcError> {
        let conn = RpcConn::connect_unauthenticated(addr, credentials.tls.as_ref()).await?;
        if let Some(token) = &credentials.token {
            let hello = Request::Hello {
                token: blob(token.as_bytes()),
            };
            let reply = conn.call(&hello).await?;
            if !reply.status.is_ok() {
                return Err(RpcError::Refused {
                    addr: addr.to_string(),
                    status: reply.status,
                    message: reply.error_message(),
                });
            }
        }
        Ok(conn)
    }

    async fn connect_unauthenticated(
        addr: &str,
        tls: Option<&ClientTls>,
    ) -> Result<RpcConn, RpcError> {
        let connect_err = |source| RpcError::Connect {
            addr: addr.to_string(),
            source,
        };
        let tcp = TcpStream::connect(addr).await.map_err(connect_err)?;
        tcp.set_nodelay(true).ok();
        let stream = match tls {
            Some(tls) => tls.connect(addr, tcp).await.map_err(connect_err)?,
            None => Stream::Plain(tcp),
        };
        let (read_half, mut write_half) = stream.into_split();
        let pending: Pending = Arc::default();
        let closed = Arc::new(AtomicBool::new(false));
        let (tx, mut rx) = mpsc::unbounded_channel::<Outgoing>();

        let closed_w = closed.clone();
        tokio::spawn(async move {
            // A frame taken from the queue that did not join the last write.
            let mut carried: Option<Outgoing> = None;
            loop {
                let next = match carried.take() {
                    Some(next) => next,
                    None => match rx.recv().await {
                        Some(next) => next,
                        None => break,
                    },
                };
                let written = match next {
                    Outgoing::Whole(mut buf) => {
                        // Coalesce small queued frames into one write; a big
                        // frame (a replication batch) goes out alone rather
                        // than copied.
                        while buf.len() < COALESCE_BYTES {
                            match rx.try_recv() {
                                Ok(Outgoing::Whole(more))
                                    if buf.len() + more.len() <= COALESCE_BYTES =>
                                {
                                    buf.extend_from_slice(&more)
                                }
                                Ok(more) => {
                                    carried = Some(more);
                                    break;
                                }
                                Err(_) => break,
                            }
                        }
                        write_half.write_all(&buf).await
                    }
                    Outgoing::Parts(parts) => {
                        let mut result = Ok(());
                        for part in &parts {
                            result = write_half.write_all(part).await;
                            if result.is_err() {
                                break;
                            }
                        }
                        result
                    }
                };
                // Flush: TLS may hold records the socket did not take yet.
                if written.is_err() || write_half.flush().await.is_err() {
                    break;
                }
            }
            closed_w.store(true, Ordering::Release);
        });

        let pending_r = pending.clone();
        let closed_r = closed.clone();
        tokio::spawn(async move {
            let mut frames = FramedRead::new(read_half, FrameCodec::default());
            while let Some(Ok(frame)) = frames.next().await {
                if frame.header.kind != FrameKind::Response {
                    break;
                }
                let waiter = pending_r
                    .lock()
                    .expect("pending map")
                    .remove(&frame.header.request_id);
                if let Some(waiter) = waiter {
                    let _ = waiter.send(Reply {
                        status: frame.header.status,
                        body: frame.body.freeze(),
                    });
                }
            }
            closed_r.store(true, Ordering::Release);
            // Dropping the senders wakes every waiter with "closed".
            pending_r.lock().expect("pending map").clear();
        });

        Ok(RpcConn {
            inner: Arc::new(Inner {
                addr: addr.to_string(),
                next_id: AtomicU64::new(1),
                pending,
                tx,
                closed,
            }),
        })
    }

    pub fn addr(&self) -> &str {
        &self.inner.addr
    }

    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }

    /// Send one request and wait for its reply.
    pub async fn call(&self, request: &Request<'_>) -> Result<Reply, RpcError> {
        // Sized before encoding: a large request (a replication batch)
        // would otherwise grow by doubling, copying and faulting in pages.
        // (A request too large for a frame fails in `encode_request`.)
        let mut buf =
            BytesMut::with_capacity(HEADER_BYTES + encoded_len(request).min(MAX_BODY_BYTES));
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        encode_request(&mut buf, id, request)?;
        self.submit(id, Outgoing::Whole(buf)).await
    }

    /// `call`, where the big byte strings `request` borrows from `shared`
    /// go to the socket from that memory, not copied into a frame first
    /// (`encode_request_parts`): a replication round's segment bytes, sent
    /// to several backups.
    pub async fn call_sharing(
        &self,
        request: &Request<'_>,
        shared: &[Bytes],
    ) -> Result<Reply, RpcError> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let parts = encode_request_parts(id, request, shared)?;
        self.submit(id, Outgoing::Parts(parts)).await
    }

    /// Queue frame `id` for the writer and wait for its reply.
    async fn submit(&self, id: u64, frame: Outgoing) -> Result<Reply, RpcError> {
        let (reply_tx, reply_rx) = oneshot::channel();
        self.inner
            .pending
            .lock()
            .expect("pending map")
            .insert(id, reply_tx);
        if self.is_closed() || self.inner.tx.send(frame).is_err() {
            self.inner.pending.lock().expect("pending map").remove(&id);
            return Err(RpcError::Closed(self.inner.addr.clone()));
        }
        reply_rx
            .await
            .map_err(|_| RpcError::Closed(self.inner.addr.clone()))
    }

    /// `call` with a deadline.
    pub async fn call_timeout(
        &self,
        request: &Request<'_>,
        timeout: Duration,
    ) -> Result<Reply, RpcError> {
        tokio::time::timeout(timeout, self.call(request))
            .await
            .map_err(|_| RpcError::Timeout(timeout))?
    }
}
