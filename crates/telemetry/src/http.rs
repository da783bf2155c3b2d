//! The metrics port: a minimal HTTP/1.1 server for `GET /metrics` (the
//! Prometheus text) and `GET /` (a status page, where the process has one).
//!
//! Hand-written rather than a web framework: two read-only routes, one
//! request per connection (`Connection: close`), and every limit explicit:
//! the request head is at most `MAX_HEAD_BYTES` and must arrive within
//! `READ_TIMEOUT`, at most `MAX_CONNECTIONS` are served at once (more wait
//! in the kernel's accept queue), a reply must be taken within `WRITE_TIMEOUT`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// A request head longer than this is refused (a scraper's is ~200 bytes).
pub const MAX_HEAD_BYTES: usize = 8 * 1024;
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 32;
const READ_TIMEOUT: Duration = Duration::from_secs(5);
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Renders the status page (`GET /`): HTML.
pub type StatusPage = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = String> + Send>> + Send + Sync>;

/// Serve the metrics port on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, page: Option<StatusPage>) {
    super::recorder();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!("metrics port: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let page = page.clone();
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(e) = answer(stream, page).await {
                tracing::debug!("metrics port: {e}");
            }
        });
    }
}

/// The path of a `GET` request head, or the status line to refuse it with.
fn parse_head(head: &[u8]) -> Result<&str, &'static str> {
    let line_end = head
        .iter()
        .position(|b| *b == b'\r' || *b == b'\n')
        .ok_or("400 Bad Request")?;
    let line = std::str::from_utf8(&head[..line_end]).map_err(|_| "400 Bad Request")?;
    let mut parts = line.split(' ');
    let (method, target) = match (parts.next(), parts.next(), parts.next()) {
        (Some(m), Some(t), Some(v)) if v.starts_with("HTTP/1.") => (m, t),
        _ => return Err("400 Bad Request"),
    };
    if method != "GET" && method != "HEAD" {
        return Err("405 Method Not Allowed");
    }
    // The query string is ignored (`/metrics?x=1` is `/metrics`).
    Ok(target.split('?').next().unwrap_or(target))
}

async fn answer(mut stream: TcpStream, page: Option<StatusPage>) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let complete = tokio::time::timeout(READ_TIMEOUT, async {
        let mut buf = [0u8; 1024];
        loop {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Ok::<bool, std::io::Error>(false);
            }
            head.extend_from_slice(&buf[..n]);
            if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
                return Ok(true);
            }
            if head.len() > MAX_HEAD_BYTES {
                return Ok(false);
            }
        }
    })
    .await;
    let (status, content_type, body) = match complete {
        Ok(Ok(true)) => match parse_head(&head) {
            Ok("/metrics") => (
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                super::render(),
            ),
            Ok("/") => match &page {
                Some(render) => ("200 OK", "text/html; charset=utf-8", render().await),
                None => (
                    "200 OK",
                    "text/plain; charset=utf-8",
                    "insitu: metrics at /metrics (the status page is on the coordinator's metrics port)\n"
                        .to_string(),
                ),
            },
            Ok(_) => (
                "404 Not Found",
                "text/plain; charset=utf-8",
                "not found: try /metrics or /\n".to_string(),
            ),
            Err(status) => (status, "text/plain; charset=utf-8", format!("{status}\n")),
        },
        Ok(Ok(false)) if head.len() > MAX_HEAD_BYTES => (
            "431 Request Header Fields Too Large",
            "text/plain; charset=utf-8",
            "request head too large\n".to_string(),
        ),
        Ok(Ok(false)) => return Ok(()),
        Ok(Err(e)) => return Err(e),
        Err(_) => (
            "408 Request Timeout",
            "text/plain; charset=utf-8",
            "request head not received in time\n".to_string(),
        ),
    };
    let is_head = head.starts_with(b"HEAD ");
    let mut reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !is_head {
        reply.extend_from_slice(body.as_bytes());
    }
    tokio::time::timeout(WRITE_TIMEOUT, async {
        stream.write_all(&reply).await?;
        stream.shutdown().await
    })
    .await
    .unwrap_or(Ok(()))
}

