//! A lean closed-loop load generator that drives Redis and insitu with the
//! *same* code: only the `Wire` (how a request is encoded and a reply cut
//! out) differs. Every connection is one task on the caller's single-threaded
//! runtime; it writes a batch of `depth` requests with one `write`, then reads
//! until all `depth` replies are in (depth 1 = no pipelining), records each
//! reply's latency from the moment its batch was written, and repeats until
//! the case's time is up. Nothing here allocates per request.

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::BytesMut;
use hdrhistogram::Histogram;
use insitu_protocol::frame::{MAX_BODY_BYTES, check_header};
use insitu_protocol::{Request, Response, Status, blob, decode_response, encode_request};
use insitu_tls::{ClientTls, Stream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::resp;

pub const KEY_BYTES: usize = 30;
pub const VALUE_BYTES: usize = 100;

pub type Key = [u8; KEY_BYTES];

/// Key number `i`: `key:` and 26 zero-padded decimal digits (30 bytes).
pub fn key(i: u64) -> Key {
    let mut k = [b'0'; KEY_BYTES];
    k[..4].copy_from_slice(b"key:");
    let mut n = i;
    let mut at = KEY_BYTES;
    while n > 0 && at > 4 {
        at -= 1;
        k[at] = b'0' + (n % 10) as u8;
        n /= 10;
    }
    k
}

/// The value written under key `i`: its number, then filler (100 bytes).
pub fn value(i: u64) -> [u8; VALUE_BYTES] {
    let mut v = [b'v'; VALUE_BYTES];
    v[..8].copy_from_slice(&i.to_le_bytes());
    v
}

/// How one store's requests and replies look on the wire.
pub trait Wire {
    fn read(&mut self, out: &mut BytesMut, key: &[u8]);
    fn write(&mut self, out: &mut BytesMut, key: &[u8], value: &[u8]);
    fn multi_read(&mut self, out: &mut BytesMut, keys: &[Key]);
    /// Write keys `first..first + n` with their values (the bulk load).
    fn multi_write(&mut self, out: &mut BytesMut, first: u64, n: u64);
    /// Cut one reply from the front of `buf`: Ok(None) if incomplete,
    /// Ok(Some(bytes consumed)). A failed operation is an error.
    fn parse(&mut self, buf: &[u8]) -> anyhow::Result<Option<usize>>;
}

/// RESP: GET / SET / MGET / MSET.
#[derive(Default)]
pub struct RedisWire;

impl Wire for RedisWire {
    #[inline]
    fn read(&mut self, out: &mut BytesMut, key: &[u8]) {
        resp::command(out, &[b"GET", key]);
    }
    #[inline]
    fn write(&mut self, out: &mut BytesMut, key: &[u8], value: &[u8]) {
        resp::command(out, &[b"SET", key, value]);
    }
    fn multi_read(&mut self, out: &mut BytesMut, keys: &[Key]) {
        resp::array_header(out, keys.len() + 1);
        resp::bulk(out, b"MGET");
        for k in keys {
            resp::bulk(out, k);
        }
    }
    fn multi_write(&mut self, out: &mut BytesMut, first: u64, n: u64) {
        resp::array_header(out, 2 * n as usize + 1);
        resp::bulk(out, b"MSET");
        for i in first..first + n {
            resp::bulk(out, &key(i));
            resp::bulk(out, &value(i));
        }
    }
    #[inline]
    fn parse(&mut self, buf: &[u8]) -> anyhow::Result<Option<usize>> {
        let Some((reply, used)) = resp::parse(buf)? else {
            return Ok(None);
        };
        match reply {
            resp::Reply::Bulk(v) if v.len() == VALUE_BYTES => {}
            resp::Reply::Simple(_) => {}
            resp::Reply::Array { nils: 0, .. } => {}
            other => bail!("unexpected redis reply {other:?}"),
        }
        Ok(Some(used))
    }
}

/// Whether an insitu `Retry` answer to a write counts as its answer (and
/// in `RETRY_ANSWERS`) instead of failing the case. Off except in `bench kv
/// --vs snapshots`: there two writes of one key in flight together meet the
/// lock the first holds over its oracle round trip, and the second is told
/// to retry, as the Rust client does by itself.
pub static ACCEPT_RETRY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// `Retry` answers counted while `ACCEPT_RETRY` is on.
pub static RETRY_ANSWERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// insitu's own protocol, through `insitu_protocol`'s encoder and decoder.
pub struct InsituWire {
    pub table: u64,
    next_id: u64,
}

impl InsituWire {
    pub fn new(table: u64) -> InsituWire {
        InsituWire { table, next_id: 1 }
    }
    #[inline]
    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }
}

