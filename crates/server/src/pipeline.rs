//! Pipelined point requests prefetched: before a connection answers the
//! whole frames it has read, the keys of the point requests among the first
//! `PIPELINE_BATCH` of them go to the engine (`Engine::prefetch`), so that
//! their index probes and log entries load side by side instead of one
//! after another. The RESP port does the same with its commands
//! (`resp/conn.rs`).
//!
//! Why: a point request over a large keyspace is two dependent cache misses
//! (the index slot, then the log entry whose key it compares), and a shard
//! answering a pipeline pays them in series. Under `insitu bench kv` writes
//! at 16 in flight per connection, the probe's key comparison was a fifth
//! of the shard's time (perf).

use insitu_protocol::frame::check_header;
use insitu_protocol::{FrameKind, HEADER_BYTES, MAX_BODY_BYTES, Request, decode_request};

use crate::shard::ShardState;

/// Frames looked at per hint: more than a pipeline of 16, few enough that
/// the entries hinted for the first are still in cache when it runs.
pub(crate) const PIPELINE_BATCH: usize = 32;

/// Hint the engine with the keys of the reads, writes, removes and
/// increments among the first `PIPELINE_BATCH` whole frames at the front of
/// `input` (`point_keys`). Returns how many whole frames were looked at:
/// the serve loop hints again after answering that many.
pub(crate) fn hint_point_keys(state: &ShardState, input: &[u8]) -> usize {
    let mut keys: [(u64, &[u8]); PIPELINE_BATCH] = [(0, &[]); PIPELINE_BATCH];
    let (frames, n) = point_keys(input, &mut keys);
    if n == 0 {
        return frames;
    }
    let engine = state.engine.borrow();
    // One call per run of keys of one table (pipelines are usually one).
    let mut i = 0;
    while i < n {
        let table = keys[i].0;
        let run = keys[i..n].iter().take_while(|k| k.0 == table).count();
        engine.prefetch(table, keys[i..i + run].iter().map(|k| k.1));
        i += run;
    }
    frames
}

/// The (table, key) of each point request among the first
/// `PIPELINE_BATCH` whole frames at the front of `input`, into `keys`;
/// returns (whole frames looked at, keys found). Nothing is consumed or
/// answered here: a frame that does not decode is skipped, a bad header
/// ends the walk, and the serve loop deals with both as before. A lone
/// frame is not decoded (a hint right before its use gains nothing).
fn point_keys<'a>(input: &'a [u8], keys: &mut [(u64, &'a [u8]); PIPELINE_BATCH]) -> (usize, usize) {
    let mut spans = [(0usize, 0usize); PIPELINE_BATCH];
    let mut frames = 0;
    let mut at = 0;
    while frames < PIPELINE_BATCH {
        let Some(rest) = input.get(at..) else { break };
        let Ok(Some((header, body_len))) = check_header(rest, MAX_BODY_BYTES) else {
            break;
        };
        let end = at + HEADER_BYTES + body_len;
        if end > input.len() {
            break;
        }
        if header.kind == FrameKind::Request {
            spans[frames] = (at + HEADER_BYTES, end);
        }
        frames += 1;
        at = end;
    }
    if frames < 2 {
        return (frames, 0);
    }
    let mut n = 0;
    for &(from, to) in &spans[..frames] {
        if from == to {
            continue; // not a request frame, or an empty body
        }
        if let Ok(
            Request::Read { table, key }
            | Request::Write { table, key, .. }
            | Request::Remove { table, key, .. }
            | Request::Increment { table, key, .. },
        ) = decode_request(&input[from..to])
        {
            keys[n] = (table, &key[..]);
            n += 1;
        }
    }
    (frames, n)
}

#[cfg(test)]
#[path = "pipeline_tests.rs"]
mod tests;
