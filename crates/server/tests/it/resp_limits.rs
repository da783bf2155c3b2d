//! The Redis protocol port's input limits on real servers: bad input closes
//! only its own connection, stalled and idle connections are closed, a
//! growing command is charged to the frame budget, big MSETs served or refused whole.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::resp::{cluster, pipeline, read_reply};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_closes_only_its_connection() {
    let c = cluster(|_| {}).await;
    let addr = c.resp();
    tokio::task::spawn_blocking(move || {
        let bad: &[(&[u8], &str)] = &[
            (
                b"*1\r\n$99999999999\r\n",
                "-ERR Protocol error: invalid bulk length\r\n",
            ),
            (
                b"*1\r\n+OK\r\n",
                "-ERR Protocol error: expected '$', got '+'\r\n",
            ),
            (
                b"*99999999999\r\n",
                "-ERR Protocol error: invalid multibulk length\r\n",
            ),
            (
                b"SET k \"open\r\n",
                "-ERR Protocol error: unbalanced quotes in request\r\n",
            ),
            // Commands before the bad one in the same read are answered
            // first, in order (they are cut from the buffer as a batch).
            (
                b"SET a 1\r\nGET a\r\n*1\r\n+OK\r\n",
                "+OK\r\n$1\r\n1\r\n-ERR Protocol error: expected '$', got '+'\r\n",
            ),
        ];
        for (bytes, want) in bad {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(bytes).unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap(); // the server closes
            assert_eq!(String::from_utf8_lossy(&got), *want);
        }
        // A value over the limit (1 MiB by default) is refused the same way.
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(format!("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n${}\r\n", 2 << 20).as_bytes())
            .unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&got),
            "-ERR Protocol error: invalid bulk length\r\n"
        );
        // Inline commands (telnet) work, and the server kept serving.
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"SET k \"a b\"\r\nGET k\r\n").unwrap();
        let mut buf = Vec::new();
        assert_eq!(read_reply(&mut s, &mut buf), b"+OK\r\n");
        assert_eq!(read_reply(&mut s, &mut buf), b"$3\r\na b\r\n");
    })
    .await
    .unwrap();
}
/// The RESP port applies the shard's connection limits: a command not
/// completed within the stall timeout, and a connection idle past the idle
/// timeout, are closed; others keep being served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_and_idle_resp_connections_are_closed() {
    let c = cluster(|c| {
        c.limits.stall_timeout = Duration::from_millis(300);
        c.limits.idle_timeout = Duration::from_millis(600);
    })
    .await;
    let addr = c.resp();
    tokio::task::spawn_blocking(move || {
        let mut stalled = TcpStream::connect(addr).unwrap();
        stalled
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stalled.write_all(b"*2\r\n$3\r\nGET\r\n$5\r\nab").unwrap();
        let mut idle = TcpStream::connect(addr).unwrap();
        idle.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let t = std::time::Instant::now();
        let mut got = Vec::new();
        stalled.read_to_end(&mut got).unwrap();
        assert!(got.is_empty(), "{got:?}");
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "stall not enforced: {:?}",
            t.elapsed()
        );
        idle.read_to_end(&mut got).unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(500),
            "idle closed too early"
        );
        assert_eq!(pipeline(addr, &["PING"]), vec!["+PONG\r\n"]);
    })
    .await
    .unwrap();
}