/// `GET path` on `addr`: the status code and body (for tests and scripts).
pub async fn get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).await?;
    let text = String::from_utf8_lossy(&reply).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no HTTP head in the reply"))?;
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line: {head}")))?;
    Ok((code, body.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_are_parsed_or_refused() {
        assert_eq!(parse_head(b"GET /metrics HTTP/1.1\r\n\r\n"), Ok("/metrics"));
        assert_eq!(
            parse_head(b"GET /metrics?a=b HTTP/1.0\r\n\r\n"),
            Ok("/metrics")
        );
        assert_eq!(
            parse_head(b"POST / HTTP/1.1\r\n\r\n"),
            Err("405 Method Not Allowed")
        );
        assert_eq!(parse_head(b"GET /\r\n\r\n"), Err("400 Bad Request"));
        assert_eq!(
            parse_head(b"\xff\xfe HTTP/1.1\r\n\r\n"),
            Err("400 Bad Request")
        );
    }

    #[tokio::test]
    async fn metrics_parse_as_prometheus_text_and_counters_move() {
        crate::recorder();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let page: StatusPage = Arc::new(|| Box::pin(async { "<html>page</html>".to_string() }));
        tokio::spawn(serve(listener, Some(page)));
        let counter = |n| metrics::counter!("insitu_test_events_total", "kind" => "a").increment(n);
        counter(3);
        let value = |text: &str| {
            let lines = text.lines().map(|l| Ok(l.to_string()));
            let scrape = prometheus_parse::Scrape::parse(lines).expect("Prometheus text");
            scrape
                .samples
                .iter()
                .find(|s| s.metric == "insitu_test_events_total")
                .map(|s| match s.value {
                    prometheus_parse::Value::Counter(v) => v,
                    ref other => panic!("not a counter: {other:?}"),
                })
        };
        let (code, first) = get(&addr, "/metrics").await.unwrap();
        assert_eq!(code, 200);
        assert_eq!(value(&first), Some(3.0));
        counter(2);
        let (_, second) = get(&addr, "/metrics").await.unwrap();
        assert_eq!(value(&second), Some(5.0));
        assert_eq!(
            get(&addr, "/").await.unwrap(),
            (200, "<html>page</html>".into())
        );
        assert_eq!(get(&addr, "/nope").await.unwrap().0, 404);
        // A head that never ends is cut off at the limit.
        let mut s = TcpStream::connect(&addr).await.unwrap();
        let huge = format!("GET /{} HTTP/1.1\r\n", "a".repeat(MAX_HEAD_BYTES * 2));
        let _ = s.write_all(huge.as_bytes()).await;
        let mut reply = Vec::new();
        let _ = s.read_to_end(&mut reply).await;
        assert!(String::from_utf8_lossy(&reply).starts_with("HTTP/1.1 431"));
    }

    /// 32 silent connections take every slot: a scrape waits (it is not
    /// answered while they hold them), each silent one is answered 408 after
    /// `READ_TIMEOUT`, and then the scrape is served.
    #[tokio::test]
    async fn silent_connections_hold_slots_until_their_head_times_out() {
        crate::recorder();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(serve(listener, None));
        let mut silent = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            silent.push(TcpStream::connect(&addr).await.unwrap());
        }
        // Let the server accept them all before the scrape arrives.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = std::time::Instant::now();
        let scrape = tokio::spawn({
            let addr = addr.clone();
            async move { get(&addr, "/metrics").await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            !scrape.is_finished(),
            "served beyond {MAX_CONNECTIONS} connections"
        );
        let (code, _) = tokio::time::timeout(READ_TIMEOUT * 3, scrape)
            .await
            .expect("served once slots free up")
            .unwrap()
            .unwrap();
        assert_eq!(code, 200);
        assert!(started.elapsed() >= READ_TIMEOUT - Duration::from_millis(500));
        for mut s in silent {
            let mut reply = Vec::new();
            let _ = s.read_to_end(&mut reply).await;
            assert!(
                String::from_utf8_lossy(&reply).starts_with("HTTP/1.1 408"),
                "{}",
                String::from_utf8_lossy(&reply)
            );
        }
    }
}
