//! Writing files atomically: weights and checkpoints here, configs in the learner.
//!
//! The data goes to a temporary file beside the target, which is fsynced, renamed over the target, and the
//! directory fsynced, so a crash mid-save leaves either the old file or the new one, never a torn one.
use std::fs::File;
use std::io;
use std::path::Path;

/// Write `path` through `write(tmp)`, atomically. The temporary name keeps the target's extension (libtorch
/// picks the format from it); on failure it is removed and the old file is untouched.
pub fn write_atomic(path: &Path, write: impl FnOnce(&Path) -> io::Result<()>) -> io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| io::Error::other("path has no file name"))?;
    let ext = path.extension().map(|e| e.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{}.{}.tmp.{ext}", name.to_string_lossy(), std::process::id()));
    let result = write(&tmp).and_then(|_| File::open(&tmp)?.sync_all()).and_then(|_| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result?;
    File::open(dir)?.sync_all()
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
}
