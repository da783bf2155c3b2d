//! A cluster's own certificates: a fresh CA, and one certificate it signs
//! that names every host the cluster's processes are reached at. For
//! `insitu up --tls` (loopback) and `insitu tls init` (a small cluster whose
//! operator has no PKI of their own); anyone with one uses their own files.
//!
//! Files written under the directory:
//! - `ca.pem`   — the CA certificate: what clients pass as `--tls-ca`;
//! - `cert.pem` — the server certificate (`--tls-cert`), one for all
//!   processes, naming every `--host`;
//! - `key.pem`  — its private key (`--tls-key`), mode 0600.
//!
//! The CA's private key is never written: a copy of these files can prove
//! a server's identity, but cannot mint a certificate for another host.
//! Re-run `tls init` (and restart) to add hosts.

use std::io::Write;
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};

use crate::TlsError;

/// How long generated certificates are valid for.
pub const VALID_YEARS: i32 = 10;

/// Where `generate` put (or found) the files.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TlsFiles {
    /// The file names under `dir`.
    pub fn in_dir(dir: &Path) -> TlsFiles {
        TlsFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
        }
    }

    fn all_exist(&self) -> bool {
        self.ca.exists() && self.cert.exists() && self.key.exists()
    }
}

/// The files under `dir`, created if any is missing (then all three are
/// new). Returns them and whether they were created. `hosts`: names and IP
/// addresses the certificate names (at least one).
pub fn load_or_create(dir: &Path, hosts: &[String]) -> Result<(TlsFiles, bool), TlsError> {
    let files = TlsFiles::in_dir(dir);
    if files.all_exist() {
        return Ok((files, false));
    }
    create(dir, hosts)?;
    Ok((files, true))
}

/// Write a new CA and a certificate for `hosts` under `dir`, replacing any.
pub fn create(dir: &Path, hosts: &[String]) -> Result<TlsFiles, TlsError> {
    if hosts.is_empty() {
        return Err(TlsError::Generate(
            "a certificate must name at least one host".into(),
        ));
    }
    let fail = |e: rcgen::Error| TlsError::Generate(e.to_string());
    let (first_year, last_year) = validity_years();
    let not_before = rcgen::date_time_ymd(first_year, 1, 1);
    let not_after = rcgen::date_time_ymd(last_year, 1, 1);

    let ca_key = KeyPair::generate().map_err(fail)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(fail)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name
        .push(DnType::CommonName, "insitu cluster CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.not_before = not_before;
    ca.not_after = not_after;
    let ca_cert = ca.self_signed(&ca_key).map_err(fail)?;

    let key = KeyPair::generate().map_err(fail)?;
    let mut leaf = CertificateParams::new(hosts.to_vec()).map_err(|e| {
        TlsError::Generate(format!(
            "{hosts:?} are not all host names or IP addresses: {e}"
        ))
    })?;
    leaf.distinguished_name
        .push(DnType::CommonName, "insitu server");
    leaf.not_before = not_before;
    leaf.not_after = not_after;
    let cert = leaf.signed_by(&key, &ca_cert, &ca_key).map_err(fail)?;

    std::fs::create_dir_all(dir).map_err(|source| TlsError::Write {
        path: dir.display().to_string(),
        source,
    })?;
    let files = TlsFiles::in_dir(dir);
    write(&files.ca, ca_cert.pem().as_bytes(), 0o644)?;
    // Chain = leaf then CA, so a verifier holding only the CA builds it.
    write(
        &files.cert,
        format!("{}{}", cert.pem(), ca_cert.pem()).as_bytes(),
        0o644,
    )?;
    write(&files.key, key.serialize_pem().as_bytes(), 0o600)?;
    Ok(files)
}

/// From the start of this year to `VALID_YEARS` later (whole years: the
/// date arithmetic needs no calendar crate, and a day's slack either side
/// does not matter for a validity period of years).
fn validity_years() -> (i32, i32) {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // 365.2425 days a year.
    let year = 1970 + (secs / 31_556_952) as i32;
    (year, year + 1 + VALID_YEARS)
}

/// Write `bytes` to a new file with `mode`, replacing any, all or nothing
/// (written beside, then renamed).
fn write(path: &Path, bytes: &[u8], mode: u32) -> Result<(), TlsError> {
    let err = |source| TlsError::Write {
        path: path.display().to_string(),
        source,
    };
    let tmp = path.with_extension("pem.tmp");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut f = options.open(&tmp).map_err(err)?;
    f.write_all(bytes).map_err(err)?;
    f.sync_all().map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}
