//! Safetensors files of f32 weights with metadata: written atomically with a canonical header (the same weights
//! always give the same bytes), and read back.
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde_json::Value;
use tch::{Kind, Tensor};

use crate::{Error, Result};

/// Write f32 tensors and `metadata` to a safetensors file, atomically (temporary file, fsync, rename).
///
/// Through the `safetensors` crate (tch's writer takes no metadata), whose `HashMap` header is rewritten with
/// its keys sorted (same length), so the same weights always give the same bytes (resume compares them).
pub fn write_safetensors<S: AsRef<str>>(
    path: &Path,
    tensors: &[(S, Tensor)],
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let error = |source| Error::Weights { action: "saving", path: path.display().to_string(), source };
    let fail = |e: String| error(tch::TchError::FileFormat(e));
    let mut data = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let t = t.detach().to_device(tch::Device::Cpu).contiguous();
        if t.kind() != Kind::Float {
            return Err(fail(format!("tensor {:?} is {:?}; only f32 is written", name.as_ref(), t.kind())));
        }
        let values = Vec::<f32>::try_from(t.flatten(0, -1))?;
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let shape: Vec<usize> = t.size().iter().map(|&d| d as usize).collect();
        data.push((name.as_ref().to_string(), shape, bytes));
    }
    let views = data
        .iter()
        .map(|(name, shape, bytes)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                .map(|v| (name.as_str(), v))
                .map_err(|e| fail(format!("tensor {name:?}: {e:?}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let info: Option<HashMap<String, String>> =
        (!metadata.is_empty()).then(|| metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect());
    let mut bytes = safetensors::serialize(views, &info).map_err(|e| fail(format!("{e:?}")))?;
    sort_header(&mut bytes).map_err(fail)?;
    crate::atomic_write::save_file(path, |tmp| std::fs::write(tmp, &bytes)).map_err(|e| error(tch::TchError::Io(e)))
}

/// Rewrite a serialised safetensors header with its keys (and its metadata's keys) in sorted order, in place.
fn sort_header(bytes: &mut [u8]) -> std::result::Result<(), String> {
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header = &bytes[8..8 + n];
    let mut top: BTreeMap<String, Value> = serde_json::from_slice(header).map_err(|e| e.to_string())?;
    if let Some(meta) = top.get_mut("__metadata__") {
        let sorted: BTreeMap<String, String> = serde_json::from_value(meta.take()).map_err(|e| e.to_string())?;
        *meta = serde_json::to_value(sorted).map_err(|e| e.to_string())?;
    }
    let mut canon = serde_json::to_vec(&top).map_err(|e| e.to_string())?;
    if canon.len() > n {
        return Err(format!("sorted header is {} bytes, the crate's {n}", canon.len()));
    }
    canon.resize(n, b' ');
    bytes[8..8 + n].copy_from_slice(&canon);
    Ok(())
}

/// Where a floating-point tensor read from disk holds a NaN or an infinity, the message saying so, naming it and
/// calling `what` (`"the file"`, `"the checkpoint"`) damaged: saved parameters and optimiser moments never hold
/// one, as training refuses a non-finite step. The one check behind [`read_safetensors`] and
/// [`crate::checkpoint::Checkpoint::take_finite`].
pub(crate) fn not_finite(name: &str, tensor: &Tensor, what: &str) -> Result<Option<String>> {
    Ok((tensor.is_floating_point() && !bool::try_from(tensor.isfinite().all())?).then(|| {
        format!("{name:?} holds a NaN or infinite value: {what} is damaged (training never takes a non-finite step)")
    }))
}

/// A safetensors file's named tensors, in the file's order, and its metadata.
pub type NamedTensors = (Vec<(String, Tensor)>, BTreeMap<String, String>);

/// Every tensor of a safetensors file (f32 as written by [`write_safetensors`] or tch) and its metadata (empty
/// when it has none). A tensor holding a NaN or an infinity is an error naming it: weights never hold one (a
/// non-finite step is never taken), so the file is damaged.
pub fn read_safetensors(path: &Path) -> Result<NamedTensors> {
    let fail = |source| Error::Weights { action: "loading", path: path.display().to_string(), source };
    let bytes = std::fs::read(path).map_err(|e| fail(tch::TchError::Io(e)))?;
    let wrap = |err| fail(tch::TchError::SafeTensorError { path: path.display().to_string(), err });
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).map_err(wrap)?;
    let metadata: BTreeMap<String, String> = header.metadata().clone().unwrap_or_default().into_iter().collect();
    let file = safetensors::SafeTensors::deserialize(&bytes).map_err(wrap)?;
    let mut tensors = Vec::new();
    for (name, view) in file.tensors() {
        if view.dtype() != safetensors::Dtype::F32 {
            return Err(fail(tch::TchError::FileFormat(format!("tensor {name:?} is {:?}, not F32", view.dtype()))));
        }
        let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
        let tensor = Tensor::f_from_data_size(view.data(), &shape, Kind::Float)?;
        if let Some(damage) = not_finite(&name, &tensor, "the file")? {
            return Err(fail(tch::TchError::FileFormat(format!("tensor {damage}"))));
        }
        tensors.push((name, tensor));
    }
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((tensors, metadata))
}
