//! Pages of typed-query answers a shard holds for the client to fetch.
//!
//! A query whose rows outgrow one reply page (`query.rs`) still walks the
//! tablet's log once, sequentially, to the end: the walk is exact for one
//! instant of the tablet (the scan driver restarts it, holding the tablet,
//! if the tablet changed between chunks). Its pages are kept here and
//! fetched one request each (`QueryResume::Held { cursor, page }`).
//!
//! Why hold pages instead of resuming the walk: a log position is valid only
//! while the tablet is unchanged (the cleaner moves live entries, a write
//! appends a new version), so a walk resumed by a later request could return
//! a row twice or miss one; the key-hash-order walk that can resume
//! (`enumerate.rs`) reads the tablet in random order, ~9 µs per returned
//! row measured at TPC-H SF 1 against ~40 ns per row for the log walk.
//!
//! Limits: a query may hold at most `MAX_HELD_BYTES` (beyond that it pages
//! in hash order instead), every page is charged to the engine's memory
//! budget (a refused charge also falls back), a shard holds at most
//! `MAX_HELD_QUERIES` answers (the oldest is dropped for a new one), and an
//! answer not fully fetched within `HELD_TTL` is dropped. A fetch of a
//! dropped answer gets `Status::CursorExpired`; the client then runs that
//! tablet's query again.

use std::rc::Rc;
use std::time::{Duration, Instant};

use insitu_engine::TransientCharge;

use crate::shard::ShardState;

/// Most Arrow bytes one query's held pages may take. Why 1 GiB: reading a
/// whole tablet out (`select *`, what a client-side analysis does) of a
/// 3M-row TPC-H lineitem tablet takes ~510 MB; beyond this the answer pages
/// in hash order rather than pinning more of a server's memory. The memory
/// budget is the real guard: every page is charged to it, and a refused
/// charge also falls back.
pub const MAX_HELD_BYTES: usize = 1 << 30;
/// Most answers one shard holds at once (each bounded by MAX_HELD_BYTES and
/// charged to the budget).
pub const MAX_HELD_QUERIES: usize = 32;
/// How long an answer waits for its next fetch. A client fetches the next
/// page as soon as it has the previous one, so this only reclaims answers
/// whose client went away.
pub const HELD_TTL: Duration = Duration::from_secs(30);
/// How often expired answers are swept.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// One page of rows: its Arrow IPC stream, rows, and the budget it holds.
pub struct Page {
    pub data: Vec<u8>,
    pub rows: u64,
    /// `data` counted against the engine's memory budget while held.
    pub _charge: TransientCharge,
}

/// One answer's pages not yet fetched.
struct Held {
    cursor: u64,
    /// The tablet it answers: a fetch naming another tablet is refused.
    table: u64,
    start_hash: u64,
    /// Page number of `pages[0]`.
    first: u32,
    pages: Vec<Page>,
    /// When last fetched (or made): expiry counts from here.
    touched: Instant,
}

/// A shard's held answers.
#[derive(Default)]
pub struct HeldQueries {
    held: Vec<Held>,
    /// Last cursor handed out; cursors are never reused by a shard.
    last_cursor: u64,
}

impl HeldQueries {
    /// Hold `pages` (pages 1.. of an answer; page 0 was sent) of the tablet
    /// (`table`, `start_hash`); returns the cursor to fetch them by.
    pub fn hold(&mut self, table: u64, start_hash: u64, pages: Vec<Page>) -> u64 {
        debug_assert!(!pages.is_empty());
        self.expire(Instant::now());
        if self.held.len() >= MAX_HELD_QUERIES {
            // The least recently fetched answer goes first.
            if let Some(oldest) = (0..self.held.len()).min_by_key(|&i| self.held[i].touched) {
                self.held.swap_remove(oldest);
            }
        }
        self.last_cursor += 1;
        self.held.push(Held {
            cursor: self.last_cursor,
            table,
            start_hash,
            first: 1,
            pages,
            touched: Instant::now(),
        });
        self.last_cursor
    }

