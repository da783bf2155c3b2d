//! A reader of log entries written from the layout in ARCHITECTURE.md ("Log
//! entry"), independent of the engine's own decoder: tests look into a
//! tablet's raw segments with it (which kinds are where, and whether live).

#![allow(dead_code)] // each test file uses part of it

use insitu_engine::{Engine, TableId};

pub const KIND_OBJECT: u8 = 0x01;
pub const KIND_TOMBSTONE: u8 = 0x02;
pub const KIND_MARK: u8 = 0x03;
pub const KIND_RECORD: u8 = 0x21;
pub const KIND_RECORD_REMOVED: u8 = 0x22;

/// One entry of a segment.
#[derive(Clone, Debug)]
pub struct Raw {
    /// Flags bits 0-1 and 5.
    pub kind: u8,
    /// The in-memory dead flag (bit 7).
    pub dead: bool,
    /// To tell a group's new entries from older ones.
    pub version: u64,
    /// The key (a record's anchor), to find an entry by.
    pub key: Vec<u8>,
    /// The value (a record's class, id and payload).
    pub value: Vec<u8>,
    /// Where it starts in its segment.
    pub offset: usize,
}

fn varint(buf: &[u8], p: &mut usize) -> usize {
    let (mut v, mut shift) = (0usize, 0);
    loop {
        let b = buf[*p];
        *p += 1;
        v |= usize::from(b & 0x7f) << shift;
        if b < 0x80 {
            return v;
        }
        shift += 7;
    }
}

/// Every entry of one segment's bytes (written by the engine: trusted).
pub fn decode(seg: &[u8]) -> Vec<Raw> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < seg.len() {
        let flags = seg[at + 4];
        let width = usize::from((flags >> 2) & 7) + 1;
        let mut version = 0u64;
        for (i, &b) in seg[at + 5..at + 5 + width].iter().enumerate() {
            version |= u64::from(b) << (8 * i);
        }
        let mut p = at + 5 + width;
        let key_len = varint(seg, &mut p);
        let value_len = varint(seg, &mut p);
        out.push(Raw {
            kind: flags & 0x23,
            dead: flags & 0x80 != 0,
            version,
            key: seg[p..p + key_len].to_vec(),
            value: seg[p + key_len..p + key_len + value_len].to_vec(),
            offset: at,
        });
        at = p + key_len + value_len;
    }
    out
}

/// (segment id, entry) for every entry of the tablet's log, oldest segment first.
pub fn log(e: &Engine, table: TableId, start_hash: u64) -> Vec<(u64, Raw)> {
    let mut out = Vec::new();
    e.for_each_segment(|v| {
        if v.table == table && v.start_hash == start_hash {
            out.extend(decode(v.bytes).into_iter().map(|r| (v.segment, r)));
        }
    });
    out
}
