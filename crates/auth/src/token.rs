//! Secrets a connection presents: where they come from (a file, the
//! environment, generated) and how they are compared.

use std::fmt;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

/// Environment variable clients read their token from.
pub const ENV_AUTH_TOKEN: &str = "INSITU_AUTH_TOKEN";
/// Environment variable naming a file that holds the client token (read
/// when `ENV_AUTH_TOKEN` is unset).
pub const ENV_AUTH_TOKEN_FILE: &str = "INSITU_AUTH_TOKEN_FILE";
/// Environment variable servers and the coordinator read the cluster
/// credential from (when no `--cluster-token-file` is given).
pub const ENV_CLUSTER_TOKEN: &str = "INSITU_CLUSTER_TOKEN";

/// Shortest token accepted: 16 characters. A guessable secret is no
/// secret; generated tokens are 64 hex digits (256 bits).
pub const MIN_TOKEN_BYTES: usize = 16;
/// Longest token accepted (a `Hello` is a small frame; a file of megabytes
/// is a mistake, not a token).
pub const MAX_TOKEN_BYTES: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("cannot read the token file {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("cannot write the token file {path}: {error}")]
    Write { path: String, error: std::io::Error },
    #[error(
        "the token from {source_name} is {len} bytes; a token must be {MIN_TOKEN_BYTES} to {MAX_TOKEN_BYTES} bytes of printable text (no spaces)"
    )]
    BadLength { source_name: String, len: usize },
    #[error(
        "the token from {source_name} holds a space or a control character; a token is printable text"
    )]
    BadByte { source_name: String },
    #[error("the operating system's random source failed: {0}")]
    Random(String),
}

/// A secret. Cheap to clone; never printed (`Debug` shows its length only),
/// so a token cannot leak into a log line or an error message.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Arc<[u8]>);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token(<{} bytes>)", self.0.len())
    }
}

impl Token {
    /// A token from text: surrounding whitespace (a file's trailing newline)
    /// is dropped; what remains must be printable, without spaces, and
    /// `MIN_TOKEN_BYTES..=MAX_TOKEN_BYTES` long. `source_name` is for errors.
    pub fn parse(text: &[u8], source_name: &str) -> Result<Token, TokenError> {
        let trimmed = text.trim_ascii();
        if !(MIN_TOKEN_BYTES..=MAX_TOKEN_BYTES).contains(&trimmed.len()) {
            return Err(TokenError::BadLength {
                source_name: source_name.to_string(),
                len: trimmed.len(),
            });
        }
        if !trimmed.iter().all(|b| b.is_ascii_graphic()) {
            return Err(TokenError::BadByte {
                source_name: source_name.to_string(),
            });
        }
        Ok(Token(trimmed.into()))
    }

    /// The token in file `path` (bounded read: a huge file is refused, not loaded).
    pub fn from_file(path: &Path) -> Result<Token, TokenError> {
        use std::io::Read;
        let read_err = |error| TokenError::Read {
            path: path.display().to_string(),
            error,
        };
        let mut text = Vec::new();
        std::fs::File::open(path)
            .map_err(read_err)?
            .take(MAX_TOKEN_BYTES as u64 + 64)
            .read_to_end(&mut text)
            .map_err(read_err)?;
        Token::parse(&text, &path.display().to_string())
    }

    /// The token in environment variable `var`; None if it is unset or empty.
    pub fn from_env(var: &str) -> Option<Result<Token, TokenError>> {
        let value = std::env::var_os(var)?;
        if value.is_empty() {
            return None;
        }
        Some(Token::parse(value.as_encoded_bytes(), var))
    }

    /// The client token from the environment: `INSITU_AUTH_TOKEN`, else the
    /// file `INSITU_AUTH_TOKEN_FILE` names; None if neither is set.
    pub fn client_from_env() -> Option<Result<Token, TokenError>> {
        if let Some(token) = Token::from_env(ENV_AUTH_TOKEN) {
            return Some(token);
        }
        let path = std::env::var_os(ENV_AUTH_TOKEN_FILE).filter(|p| !p.is_empty())?;
        Some(Token::from_file(Path::new(&path)))
    }

    /// A new random token: 32 bytes from the OS, as 64 hex digits.
    pub fn generate() -> Result<Token, TokenError> {
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw).map_err(|e| TokenError::Random(e.to_string()))?;
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        Ok(Token(hex.as_bytes().into()))
    }

    /// The token in `path`, or a new one written there (readable by this
    /// user only) if the file does not exist. Returns whether it was created.
    pub fn load_or_create(path: &Path) -> Result<(Token, bool), TokenError> {
        if path.exists() {
            return Ok((Token::from_file(path)?, false));
        }
        let token = Token::generate()?;
        let write_err = |error| TokenError::Write {
            path: path.display().to_string(),
            error,
        };
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let mut file = options.open(path).map_err(write_err)?;
        file.write_all(&token.0).map_err(write_err)?;
        file.write_all(b"\n").map_err(write_err)?;
        file.sync_all().map_err(write_err)?;
        Ok((token, true))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Compare with presented bytes in time that depends on the lengths only,
    /// not on where the first difference is (so timing does not reveal a
    /// token's prefix to a guesser).
    pub fn matches(&self, presented: &[u8]) -> bool {
        if presented.len() != self.0.len() {
            return false;
        }
        let diff = self
            .0
            .iter()
            .zip(presented)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        // Keep the fold from being turned into an early-exit compare.
        std::hint::black_box(diff) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_trims_and_checks_length_and_bytes() {
        let t = Token::parse(b"  0123456789abcdef\n", "test").unwrap();
        assert_eq!(t.as_bytes(), b"0123456789abcdef");
        assert!(matches!(
            Token::parse(b"short", "test"),
            Err(TokenError::BadLength { len: 5, .. })
        ));
        assert!(matches!(
            Token::parse(&[b'a'; MAX_TOKEN_BYTES + 1], "test"),
            Err(TokenError::BadLength { .. })
        ));
        assert!(matches!(
            Token::parse(b"0123456789 abcdef", "test"),
            Err(TokenError::BadByte { .. })
        ));
    }

    #[test]
    fn matches_only_the_same_bytes_and_debug_hides_them() {
        let t = Token::parse(b"0123456789abcdef", "test").unwrap();
        assert!(t.matches(b"0123456789abcdef"));
        assert!(!t.matches(b"0123456789abcdeF"));
        assert!(!t.matches(b"0123456789abcde"));
        assert!(!t.matches(b""));
        assert_eq!(format!("{t:?}"), "Token(<16 bytes>)");
    }

    #[test]
    fn generated_tokens_differ_and_load_or_create_keeps_the_first() {
        let a = Token::generate().unwrap();
        let b = Token::generate().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.as_bytes().len(), 64);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("auth-token");
        let (first, created) = Token::load_or_create(&path).unwrap();
        assert!(created);
        let (again, created) = Token::load_or_create(&path).unwrap();
        assert!(!created);
        assert_eq!(first, again);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(
                mode & 0o077,
                0,
                "the token file is readable by others: {mode:o}"
            );
        }
    }
}
