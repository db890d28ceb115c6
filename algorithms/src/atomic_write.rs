//! Writing files atomically: weights and checkpoints here, configs in the learner.
//!
//! The data goes to a temporary file beside the target, which is fsynced, renamed over the target, and the
//! directory fsynced, so a crash mid-save leaves either the old file or the new one, never a torn one.
//!
//! Many files saved at once (a population's members checkpointing together) are written with [`save_file`]
//! inside [`together`]: each goes to its temporary file as it comes, and at the end of the scope the files are
//! fsynced in parallel, renamed, and their directories fsynced in parallel. Each file keeps the guarantee
//! above; a disk's fsync latency is paid about once per scope instead of twice per file. Only [`save_file`]
//! waits for the scope: files that are written and then read back (a CSV whose header is rewritten) use
//! [`write_atomic`], which is immediate everywhere.
use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// Threads that wait on fsyncs at the end of a [`together`] scope (they wait on the disk, not the CPU).
const SYNC_THREADS: usize = 32;

/// A file written to its temporary name inside a [`together`] scope, renamed over `path` at its end.
struct Pending {
    tmp: PathBuf,
    path: PathBuf,
}

thread_local! {
    /// This thread's open [`together`] scope: the files written in it so far.
    static DEFERRED: RefCell<Option<Vec<Pending>>> = const { RefCell::new(None) };
}