    /// Page `page` of answer `cursor` and whether it is the last; frees the
    /// pages before it (and the answer, with its last page). `None`: the
    /// answer or that page is gone (expired, evicted, fetched past, or
    /// another tablet's).
    pub fn fetch(
        &mut self,
        cursor: u64,
        table: u64,
        start_hash: u64,
        page: u32,
    ) -> Option<(Vec<u8>, u64, bool)> {
        let now = Instant::now();
        self.expire(now);
        let i = self
            .held
            .iter()
            .position(|h| h.cursor == cursor && h.table == table && h.start_hash == start_hash)?;
        let h = &mut self.held[i];
        if page < h.first {
            return None;
        }
        let skip = (page - h.first) as usize;
        if skip >= h.pages.len() {
            return None;
        }
        // Pages before `page` were received: the client asks for a page only
        // after it has the one before.
        h.pages.drain(..skip);
        h.first = page;
        h.touched = now;
        let last = h.pages.len() == 1;
        let p = &h.pages[0];
        let got = (p.data.clone(), p.rows, last);
        if last {
            self.held.swap_remove(i);
        }
        Some(got)
    }

    /// Drop answers untouched for `HELD_TTL`.
    fn expire(&mut self, now: Instant) {
        self.held
            .retain(|h| now.saturating_duration_since(h.touched) < HELD_TTL);
    }

    /// Answers held now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.held.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

/// The shard's sweeper: drops expired answers (and their budget charges)
/// even when no query comes to do it.
pub async fn sweep(state: Rc<ShardState>) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        state.held.borrow_mut().expire(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use insitu_engine::{Engine, EngineConfig};

    fn pages(engine: &Engine, n: usize) -> Vec<Page> {
        (0..n)
            .map(|i| Page {
                data: vec![i as u8; 10],
                rows: i as u64,
                _charge: engine.try_charge_transient(10).expect("room"),
            })
            .collect()
    }

    fn engine() -> Engine {
        Engine::new(EngineConfig::default()).expect("engine")
    }

    #[test]
    fn pages_are_fetched_in_order_resent_and_freed_with_the_last() {
        let e = engine();
        let mut h = HeldQueries::default();
        let c = h.hold(7, 0, pages(&e, 3));
        assert_eq!(e.memory().transient_bytes, 30);
        // Page 0 was the reply that made the cursor: pages 1.. are held.
        assert_eq!(h.fetch(c, 7, 0, 1), Some((vec![0; 10], 0, false)));
        // A resent request for the same page gets it again.
        assert_eq!(h.fetch(c, 7, 0, 1), Some((vec![0; 10], 0, false)));
        assert_eq!(h.fetch(c, 7, 0, 2), Some((vec![1; 10], 1, false)));
        assert_eq!(e.memory().transient_bytes, 20, "page 1 freed");
        // Pages already passed are gone.
        assert_eq!(h.fetch(c, 7, 0, 1), None);
        assert_eq!(h.fetch(c, 7, 0, 3), Some((vec![2; 10], 2, true)));
        assert!(h.is_empty(), "the last page frees the answer");
        assert_eq!(e.memory().transient_bytes, 0);
        assert_eq!(h.fetch(c, 7, 0, 3), None);
    }

    #[test]
    fn another_tablets_or_unknown_cursor_is_refused() {
        let e = engine();
        let mut h = HeldQueries::default();
        let c = h.hold(7, 0, pages(&e, 2));
        assert_eq!(h.fetch(c, 8, 0, 1), None);
        assert_eq!(h.fetch(c, 7, 5, 1), None);
        assert_eq!(h.fetch(c + 1, 7, 0, 1), None);
        assert_eq!(h.fetch(c, 7, 0, 9), None);
        assert_eq!(h.len(), 1);
    }

    #[test]
    fn at_the_limit_the_least_recently_fetched_answer_is_dropped() {
        let e = engine();
        let mut h = HeldQueries::default();
        let first = h.hold(1, 0, pages(&e, 2));
        let cursors: Vec<u64> = (0..MAX_HELD_QUERIES - 1)
            .map(|_| h.hold(1, 0, pages(&e, 2)))
            .collect();
        // Touch the first so the second becomes the oldest.
        assert!(h.fetch(first, 1, 0, 1).is_some());
        let newest = h.hold(1, 0, pages(&e, 2));
        assert_eq!(h.len(), MAX_HELD_QUERIES);
        assert!(h.fetch(cursors[0], 1, 0, 1).is_none(), "evicted");
        assert!(h.fetch(first, 1, 0, 1).is_some());
        assert!(h.fetch(newest, 1, 0, 1).is_some());
    }

    #[test]
    fn untouched_answers_expire() {
        let e = engine();
        let mut h = HeldQueries::default();
        let c = h.hold(1, 0, pages(&e, 2));
        h.expire(Instant::now() + HELD_TTL);
        assert!(h.is_empty());
        assert_eq!(e.memory().transient_bytes, 0, "its budget charge is freed");
        assert_eq!(h.fetch(c, 1, 0, 1), None);
    }
}
