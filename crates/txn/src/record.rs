//! The durable records of a transaction, as the payloads of the engine's
//! side records (`insitu_engine::RecordId`): what a participant writes in a
//! tablet's log so that a crash in the middle of a commit neither loses a
//! yes vote nor a decision (ARCHITECTURE.md, "Transactions", "Durable
//! records").
//!
//! Three classes:
//! - `CLASS_PREPARED`, id = the transaction id, one per tablet that a
//!   participant prepared writes in (and always one in the tablet of the
//!   primary's anchor, at the primary): the primary's anchor, the other
//!   participants' anchors (in the primary's anchor record only), the
//!   participant's other records (in its vote record only) and this
//!   tablet's writes. Written before the yes vote leaves; removed in the
//!   same log segment as the commit's writes (or at an abort).
//! - `CLASS_COMMITTED`, id = the transaction id, beside each prepared
//!   record of a commit, payload the commit timestamp: this part committed.
//!   Written first in the group of the part's commit; kept for the
//!   decision's time to live beside the primary's anchor and each vote
//!   record, removed once durable beside the other parts. An abort writes
//!   no record: at the primary's anchor, no prepared record and no commit
//!   record means aborted (presumed abort).
//! - `CLASS_ABORTED`, id = the transaction id, at the primary's anchor,
//!   empty payload: the one abort that needs a record (see the constant).
//!
//! Payload layout of a prepared record (little-endian; a *bytes* field is a
//! u32 length then the bytes):
//!
//! ```text
//! u8     format (3; 2 lacks the siblings, 1 the participant too)
//! u64    primary anchor's table     bytes  primary anchor's key
//! u64    participant's anchor table bytes  participant's anchor key   (format 2, 3)
//! u32    siblings count, then per sibling: u64 table, bytes key       (format 3)
//! u32    others count, then per other: u64 table, bytes key
//! u32    item count, then per item: u64 table, u8 kind (1 put, 2 remove,
//!        3 put with a deadline), bytes key, for a put: bytes value, and
//!        for kind 3: u64 deadline (Unix ms, >= 1)
//! ```
//!
//! Kind 3 is new beside kinds 1 and 2, so records written before it decode
//! as they did; a put without a deadline is still kind 1.
//!
//! The engine checks each entry's CRC, so a payload that fails to decode
//! here is a bug or a format from the future: decoding returns an error
//! (the recovery refuses the record loudly) and never panics.

use crate::item::Write;
use crate::participant::Anchor;

/// Record class of a prepared transaction's part in one tablet.
pub const CLASS_PREPARED: u8 = 1;
/// Record class of a commit decision at the primary's anchor. Payload: the
/// commit timestamp, 8 bytes little-endian (`commit_payload`); empty in
/// records written before timestamps, read as 0 (no timestamp).
pub const CLASS_COMMITTED: u8 = 2;
/// Record class of an abort taken at the primary's anchor before the
/// primary's own prepare arrived (a participant's resolution asked first):
/// the late prepare must be refused even after a crash. Empty payload.
pub const CLASS_ABORTED: u8 = 3;

/// A commit record's payload: its timestamp.
pub fn commit_payload(commit_ts: u64) -> [u8; 8] {
    commit_ts.to_le_bytes()
}

/// The timestamp of a commit record's payload (empty: 0, an older record).
pub fn decode_commit_payload(payload: &[u8]) -> Result<u64, String> {
    match payload.len() {
        0 => Ok(0),
        8 => Ok(u64::from_le_bytes(payload.try_into().expect("8 bytes"))),
        n => Err(format!("a commit record of {n} bytes (0 or 8 expected)")),
    }
}

/// Format byte of a prepared record's payload (with the participant and
/// the siblings).
const FORMAT: u8 = 3;
/// The format without the siblings, whose vote record was written only once
/// every other part's record was durable: still read, and such a vote
/// record still proves its vote by itself.
const FORMAT_2: u8 = 2;
/// The first format, without the participant's anchor: still read.
const FORMAT_1: u8 = 1;

/// Most entries of any count field a decoder accepts (the protocol's own
/// limits are far below: 10,000 items, 1,024 participants). Why a bound:
/// a count is checked before anything is reserved for it.
const MAX_COUNT: u32 = 1 << 20;

/// A written key of a prepared record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordItem {
    pub table: u64,
    pub key: Vec<u8>,
    /// `Write::Put` or `Write::Remove` (reads are not recorded: a read
    /// needs no lock after the vote and nothing to apply).
    pub write: Write,
}

