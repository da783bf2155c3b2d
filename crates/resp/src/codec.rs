//! Cutting Redis commands out of the bytes a client sent.
//!
//! Two forms, as Redis accepts them: the multibulk form every client library
//! sends (`*2\r\n$3\r\nGET\r\n$1\r\nk\r\n`) and the inline form a person types
//! into telnet (`GET k\r\n`, arguments split on blanks, double and single
//! quotes as `redis-cli` writes them).
//!
//! Every length is checked against `Limits` before anything is reserved, and
//! a malformed command is a `ProtocolError` whose text is what Redis answers
//! (`ERR Protocol error: ...`); the connection is closed after it, as Redis
//! does, because the stream cannot be re-synchronised.
//!
//! The parser is restartable rather than incremental: `parse` looks at the
//! whole buffer each time more bytes arrive and either finds one complete
//! command or says how much it still needs. Bulk lengths let it skip over
//! values, so a retry costs O(arguments), not O(bytes).

use bytes::{Bytes, BytesMut};

/// Bounds on one command. Checked while parsing, before allocating.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest bulk string (key or value): the store's value limit, so a
    /// value the store would refuse is refused before it is buffered.
    pub max_bulk_bytes: usize,
    /// Most arguments in one command (MSET of 100,000 pairs is 200,001).
    pub max_args: usize,
    /// Most bytes one command may take in all (what a connection buffers).
    pub max_command_bytes: usize,
    /// Longest inline command line (Redis: 64 KiB).
    pub max_inline_bytes: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_bulk_bytes: 1024 * 1024,
            max_args: 2 * 100_000 + 1,
            max_command_bytes: 16 * 1024 * 1024,
            max_inline_bytes: 64 * 1024,
        }
    }
}

/// A malformed or oversized command: the message is Redis's reply text
/// without the `ERR ` prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Protocol error: {}", self.0)
    }
}

/// What `parse` found at the front of the buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A whole command: its arguments (the name first). May be empty (an
    /// empty inline line or `*0`), which Redis ignores.
    Command(Vec<Bytes>),
    /// Not complete yet: at least this many bytes are needed in all.
    Need(usize),
}

/// Cut one command from the front of `buf` (which keeps what follows).
pub fn parse(buf: &mut BytesMut, limits: &Limits) -> Result<Parsed, ProtocolError> {
    match buf.first() {
        None => Ok(Parsed::Need(1)),
        Some(b'*') => multibulk(buf, limits),
        Some(_) => inline(buf, limits),
    }
}

/// Position of the `\r\n` ending the line that starts at `from`, if present.
fn line_end(buf: &[u8], from: usize) -> Option<usize> {
    buf[from..]
        .windows(2)
        .position(|w| w == b"\r\n")
        .map(|i| from + i)
}