impl Wire for InsituWire {
    #[inline]
    fn read(&mut self, out: &mut BytesMut, key: &[u8]) {
        let id = self.id();
        let request = Request::Read {
            table: self.table,
            key: blob(key),
        };
        encode_request(out, id, &request).expect("a read fits a frame");
    }
    #[inline]
    fn write(&mut self, out: &mut BytesMut, key: &[u8], value: &[u8]) {
        let id = self.id();
        let request = Request::Write {
            expires_at_ms: 0,
            table: self.table,
            key: blob(key),
            value: blob(value),
            rules: Default::default(),
        };
        encode_request(out, id, &request).expect("a write fits a frame");
    }
    fn multi_read(&mut self, out: &mut BytesMut, keys: &[Key]) {
        let id = self.id();
        let request = Request::MultiRead {
            table: self.table,
            keys: keys.iter().map(|k| blob(k)).collect(),
        };
        encode_request(out, id, &request).expect("a multiRead fits a frame");
    }
    fn multi_write(&mut self, out: &mut BytesMut, first: u64, n: u64) {
        let id = self.id();
        let keys: Vec<Key> = (first..first + n).map(key).collect();
        let values: Vec<[u8; VALUE_BYTES]> = (first..first + n).map(value).collect();
        let request = Request::MultiWrite {
            table: self.table,
            items: keys
                .iter()
                .zip(&values)
                .map(|(k, v)| (blob(k), blob(v)))
                .collect(),
        };
        encode_request(out, id, &request).expect("a load batch fits a frame");
    }
    #[inline]
    fn parse(&mut self, buf: &[u8]) -> anyhow::Result<Option<usize>> {
        let Some((header, body_len)) = check_header(buf, MAX_BODY_BYTES)? else {
            return Ok(None);
        };
        let total = insitu_protocol::HEADER_BYTES + body_len;
        if buf.len() < total {
            return Ok(None);
        }
        let body = &buf[insitu_protocol::HEADER_BYTES..total];
        let response = decode_response(body)?;
        if header.status == Status::Retry && ACCEPT_RETRY.load(Relaxed) {
            RETRY_ANSWERS.fetch_add(1, Relaxed);
            return Ok(Some(total));
        }
        if header.status != Status::Ok {
            bail!("insitu replied {}: {response:?}", header.status);
        }
        match response {
            Response::Read { value, .. } if value.len() == VALUE_BYTES => {}
            Response::Written { .. } => {}
            Response::MultiRead { results }
                if results
                    .iter()
                    .all(|r| r.status == Status::Ok && r.value.len() == VALUE_BYTES) => {}
            Response::MultiWrite { results } if results.iter().all(|r| r.status == Status::Ok) => {}
            other => bail!("unexpected insitu reply {other:?}"),
        }
        Ok(Some(total))
    }
}

/// What a timed case sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mix {
    Read,
    Write,
    /// Reads, with this percentage of writes mixed in.
    Mixed {
        write_pct: u32,
    },
    /// One request reading this many keys (multiRead / MGET).
    MultiRead(usize),
}

impl Mix {
    pub fn objects_per_op(self) -> u64 {
        match self {
            Mix::MultiRead(n) => n as u64,
            _ => 1,
        }
    }
}

