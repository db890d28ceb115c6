//! Saving and loading a `VarStore` as safetensors, atomically.
//!
//! A save writes a temporary file beside the target, fsyncs it, renames it over the target and fsyncs the
//! directory, so a crash mid-save leaves either the old file or the new one, never a torn one.
use std::fs::File;
use std::path::Path;

use tch::nn::VarStore;

use crate::{Error, Result};

/// Write every variable of `vs` to `path` (a `.safetensors` file) atomically.
pub fn save_atomic(vs: &VarStore, path: &Path) -> Result<()> {
    let err = |source| Error::Weights { action: "saving", path: path.display().to_string(), source };
    let io_err = |e: std::io::Error| err(tch::TchError::Io(e));
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| io_err(std::io::Error::other("path has no file name")))?;
    // tch picks the format from the extension, so the temporary file keeps `.safetensors`.
    let tmp = dir.join(format!(".{}.{}.tmp.safetensors", name.to_string_lossy(), std::process::id()));
    vs.save(&tmp).map_err(err)?;
    File::open(&tmp).and_then(|f| f.sync_all()).map_err(io_err)?;
    std::fs::rename(&tmp, path).map_err(io_err)?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_err)?;
    Ok(())
}

/// Load every variable of `vs` from `path`; names and shapes must match.
pub fn load(vs: &mut VarStore, path: &Path) -> Result<()> {
    vs.load(path).map_err(|source| Error::Weights { action: "loading", path: path.display().to_string(), source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    #[test]
    fn round_trip_and_no_temporary_left() {
        let dir = std::env::temp_dir().join(format!("flotilla-weights-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.safetensors");
        let vs = VarStore::new(Device::Cpu);
        let w = vs.root().var("w", &[3], tch::nn::Init::Const(1.5));
        save_atomic(&vs, &path).unwrap();
        let mut other = VarStore::new(Device::Cpu);
        let w2 = other.root().var("w", &[3], tch::nn::Init::Const(0.0));
        load(&mut other, &path).unwrap();
        assert!(w2.equal(&w));
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "only the target file remains");
        // A missing file is an error naming the path, not a panic.
        let missing = dir.join("missing.safetensors");
        let e = load(&mut other, &missing).unwrap_err().to_string();
        assert!(e.contains("missing.safetensors"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