/// A prepared record's contents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreparedRecord {
    /// The primary's anchor: whom to ask for the outcome (routed by key, so
    /// a primary recovered onto another server is still found).
    pub primary: Anchor,
    /// The anchor of the participant that wrote it (its first item). The
    /// record kept at that very key is the participant's *vote record*.
    /// None in a format-1 record: its vote is never taken as proven.
    pub participant: Option<Anchor>,
    /// In a vote record: the anchors of the participant's other part
    /// records (one per other tablet it writes in), written in the same
    /// step. Each tablet's log is recovered on its own, so a recovery that
    /// finds the vote record proves the vote whole only by finding every
    /// sibling too (or a decision in its place); until then it is no vote.
    /// None in a format-2 or -1 record (a format-2 vote record was written
    /// after its siblings were durable, so it proves itself).
    pub siblings: Option<Vec<Anchor>>,
    /// The other participants' anchors; only in the primary's anchor
    /// record (the primary asks them before deciding an orphan).
    pub others: Vec<Anchor>,
    pub items: Vec<RecordItem>,
}

impl PreparedRecord {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        out.push(self.format());
        put_anchor(&mut out, &self.primary);
        if let Some(a) = &self.participant {
            put_anchor(&mut out, a);
        }
        if let Some(siblings) = &self.siblings {
            out.extend_from_slice(&(siblings.len() as u32).to_le_bytes());
            for a in siblings {
                put_anchor(&mut out, a);
            }
        }
        out.extend_from_slice(&(self.others.len() as u32).to_le_bytes());
        for a in &self.others {
            put_anchor(&mut out, a);
        }
        out.extend_from_slice(&(self.items.len() as u32).to_le_bytes());
        for i in &self.items {
            out.extend_from_slice(&i.table.to_le_bytes());
            match &i.write {
                Write::Put(v) => {
                    out.push(1);
                    put_bytes(&mut out, &i.key);
                    put_bytes(&mut out, v);
                }
                Write::PutExpiring(v, deadline) => {
                    out.push(3);
                    put_bytes(&mut out, &i.key);
                    put_bytes(&mut out, v);
                    out.extend_from_slice(&deadline.to_le_bytes());
                }
                Write::Remove => {
                    out.push(2);
                    put_bytes(&mut out, &i.key);
                }
                Write::None => unreachable!("reads are not recorded"),
            }
        }
        debug_assert_eq!(out.len(), self.encoded_len());
        out
    }

    /// The format `encode` writes: what the fields present allow (siblings
    /// need a participant).
    fn format(&self) -> u8 {
        match (&self.participant, &self.siblings) {
            (Some(_), Some(_)) => FORMAT,
            (Some(_), None) => FORMAT_2,
            (None, _) => FORMAT_1,
        }
    }

    /// Bytes `encode` makes.
    pub fn encoded_len(&self) -> usize {
        let anchor = |a: &Anchor| 8 + 4 + a.key.len();
        let siblings = match (&self.participant, &self.siblings) {
            (Some(_), Some(s)) => 4 + s.iter().map(anchor).sum::<usize>(),
            _ => 0,
        };
        1 + anchor(&self.primary)
            + self.participant.as_ref().map_or(0, anchor)
            + siblings
            + 4
            + self.others.iter().map(anchor).sum::<usize>()
            + 4
            + self
                .items
                .iter()
                .map(|i| {
                    8 + 1
                        + 4
                        + i.key.len()
                        + match &i.write {
                            Write::Put(v) => 4 + v.len(),
                            Write::PutExpiring(v, _) => 4 + v.len() + 8,
                            _ => 0,
                        }
                })
                .sum::<usize>()
    }

    pub fn decode(bytes: &[u8]) -> Result<PreparedRecord, String> {
        let mut r = Reader { bytes, at: 0 };
        let format = r.u8()?;
        if ![FORMAT, FORMAT_2, FORMAT_1].contains(&format) {
            return Err(format!("unknown prepared-record format {format}"));
        }
        let primary = r.anchor()?;
        let participant = match format {
            FORMAT | FORMAT_2 => Some(r.anchor()?),
            _ => None,
        };
        let siblings = match format {
            FORMAT => {
                let n = r.count()?;
                let mut siblings = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    siblings.push(r.anchor()?);
                }
                Some(siblings)
            }
            _ => None,
        };
        let n = r.count()?;
        let mut others = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            others.push(r.anchor()?);
        }
        let n = r.count()?;
        let mut items = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            let table = r.u64()?;
            let kind = r.u8()?;
            let key = r.bytes()?.to_vec();
            let write = match kind {
                1 => Write::Put(r.bytes()?.to_vec()),
                2 => Write::Remove,
                3 => {
                    let value = r.bytes()?.to_vec();
                    match r.u64()? {
                        0 => return Err("a put with a deadline of 0 in a prepared record".into()),
                        deadline => Write::PutExpiring(value, deadline),
                    }
                }
                k => return Err(format!("unknown item kind {k} in a prepared record")),
            };
            items.push(RecordItem { table, key, write });
        }
        if r.at != bytes.len() {
            return Err(format!(
                "{} bytes after the end of a prepared record",
                bytes.len() - r.at
            ));
        }
        Ok(PreparedRecord {
            primary,
            participant,
            siblings,
            others,
            items,
        })
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_anchor(out: &mut Vec<u8>, a: &Anchor) {
    out.extend_from_slice(&a.table.to_le_bytes());
    put_bytes(out, &a.key);
}

