//! What the RESP tests share: a cluster of two servers with the Redis port,
//! raw RESP over a TCP stream (encode a command line, read one whole reply
//! of any type), pipelines and one-command-at-a-time connections.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use insitu_server::{RespSettings, ServerConfig};

/// A coordinator and two servers of two shards each, with the RESP port on
/// both (sharing one port number is `insitu up`'s business; here each has
/// its own).
pub struct Cluster {
    pub node: super::Node,
    pub second: insitu_server::ServerHandle,
}

impl Cluster {
    pub fn resp(&self) -> SocketAddr {
        self.node.server.resp_addr.expect("RESP port")
    }
    pub fn resp_of_second(&self) -> SocketAddr {
        self.second.resp_addr.expect("RESP port")
    }
}

pub fn with_resp(c: &mut ServerConfig) {
    c.shards = 2;
    c.resp = Some(RespSettings {
        port: 0,
        table: "redis".into(),
        join: false,
    });
}

pub async fn cluster(tweak: impl Fn(&mut ServerConfig) + Copy) -> Cluster {
    let node = super::start(|c| {
        with_resp(c);
        tweak(c);
    })
    .await;
    let mut config = ServerConfig::new(node.addr(), node.dir.path().join("s2"));
    with_resp(&mut config);
    tweak(&mut config);
    let second = insitu_server::start(config).await.unwrap();
    Cluster { node, second }
}

/// Read one whole RESP reply (any type, nested) from `s`, as raw bytes.
pub fn read_reply(s: &mut TcpStream, buf: &mut Vec<u8>) -> Vec<u8> {
    loop {
        if let Some(n) = reply_len(buf, 0) {
            return buf.drain(..n).collect();
        }
        let mut chunk = [0u8; 65536];
        let n = s.read(&mut chunk).expect("read reply");
        assert!(
            n > 0,
            "connection closed mid-reply; have {:?}",
            String::from_utf8_lossy(buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Length of the reply starting at `at`, if whole.
pub fn reply_len(buf: &[u8], at: usize) -> Option<usize> {
    let end = at + buf.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(&buf[at + 1..end]).ok()?;
    let after = end + 2;
    match buf[at] {
        b'+' | b'-' | b':' | b'_' | b',' | b'#' => Some(after - at),
        b'$' | b'=' => {
            let n: i64 = line.parse().ok()?;
            if n < 0 {
                return Some(after - at);
            }
            let stop = after + n as usize + 2;
            (buf.len() >= stop).then_some(stop - at)
        }
        b'*' | b'%' | b'~' => {
            let n: i64 = line.parse().ok()?;
            let items = if buf[at] == b'%' { 2 * n } else { n };
            let mut pos = after;
            for _ in 0..items.max(0) {
                pos += reply_len(buf, pos)?;
            }
            Some(pos - at)
        }
        other => panic!("not a RESP reply: {:?}", other as char),
    }
}

/// Encode `line` (split as redis-cli splits) as a multibulk command.
pub fn encode(line: &str) -> Vec<u8> {
    let args = insitu_resp::codec::split_args(line.as_bytes()).expect("test line");
    encode_args(&args)
}

/// Encode `args` as a multibulk command.
pub fn encode_args<A: AsRef<[u8]>>(args: &[A]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        let a = a.as_ref();
        out.extend(format!("${}\r\n", a.len()).bytes());
        out.extend_from_slice(a);
        out.extend(b"\r\n");
    }
    out
}

/// Send every line as one pipeline and return the replies, in order.
pub fn pipeline<S: AsRef<str>>(addr: SocketAddr, lines: &[S]) -> Vec<String> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let bytes: Vec<u8> = lines.iter().flat_map(|l| encode(l.as_ref())).collect();
    s.write_all(&bytes).unwrap();
    let mut buf = Vec::new();
    lines
        .iter()
        .map(|_| String::from_utf8_lossy(&read_reply(&mut s, &mut buf)).into_owned())
        .collect()
}

/// One connection, one command at a time.
pub struct Line(TcpStream, Vec<u8>);

impl Line {
    pub fn open(addr: SocketAddr) -> Line {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        Line(s, Vec::new())
    }
    pub fn call(&mut self, line: &str) -> String {
        self.0.write_all(&encode(line)).unwrap();
        String::from_utf8_lossy(&read_reply(&mut self.0, &mut self.1)).into_owned()
    }
}

/// A throwaway `redis-server` on loopback with `extra` flags, to compare
/// replies with; None (and a SKIPPED line) where none is installed.
pub fn start_redis(extra: &[&str]) -> Option<(insitu_testkit::Proc, SocketAddr)> {
    if !insitu_testkit::on_path("redis-server") {
        eprintln!("SKIPPED: the comparison with Redis (redis-server is not installed)");
        return None;
    }
    let port = insitu_testkit::free_port().unwrap();
    let mut cmd = std::process::Command::new("redis-server");
    cmd.args(insitu_testkit::redis_server_args(port))
        .args(extra);
    let (proc, _) = insitu_testkit::Proc::spawn(cmd, "redis-server", |l| {
        l.contains("Ready to accept connections")
    })
    .unwrap();
    Some((proc, SocketAddr::from(([127, 0, 0, 1], port))))
}