/// A decimal in `digits` as Redis reads lengths (optional '-', no '+').
fn decimal(digits: &[u8]) -> Option<i64> {
    if digits.is_empty() || digits.len() > 20 {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse::<i64>().ok()
}

fn multibulk(buf: &mut BytesMut, limits: &Limits) -> Result<Parsed, ProtocolError> {
    // A header line longer than any count can be is garbage, not "need more".
    const MAX_HEADER_LINE: usize = 32;
    let Some(end) = line_end(&buf[..], 1) else {
        if buf.len() > MAX_HEADER_LINE {
            return Err(ProtocolError("invalid multibulk length".into()));
        }
        return Ok(Parsed::Need(buf.len() + 1));
    };
    let count = decimal(&buf[1..end])
        .filter(|n| *n <= limits.max_args as i64)
        .ok_or_else(|| ProtocolError("invalid multibulk length".into()))?;
    let mut at = end + 2;
    if count <= 0 {
        // `*0` and `*-1` are skipped, as by Redis.
        let _ = buf.split_to(at);
        return Ok(Parsed::Command(Vec::new()));
    }
    // Ranges first; the buffer is split only once the command is whole, so
    // an incomplete one costs nothing but this walk.
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for _ in 0..count {
        if at >= buf.len() {
            return Ok(Parsed::Need(at + 1));
        }
        if buf[at] != b'$' {
            let got = buf[at] as char;
            return Err(ProtocolError(format!("expected '$', got '{got}'")));
        }
        let Some(end) = line_end(&buf[..], at + 1) else {
            if buf.len() - at > MAX_HEADER_LINE {
                return Err(ProtocolError("invalid bulk length".into()));
            }
            return Ok(Parsed::Need(buf.len() + 1));
        };
        let len = decimal(&buf[at + 1..end])
            .filter(|n| (0..=limits.max_bulk_bytes as i64).contains(n))
            .ok_or_else(|| ProtocolError("invalid bulk length".into()))? as usize;
        let start = end + 2;
        let stop = start + len;
        if stop + 2 > limits.max_command_bytes {
            return Err(ProtocolError(format!(
                "command larger than {} bytes",
                limits.max_command_bytes
            )));
        }
        if buf.len() < stop + 2 {
            return Ok(Parsed::Need(stop + 2));
        }
        if &buf[stop..stop + 2] != b"\r\n" {
            return Err(ProtocolError("bulk string not followed by CRLF".into()));
        }
        if ranges.is_empty() {
            // Reserve only once the first argument proved the header honest,
            // and never more than the bytes present could hold.
            ranges.reserve((count as usize).min(buf.len() / 4 + 1));
        }
        ranges.push((start, stop));
        at = stop + 2;
    }
    let whole = buf.split_to(at).freeze();
    Ok(Parsed::Command(
        ranges.into_iter().map(|(s, e)| whole.slice(s..e)).collect(),
    ))
}

fn inline(buf: &mut BytesMut, limits: &Limits) -> Result<Parsed, ProtocolError> {
    let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
        if buf.len() > limits.max_inline_bytes {
            return Err(ProtocolError("too big inline request".into()));
        }
        return Ok(Parsed::Need(buf.len() + 1));
    };
    if nl > limits.max_inline_bytes {
        return Err(ProtocolError("too big inline request".into()));
    }
    let line = buf.split_to(nl + 1);
    let text = line.strip_suffix(b"\n").unwrap_or(&line);
    let text = text.strip_suffix(b"\r").unwrap_or(text);
    let args =
        split_args(text).ok_or_else(|| ProtocolError("unbalanced quotes in request".into()))?;
    if args.len() > limits.max_args {
        return Err(ProtocolError("invalid multibulk length".into()));
    }
    Ok(Parsed::Command(args.into_iter().map(Bytes::from).collect()))
}

/// Split an inline line like Redis's `sdssplitargs`: blanks separate
/// arguments; "double quotes" take `\n \r \t \b \a \\ \" \xHH` escapes,
/// 'single quotes' only `\'`; a closing quote must be followed by a blank.
/// None: unbalanced quotes.
pub fn split_args(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut args = Vec::new();
    let mut i = 0;
    let blank = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c);
    loop {
        while i < line.len() && blank(line[i]) {
            i += 1;
        }
        if i == line.len() {
            return Some(args);
        }
        let arg = match line[i] {
            quote @ (b'"' | b'\'') => {
                i += 1;
                let mut arg = Vec::new();
                loop {
                    let &c = line.get(i)?;
                    if c == quote {
                        i += 1;
                        break;
                    }
                    let (byte, took) = quoted_byte(line, i, quote);
                    arg.push(byte);
                    i += took;
                }
                if i < line.len() && !blank(line[i]) {
                    return None;
                }
                arg
            }
            _ => {
                let from = i;
                while i < line.len() && !blank(line[i]) {
                    i += 1;
                }
                line[from..i].to_vec()
            }
        };
        args.push(arg);
    }
}

