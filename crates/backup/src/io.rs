//! The file operations a backup needs, behind a trait so tests can inject
//! faults (torn writes, lost unsynced data, a full disk) against a model.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, Read, Write};
use std::path::{Path, PathBuf};

/// What a backup does to its directory. Appends are not durable until
/// `sync`; a crash may keep any prefix of what was appended since.
pub trait Io {
    fn create_dir_all(&mut self, dir: &Path) -> io::Result<()>;
    /// Paths of the regular files directly in `dir`.
    fn list(&mut self, dir: &Path) -> io::Result<Vec<PathBuf>>;
    fn read(&mut self, path: &Path) -> io::Result<Vec<u8>>;
    /// Append to `path`, creating it when missing.
    fn append(&mut self, path: &Path, bytes: &[u8]) -> io::Result<()>;
    /// Append `parts` one after the other (as `append` of their
    /// concatenation, without making it).
    fn append_parts(&mut self, path: &Path, parts: &[&[u8]]) -> io::Result<()> {
        self.append(path, &parts.concat())
    }
    /// Cut `path` to `len` bytes (repairing a torn tail before appending).
    fn truncate(&mut self, path: &Path, len: u64) -> io::Result<()>;
    /// Make everything appended to `path` so far, and its directory entry, durable.
    fn sync(&mut self, path: &Path) -> io::Result<()>;
    /// `sync` every one of `paths` (one result each, in order). A group
    /// commit touches many files; the real file system syncs them
    /// concurrently, so the journal commits them together.
    fn sync_many(&mut self, paths: &[PathBuf]) -> Vec<io::Result<()>> {
        paths.iter().map(|p| self.sync(p)).collect()
    }
    fn remove(&mut self, path: &Path) -> io::Result<()>;
}

/// Most fsyncs a group commit runs at once. Concurrent fsyncs on one file
/// system share journal commits (ext4, xfs), so a group touching many
/// replica files costs about one commit, not one per file; 16 threads keep
/// that while bounding the threads a flush starts.
const MAX_PARALLEL_SYNCS: usize = 16;

/// Most append handles kept open at once. A backup holds replicas of many
/// segments; reopening a file per append would cost a syscall pair, keeping
/// every file open would run into the process's descriptor limit.
const MAX_OPEN_FILES: usize = 256;

/// The real file system.
#[derive(Default)]
pub struct FsIo {
    /// Append handles by path, so appends to an open segment's replica cost one write.
    open: HashMap<PathBuf, File>,
    /// Files created since their directory was last synced: their directory
    /// entry must be made durable too, or a crash could lose the whole file.
    unsynced_dirents: HashSet<PathBuf>,
}

impl FsIo {
    fn handle(&mut self, path: &Path) -> io::Result<&mut File> {
        if !self.open.contains_key(path) {
            if self.open.len() >= MAX_OPEN_FILES {
                self.open.clear();
            }
            if !path.exists() {
                self.unsynced_dirents.insert(path.to_path_buf());
            }
            let f = OpenOptions::new().create(true).append(true).open(path)?;
            self.open.insert(path.to_path_buf(), f);
        }
        self.open
            .get_mut(path)
            .ok_or_else(|| io::Error::other("append handle vanished"))
    }
}

impl Io for FsIo {
    fn create_dir_all(&mut self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    fn list(&mut self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            if e.file_type()?.is_file() {
                out.push(e.path());
            }
        }
        out.sort();
        Ok(out)
    }

    fn read(&mut self, path: &Path) -> io::Result<Vec<u8>> {
        let mut v = Vec::new();
        File::open(path)?.read_to_end(&mut v)?;
        Ok(v)
    }

    fn append(&mut self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        self.handle(path)?.write_all(bytes)
    }