#[derive(Clone, Debug)]
pub struct CaseSpec {
    pub mix: Mix,
    pub conns: usize,
    /// Requests per batch (1 = no pipelining).
    pub depth: usize,
    /// Run, but not counted, before the measured window.
    pub warmup: Duration,
    pub measure: Duration,
    /// Keys are drawn uniformly from `0..keys`.
    pub keys: u64,
    pub seed: u64,
}

pub struct CaseResult {
    /// Operations (requests) completed inside the measured window.
    pub ops: u64,
    /// Objects they read or wrote.
    pub objects: u64,
    pub window: Duration,
    /// Per-request latency, nanoseconds.
    pub hist: Histogram<u64>,
}

impl CaseResult {
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.window.as_secs_f64()
    }
    pub fn objects_per_sec(&self) -> f64 {
        self.objects as f64 / self.window.as_secs_f64()
    }
    /// Latency at `q` (0..=100), microseconds.
    pub fn latency_us(&self, q: f64) -> f64 {
        self.hist.value_at_quantile(q / 100.0) as f64 / 1000.0
    }
}

/// A connection to `addr`, over TLS if `tls` is given (the handshake is
/// not measured: connections open before a case's clock starts).
async fn connect(addr: SocketAddr, tls: Option<&ClientTls>) -> anyhow::Result<Stream> {
    let stream = TcpStream::connect(addr)
        .await
        .with_context(|| format!("cannot connect to {addr}"))?;
    stream.set_nodelay(true)?;
    Ok(match tls {
        Some(tls) => tls.connect(&addr.to_string(), stream).await?,
        None => Stream::Plain(stream),
    })
}

/// Write a whole batch; flushed, so TLS holds no record back (free on TCP).
async fn send(stream: &mut Stream, bytes: &[u8]) -> std::io::Result<()> {
    stream.write_all(bytes).await?;
    stream.flush().await
}

/// A connection's receive side: bytes read but not yet parsed.
struct Inbox {
    buf: Vec<u8>,
    lo: usize,
    hi: usize,
}

impl Inbox {
    fn new() -> Inbox {
        Inbox {
            buf: vec![0; 256 * 1024],
            lo: 0,
            hi: 0,
        }
    }

    /// Wait for the next whole reply and consume it.
    #[inline]
    async fn next<W: Wire>(&mut self, stream: &mut Stream, wire: &mut W) -> anyhow::Result<()> {
        loop {
            if let Some(n) = wire.parse(&self.buf[self.lo..self.hi])? {
                self.lo += n;
                if self.lo == self.hi {
                    (self.lo, self.hi) = (0, 0);
                }
                return Ok(());
            }
            if self.hi == self.buf.len() {
                if self.lo > 0 {
                    self.buf.copy_within(self.lo..self.hi, 0);
                    self.hi -= self.lo;
                    self.lo = 0;
                } else {
                    let len = self.buf.len();
                    self.buf.resize(len * 2, 0);
                }
            }
            let n = stream.read(&mut self.buf[self.hi..]).await?;
            if n == 0 {
                bail!("the server closed the connection");
            }
            self.hi += n;
        }
    }
}

