//! A scratch directory for the unit tests, removed when dropped (the
//! coordinator's unit tests open redb files in it).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) struct TestDir(pub PathBuf);

impl TestDir {
    /// A fresh, empty directory named after `name`, the process and a counter.
    pub(crate) fn new(name: &str) -> TestDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "insitu-coordinator-test-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        TestDir(path)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
