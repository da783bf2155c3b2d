//! Encoding replies, in RESP2 or RESP3 as the connection chose (`HELLO`).
//!
//! The two differ only where RESP3 has a type of its own; of those the
//! commands here use null (`_` against `$-1`/`*-1`) and maps (`%` against a
//! flat array). Everything else is the same bytes.

use bytes::{BufMut, BytesMut};

/// Which protocol a connection speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Proto {
    #[default]
    Resp2,
    Resp3,
}

/// Writes replies into a connection's output buffer.
pub struct Out<'a> {
    pub buf: &'a mut BytesMut,
    pub proto: Proto,
}

impl Out<'_> {
    fn line(&mut self, tag: u8, text: &[u8]) {
        self.buf.put_u8(tag);
        self.buf.put_slice(text);
        self.buf.put_slice(b"\r\n");
    }

    fn number_line(&mut self, tag: u8, n: i64) {
        let mut digits = itoa_buf(n);
        self.line(tag, digits.as_bytes_mut());
    }

    /// `+OK`.
    pub fn ok(&mut self) {
        self.buf.put_slice(b"+OK\r\n");
    }

    /// A simple string (no CR or LF inside; callers pass constants).
    pub fn simple(&mut self, text: &str) {
        debug_assert!(!text.contains(['\r', '\n']));
        self.line(b'+', text.as_bytes());
    }

    /// An error reply. `text` starts with its code (`ERR`, `WRONGTYPE`, ...);
    /// line breaks are replaced so a message can never break the framing.
    pub fn error(&mut self, text: &str) {
        let clean = text.replace(['\r', '\n'], " ");
        self.line(b'-', clean.as_bytes());
    }

    pub fn int(&mut self, n: i64) {
        self.number_line(b':', n);
    }

    pub fn bulk(&mut self, bytes: &[u8]) {
        self.number_line(b'$', bytes.len() as i64);
        self.buf.put_slice(bytes);
        self.buf.put_slice(b"\r\n");
    }

    /// A missing value: `$-1` (RESP2) or `_` (RESP3).
    pub fn null(&mut self) {
        match self.proto {
            Proto::Resp2 => self.buf.put_slice(b"$-1\r\n"),
            Proto::Resp3 => self.buf.put_slice(b"_\r\n"),
        }
    }

    /// A missing array: `*-1` (RESP2) or `_` (RESP3).
    pub fn null_array(&mut self) {
        match self.proto {
            Proto::Resp2 => self.buf.put_slice(b"*-1\r\n"),
            Proto::Resp3 => self.buf.put_slice(b"_\r\n"),
        }
    }

    pub fn bulk_or_null(&mut self, value: Option<&[u8]>) {
        match value {
            Some(v) => self.bulk(v),
            None => self.null(),
        }
    }

    /// The header of an array of `n` elements; the caller writes them.
    pub fn array(&mut self, n: usize) {
        self.number_line(b'*', n as i64);
    }

    /// The header of a map of `n` pairs: `%n` (RESP3) or an array of 2n.
    pub fn map(&mut self, n: usize) {
        match self.proto {
            Proto::Resp2 => self.number_line(b'*', 2 * n as i64),
            Proto::Resp3 => self.number_line(b'%', n as i64),
        }
    }
}

/// How Redis prints a float it stores (`INCRBYFLOAT`): plain decimal, no
/// exponent, no trailing zeros, "inf"/"-inf".
pub fn format_double(x: f64) -> String {
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    // Rust's `Display` for f64 is the shortest round-tripping decimal and
    // never uses an exponent: the same text Redis's "%.17Lg" trimmed gives
    // for the values a counter holds.
    let s = format!("{x}");
    if s == "-0" { "0".into() } else { s }
}

/// A small stack buffer holding a decimal.
struct Digits {
    bytes: [u8; 20],
    start: usize,
}

impl Digits {
    fn as_bytes_mut(&mut self) -> &[u8] {
        &self.bytes[self.start..]
    }
}

fn itoa_buf(n: i64) -> Digits {
    let mut d = Digits {
        bytes: [0; 20],
        start: 20,
    };
    let negative = n < 0;
    let mut m = n.unsigned_abs();
    loop {
        d.start -= 1;
        d.bytes[d.start] = b'0' + (m % 10) as u8;
        m /= 10;
        if m == 0 {
            break;
        }
    }
    if negative {
        d.start -= 1;
        d.bytes[d.start] = b'-';
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(proto: Proto, f: impl FnOnce(&mut Out<'_>)) -> Vec<u8> {
        let mut buf = BytesMut::new();
        f(&mut Out {
            buf: &mut buf,
            proto,
        });
        buf.to_vec()
    }

    #[test]
    fn replies_in_both_protocols() {
        assert_eq!(
            with(Proto::Resp2, |o| o.int(i64::MIN)),
            b":-9223372036854775808\r\n"
        );
        assert_eq!(with(Proto::Resp2, |o| o.bulk(b"")), b"$0\r\n\r\n");
        assert_eq!(with(Proto::Resp2, |o| o.null()), b"$-1\r\n");
        assert_eq!(with(Proto::Resp3, |o| o.null()), b"_\r\n");
        assert_eq!(with(Proto::Resp2, |o| o.map(2)), b"*4\r\n");
        assert_eq!(with(Proto::Resp3, |o| o.map(2)), b"%2\r\n");
        assert_eq!(
            with(Proto::Resp2, |o| o.error("ERR a\r\nb")),
            b"-ERR a  b\r\n"
        );
    }

    #[test]
    fn doubles_print_as_redis_does() {
        assert_eq!(format_double(5.0e3), "5000");
        assert_eq!(format_double(0.1 + 0.2), "0.30000000000000004");
        assert_eq!(format_double(-0.0), "0");
        assert_eq!(format_double(f64::NEG_INFINITY), "-inf");
    }
}
