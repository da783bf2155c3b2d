//! The server's identity: a random 128-bit value, in hex, kept in
//! `DIR/server-identity` from its first start on.
//!
//! The coordinator tells a restart of this server (same identity: the old
//! process is gone, retire it) from a second server that advertises the same
//! address by mistake (another identity: refuse it, instead of re-homing the
//! first one's tablets empty).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};

pub const IDENTITY_FILE: &str = "server-identity";
/// Hex digits of an identity (128 bits).
const IDENTITY_HEX_DIGITS: usize = 32;

/// Read the identity kept in `dir`, or create and keep a new one.
pub fn load_or_create(dir: &Path) -> anyhow::Result<String> {
    let path = dir.join(IDENTITY_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => {
            // A short file; anything longer is not ours.
            if bytes.len() > 2 * IDENTITY_HEX_DIGITS {
                bail!(
                    "{} is not a server identity file ({} bytes); move it away to start this directory as a new server",
                    path.display(),
                    bytes.len()
                );
            }
            let text = String::from_utf8_lossy(&bytes);
            let id = text.trim();
            if id.len() != IDENTITY_HEX_DIGITS || !id.chars().all(|c| c.is_ascii_hexdigit()) {
                bail!(
                    "{} is damaged (expected {IDENTITY_HEX_DIGITS} hex digits, found {id:?}); move it away to start this directory as a new server",
                    path.display()
                );
            }
            Ok(id.to_ascii_lowercase())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = random_identity();
            // Write a temporary file and rename it, so a crash never leaves half an identity.
            let tmp = dir.join(format!("{IDENTITY_FILE}.tmp"));
            std::fs::write(&tmp, format!("{id}\n"))
                .with_context(|| format!("cannot write {}", tmp.display()))?;
            std::fs::rename(&tmp, &path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            tracing::info!(identity = %id, file = %path.display(), "new server identity");
            Ok(id)
        }
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// 128 random bits: std's per-process random hash keys, mixed with the time
/// and the process id (no extra dependency; uniqueness, not secrecy, is needed).
fn random_identity() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let half = |salt: u64| {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(salt);
        h.write_u128(nanos);
        h.write_u32(std::process::id());
        h.finish()
    };
    format!("{:016x}{:016x}", half(1), half(2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_kept_and_checked() {
        let dir = std::env::temp_dir().join(format!("insitu-identity-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let first = load_or_create(&dir).unwrap();
        assert_eq!(first.len(), IDENTITY_HEX_DIGITS);
        assert_eq!(load_or_create(&dir).unwrap(), first, "kept across restarts");
        let other =
            std::env::temp_dir().join(format!("insitu-identity-test2-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&other);
        std::fs::create_dir_all(&other).unwrap();
        assert_ne!(
            load_or_create(&other).unwrap(),
            first,
            "two directories, two identities"
        );
        std::fs::write(dir.join(IDENTITY_FILE), "not hex").unwrap();
        let err = load_or_create(&dir).unwrap_err().to_string();
        assert!(err.contains("damaged"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&other);
    }
}