/// A command's size is learned one argument at a time; the bytes buffered
/// for it are charged to the shard's frame budget in full as it grows, not
/// at the size of its first big argument (which let one connection buffer
/// up to a 16 MiB command against a charge of one argument's size).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_growing_command_is_charged_to_the_frame_budget_in_full() {
    const VALUE: usize = 512 * 1024;
    let c = cluster(|c| c.limits.stall_timeout = Duration::from_secs(30)).await;
    let addr = c.resp();
    let mut cmd = b"*7\r\n$4\r\nMSET\r\n".to_vec();
    for k in ["k1", "k2", "k3"] {
        cmd.extend_from_slice(format!("$2\r\n{k}\r\n${VALUE}\r\n").as_bytes());
        cmd.extend(std::iter::repeat_n(b'v', VALUE));
        cmd.extend_from_slice(b"\r\n");
    }
    // All but the last value's final bytes: the command stays incomplete.
    let sent = cmd.len() - 1024;
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&cmd[..sent]).unwrap();
    let buffered = || -> usize {
        c.node
            .server
            .buffered_frame_bytes()
            .iter()
            .map(|b| b.0)
            .sum()
    };
    let charged = insitu_testkit::poll_until(2000, || buffered() >= sent).await;
    assert!(
        charged,
        "{} bytes charged for a command of which {sent} bytes are buffered",
        buffered()
    );
    // A growing command's buffer at most doubles what it holds (`Inbox::growing`).
    assert!(buffered() <= 2 * cmd.len(), "{} charged", buffered());
    // Completed, it runs, and the charge is given back.
    s.write_all(&cmd[sent..]).unwrap();
    let mut got = Vec::new();
    assert_eq!(read_reply(&mut s, &mut got), b"+OK\r\n");
    assert!(insitu_testkit::poll_until(2000, || buffered() == 0).await);
}

/// An MSET of `pairs` keys `{prefix}:{i}` with 20-byte values, as one command.
fn mset_command(prefix: &str, pairs: usize) -> Vec<u8> {
    let mut cmd = format!("*{}\r\n$4\r\nMSET\r\n", 2 * pairs + 1).into_bytes();
    for i in 0..pairs {
        let (k, v) = (format!("{prefix}:{i}"), format!("value-{i:>14}"));
        cmd.extend_from_slice(format!("${}\r\n{k}\r\n${}\r\n{v}\r\n", k.len(), v.len()).as_bytes());
    }
    cmd
}

/// Big MSETs over the four shards of two servers: one of 30,000 pairs (a
/// 1.2 MB command of 60,001 arguments) is served, its buffer grown by
/// doubling (made exactly each new argument's end, it was copied whole per
/// argument and per byte of each argument's header: quadratic); one of
/// 60,000 pairs, over the per-shard limit of a transaction, is refused
/// with the limit named and writes nothing. Then one DEL removes them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_msets_are_served_or_refused_whole() {
    let c = cluster(|_| {}).await;
    let addr = c.resp();
    tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let mut got = Vec::new();
        s.write_all(&mset_command("big", 30_000)).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&read_reply(&mut s, &mut got)),
            "+OK\r\n"
        );
        s.write_all(&mset_command("huge", 60_000)).unwrap();
        let refused = String::from_utf8_lossy(&read_reply(&mut s, &mut got)).into_owned();
        assert!(
            refused.starts_with("-ERR")
                && refused.contains("more than the limit of 10000 per shard"),
            "{refused}"
        );
        assert_eq!(
            pipeline(
                addr,
                &[
                    "GET big:0",
                    "GET big:29999",
                    "GET huge:0",
                    "GET huge:59999",
                    "DBSIZE"
                ]
            ),
            vec![
                format!("$20\r\nvalue-{:>14}\r\n", 0),
                format!("$20\r\nvalue-{:>14}\r\n", 29_999),
                "$-1\r\n".to_string(),
                "$-1\r\n".to_string(),
                ":30000\r\n".to_string(),
            ]
        );
        // One DEL of every key, each named twice, and one never written:
        // removed in one round trip per shard, each counted once.
        let mut del = format!("*{}\r\n$3\r\nDEL\r\n", 2 * 30_000 + 2).into_bytes();
        for i in (0..30_000).chain(0..30_000) {
            let k = format!("big:{i}");
            del.extend_from_slice(format!("${}\r\n{k}\r\n", k.len()).as_bytes());
        }
        del.extend_from_slice(b"$5\r\nnever\r\n");
        s.write_all(&del).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&read_reply(&mut s, &mut got)),
            ":30000\r\n"
        );
        assert_eq!(
            pipeline(addr, &["GET big:7", "DBSIZE"]),
            vec!["$-1\r\n", ":0\r\n"]
        );
    })
    .await
    .unwrap();
}
