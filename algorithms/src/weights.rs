//! Writing weight files atomically.
//!
//! A save writes a temporary file beside the target, fsyncs it, renames it over the target and fsyncs the
//! directory, so a crash mid-save leaves either the old file or the new one, never a torn one.
use std::fs::File;
use std::path::Path;

use crate::{Error, Result};

/// Write `path` through `write(tmp)`, atomically. The temporary name keeps the target's extension, since
/// libtorch picks the format from it.
pub fn write_atomic(path: &Path, write: impl FnOnce(&Path) -> std::result::Result<(), tch::TchError>) -> Result<()> {
    let err = |source| Error::Weights { action: "saving", path: path.display().to_string(), source };
    let io_err = |e: std::io::Error| err(tch::TchError::Io(e));
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| io_err(std::io::Error::other("path has no file name")))?;
    let ext = path.extension().map(|e| e.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{}.{}.tmp.{ext}", name.to_string_lossy(), std::process::id()));
    write(&tmp).map_err(err)?;
    File::open(&tmp).and_then(|f| f.sync_all()).map_err(io_err)?;
    std::fs::rename(&tmp, path).map_err(io_err)?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Tensor;

    #[test]
    fn writes_atomically_and_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("flotilla-weights-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.safetensors");
        let t = Tensor::from_slice(&[1.5f32, 2.5]);
        write_atomic(&path, |tmp| Tensor::write_safetensors(&[("w", &t)], tmp)).unwrap();
        let back = Tensor::read_safetensors(&path).unwrap();
        assert_eq!(back[0].0, "w");
        assert!(back[0].1.equal(&t));
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "only the target file remains");
        // A failed write leaves the old file in place and reports the path.
        let e = write_atomic(&path, |_| Err(tch::TchError::FileFormat("disk full".into()))).unwrap_err().to_string();
        assert!(e.contains("model.safetensors") && e.contains("disk full"), "{e}");
        assert!(Tensor::read_safetensors(&path).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
