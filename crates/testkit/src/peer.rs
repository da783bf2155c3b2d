//! A fake insitu peer for tests: a loopback listener whose connections read
//! request frames and answer each through a handler, so a test that stands
//! in for a backup, a shard or a coordinator writes only what it answers.
//! Frames are read with the protocol crate's own header check (only it
//! knows the wire bytes).

use std::sync::Arc;

use bytes::BytesMut;
use insitu_protocol::frame::{HEADER_BYTES, MAX_BODY_BYTES, check_header};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Start a fake peer on 127.0.0.1; returns its address. `answer(request_id,
/// body, out)` encodes the reply (or nothing) into `out`; a connection ends
/// when its peer closes it or sends a malformed header.
pub async fn serve(
    answer: impl Fn(u64, &[u8], &mut BytesMut) + Send + Sync + 'static,
) -> std::io::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut header = [0u8; HEADER_BYTES];
                loop {
                    if stream.read_exact(&mut header).await.is_err() {
                        return;
                    }
                    let Ok(Some((h, len))) = check_header(&header, MAX_BODY_BYTES) else {
                        return;
                    };
                    let mut body = vec![0u8; len];
                    if stream.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    let mut out = BytesMut::new();
                    answer(h.request_id, &body, &mut out);
                    if !out.is_empty() && stream.write_all(&out).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok(addr)
}
