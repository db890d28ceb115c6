//! A whole training state in one file: named tensors plus JSON metadata, written atomically.
//!
//! Tensors (weights, optimiser moments, target networks, replay arrays and priorities) go into a safetensors
//! file; small structured state (counters, schedule steps, RNG streams, env snapshots) goes into a JSON
//! document stored in the same file as the u8 tensor `__meta__.json`, so a checkpoint is one atomic write.
//! Names are `section.field` (`q.params`, `adam.exp_avg`, `replay.obs`, ...).
use std::path::Path;

use flotilla_core::{ObsBuf, ObsRef};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tch::{Device, Kind, Tensor};

use crate::{Error, Result};

const META: &str = "__meta__.json";

/// Named tensors and named JSON values.
#[derive(Debug, Default)]
pub struct Checkpoint {
    tensors: Vec<(String, Tensor)>,
    meta: serde_json::Map<String, serde_json::Value>,
}

fn missing(what: &str, name: &str) -> Error {
    Error::Checkpoint(format!("checkpoint has no {what} {name:?}"))
}

impl Checkpoint {
    /// An empty checkpoint.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a tensor (copied to the CPU, detached).
    pub fn put_tensor(&mut self, name: impl Into<String>, t: &Tensor) {
        self.tensors.push((name.into(), t.detach().to_device(Device::Cpu).copy()));
    }

    /// Add a slice of f32 as a 1-D tensor.
    pub fn put_f32(&mut self, name: impl Into<String>, v: &[f32]) {
        self.tensors.push((name.into(), Tensor::from_slice(v)));
    }

    /// Add observations in their own dtype (frames stay u8).
    pub fn put_obs(&mut self, name: impl Into<String>, obs: ObsRef<'_>) {
        let t = match obs {
            ObsRef::F32(v) => Tensor::from_slice(v),
            ObsRef::U8(v) => Tensor::from_slice(v),
        };
        self.tensors.push((name.into(), t));
    }

    /// Take observations [`Checkpoint::put_obs`] saved, in the dtype they were saved in.
    pub fn take_obs(&mut self, name: &str) -> Result<ObsBuf> {
        let t = self.take_tensor(name)?.flatten(0, -1);
        Ok(match t.kind() {
            Kind::Uint8 => ObsBuf::U8(Vec::<u8>::try_from(t)?),
            _ => ObsBuf::F32(Vec::<f32>::try_from(t.to_kind(Kind::Float))?),
        })
    }

    /// Add a serialisable value to the JSON metadata.
    pub fn put_meta<T: Serialize>(&mut self, name: impl Into<String>, value: &T) -> Result<()> {
        let name = name.into();
        let v = serde_json::to_value(value).map_err(|e| Error::Checkpoint(format!("encoding {name:?}: {e}")))?;
        self.meta.insert(name, v);
        Ok(())
    }

    /// Take a tensor out by name.
    pub fn take_tensor(&mut self, name: &str) -> Result<Tensor> {
        let i = self.tensors.iter().position(|(n, _)| n == name).ok_or_else(|| missing("tensor", name))?;
        Ok(self.tensors.swap_remove(i).1)
    }

    /// Copy a named tensor into `dst` (same shape), e.g. weights into a live parameter buffer. Refused, naming
    /// it, where it holds a NaN or an infinity: parameters never do (training refuses a non-finite step), so the
    /// file is damaged.
    pub fn copy_into(&mut self, name: &str, dst: &Tensor) -> Result<()> {
        let src = self.take_finite(name)?;
        if src.size() != dst.size() {
            return Err(Error::Checkpoint(format!("{name:?} has shape {:?}, expected {:?}", src.size(), dst.size())));
        }
        tch::no_grad(|| dst.shallow_clone().copy_(&src));
        Ok(())
    }

    /// Take a tensor that must be finite throughout (parameters, optimiser moments); one with a NaN or an
    /// infinity is refused by name as damaged. Not for parts where infinity means something (a prioritised
    /// replay's empty-slot minimum).
    pub fn take_finite(&mut self, name: &str) -> Result<Tensor> {
        let t = self.take_tensor(name)?;
        match crate::weights_file::not_finite(name, &t, "the checkpoint")? {
            Some(damage) => Err(Error::Checkpoint(damage)),
            None => Ok(t),
        }
    }

    /// Take a 1-D f32 tensor as a vector.
    pub fn take_f32(&mut self, name: &str) -> Result<Vec<f32>> {
        Ok(Vec::<f32>::try_from(self.take_tensor(name)?.to_kind(Kind::Float).flatten(0, -1))?)
    }