/// Run one timed case: `spec.conns` connections made by `make` (one `Wire`
/// each), all on the current thread. Call inside a `LocalSet`.
pub async fn run_case<W, F>(
    addr: SocketAddr,
    tls: Option<&ClientTls>,
    make: F,
    spec: &CaseSpec,
) -> anyhow::Result<CaseResult>
where
    W: Wire + 'static,
    F: Fn() -> W,
{
    let mut streams = Vec::with_capacity(spec.conns);
    for _ in 0..spec.conns {
        streams.push(connect(addr, tls).await?);
    }
    let begin = Instant::now();
    let measure_from = begin + spec.warmup;
    let end = measure_from + spec.measure;
    let mut tasks = Vec::with_capacity(spec.conns);
    for (c, mut stream) in streams.into_iter().enumerate() {
        let mut wire = make();
        let spec = spec.clone();
        tasks.push(tokio::task::spawn_local(async move {
            let mut rng = insitu_testkit::rng(spec.seed ^ ((c as u64 + 1) << 32));
            let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
            let mut out = BytesMut::with_capacity(64 * 1024);
            let mut inbox = Inbox::new();
            let mut multi: Vec<Key> = Vec::new();
            let (mut ops, mut objects) = (0u64, 0u64);
            let per_op = spec.mix.objects_per_op();
            while Instant::now() < end {
                out.clear();
                for _ in 0..spec.depth {
                    match spec.mix {
                        Mix::Read => wire.read(&mut out, &key(rng.u64(0..spec.keys))),
                        Mix::Write => {
                            let i = rng.u64(0..spec.keys);
                            wire.write(&mut out, &key(i), &value(i));
                        }
                        Mix::Mixed { write_pct } => {
                            let i = rng.u64(0..spec.keys);
                            if rng.u64(0..100) < u64::from(write_pct) {
                                wire.write(&mut out, &key(i), &value(i));
                            } else {
                                wire.read(&mut out, &key(i));
                            }
                        }
                        Mix::MultiRead(n) => {
                            multi.clear();
                            multi.extend((0..n).map(|_| key(rng.u64(0..spec.keys))));
                            wire.multi_read(&mut out, &multi);
                        }
                    }
                }
                let sent = Instant::now();
                send(&mut stream, &out).await?;
                for _ in 0..spec.depth {
                    inbox.next(&mut stream, &mut wire).await?;
                    let done = Instant::now();
                    if sent >= measure_from && done <= end {
                        hist.record((done - sent).as_nanos().max(1) as u64)?;
                        ops += 1;
                        objects += per_op;
                    }
                }
            }
            anyhow::Ok((ops, objects, hist))
        }));
    }
    let mut result = CaseResult {
        ops: 0,
        objects: 0,
        window: spec.measure,
        hist: Histogram::new_with_bounds(1, 60_000_000_000, 3)?,
    };
    for t in tasks {
        let (ops, objects, hist) = t.await.context("load task panicked")??;
        result.ops += ops;
        result.objects += objects;
        result.hist.add(hist)?;
    }
    Ok(result)
}

/// Load keys `0..keys` in batches of `batch` (MSET / multiWrite) over
/// `conns` connections. Returns the time it took.
pub async fn load<W, F>(
    addr: SocketAddr,
    tls: Option<&ClientTls>,
    make: F,
    keys: u64,
    batch: u64,
    conns: usize,
) -> anyhow::Result<Duration>
where
    W: Wire + 'static,
    F: Fn() -> W,
{
    let start = Instant::now();
    let next = Rc::new(Cell::new(0u64));
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let mut stream = connect(addr, tls).await?;
        let mut wire = make();
        let next = next.clone();
        tasks.push(tokio::task::spawn_local(async move {
            let mut out = BytesMut::with_capacity(256 * 1024);
            let mut inbox = Inbox::new();
            loop {
                let first = next.get();
                if first >= keys {
                    break;
                }
                let n = batch.min(keys - first);
                next.set(first + n);
                out.clear();
                wire.multi_write(&mut out, first, n);
                send(&mut stream, &out).await?;
                inbox.next(&mut stream, &mut wire).await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await.context("load task panicked")??;
    }
    Ok(start.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_30_bytes_and_distinct() {
        assert_eq!(&key(0), b"key:00000000000000000000000000");
        assert_eq!(&key(1234), b"key:00000000000000000000001234");
        assert_ne!(key(1), key(10));
    }

    #[test]
    fn insitu_wire_round_trips_a_read_reply() {
        let mut w = InsituWire::new(3);
        let mut out = BytesMut::new();
        let v = value(5);
        insitu_protocol::encode_response(
            &mut out,
            9,
            Status::Ok,
            &Response::Read {
                version: 1,
                value: blob(&v),
                expires_at_ms: 0,
            },
        )
        .unwrap();
        let n = out.len();
        assert_eq!(w.parse(&out[..n - 1]).unwrap(), None);
        assert_eq!(w.parse(&out).unwrap(), Some(n));
    }
}
