//! Timestamps from the coordinator's oracle (`Client::timestamp`), with the
//! concurrent callers of one process sharing requests.
//!
//! Coalescing: a caller joins a queue; one driver task at a time sends a
//! `Timestamps` request for everyone queued and hands each a distinct
//! timestamp of the answer, then does the same for those who queued
//! meanwhile. Why a caller never joins a request already in flight: that
//! request may have reached the coordinator before the caller asked, so
//! its timestamps could be below one handed out (to anyone) between then
//! and the caller's call, whereas a timestamp must be greater than every
//! one handed out before its caller asked (a snapshot must see every commit
//! that finished before it was taken). A request sent after the caller
//! queued is received after it asked, and the oracle promises exactly that.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use insitu_protocol::{MAX_TIMESTAMPS, Request, Response};
use tokio::sync::oneshot;

use crate::client::{Client, check_ok, decode};
use crate::error::ClientError;

/// Where a caller waits for its timestamp.
type Waiter = oneshot::Sender<Result<u64, ClientError>>;

/// The callers waiting for a timestamp (`Inner::timestamps`).
#[derive(Default)]
pub(crate) struct Timestamps {
    /// A std mutex: held only to push or take, never across an await.
    queue: Mutex<Queue>,
    /// The highest timestamp this client has received: a snapshot at or
    /// below it needs no question to the oracle (`Client::snapshot_at`).
    highest: AtomicU64,
}

#[derive(Default)]
struct Queue {
    /// Callers that queued since the driver last took the queue: they wait
    /// for the next request, sent after they arrived.
    waiting: Vec<Waiter>,
    /// A driver task is running: callers only queue (one request at a time).
    driving: bool,
}

impl Timestamps {
    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        // Nothing panics while holding it; the queue is whole either way.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Client {
    /// A fresh timestamp from the coordinator's oracle: greater than every
    /// timestamp handed out (to any client) before this call, never 0.
    /// Concurrent callers share one request (see the module docs). Retried
    /// like other coordinator requests within `op_timeout` (a lost reply
    /// only wastes timestamps).
    pub async fn timestamp(&self) -> Result<u64, ClientError> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut queue = self.inner.timestamps.queue();
            queue.waiting.push(tx);
            !std::mem::replace(&mut queue.driving, true)
        };
        if start {
            tokio::spawn(drive(self.clone()));
        }
        // An error here: the driver stopped (its runtime is shutting down).
        rx.await
            .map_err(|_| ClientError::Closed(self.inner.coordinator.addr.clone()))?
    }

    /// Whether `ts` is at or below a timestamp the oracle has handed out,
    /// asking it for a fresh one only when this client has not seen one as
    /// high. A snapshot above every timestamp handed out would not be
    /// repeatable: a transaction that commits later could take a commit
    /// timestamp below it and appear in it after it was read.
    pub(crate) async fn handed_out(&self, ts: u64) -> Result<bool, ClientError> {
        if ts <= self.inner.timestamps.highest.load(Ordering::Acquire) {
            return Ok(true);
        }
        Ok(ts <= self.timestamp().await?)
    }

    /// `count` timestamps in one request: the first.
    async fn take_timestamps(&self, count: u32) -> Result<u64, ClientError> {
        let addr = &self.inner.coordinator.addr;
        let reply = self
            .coord_call(&Request::Timestamps { count }, true, self.deadline())
            .await?;
        check_ok(&reply)?;
        match decode(&reply, addr)? {
            Response::Timestamps { first, count: n } if n == count && first != 0 => Ok(first),
            other => Err(ClientError::unexpected(
                addr,
                format!("{other:?} to Timestamps"),
            )),
        }
    }
}

/// Resets the queue if the driver stops before emptying it (a panic, or its
/// runtime shut down): the waiters' senders drop (they get an error) and
/// the next caller starts a new driver.
struct Driving {
    /// The client whose queue is driven.
    client: Client,
    /// The driver left the queue empty and `driving` false itself.
    done: bool,
}

impl Drop for Driving {
    fn drop(&mut self) {
        if !self.done {
            let mut queue = self.client.inner.timestamps.queue();
            queue.waiting.clear();
            queue.driving = false;
        }
    }
}

/// Send requests until no caller waits.
async fn drive(client: Client) {
    let mut driving = Driving {
        client,
        done: false,
    };
    loop {
        let mut batch: Vec<Waiter> = {
            let mut queue = driving.client.inner.timestamps.queue();
            let n = queue.waiting.len().min(MAX_TIMESTAMPS as usize);
            if n == 0 {
                queue.driving = false;
                driving.done = true;
                return;
            }
            queue.waiting.drain(..n).collect()
        };
        // Callers that gave up need no timestamp.
        batch.retain(|w| !w.is_closed());
        if batch.is_empty() {
            continue;
        }
        match driving.client.take_timestamps(batch.len() as u32).await {
            Ok(first) => {
                let last = first + (batch.len() as u64 - 1);
                driving
                    .client
                    .inner
                    .timestamps
                    .highest
                    .fetch_max(last, Ordering::AcqRel);
                for (ts, waiter) in (first..).zip(batch) {
                    let _ = waiter.send(Ok(ts));
                }
            }
            Err(e) => {
                for waiter in batch {
                    let _ = waiter.send(Err(e.clone()));
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "oracle_tests.rs"]
mod tests;