    fn append_parts(&mut self, path: &Path, parts: &[&[u8]]) -> io::Result<()> {
        let file = self.handle(path)?;
        let mut slices: Vec<IoSlice<'_>> = parts.iter().map(|p| IoSlice::new(p)).collect();
        let mut left = &mut slices[..];
        // `write_all_vectored` is not stable: the same loop by hand.
        while !left.is_empty() {
            match file.write_vectored(left) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut left, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn truncate(&mut self, path: &Path, len: u64) -> io::Result<()> {
        self.open.remove(path);
        OpenOptions::new().write(true).open(path)?.set_len(len)
    }

    fn sync(&mut self, path: &Path) -> io::Result<()> {
        self.handle(path)?.sync_data()?;
        if self.unsynced_dirents.remove(path)
            && let Some(dir) = path.parent()
        {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    }

    fn sync_many(&mut self, paths: &[PathBuf]) -> Vec<io::Result<()>> {
        if paths.len() <= 1 {
            return paths.iter().map(|p| self.sync(p)).collect();
        }
        // Open (or find) every handle first; a path that cannot be opened
        // fails alone.
        let mut files: Vec<io::Result<File>> = Vec::with_capacity(paths.len());
        for p in paths {
            files.push(self.handle(p).and_then(|f| f.try_clone()));
        }
        let mut results: Vec<io::Result<()>> = Vec::with_capacity(paths.len());
        let chunk = paths.len().div_ceil(MAX_PARALLEL_SYNCS);
        std::thread::scope(|scope| {
            let workers: Vec<_> = files
                .chunks(chunk)
                .map(|files| {
                    scope.spawn(move || {
                        files
                            .iter()
                            .map(|f| match f {
                                Ok(f) => f.sync_data(),
                                Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            for (w, n) in workers
                .into_iter()
                .zip(files.chunks(chunk).map(|c| c.len()))
            {
                match w.join() {
                    Ok(r) => results.extend(r),
                    Err(_) => results
                        .extend((0..n).map(|_| Err(io::Error::other("sync thread panicked")))),
                }
            }
        });
        debug_assert_eq!(results.len(), paths.len());
        // New files' directory entries: one fsync per directory covers all.
        let mut dirs: Vec<&Path> = Vec::new();
        for (p, r) in paths.iter().zip(&results) {
            if r.is_ok()
                && self.unsynced_dirents.contains(p)
                && let Some(dir) = p.parent()
                && !dirs.contains(&dir)
            {
                dirs.push(dir);
            }
        }
        for dir in dirs {
            let synced = File::open(dir).and_then(|d| d.sync_all());
            for (p, r) in paths.iter().zip(results.iter_mut()) {
                if r.is_ok() && p.parent() == Some(dir) && self.unsynced_dirents.contains(p) {
                    match &synced {
                        Ok(()) => {
                            self.unsynced_dirents.remove(p);
                        }
                        Err(e) => *r = Err(io::Error::new(e.kind(), e.to_string())),
                    }
                }
            }
        }
        results
    }

    fn remove(&mut self, path: &Path) -> io::Result<()> {
        self.open.remove(path);
        self.unsynced_dirents.remove(path);
        match std::fs::remove_file(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
}

/// An in-memory disk for tests, with the failure modes of a real one.
pub mod sim {
    use super::*;

    #[derive(Clone, Debug, Default)]
    struct SimFile {
        /// What a reader sees now (the page cache).
        now: Vec<u8>,
        /// What survives a crash for certain: the contents at the last sync.
        durable: Vec<u8>,
        /// Whether the file's directory entry survives a crash (synced once).
        durable_entry: bool,
    }

    /// A simulated disk. `crash` keeps what was synced plus, per file, a
    /// random prefix of what was appended since (a torn write), optionally
    /// followed by garbage; files never synced may vanish.
    #[derive(Clone, Debug, Default)]
    pub struct SimIo {
        files: BTreeMap<PathBuf, SimFile>,
        /// Bytes the disk can still take; `None` is unlimited. Appends past it
        /// fail with a "no space" error and write nothing.
        pub free_bytes: Option<u64>,
        /// Fail every sync (a dying disk).
        pub fail_sync: bool,
        /// Successful syncs so far (tests count fsyncs to check group commit).
        pub syncs: u64,
    }

    impl SimIo {
        /// Lose power. `choice(n)` picks a number in `0..n` (the test's RNG).
        pub fn crash(&mut self, mut choice: impl FnMut(u64) -> u64) {
            let mut kept = BTreeMap::new();
            for (path, f) in std::mem::take(&mut self.files) {
                if !f.durable_entry && choice(2) == 0 {
                    continue; // the file's creation itself was lost
                }
                let mut now = f.durable.clone();
                if f.now.starts_with(&f.durable) && f.now.len() > f.durable.len() {
                    let extra = (f.now.len() - f.durable.len()) as u64;
                    let keep = choice(extra + 1) as usize;
                    now.extend_from_slice(&f.now[f.durable.len()..f.durable.len() + keep]);
                    if keep < extra as usize && choice(4) == 0 {
                        // A sector half written: garbage where the tail was going.
                        let junk = choice(16) as usize + 1;
                        now.extend((0..junk).map(|_| choice(256) as u8));
                    }
                }
                kept.insert(
                    path,
                    SimFile {
                        durable: now.clone(),
                        now,
                        durable_entry: true,
                    },
                );
            }
            self.files = kept;
        }

        /// Flip one bit of `path` at `byte` (a bad sector found later).
        pub fn corrupt(&mut self, path: &Path, byte: usize) {
            if let Some(f) = self.files.get_mut(path) {
                if let Some(b) = f.now.get_mut(byte) {
                    *b ^= 1;
                }
                if let Some(b) = f.durable.get_mut(byte) {
                    *b ^= 1;
                }
            }
        }

        pub fn paths(&self) -> Vec<PathBuf> {
            self.files.keys().cloned().collect()
        }

        pub fn len(&self, path: &Path) -> Option<usize> {
            self.files.get(path).map(|f| f.now.len())
        }

        fn missing(path: &Path) -> io::Error {
            io::Error::new(io::ErrorKind::NotFound, format!("{}", path.display()))
        }
    }

    impl Io for SimIo {
        fn create_dir_all(&mut self, _dir: &Path) -> io::Result<()> {
            Ok(())
        }

        fn list(&mut self, dir: &Path) -> io::Result<Vec<PathBuf>> {
            Ok(self
                .files
                .keys()
                .filter(|p| p.parent() == Some(dir))
                .cloned()
                .collect())
        }

        fn read(&mut self, path: &Path) -> io::Result<Vec<u8>> {
            self.files
                .get(path)
                .map(|f| f.now.clone())
                .ok_or_else(|| Self::missing(path))
        }

        fn append(&mut self, path: &Path, bytes: &[u8]) -> io::Result<()> {
            if let Some(free) = &mut self.free_bytes {
                if (bytes.len() as u64) > *free {
                    return Err(io::Error::new(
                        io::ErrorKind::StorageFull,
                        "no space left on device",
                    ));
                }
                *free -= bytes.len() as u64;
            }
            self.files
                .entry(path.to_path_buf())
                .or_default()
                .now
                .extend_from_slice(bytes);
            Ok(())
        }

        fn truncate(&mut self, path: &Path, len: u64) -> io::Result<()> {
            let f = self
                .files
                .get_mut(path)
                .ok_or_else(|| Self::missing(path))?;
            f.now.truncate(len as usize);
            // Cutting a torn tail is made durable at the next sync like any
            // change; until then a crash may bring the tail back, which the
            // reader cuts again.
            Ok(())
        }

        fn sync(&mut self, path: &Path) -> io::Result<()> {
            if self.fail_sync {
                return Err(io::Error::other("injected sync failure"));
            }
            let f = self
                .files
                .get_mut(path)
                .ok_or_else(|| Self::missing(path))?;
            f.durable = f.now.clone();
            f.durable_entry = true;
            self.syncs += 1;
            Ok(())
        }

        fn remove(&mut self, path: &Path) -> io::Result<()> {
            self.files.remove(path);
            Ok(())
        }
    }
}
