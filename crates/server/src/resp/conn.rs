//! One RESP connection: read what has arrived, run every whole command in
//! it, wait until the shard's changes are durable, write all the replies in
//! one syscall (a pipeline of commands is thereby batched, as on the native
//! port).
//!
//! Bounded like the native port (`crate::inbox`): a base buffer of 64 KiB,
//! a bigger command first takes its size from the shard's frame budget (its
//! buffer doubling as its arguments arrive, `Inbox::growing`: a command's
//! length is learned one argument at a time), a
//! command not completed within the stall timeout closes the connection, so
//! does an idle timeout, and idle connections may be evicted at the
//! connection limit. A malformed command gets Redis's `Protocol error`
//! reply and closes only its own connection.

use bytes::{Bytes, BytesMut};
use insitu_resp::reply::Out;
use insitu_resp::{Parsed, Session, execute, parse, prefetch};
use insitu_tls::Stream;

use crate::conn::{BASE_BUFFER_BYTES, ended_by, replies_durable, write};
use crate::inbox::{Inbox, Wait};
use crate::limits::Closed;
use crate::shard::ShardState;

use super::RespShard;
use super::store::ShardStore;

/// Replies buffered past this are written before more commands run, so a
/// long pipeline of big replies cannot pile up.
const MAX_PENDING_REPLY_BYTES: usize = 4 * 1024 * 1024;
/// Commands cut from the buffer before any of them runs (see `serve`):
/// more than a pipeline of 16 (`redis-benchmark -P 16`), few enough that
/// the entries prefetched for the first are still in cache when it runs.
const PIPELINE_BATCH: usize = 32;

pub async fn serve(
    mut stream: Stream,
    state: &ShardState,
    resp: &RespShard,
) -> std::io::Result<Option<Closed>> {
    let limits = &state.limits;
    let store = ShardStore { state, resp };
    let mut session = Session::new(super::next_client_id());
    // The address this client reached: the node cluster clients are told of.
    session.local = stream
        .tcp()
        .local_addr()
        .ok()
        .map(|a| (a.ip().to_string(), a.port()));
    let mut inbox = Inbox::growing(resp.config.limits.max_command_bytes);
    let mut wbuf = BytesMut::with_capacity(BASE_BUFFER_BYTES);
    let mut batch: Vec<Vec<Bytes>> = Vec::with_capacity(PIPELINE_BATCH);
    loop {
        let mut need = 1;
        let mut ran = false;
        'commands: loop {
            // Cut up to a batch of whole commands first, so the store can
            // start loading what all of them read before the first runs
            // (`insitu_resp::prefetch`); they still run one by one, in order.
            let mut stop = None;
            while batch.len() < PIPELINE_BATCH {
                match parse(&mut inbox.buf, &resp.config.limits) {
                    Ok(Parsed::Command(args)) => batch.push(args),
                    Ok(Parsed::Need(n)) => {
                        stop = Some(Ok(n));
                        break;
                    }
                    Err(e) => {
                        stop = Some(Err(e));
                        break;
                    }
                }
            }
            prefetch(&store, &session, &batch);
            for args in batch.drain(..) {
                ran = true;
                let at = wbuf.len();
                let started = state.metrics.sample_next().then(std::time::Instant::now);
                let command = execute(&store, &resp.settings, &mut session, &args, &mut wbuf).await;
                // An error reply counts as a refused request (its text
                // says why; the status only classifies it).
                let status = match wbuf.get(at) {
                    Some(b'-') => insitu_protocol::Status::BadRequest,
                    _ => insitu_protocol::Status::Ok,
                };
                let kind = command.map_or("resp_unknown", |c| c.metric);
                state
                    .metrics
                    .record(kind, status, started.map(|t| t.elapsed()));
                if session.closing {
                    break 'commands;
                }
                if wbuf.len() >= MAX_PENDING_REPLY_BYTES {
                    flush(state, &mut stream, &mut wbuf).await?;
                }
            }
            match stop {
                None => {}
                Some(Ok(n)) => {
                    need = n;
                    break;
                }
                Some(Err(e)) => {
                    // The stream cannot be re-synchronised: say why, close.
                    let mut out = Out {
                        buf: &mut wbuf,
                        proto: session.proto,
                    };
                    out.error(&format!("ERR {e}"));
                    flush(state, &mut stream, &mut wbuf).await?;
                    return Ok(Some(Closed::Malformed));
                }
            }
        }
        if !wbuf.is_empty() {
            flush(state, &mut stream, &mut wbuf).await?;
        }
        if session.closing {
            return Ok(None);
        }
        if ran {
            inbox.consumed();
        }
        if wbuf.capacity() > BASE_BUFFER_BYTES {
            wbuf = BytesMut::with_capacity(BASE_BUFFER_BYTES);
        }
        let wait = inbox.fill(state, &mut stream, need).await?;
        // A stalled command closes without a word, as in Redis.
        if wait == Wait::NoRoom {
            let mut out = Out {
                buf: &mut wbuf,
                proto: session.proto,
            };
            out.error(&format!(
                "ERR server busy: no room to buffer a {need}-byte command within {} ms; closing",
                limits.stall_timeout.as_millis()
            ));
            write(&mut stream, &wbuf, limits.stall_timeout).await?;
        }
        if let Some(end) = ended_by(&wait) {
            return Ok(end);
        }
    }
}

/// Wait until what the replies may show is durable, then write them.
async fn flush(
    state: &ShardState,
    stream: &mut Stream,
    wbuf: &mut BytesMut,
) -> std::io::Result<()> {
    // Every reply may show data (a read of a write not yet replicated):
    // wait for every change made so far.
    let mut need = state.engine.borrow().log_changes();
    replies_durable(state, &mut need).await?;
    write(stream, wbuf, state.limits.stall_timeout).await?;
    wbuf.clear();
    Ok(())
}
