//! Just enough RESP (the Redis protocol) for the load generator: encode the
//! commands it sends (GET, SET, MGET, MSET, INFO, PING) and cut one reply out
//! of a byte buffer without allocating.

use anyhow::{anyhow, bail};
use bytes::BufMut;

/// Append `*N\r\n` (an array header).
pub fn array_header(out: &mut impl BufMut, n: usize) {
    out.put_u8(b'*');
    push_decimal(out, n as u64);
    out.put_slice(b"\r\n");
}

/// Append one bulk string `$len\r\nbytes\r\n`.
pub fn bulk(out: &mut impl BufMut, bytes: &[u8]) {
    out.put_u8(b'$');
    push_decimal(out, bytes.len() as u64);
    out.put_slice(b"\r\n");
    out.put_slice(bytes);
    out.put_slice(b"\r\n");
}

/// Append a whole command.
pub fn command(out: &mut impl BufMut, args: &[&[u8]]) {
    array_header(out, args.len());
    for a in args {
        bulk(out, a);
    }
}

fn push_decimal(out: &mut impl BufMut, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.put_slice(&digits[i..]);
}

/// One parsed reply, borrowing from the buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply<'a> {
    /// `+OK` and friends.
    Simple(&'a [u8]),
    Integer(i64),
    /// `$-1`: no such key.
    Nil,
    Bulk(&'a [u8]),
    /// `*N`: the elements were checked; `nils` of them were `$-1`, and
    /// `bytes` is the total length of the bulk strings.
    Array {
        len: usize,
        nils: usize,
        bytes: usize,
    },
}

/// Position of the `\r\n` that ends the line starting at `from`.
#[inline]
fn line_end(buf: &[u8], from: usize) -> Option<usize> {
    let rel = buf.get(from..)?.iter().position(|&b| b == b'\r')?;
    let at = from + rel;
    (at + 1 < buf.len()).then_some(at)
}

#[inline]
fn parse_int(bytes: &[u8]) -> anyhow::Result<i64> {
    let (neg, digits) = match bytes.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, bytes),
    };
    if digits.is_empty() || digits.len() > 18 {
        bail!("bad RESP integer {:?}", String::from_utf8_lossy(bytes));
    }
    let mut v: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            bail!("bad RESP integer {:?}", String::from_utf8_lossy(bytes));
        }
        v = v * 10 + i64::from(d - b'0');
    }
    Ok(if neg { -v } else { v })
}

/// A bulk string (None for nil) and the offset after it.
type Bulk<'a> = (Option<&'a [u8]>, usize);

/// A bulk string or nil at `at`: Ok(Some((value or None for nil, next offset))).
#[inline]
fn bulk_at(buf: &[u8], at: usize) -> anyhow::Result<Option<Bulk<'_>>> {
    let Some(end) = line_end(buf, at) else {
        return Ok(None);
    };
    if buf[at] != b'$' {
        bail!("expected a RESP bulk string, got {:?}", buf[at] as char);
    }
    let len = parse_int(&buf[at + 1..end])?;
    if len < 0 {
        return Ok(Some((None, end + 2)));
    }
    let start = end + 2;
    let stop = start + len as usize;
    if buf.len() < stop + 2 {
        return Ok(None);
    }
    Ok(Some((Some(&buf[start..stop]), stop + 2)))
}

/// Cut one reply from the front of `buf`: Ok(None) if it is not complete yet,
/// Ok(Some((reply, bytes consumed))). An error reply (`-ERR ...`) is an error.
pub fn parse(buf: &[u8]) -> anyhow::Result<Option<(Reply<'_>, usize)>> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    match first {
        b'$' => Ok(bulk_at(buf, 0)?.map(|(v, n)| (v.map_or(Reply::Nil, Reply::Bulk), n))),
        b'+' | b'-' | b':' => {
            let Some(end) = line_end(buf, 0) else {
                return Ok(None);
            };
            let line = &buf[1..end];
            match first {
                b'+' => Ok(Some((Reply::Simple(line), end + 2))),
                b':' => Ok(Some((Reply::Integer(parse_int(line)?), end + 2))),
                _ => Err(anyhow!("redis error: {}", String::from_utf8_lossy(line))),
            }
        }
        b'*' => {
            let Some(end) = line_end(buf, 0) else {
                return Ok(None);
            };
            let n = parse_int(&buf[1..end])?;
            let n = usize::try_from(n).map_err(|_| anyhow!("nil array"))?;
            let mut at = end + 2;
            let (mut nils, mut bytes) = (0, 0);
            for _ in 0..n {
                match bulk_at(buf, at)? {
                    None => return Ok(None),
                    Some((v, next)) => {
                        match v {
                            None => nils += 1,
                            Some(v) => bytes += v.len(),
                        }
                        at = next;
                    }
                }
            }
            Ok(Some((
                Reply::Array {
                    len: n,
                    nils,
                    bytes,
                },
                at,
            )))
        }
        other => bail!("unexpected RESP type byte {:?}", other as char),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_commands() {
        let mut out: Vec<u8> = Vec::new();
        command(&mut out, &[b"SET", b"k", b"value"]);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nvalue\r\n");
    }

    #[test]
    fn parses_every_reply_kind_and_waits_for_more() {
        let cases: &[(&[u8], Reply<'_>)] = &[
            (b"+OK\r\n", Reply::Simple(b"OK")),
            (b":42\r\n", Reply::Integer(42)),
            (b"$-1\r\n", Reply::Nil),
            (b"$3\r\nabc\r\n", Reply::Bulk(b"abc")),
            (
                b"*3\r\n$1\r\na\r\n$-1\r\n$2\r\nbc\r\n",
                Reply::Array {
                    len: 3,
                    nils: 1,
                    bytes: 3,
                },
            ),
        ];
        for (bytes, want) in cases {
            let (got, n) = parse(bytes).unwrap().unwrap();
            assert_eq!(&got, want);
            assert_eq!(n, bytes.len());
            for cut in 0..bytes.len() {
                assert!(parse(&bytes[..cut]).unwrap().is_none(), "cut at {cut}");
            }
        }
        assert!(parse(b"-ERR no\r\n").is_err());
        assert!(parse(b"?\r\n").is_err());
    }
}