    /// Whether there is a tensor named `name` (for parts only some agents save).
    pub fn has_tensor(&self, name: &str) -> bool {
        self.tensors.iter().any(|(n, _)| n == name)
    }

    /// Whether the metadata has a value named `name` (for parts older checkpoints lack).
    pub fn has_meta(&self, name: &str) -> bool {
        self.meta.contains_key(name)
    }

    /// Read a JSON metadata value.
    pub fn meta<T: DeserializeOwned>(&self, name: &str) -> Result<T> {
        let v = self.meta.get(name).ok_or_else(|| missing("value", name))?;
        serde_json::from_value(v.clone()).map_err(|e| Error::Checkpoint(format!("decoding {name:?}: {e}")))
    }

    /// Write to `path` (a `.safetensors` file) atomically.
    pub fn save(&self, path: &Path) -> Result<()> {
        let json = serde_json::to_vec(&self.meta).map_err(|e| Error::Checkpoint(format!("encoding metadata: {e}")))?;
        let meta = Tensor::from_slice(&json);
        let mut named: Vec<(&str, &Tensor)> = self.tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        named.push((META, &meta));
        crate::atomic_write::save_file(path, |tmp| {
            Tensor::write_safetensors(&named, tmp).map_err(std::io::Error::other)
        })
        .map_err(|e| Error::Checkpoint(format!("saving {}: {e}", path.display())))
    }

    /// Read a checkpoint written by [`Checkpoint::save`].
    pub fn load(path: &Path) -> Result<Self> {
        let fail = |e: String| Error::Checkpoint(format!("loading {}: {e}", path.display()));
        let mut tensors = Tensor::read_safetensors(path).map_err(|e| fail(e.to_string()))?;
        let i = tensors.iter().position(|(n, _)| n == META).ok_or_else(|| fail("no metadata".into()))?;
        let bytes = Vec::<u8>::try_from(tensors.swap_remove(i).1).map_err(|e| fail(e.to_string()))?;
        let meta = serde_json::from_slice(&bytes).map_err(|e| fail(e.to_string()))?;
        Ok(Checkpoint { tensors, meta })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngCore, SeedableRng};
    use rand_pcg::Pcg64;

    #[test]
    fn round_trip_tensors_meta_and_rng_streams() {
        let path = std::env::temp_dir().join(format!("flotilla-ckpt-{}.safetensors", std::process::id()));
        let mut rng = Pcg64::seed_from_u64(3);
        rng.next_u64();
        let mut c = Checkpoint::new();
        c.put_f32("a.x", &[1.0, 2.5]);
        c.put_tensor("b.u8", &Tensor::from_slice(&[7u8, 8]));
        c.put_meta("steps", &42u64).unwrap();
        c.put_meta("rng", &rng).unwrap();
        c.save(&path).unwrap();
        let mut d = Checkpoint::load(&path).unwrap();
        assert_eq!(d.take_f32("a.x").unwrap(), vec![1.0, 2.5]);
        assert_eq!(Vec::<u8>::try_from(d.take_tensor("b.u8").unwrap()).unwrap(), vec![7, 8]);
        assert_eq!(d.meta::<u64>("steps").unwrap(), 42);
        let mut back: Pcg64 = d.meta("rng").unwrap();
        assert_eq!(back.next_u64(), rng.next_u64(), "the RNG stream continues where it was");
        let e = d.take_tensor("nope").unwrap_err().to_string();
        assert!(e.contains("nope"), "{e}");
        std::fs::remove_file(&path).unwrap();
    }

    /// Parameters and optimiser state with a NaN or an infinity (a damaged file) are refused by name before
    /// anything is copied; finite ones load, and other parts may hold infinity.
    #[test]
    fn a_non_finite_parameter_is_refused_by_name() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut c = Checkpoint::new();
            c.put_f32("q.online", &[1.0, bad, 3.0]);
            c.put_f32("q.target", &[1.0, 2.0, 3.0]);
            c.put_f32("replay.min", &[f32::INFINITY]);
            let dst = Tensor::zeros([3], (Kind::Float, Device::Cpu));
            let e = c.copy_into("q.online", &dst).unwrap_err().to_string();
            assert!(e.contains("\"q.online\"") && e.contains("damaged"), "{e}");
            assert_eq!(Vec::<f32>::try_from(&dst).unwrap(), vec![0.0; 3], "nothing copied");
            c.copy_into("q.target", &dst).unwrap();
            assert_eq!(Vec::<f32>::try_from(&dst).unwrap(), vec![1.0, 2.0, 3.0]);
            assert_eq!(c.take_f32("replay.min").unwrap(), vec![f32::INFINITY]);
        }
    }
}
