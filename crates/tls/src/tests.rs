//! Handshakes over loopback with generated certificates: the right CA and
//! name connect and carry bytes both ways; a wrong CA, a wrong name, and a
//! plain peer are refused.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

fn hosts(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// A listener that TLS-accepts one connection and echoes what it reads.
async fn echo_server(server: ServerTls) -> (String, tokio::task::JoinHandle<std::io::Result<()>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let task = tokio::spawn(async move {
        let (tcp, _) = l.accept().await?;
        let mut s = server.accept(tcp, Duration::from_secs(5)).await?;
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).await?;
        s.write_all(&buf[..n]).await?;
        s.flush().await?;
        Ok(())
    });
    (addr, task)
}

#[tokio::test]
async fn generated_certificates_carry_bytes_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let (files, created) =
        generate::load_or_create(dir.path(), &hosts(&["localhost", "127.0.0.1"])).unwrap();
    assert!(created);
    let server = ServerTls::from_files(&files.cert, &files.key).unwrap();
    let client = ClientTls::from_ca_file(&files.ca).unwrap();
    for dial in ["127.0.0.1", "localhost"] {
        let (addr, task) = echo_server(server.clone()).await;
        let port = addr.rsplit_once(':').unwrap().1;
        let dial_addr = format!("{dial}:{port}");
        let tcp = TcpStream::connect(&addr).await.unwrap();
        let s = client.connect(&dial_addr, tcp).await.unwrap();
        assert!(s.is_tls());
        let (mut r, mut w) = s.into_split();
        w.write_all(b"hello over tls").await.unwrap();
        w.flush().await.unwrap();
        let mut got = vec![0u8; 14];
        r.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello over tls");
        task.await.unwrap().unwrap();
    }
    // A second call keeps the files (a restart keeps its identity).
    let before = std::fs::read(&files.cert).unwrap();
    let (_, created) = generate::load_or_create(dir.path(), &hosts(&["localhost"])).unwrap();
    assert!(!created);
    assert_eq!(std::fs::read(&files.cert).unwrap(), before);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&files.key).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "the key must not be readable by others");
    }
}

#[tokio::test]
async fn another_ca_is_refused() {
    let ours = tempfile::tempdir().unwrap();
    let theirs = tempfile::tempdir().unwrap();
    let ours = generate::create(ours.path(), &hosts(&["127.0.0.1"])).unwrap();
    let theirs = generate::create(theirs.path(), &hosts(&["127.0.0.1"])).unwrap();
    let server = ServerTls::from_files(&ours.cert, &ours.key).unwrap();
    let client = ClientTls::from_ca_file(&theirs.ca).unwrap();
    let (addr, task) = echo_server(server).await;
    let tcp = TcpStream::connect(&addr).await.unwrap();
    let err = client.connect(&addr, tcp).await.err().expect("refused");
    let msg = err.to_string();
    assert!(msg.contains("TLS handshake with"), "{msg}");
    assert!(msg.to_lowercase().contains("certificate"), "{msg}");
    assert!(
        task.await.unwrap().is_err(),
        "the server saw the handshake fail too"
    );
}

#[tokio::test]
async fn a_certificate_for_another_host_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let files = generate::create(dir.path(), &hosts(&["db.example"])).unwrap();
    let server = ServerTls::from_files(&files.cert, &files.key).unwrap();
    let client = ClientTls::from_ca_file(&files.ca).unwrap();
    let (addr, _task) = echo_server(server).await;
    let tcp = TcpStream::connect(&addr).await.unwrap();
    let err = client.connect(&addr, tcp).await.err().expect("refused");
    assert!(err.to_string().contains("not valid for name"), "{err}");
}

#[tokio::test]
async fn a_plain_peer_is_refused_by_a_tls_listener() {
    let dir = tempfile::tempdir().unwrap();
    let files = generate::create(dir.path(), &hosts(&["127.0.0.1"])).unwrap();
    let server = ServerTls::from_files(&files.cert, &files.key).unwrap();
    let (addr, task) = echo_server(server).await;
    let mut tcp = TcpStream::connect(&addr).await.unwrap();
    // A plausible insitu frame header, not a TLS record.
    tcp.write_all(&[0x49, 0x4e, 0x53, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
        .await
        .unwrap();
    let err = task.await.unwrap().expect_err("handshake fails");
    assert!(err.to_string().contains("TLS handshake failed"), "{err}");
}

#[test]
fn bad_files_get_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.pem");
    let e = ClientTls::from_ca_file(&missing).unwrap_err().to_string();
    assert!(e.contains("cannot read") && e.contains("nope.pem"), "{e}");
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate at all\n").unwrap();
    let e = ClientTls::from_ca_file(&junk).unwrap_err().to_string();
    assert!(e.contains("no certificate found"), "{e}");
    let files = generate::create(dir.path(), &hosts(&["localhost"])).unwrap();
    // Certificate and key swapped.
    let e = ServerTls::from_files(&files.key, &files.cert)
        .unwrap_err()
        .to_string();
    assert!(e.contains("certificate"), "{e}");
    let big = dir.path().join("big.pem");
    std::fs::write(&big, vec![b'A'; (MAX_PEM_FILE_BYTES + 1) as usize]).unwrap();
    let e = ClientTls::from_ca_file(&big).unwrap_err().to_string();
    assert!(e.contains("at most"), "{e}");
    assert!(generate::create(dir.path(), &[]).is_err());
}

#[test]
fn host_of_addresses() {
    assert_eq!(host_of("127.0.0.1:7000"), "127.0.0.1");
    assert_eq!(host_of("db.example:1"), "db.example");
    assert_eq!(host_of("[::1]:7000"), "::1");
    assert_eq!(host_of("localhost"), "localhost");
}