/// The byte at `line[i]` inside an argument quoted with `quote`, and how
/// many bytes of the line it took: the one place the two quotes differ.
/// Double quotes read `\n \r \t \b \a \xHH` and pass any other escaped
/// byte through; single quotes read only `\'`.
fn quoted_byte(line: &[u8], i: usize, quote: u8) -> (u8, usize) {
    let c = line[i];
    let Some(&e) = line.get(i + 1).filter(|_| c == b'\\') else {
        return (c, 1);
    };
    if quote == b'\'' {
        return if e == b'\'' { (e, 2) } else { (c, 1) };
    }
    let hex = |b: u8| (b as char).to_digit(16);
    if e == b'x'
        && i + 3 < line.len()
        && let (Some(h), Some(l)) = (hex(line[i + 2]), hex(line[i + 3]))
    {
        return ((h * 16 + l) as u8, 4);
    }
    let byte = match e {
        b'n' => b'\n',
        b'r' => b'\r',
        b't' => b'\t',
        b'b' => 0x08,
        b'a' => 0x07,
        other => other,
    };
    (byte, 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(bytes: &[u8]) -> Result<Vec<Vec<Vec<u8>>>, ProtocolError> {
        let mut buf = BytesMut::from(bytes);
        let mut out = Vec::new();
        loop {
            match parse(&mut buf, &Limits::default())? {
                Parsed::Command(args) => out.push(args.iter().map(|a| a.to_vec()).collect()),
                Parsed::Need(_) => return Ok(out),
            }
        }
    }

    #[test]
    fn multibulk_and_pipelines() {
        let got = parse_all(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*1\r\n$4\r\nPING\r\n").unwrap();
        assert_eq!(
            got,
            vec![vec![b"GET".to_vec(), b"k".to_vec()], vec![b"PING".to_vec()]]
        );
        // Binary-safe values, including CRLF inside.
        let got = parse_all(b"*2\r\n$3\r\nSET\r\n$4\r\na\r\nb\r\n").unwrap();
        assert_eq!(got[0][1], b"a\r\nb");
    }

    #[test]
    fn every_prefix_asks_for_more() {
        let whole = b"*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$5\r\nvalue\r\n";
        for cut in 0..whole.len() {
            let mut buf = BytesMut::from(&whole[..cut]);
            match parse(&mut buf, &Limits::default()).unwrap() {
                Parsed::Need(n) => {
                    assert!(n > cut, "cut {cut}: need {n}");
                    assert!(n <= whole.len(), "cut {cut}: need {n}");
                }
                other => panic!("cut {cut}: {other:?}"),
            }
            assert_eq!(buf.len(), cut, "nothing consumed");
        }
    }

    #[test]
    fn inline_commands() {
        let got = parse_all(b"SET k \"a b\\x41\\n\" 'it\\'s'\r\nPING\n\r\n").unwrap();
        assert_eq!(
            got,
            vec![
                vec![
                    b"SET".to_vec(),
                    b"k".to_vec(),
                    b"a bA\n".to_vec(),
                    b"it's".to_vec()
                ],
                vec![b"PING".to_vec()],
                vec![],
            ]
        );
        assert_eq!(
            parse_all(b"SET k \"open\r\n").unwrap_err().0,
            "unbalanced quotes in request"
        );
        assert_eq!(
            parse_all(b"GET \"a\"b\r\n").unwrap_err().0,
            "unbalanced quotes in request"
        );
    }

    #[test]
    fn limits_refuse_before_buffering() {
        let limits = Limits {
            max_bulk_bytes: 10,
            max_args: 3,
            max_command_bytes: 48,
            max_inline_bytes: 16,
        };
        let err = |bytes: &[u8]| parse(&mut BytesMut::from(bytes), &limits).unwrap_err().0;
        assert_eq!(err(b"*4\r\n"), "invalid multibulk length");
        assert_eq!(
            err(b"*99999999999999999999999\r\n"),
            "invalid multibulk length"
        );
        assert_eq!(err(b"*1\r\n$11\r\n"), "invalid bulk length");
        assert_eq!(err(b"*1\r\n$-1\r\n"), "invalid bulk length");
        assert_eq!(err(b"*1\r\n$abc\r\n"), "invalid bulk length");
        assert_eq!(err(b"*1\r\n+OK\r\n"), "expected '$', got '+'");
        assert_eq!(err(b"*1\r\n$2\r\nabcd"), "bulk string not followed by CRLF");
        assert_eq!(
            err(b"*3\r\n$10\r\n0123456789\r\n$10\r\n0123456789\r\n$10\r\n"),
            "command larger than 48 bytes"
        );
        assert_eq!(err(&[b'x'; 17]), "too big inline request");
        assert_eq!(
            err(b"*1111111111111111111111111111111111111111"),
            "invalid multibulk length"
        );
    }

    proptest::proptest! {
        /// Any bytes: an error, a request for more, or commands whose bytes
        /// came from the input; never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            let mut buf = BytesMut::from(&bytes[..]);
            let limits = Limits { max_bulk_bytes: 64, max_args: 8, max_command_bytes: 128, max_inline_bytes: 64 };
            for _ in 0..bytes.len() + 1 {
                match parse(&mut buf, &limits) {
                    Ok(Parsed::Command(_)) => continue,
                    Ok(Parsed::Need(n)) => { proptest::prop_assert!(n > buf.len()); break; }
                    Err(_) => break,
                }
            }
        }

        /// Encoding any arguments as multibulk and parsing gives them back.
        #[test]
        fn multibulk_round_trips(args in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..20), 1..6)) {
            let mut wire = format!("*{}\r\n", args.len()).into_bytes();
            for a in &args {
                wire.extend(format!("${}\r\n", a.len()).bytes());
                wire.extend(a);
                wire.extend(b"\r\n");
            }
            let got = parse_all(&wire).unwrap();
            proptest::prop_assert_eq!(got, vec![args]);
        }
    }
}
