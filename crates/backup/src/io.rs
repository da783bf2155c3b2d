//! The file operations a backup needs, behind a trait so tests can inject
//! faults (torn writes, lost unsynced data, a full disk) against a model.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, Read, Write};
use std::path::{Path, PathBuf};

use crate::sync_job::{Applied, JobKind};
pub use crate::sync_job::{SyncDone, SyncJob};

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
    /// `sync_many` split in three so that the fsyncs run on another thread
    /// while this `Io` goes on appending: this opens what the job needs,
    /// `SyncJob::run` syncs (anywhere), `sync_job_done` records what it made
    /// durable. Appends made while the job runs may or may not be covered;
    /// the caller syncs them again. `None`: this `Io` cannot sync elsewhere
    /// (the simulated disk), the caller uses `sync_many`.
    fn sync_job(&mut self, _paths: &[PathBuf]) -> Option<SyncJob> {
        None
    }
    /// Record what a finished `sync_job(paths)` made durable.
    fn sync_job_done(&mut self, _paths: &[PathBuf], _done: &SyncDone) {}
    fn remove(&mut self, path: &Path) -> io::Result<()>;
}

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
    /// Files removed so far. A detached sync (`sync_job`) marks directory
    /// entries durable only if none was removed while it ran: a file
    /// removed and created again meanwhile has a new entry it may not cover.
    removals: u64,
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

    /// A job syncing `paths` (see `Io::sync_job`).
    fn open_sync_job(&mut self, paths: &[PathBuf]) -> SyncJob {
        // Open (or find) every handle first; a path that cannot be opened
        // fails alone.
        let files: Vec<io::Result<File>> = paths
            .iter()
            .map(|p| self.handle(p).and_then(|f| f.try_clone()))
            .collect();
        let mut dirs: Vec<(PathBuf, Vec<usize>)> = Vec::new();
        for (i, p) in paths.iter().enumerate() {
            if !self.unsynced_dirents.contains(p) {
                continue;
            }
            let Some(dir) = p.parent() else { continue };
            match dirs.iter_mut().find(|(d, _)| d == dir) {
                Some((_, members)) => members.push(i),
                None => dirs.push((dir.to_path_buf(), vec![i])),
            }
        }
        SyncJob {
            kind: JobKind::Fs {
                files,
                dirs,
                removals: self.removals,
            },
        }
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
        let done = self.open_sync_job(paths).run();
        self.sync_job_done(paths, &done);
        done.results
    }

    fn sync_job(&mut self, paths: &[PathBuf]) -> Option<SyncJob> {
        Some(self.open_sync_job(paths))
    }

    fn sync_job_done(&mut self, paths: &[PathBuf], done: &SyncDone) {
        let Applied::Fs {
            dirents_synced,
            removals,
        } = &done.applied
        else {
            return;
        };
        // Conservative when a file was removed meanwhile (see `removals`):
        // those entries are synced again by the next flush.
        if *removals == self.removals {
            for &i in dirents_synced {
                self.unsynced_dirents.remove(&paths[i]);
            }
        }
    }

    fn remove(&mut self, path: &Path) -> io::Result<()> {
        self.open.remove(path);
        self.unsynced_dirents.remove(path);
        self.removals += 1;
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
        /// Unique per file created: a detached sync of a file removed and
        /// created again meanwhile must not touch the new one.
        id: u64,
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
        /// Files created so far (their ids).
        created: u64,
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
                        id: f.id,
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
                .or_insert_with(|| {
                    self.created += 1;
                    SimFile {
                        id: self.created,
                        ..SimFile::default()
                    }
                })
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

        /// A job that makes durable what each file held when it was made
        /// (the least a real fsync covers); `fail_sync` fails it.
        fn sync_job(&mut self, paths: &[PathBuf]) -> Option<SyncJob> {
            let snapshots = paths
                .iter()
                .map(|p| {
                    if self.fail_sync {
                        return Err(io::Error::other("injected sync failure"));
                    }
                    let f = self.files.get(p).ok_or_else(|| Self::missing(p))?;
                    Ok((f.id, f.now.clone()))
                })
                .collect();
            Some(SyncJob {
                kind: JobKind::Sim(snapshots),
            })
        }

        fn sync_job_done(&mut self, paths: &[PathBuf], done: &SyncDone) {
            let Applied::Sim(snapshots) = &done.applied else {
                return;
            };
            for (path, snapshot) in paths.iter().zip(snapshots) {
                let Some((id, bytes)) = snapshot else {
                    continue;
                };
                // Only the same file, and only what it still starts with
                // (appends only grow a file; a truncation is a reopen's).
                if let Some(f) = self.files.get_mut(path)
                    && f.id == *id
                    && f.now.starts_with(bytes)
                    && bytes.len() >= f.durable.len()
                {
                    f.durable = bytes.clone();
                    f.durable_entry = true;
                    self.syncs += 1;
                }
            }
        }

        fn remove(&mut self, path: &Path) -> io::Result<()> {
            self.files.remove(path);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `FsIo::removals`: a detached sync that ran while its file was removed
    /// and created again does not vouch for the new file's directory entry.
    #[test]
    fn a_detached_sync_leaves_a_recreated_files_entry_unsynced() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("a.replica");
        let mut io = FsIo::default();
        io.append(&path, b"first").expect("append");
        assert!(io.unsynced_dirents.contains(&path), "a new file's entry");
        let job = io.sync_job(std::slice::from_ref(&path)).expect("a job");
        io.remove(&path).expect("remove");
        io.append(&path, b"again").expect("append");
        let done = job.run();
        assert!(done.results[0].is_ok());
        io.sync_job_done(std::slice::from_ref(&path), &done);
        assert!(
            io.unsynced_dirents.contains(&path),
            "the new file's entry was not covered"
        );
        // With nothing removed meanwhile, the job's directory sync counts.
        let done = io
            .sync_job(std::slice::from_ref(&path))
            .expect("a job")
            .run();
        assert!(done.results[0].is_ok());
        io.sync_job_done(std::slice::from_ref(&path), &done);
        assert!(!io.unsynced_dirents.contains(&path));
    }
}
