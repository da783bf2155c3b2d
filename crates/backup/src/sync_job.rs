//! Fsyncs detached from the `Io` that opened them (`Io::sync_job`): the
//! store makes a job, the job runs on any thread while the store goes on
//! taking appends, and the store's `Io` then records what the job made
//! durable (`Io::sync_job_done`).
//!
//! Crash argument: a job covers, per file, at least the bytes appended
//! before it was made (an fsync of a descriptor makes everything written
//! to that file before the call durable). Bytes appended while it runs may
//! or may not be covered, so the store treats them as unsynced (its
//! `Replica::last_write` stamp). A file removed while a job runs is not
//! harmed: the job holds its own descriptor of the old file, and a new
//! file of the same path is a different file (the real disk's directory
//! entries, the simulated disk's file ids).

use std::fs::File;
use std::io;
use std::path::PathBuf;

/// Most fsyncs a job runs at once. Concurrent fsyncs on one file system
/// share journal commits (ext4, xfs), so a flush touching many replica
/// files costs about one commit, not one per file; 16 threads keep that
/// while bounding the threads a flush starts.
const MAX_PARALLEL_SYNCS: usize = 16;

/// The fsyncs of several files (see the module docs), in the order of the
/// paths the job was made for; its results and `Io::sync_job_done` take
/// that order too.
pub struct SyncJob {
    pub(crate) kind: JobKind,
}

pub(crate) enum JobKind {
    /// The real file system.
    Fs {
        /// Per path: its own descriptor, or why none could be opened.
        files: Vec<io::Result<File>>,
        /// Per directory: its path and the indices of the new files in it,
        /// whose entries are synced after the files.
        dirs: Vec<(PathBuf, Vec<usize>)>,
        /// `FsIo::removals` when the job was made.
        removals: u64,
    },
    /// The simulated disk: per path, the file's id and its bytes when the
    /// job was made (what the job makes durable), or why it fails.
    Sim(Vec<io::Result<(u64, Vec<u8>)>>),
}

/// What a `SyncJob` did: one result per path, in order.
pub struct SyncDone {
    pub results: Vec<io::Result<()>>,
    pub(crate) applied: Applied,
}

/// What the `Io` records once the job is done.
pub(crate) enum Applied {
    Fs {
        /// Indices of the paths whose directory entries the job synced.
        dirents_synced: Vec<usize>,
        /// `FsIo::removals` when the job was made.
        removals: u64,
    },
    /// Per path: the file id and the bytes now durable (`None`: failed).
    Sim(Vec<Option<(u64, Vec<u8>)>>),
    /// Nothing (a job that could not run).
    Nothing,
}

impl SyncJob {
    /// Sync every file (the real disk: up to `MAX_PARALLEL_SYNCS` fsyncs at
    /// once, then the directories of the new files). Blocks for as long as
    /// the disk takes.
    pub fn run(self) -> SyncDone {
        match self.kind {
            JobKind::Fs {
                files,
                dirs,
                removals,
            } => {
                let mut results = sync_files(&files);
                // New files' directory entries: one fsync per directory.
                let mut dirents_synced = Vec::new();
                for (dir, members) in &dirs {
                    if !members.iter().any(|&i| results[i].is_ok()) {
                        continue;
                    }
                    let synced = File::open(dir).and_then(|d| d.sync_all());
                    for &i in members {
                        if results[i].is_ok() {
                            match &synced {
                                Ok(()) => dirents_synced.push(i),
                                Err(e) => results[i] = Err(copy_error(e)),
                            }
                        }
                    }
                }
                SyncDone {
                    results,
                    applied: Applied::Fs {
                        dirents_synced,
                        removals,
                    },
                }
            }
            JobKind::Sim(snapshots) => {
                let results = snapshots
                    .iter()
                    .map(|s| s.as_ref().map(|_| ()).map_err(copy_error))
                    .collect();
                let applied = Applied::Sim(snapshots.into_iter().map(Result::ok).collect());
                SyncDone { results, applied }
            }
        }
    }
}

impl SyncDone {
    /// A job of `files` files that could not run: every one failed with `why`.
    pub fn failed(files: usize, why: &str) -> SyncDone {
        SyncDone {
            results: (0..files).map(|_| Err(io::Error::other(why))).collect(),
            applied: Applied::Nothing,
        }
    }
}

/// `sync_data` every file, several at once.
fn sync_files(files: &[io::Result<File>]) -> Vec<io::Result<()>> {
    let mut results: Vec<io::Result<()>> = Vec::with_capacity(files.len());
    let chunk = files.len().div_ceil(MAX_PARALLEL_SYNCS).max(1);
    std::thread::scope(|scope| {
        let workers: Vec<_> = files
            .chunks(chunk)
            .map(|files| {
                scope.spawn(move || {
                    files
                        .iter()
                        .map(|f| match f {
                            Ok(f) => f.sync_data(),
                            Err(e) => Err(copy_error(e)),
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
                Err(_) => {
                    results.extend((0..n).map(|_| Err(io::Error::other("sync thread panicked"))))
                }
            }
        }
    });
    debug_assert_eq!(results.len(), files.len());
    results
}

/// `io::Error` is not `Clone`: the same kind and message.
fn copy_error(e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), e.to_string())
}
