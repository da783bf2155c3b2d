//! The RESP port's input path: arbitrary bytes cut into commands by the
//! parser (tight limits, so the length checks are reached), every command
//! run against the in-memory model store (its clock pinned and moved a
//! second per command, so keys expire). Must never panic; a protocol error
//! ends the input as it ends a connection.

#![no_main]

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use bytes::BytesMut;
use insitu_resp::{Limits, MemStore, Parsed, Session, Settings, execute, parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        max_bulk_bytes: 256,
        max_args: 64,
        max_command_bytes: 4096,
        max_inline_bytes: 512,
    };
    let store = MemStore::default();
    // A pinned clock, moved one second per command: a run does not depend
    // on the wall clock (so a crash replays), and keys set with EX/PX do
    // expire within one input.
    let mut clock_ms: u64 = 1_700_000_000_000;
    store.set_clock_ms(Some(clock_ms));
    let settings = Settings::default();
    let mut session = Session::new(1);
    let mut buf = BytesMut::from(data);
    let mut out = BytesMut::new();
    // The model store never waits: each command completes in one poll.
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        match parse(&mut buf, &limits) {
            Ok(Parsed::Command(args)) => {
                {
                    let fut = pin!(execute(&store, &settings, &mut session, &args, &mut out));
                    assert!(matches!(fut.poll(&mut cx), Poll::Ready(_)), "MemStore never waits");
                }
                // Bound the replies kept (a long input of PINGs).
                out.clear();
                clock_ms += 1_000;
                store.set_clock_ms(Some(clock_ms));
                if session.closing {
                    break;
                }
            }
            Ok(Parsed::Need(n)) => {
                assert!(n > buf.len(), "Need must ask for more than is buffered");
                break;
            }
            Err(_) => break,
        }
    }
});