/// Write `path` through `write(tmp)`, atomically and at once. The temporary name keeps the target's extension
/// (libtorch picks the format from it); on failure it is removed and the old file is untouched.
pub fn write_atomic(path: &Path, write: impl FnOnce(&Path) -> io::Result<()>) -> io::Result<()> {
    let (dir, tmp) = temporary(path)?;
    let result = write(&tmp).and_then(|_| File::open(&tmp)?.sync_all()).and_then(|_| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result?;
    File::open(dir)?.sync_all()
}

/// A saved file (a checkpoint, weights, a run's config): [`write_atomic`], except inside a [`together`] scope
/// on this thread, where the target is replaced, durably, when the scope ends (until then it keeps its old
/// contents; nothing in the scope may read it back).
pub fn save_file(path: &Path, write: impl FnOnce(&Path) -> io::Result<()>) -> io::Result<()> {
    if DEFERRED.with_borrow(Option::is_none) {
        return write_atomic(path, write);
    }
    let (_, tmp) = temporary(path)?;
    if let Err(e) = write(&tmp) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    let pending = Pending { tmp, path: path.to_path_buf() };
    DEFERRED.with_borrow_mut(|d| d.as_mut().expect("checked above").push(pending));
    Ok(())
}

/// `path`'s directory and the temporary file beside it.
fn temporary(path: &Path) -> io::Result<(&Path, PathBuf)> {
    let dir = parent(path);
    let name = path.file_name().ok_or_else(|| io::Error::other("path has no file name"))?;
    let ext = path.extension().map(|e| e.to_string_lossy().into_owned()).unwrap_or_default();
    Ok((dir, dir.join(format!(".{}.{}.tmp.{ext}", name.to_string_lossy(), std::process::id()))))
}

/// Run `f` with this thread's [`save_file`] calls made durable together when it returns: the files are
/// fsynced in parallel, renamed over their targets, and their directories fsynced in parallel. Until then
/// every target keeps its old contents. If `f` fails, or an fsync or rename does, the temporary files not yet
/// renamed are removed and the error returned (an I/O error names its file). A scope inside another is part of
/// the outer one. `io_error` turns the end's I/O error into `f`'s error type.
pub fn together<T, E>(f: impl FnOnce() -> Result<T, E>, io_error: impl FnOnce(io::Error) -> E) -> Result<T, E> {
    if DEFERRED.with_borrow(Option::is_some) {
        return f();
    }
    DEFERRED.set(Some(Vec::new()));
    let out = f();
    let pending = DEFERRED.take().unwrap_or_default();
    match out {
        Ok(value) => commit(pending).map(|()| value).map_err(io_error),
        Err(e) => {
            discard(&pending);
            Err(e)
        }
    }
}

/// The end of a [`together`] scope: fsync the files, rename them, fsync their directories. A file written
/// twice in the scope has one temporary file, holding the second write.
fn commit(mut pending: Vec<Pending>) -> io::Result<()> {
    let mut seen = std::collections::HashSet::new();
    pending.reverse();
    pending.retain(|p| seen.insert(p.tmp.clone()));
    let synced = in_parallel(pending.iter().map(|p| p.tmp.as_path()).collect());
    if let Err(e) = synced {
        discard(&pending);
        return Err(e);
    }
    let mut dirs: Vec<&Path> = Vec::new();
    for (k, p) in pending.iter().enumerate() {
        if let Err(e) = std::fs::rename(&p.tmp, &p.path) {
            discard(&pending[k..]);
            return Err(io::Error::new(
                e.kind(),
                format!("renaming {} over {}: {e}", p.tmp.display(), p.path.display()),
            ));
        }
        dirs.push(parent(&p.path));
    }
    dirs.sort();
    dirs.dedup();
    in_parallel(dirs)
}

/// fsync every path (files or directories) on up to [`SYNC_THREADS`] threads; the first error names its path.
fn in_parallel(paths: Vec<&Path>) -> io::Result<()> {
    let sync = |p: &Path| {
        File::open(p)
            .and_then(|f| f.sync_all())
            .map_err(|e| io::Error::new(e.kind(), format!("fsync of {}: {e}", p.display())))
    };
    if paths.len() < 2 {
        return paths.into_iter().try_for_each(sync);
    }
    let per_thread = paths.len().div_ceil(SYNC_THREADS);
    std::thread::scope(|s| {
        let handles: Vec<_> =
            paths.chunks(per_thread).map(|share| s.spawn(move || share.iter().try_for_each(|p| sync(p)))).collect();
        handles.into_iter().try_for_each(|h| h.join().expect("an fsync thread does not panic"))
    })
}

/// Remove the temporary files of a scope that did not commit.
fn discard(pending: &[Pending]) {
    for p in pending {
        let _ = std::fs::remove_file(&p.tmp);
    }
}

/// The directory `path` is in (`.` for a bare file name).
fn parent(path: &Path) -> &Path {
    path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_atomically_and_cleans_up_after_failure() {
        let dir = std::env::temp_dir().join(format!("flotilla-atomic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.safetensors");
        write_atomic(&path, |tmp| std::fs::write(tmp, b"first")).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        // A failed write leaves the old file in place and no temporary behind.
        let e = write_atomic(&path, |tmp| {
            std::fs::write(tmp, b"half")?;
            Err(io::Error::other("disk full"))
        })
        .unwrap_err();
        assert!(e.to_string().contains("disk full"));
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "only the target file remains");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn same(e: io::Error) -> io::Error {
        e
    }

    /// A fresh directory with `n` member directories, each with `file` holding "old".
    fn members(name: &str, n: usize) -> (PathBuf, Vec<PathBuf>) {
        let dir = std::env::temp_dir().join(format!("flotilla-together-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let files: Vec<PathBuf> = (0..n).map(|k| dir.join(format!("{k:03}")).join("checkpoint.safetensors")).collect();
        for f in &files {
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(f, b"old").unwrap();
        }
        (dir, files)
    }

    /// Every member directory holds only its one file.
    fn only_targets(files: &[PathBuf]) -> bool {
        files.iter().all(|f| std::fs::read_dir(f.parent().unwrap()).unwrap().count() == 1)
    }

    #[test]
    fn together_replaces_every_file_when_the_scope_ends() {
        let (dir, files) = members("commit", 70);
        let written = together(
            || {
                for (k, f) in files.iter().enumerate() {
                    save_file(f, |tmp| std::fs::write(tmp, format!("new {k}")))?;
                    // Nested scopes are part of the outer one.
                    together(|| save_file(f, |tmp| std::fs::write(tmp, format!("new {k}"))), same)?;
                }
                // Nothing is replaced before the scope ends, but for what write_atomic writes, at once.
                assert!(files.iter().all(|f| std::fs::read(f).unwrap() == b"old"));
                let other = files[0].with_file_name("metrics.csv");
                write_atomic(&other, |tmp| std::fs::write(tmp, b"read back"))?;
                assert_eq!(std::fs::read(&other)?, b"read back");
                std::fs::remove_file(&other)?;
                Ok::<_, io::Error>(files.len())
            },
            same,
        )
        .unwrap();
        assert_eq!(written, 70);
        for (k, f) in files.iter().enumerate() {
            assert_eq!(std::fs::read_to_string(f).unwrap(), format!("new {k}"));
        }
        assert!(only_targets(&files), "no temporary file is left");
        // Outside a scope, saves are immediate again.
        save_file(&files[0], |tmp| std::fs::write(tmp, b"now")).unwrap();
        assert_eq!(std::fs::read(&files[0]).unwrap(), b"now");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Run `f` in a scope that must fail; every file of `kept` must still hold "old", with no temporary beside
    /// it. Returns the error's message.
    fn failed_scope(kept: &[PathBuf], f: impl FnOnce() -> io::Result<()>) -> String {
        let e = together(f, same).unwrap_err();
        assert!(kept.iter().all(|f| std::fs::read(f).unwrap() == b"old"));
        assert!(only_targets(kept));
        e.to_string()
    }

    #[test]
    fn a_failed_scope_keeps_every_old_file_and_leaves_no_temporaries() {
        let (dir, files) = members("fail", 5);
        let save_all = || files.iter().try_for_each(|f| save_file(f, |tmp| std::fs::write(tmp, b"new")));
        let e = failed_scope(&files, || {
            save_all()?;
            Err(io::Error::other("member 3 could not checkpoint"))
        });
        assert!(e.contains("member 3"));
        // A write that fails inside a scope fails at once, naming its error, and the scope then fails whole.
        let e = failed_scope(&files, || {
            save_file(&files[0], |tmp| std::fs::write(tmp, b"new"))?;
            save_file(&files[1], |_| Err(io::Error::other("disk full")))
        });
        assert!(e.contains("disk full"));
        // A file lost before the end (its directory removed) fails the commit, naming it; no other target
        // is replaced and no temporary is left.
        let others: Vec<PathBuf> = files.iter().enumerate().filter(|(k, _)| *k != 2).map(|(_, f)| f.clone()).collect();
        let e = failed_scope(&others, || {
            save_all()?;
            std::fs::remove_dir_all(files[2].parent().unwrap())
        });
        assert!(e.contains("002"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