/// A cursor over untrusted bytes: every read is bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(format!(
                "prepared record cut short: {n} bytes wanted at offset {} of {}",
                self.at,
                self.bytes.len()
            ));
        };
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, String> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }

    fn u64(&mut self) -> Result<u64, String> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }

    fn count(&mut self) -> Result<usize, String> {
        let n = self.u32()?;
        if n > MAX_COUNT {
            return Err(format!("count {n} in a prepared record passes {MAX_COUNT}"));
        }
        Ok(n as usize)
    }

    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    fn anchor(&mut self) -> Result<Anchor, String> {
        let table = self.u64()?;
        let key = self.bytes()?.to_vec();
        Ok(Anchor { table, key })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> PreparedRecord {
        PreparedRecord {
            primary: Anchor {
                table: 3,
                key: b"acct-1".to_vec(),
            },
            participant: Some(Anchor {
                table: 3,
                key: b"acct-0".to_vec(),
            }),
            siblings: Some(vec![Anchor {
                table: 3,
                key: b"acct-7".to_vec(),
            }]),
            others: vec![Anchor {
                table: 4,
                key: vec![],
            }],
            items: vec![
                RecordItem {
                    table: 3,
                    key: b"acct-1".to_vec(),
                    write: Write::Put(b"90".to_vec()),
                },
                RecordItem {
                    table: 3,
                    key: b"acct-9".to_vec(),
                    write: Write::Remove,
                },
                RecordItem {
                    table: 3,
                    key: b"session".to_vec(),
                    write: Write::PutExpiring(b"s".to_vec(), 1_700_000_000_000),
                },
            ],
        }
    }

    #[test]
    fn a_put_with_a_deadline_is_kind_3_and_a_zero_deadline_is_refused() {
        let r = PreparedRecord {
            items: vec![RecordItem {
                table: 5,
                key: b"k".to_vec(),
                write: Write::PutExpiring(b"v".to_vec(), 42),
            }],
            ..sample()
        };
        let mut bytes = r.encode();
        let tail = bytes.len() - 8;
        assert_eq!(&bytes[tail..], &42u64.to_le_bytes());
        assert_eq!(bytes[tail - 4 - 1 - 4 - 1 - 1], 3, "kind byte");
        assert_eq!(PreparedRecord::decode(&bytes), Ok(r));
        bytes[tail..].copy_from_slice(&0u64.to_le_bytes());
        assert!(PreparedRecord::decode(&bytes).is_err());
    }

    #[test]
    fn commit_payloads_round_trip_and_old_ones_read_as_no_timestamp() {
        for ts in [1, 77, u64::MAX] {
            assert_eq!(decode_commit_payload(&commit_payload(ts)), Ok(ts));
        }
        assert_eq!(decode_commit_payload(&[]), Ok(0));
        assert!(decode_commit_payload(&[1, 2, 3]).is_err());
    }

    #[test]
    fn a_record_round_trips() {
        let r = sample();
        let bytes = r.encode();
        assert_eq!(bytes.len(), r.encoded_len());
        assert_eq!(PreparedRecord::decode(&bytes), Ok(r.clone()));
        // A format-2 record (no siblings) is still read.
        let two = PreparedRecord {
            siblings: None,
            ..r.clone()
        };
        let bytes = two.encode();
        assert_eq!(bytes[0], FORMAT_2);
        assert_eq!(bytes.len(), two.encoded_len());
        assert_eq!(PreparedRecord::decode(&bytes), Ok(two));
        // A format-1 record (no participant) is still read.
        let old = PreparedRecord {
            participant: None,
            siblings: None,
            ..r
        };
        let bytes = old.encode();
        assert_eq!(bytes[0], FORMAT_1);
        assert_eq!(bytes.len(), old.encoded_len());
        assert_eq!(PreparedRecord::decode(&bytes), Ok(old));
    }

    #[test]
    fn every_cut_and_a_trailing_byte_are_refused() {
        let bytes = sample().encode();
        for n in 0..bytes.len() {
            assert!(PreparedRecord::decode(&bytes[..n]).is_err(), "cut at {n}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(PreparedRecord::decode(&longer).is_err());
        let mut future = bytes;
        future[0] = 4;
        assert!(PreparedRecord::decode(&future).is_err());
    }

    #[test]
    fn a_huge_count_is_refused_before_anything_is_reserved() {
        let mut bytes = vec![FORMAT];
        bytes.extend_from_slice(&3u64.to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes()); // empty primary key
        bytes.extend_from_slice(&3u64.to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes()); // empty participant key
        bytes.extend_from_slice(&u32::MAX.to_le_bytes()); // siblings
        let e = PreparedRecord::decode(&bytes).unwrap_err();
        assert!(e.contains("passes"), "{e}");
    }

    proptest! {
        /// Any bytes decode to an error or a record, never a panic, and a
        /// huge count is refused before anything is reserved for it.
        #[test]
        fn decoding_any_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = PreparedRecord::decode(&bytes);
        }
    }
}
