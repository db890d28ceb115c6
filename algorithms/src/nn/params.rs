//! All of a model's parameters in one contiguous tensor, seen through named views.
//!
//! Small RL networks are dispatch-bound (a few microseconds per libtorch op whatever the size): one flat leaf
//! tensor makes clipping the global gradient norm and an Adam step a handful of ops ([`crate::nn::optimiser`])
//! and broadcasting the weights one buffer copy. The views are made once, with gradient tracking on; updates
//! write the flat tensor in place under `no_grad`.
use std::path::Path;

use tch::{Device, Kind, Tensor};

use crate::{Error, Result};

/// One named parameter inside the flat buffer.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    name: String,
    shape: Vec<i64>,
    offset: i64,
    numel: i64,
}

/// A flat f32 parameter buffer with named, shaped views.
#[derive(Debug)]
pub struct FlatParams {
    flat: Tensor,
    entries: Vec<Entry>,
    views: Vec<Tensor>,
    /// Slices of `flat.grad()`, one per view (empty for buffers that take no gradient).
    grad_views: Vec<Tensor>,
    /// Per view: frozen (its gradient is always zero, so no optimiser ever moves it).
    frozen: Vec<bool>,
    /// The trainable scalars as `(offset, len)` runs of the buffer: every entry not frozen, neighbours merged
    /// (one run covering the whole buffer while nothing is frozen).
    runs: Vec<(i64, i64)>,
    /// What [`FlatParams::save`] writes into the file's `__metadata__` (the architecture: [`crate::export`]).
    metadata: std::collections::BTreeMap<String, String>,
    /// A bf16 copy of the buffer for updates that run layers in bf16 ([`FlatParams::refresh_bf16`]).
    bf16: Option<Bf16Copy>,
    /// How often the buffer was lent out for writing on the host ([`FlatParams::host_values_mut`]), which
    /// libtorch's version counter does not see ([`FlatParams::generation`]).
    host_writes: u64,
}

/// A bf16 copy of a [`FlatParams`] buffer seen through the same views, a leaf of its own: a bf16 forward pass
/// reads it instead of casting each weight at each use (as PyTorch's CPU autocast does), and
/// [`FlatParams::backward`] writes its gradients into the f32 gradient buffer: the same numbers, one cast per refresh.
#[derive(Debug)]
struct Bf16Copy {
    flat: Tensor,
    views: Vec<Tensor>,
}

impl FlatParams {
    /// Gather `named` initial values (in order) into one buffer on `device`.
    pub fn new(named: Vec<(String, Tensor)>, device: Device) -> Self {
        let mut entries = Vec::with_capacity(named.len());
        let mut offset = 0;
        for (name, t) in &named {
            let numel = t.numel() as i64;
            entries.push(Entry { name: name.clone(), shape: t.size(), offset, numel });
            offset += numel;
        }
        let parts: Vec<Tensor> = named.iter().map(|(_, t)| t.detach().to_kind(Kind::Float).flatten(0, -1)).collect();
        let flat = Tensor::cat(&parts, 0).to_device(device).set_requires_grad(true);
        let views = entries.iter().map(|e| flat.narrow(0, e.offset, e.numel).view(e.shape.as_slice())).collect();
        // One backward through the leaf itself allocates its `.grad()` (zeros); the slices alias it for good.
        (&flat * 0.0).sum(Kind::Float).backward();
        let grad = flat.grad();
        let grad_views = entries.iter().map(|e| grad.narrow(0, e.offset, e.numel).view(e.shape.as_slice())).collect();
        let frozen = vec![false; entries.len()];
        let runs = vec![(0, offset)];
        let metadata = Default::default();
        FlatParams { flat, entries, views, grad_views, frozen, runs, metadata, bf16: None, host_writes: 0 }
    }

    /// Set the gradient buffer to `∂loss/∂θ`, overwriting it (no `zero_grad` needed): the views' own gradients
    /// copied into their slices, one pass (`loss.backward()` would sum a buffer-sized gradient per view).
    pub fn backward(&mut self, loss: &Tensor) {
        self.backward_into(loss, false)
    }

    /// [`FlatParams::backward`], or with `add` adding `∂loss/∂θ` to the gradient buffer (gradient accumulation
    /// over micro-batches).
    pub(crate) fn backward_into(&mut self, loss: &Tensor, add: bool) {
        let grads = match &self.bf16 {
            None => Tensor::run_backward(&[loss], &self.views, false, false),
            Some(copy) => {
                let inputs: Vec<&Tensor> = self.views.iter().chain(&copy.views).collect();
                let mut grads = Tensor::run_backward(&[loss], &inputs, false, false);
                // A parameter's gradient through its bf16 view, if the loss reached it there (in f32 when
                // it reached both views).
                let low = grads.split_off(self.views.len());
                for (g, l) in grads.iter_mut().zip(low) {
                    if l.defined() {
                        *g = if g.defined() { &*g + l.to_kind(Kind::Float) } else { l };
                    }
                }
                grads
            }
        };
        tch::no_grad(|| {
            for ((dst, g), frozen) in self.grad_views.iter().zip(&grads).zip(&self.frozen) {
                let mut dst = dst.shallow_clone();
                // A parameter the loss does not reach (e.g. a padding column) gets zero (adds nothing); a
                // frozen one always holds zero.
                match (g.defined() && !frozen, add) {
                    (true, false) => dst.copy_(g),
                    (true, true) => {
                        let _ = dst.g_add_(g);
                    }
                    (false, false) => {
                        let _ = dst.zero_();
                    }
                    (false, true) => {}
                }
            }
        });
    }

    /// The view of parameter `i` (in the order given to [`FlatParams::new`]).
    pub fn view(&self, i: usize) -> &Tensor {
        &self.views[i]
    }

    /// Parameter `i` in bf16 where `bf16` and a bf16 copy exists ([`FlatParams::refresh_bf16`]), else its f32
    /// view.
    pub(crate) fn view_in(&self, i: usize, bf16: bool) -> &Tensor {
        match &self.bf16 {
            Some(copy) if bf16 => &copy.views[i],
            _ => &self.views[i],
        }
    }

    /// Make or bring up to date the bf16 copy that [`FlatParams::view_in`] reads (one cast of the buffer): an
    /// update calls this right before the forward passes that read it.
    pub(crate) fn refresh_bf16(&mut self) {
        match &mut self.bf16 {
            Some(copy) => tch::no_grad(|| {
                copy.flat.copy_(&self.flat);
            }),
            None => {
                let flat = self.flat.detach().to_kind(Kind::BFloat16).set_requires_grad(self.flat.requires_grad());
                let views =
                    self.entries.iter().map(|e| flat.narrow(0, e.offset, e.numel).view(e.shape.as_slice())).collect();
                self.bf16 = Some(Bf16Copy { flat, views });
            }
        }
    }

    /// The flat leaf tensor.
    pub fn flat(&self) -> &Tensor {
        &self.flat
    }

    /// Move the buffer into `row` (a `[P]` f32 tensor on the same device, e.g. a row of a population's stack,
    /// `nn::members::shared_rows`): the values (and the gradient buffer's) copied there, then the flat leaf,
    /// its views and gradient slices remade over it; the old buffer is dropped. The buffer stays a leaf of its
    /// own, with its own gradient; what writes `row` in place writes these parameters.
    pub(crate) fn move_into(&mut self, row: &Tensor) {
        assert_eq!(row.size(), self.flat.size(), "a row of the buffer's size");
        tch::no_grad(|| row.shallow_clone().copy_(&self.flat));
        let old_grad = self.flat.grad();
        let flat = row.detach().set_requires_grad(self.flat.requires_grad());
        self.views = self.entries.iter().map(|e| flat.narrow(0, e.offset, e.numel).view(e.shape.as_slice())).collect();
        if !self.grad_views.is_empty() {
            // As in `new`: one backward through the leaf allocates its gradient, which the slices alias.
            (&flat * 0.0).sum(Kind::Float).backward();
            let grad = flat.grad();
            if old_grad.defined() {
                tch::no_grad(|| grad.shallow_clone().copy_(&old_grad));
            }
            self.grad_views =
                self.entries.iter().map(|e| grad.narrow(0, e.offset, e.numel).view(e.shape.as_slice())).collect();
        }
        self.flat = flat;
        // A new buffer: whatever kept a stack of the old one sees it by its address; count a write as well.
        self.host_writes += 1;
    }

    /// The buffer's values as a slice of host memory, when it is CPU f32 contiguous (else `None`). Its one
    /// rule: nothing may write the buffer while the slice is alive (callers drop it within a `&self` method).
    pub(crate) fn host_values(&self) -> Option<&[f32]> {
        if self.flat.device() != Device::Cpu || self.flat.kind() != Kind::Float || !self.flat.is_contiguous() {
            return None;
        }
        let n = self.flat.numel();
        // SAFETY: `flat` is a contiguous f32 CPU tensor of `n` elements (checked above), owned by `self`, so
        // its storage outlives the returned borrow; libtorch never reallocates it (updates are in place).
        // Within this crate no write to it happens while a returned slice is alive (see above), and the
        // tensor is not shared with another thread.
        Some(unsafe { std::slice::from_raw_parts(self.flat.data_ptr() as *const f32, n) })
    }

    /// The buffer's values as a mutable host slice (CPU, f32, contiguous; else `None`), for the fused CPU
    /// training step; the `&mut self` borrow keeps every other reader out while the slice is alive.
    pub(crate) fn host_values_mut(&mut self) -> Option<&mut [f32]> {
        let n = self.host_values()?.len();
        self.host_writes += 1;
        // SAFETY: as `host_values`, and the exclusive borrow of `self` makes this the only live slice.
        Some(unsafe { std::slice::from_raw_parts_mut(self.flat.data_ptr() as *mut f32, n) })
    }

    /// Changes whenever the buffer's values may have: libtorch's version counter of the buffer (bumped by every
    /// in-place op on it or a view of it) and the host writes libtorch does not see. Equal generations of
    /// one buffer mean equal values.
    pub(crate) fn generation(&self) -> (i64, u64) {
        (self.flat.internal_version(), self.host_writes)
    }

    /// The buffer's values (mutable) and its gradient as host slices, for an optimiser step as one host loop:
    /// both CPU f32 contiguous, a gradient from a backward pass, nothing frozen; else `None`.
    pub(crate) fn host_values_and_grad_mut(&mut self) -> Option<(&mut [f32], &[f32])> {
        let grad = self.flat.grad();
        let host = |t: &Tensor| t.device() == Device::Cpu && t.kind() == Kind::Float && t.is_contiguous();
        if self.has_frozen() || !grad.defined() || !host(&grad) || grad.numel() != self.flat.numel() {
            return None;
        }
        let n = grad.numel();
        // SAFETY: the gradient is a contiguous f32 CPU tensor of `n` elements (checked above), held by the flat
        // leaf `self` owns; it is neither replaced nor written while the `&mut self` borrow lasts, and it is a
        // buffer of its own, not the values'.
        let grad = unsafe { std::slice::from_raw_parts(grad.data_ptr() as *const f32, n) };
        Some((self.host_values_mut()?, grad))
    }

    /// [`FlatParams::polyak_from`] as one host loop, `θ ← θ + τ(θ_source − θ)`, where both buffers live on the
    /// CPU (false, changing nothing, where they do not).
    pub(crate) fn polyak_from_host(&mut self, source: &FlatParams, tau: f64) -> bool {
        let (Some(from), Some(to)) = (source.host_values(), self.host_values_mut()) else {
            return false;
        };
        if from.len() != to.len() {
            return false;
        }
        let tau = tau as f32;
        to.iter_mut().zip(from).for_each(|(t, &s)| *t += tau * (s - *t));
        true
    }

    /// Where parameter `i` starts in the flat buffer.
    pub(crate) fn offset(&self, i: usize) -> usize {
        self.entries[i].offset as usize
    }

    /// Total number of scalars.
    pub fn numel(&self) -> i64 {
        self.flat.numel() as i64
    }

    /// Parameter names in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.name.as_str())
    }

    /// The layers: parameter names without their last component (`pi_vf.0.weight` → `pi_vf.0`), in order.
    pub fn layers(&self) -> Vec<&str> {
        let mut layers: Vec<&str> = Vec::new();
        for e in &self.entries {
            let layer = e.name.rsplit_once('.').map_or(e.name.as_str(), |(layer, _)| layer);
            if !layers.contains(&layer) {
                layers.push(layer);
            }
        }
        layers
    }

    /// The parameters `layer` names: its own name, or every parameter under `layer.` (a layer or a prefix of
    /// layers). Error (listing the layers) when it names none.
    fn select(&self, what: &str, layer: &str) -> Result<Vec<usize>> {
        let picked: Vec<usize> = (0..self.entries.len())
            .filter(|&i| {
                let name = &self.entries[i].name;
                name == layer || name.strip_prefix(layer).is_some_and(|rest| rest.starts_with('.'))
            })
            .collect();
        if picked.is_empty() {
            return Err(Error::Init(format!(
                "{what}: no layer {layer:?} in this network; its layers are {:?}",
                self.layers()
            )));
        }
        Ok(picked)
    }

    /// Start from `source` (named tensors, e.g. a run's `model.safetensors`): every parameter is copied from
    /// the source tensor of the same name, except those under a `reinit` layer, which keep their fresh
    /// initialisation. A parameter the source lacks, or whose shape differs, is an error naming it and both
    /// shapes (unless reinitialised). `what` names the source in errors. Returns how many were copied.
    pub fn init_from(&mut self, what: &str, source: &[(String, Tensor)], reinit: &[String]) -> Result<usize> {
        let mut fresh = vec![false; self.entries.len()];
        for layer in reinit {
            for i in self.select(what, layer)? {
                fresh[i] = true;
            }
        }
        let mut copied = 0;
        for (i, e) in self.entries.iter().enumerate() {
            if fresh[i] {
                continue;
            }
            let bad = |detail: String| Error::Init(format!("{what}: {detail}"));
            let Some((_, t)) = source.iter().find(|(name, _)| *name == e.name) else {
                let names: Vec<&str> = source.iter().map(|(n, _)| n.as_str()).collect();
                return Err(bad(format!(
                    "has no {} (shape {:?}); it holds {names:?}: reinitialise that layer (reinit) or start from a \
                     run of the same network",
                    e.name, e.shape
                )));
            };
            if t.size() != e.shape {
                return Err(bad(format!(
                    "{} has shape {:?} there and {:?} here: list its layer in reinit to start it afresh",
                    e.name,
                    t.size(),
                    e.shape
                )));
            }
            let value = t.to_kind(Kind::Float).to_device(self.flat.device());
            tch::no_grad(|| self.views[i].shallow_clone().copy_(&value));
            copied += 1;
        }
        Ok(copied)
    }

    /// Keep the parameters under `layers` fixed: their gradient is zero from now on (after every backward
    /// pass), so clipping ignores them and Adam and RMSprop never move them. Returns how many scalars are frozen.
    pub fn freeze(&mut self, what: &str, layers: &[String]) -> Result<i64> {
        for layer in layers {
            for i in self.select(what, layer)? {
                self.frozen[i] = true;
            }
        }
        self.zero_frozen_grads();
        self.runs.clear();
        for (e, _) in self.entries.iter().zip(&self.frozen).filter(|(_, f)| !**f) {
            match self.runs.last_mut() {
                Some((offset, len)) if *offset + *len == e.offset => *len += e.numel,
                _ => self.runs.push((e.offset, e.numel)),
            }
        }
        Ok(self.numel() - self.trainable_numel())
    }

    /// How many scalars train (all but the frozen ones): the size of an optimiser's state and of a gradient
    /// on the wire ([`FlatParams::trainable_grad`]).
    pub fn trainable_numel(&self) -> i64 {
        self.runs.iter().map(|(_, len)| len).sum()
    }

    /// Optimiser state `name` from checkpoint `c` for these parameters' trainable scalars, as an optimiser
    /// that has taken `steps` steps saved it: zeros when it took none (it may have been saved before layers
    /// were frozen), else the saved tensor, which must hold one value per trainable scalar.
    pub(crate) fn take_optimiser_state(
        &self,
        c: &mut crate::checkpoint::Checkpoint,
        name: &str,
        steps: u64,
    ) -> Result<Tensor> {
        let saved = c.take_finite(name)?;
        if steps == 0 {
            return Ok(self.trainable_grad().zeros_like().detach());
        }
        let n = self.trainable_numel();
        if saved.size() != [n] {
            return Err(Error::length(
                format!("checkpoint {name} (optimiser state of the trainable parameters)"),
                saved.numel(),
                n as usize,
            ));
        }
        Ok(saved.to_kind(Kind::Float).to_device(self.flat.device()))
    }

    /// Whether any layer is frozen.
    pub fn has_frozen(&self) -> bool {
        self.runs.len() != 1 || self.runs[0] != (0, self.numel())
    }

    /// The gradient of the trainable parameters, packed: the gradient buffer itself (aliased, no copy) while
    /// nothing is frozen, else the trainable runs concatenated ([`FlatParams::trainable_numel`] scalars) —
    /// what optimisers keep state for and what goes on the wire, so frozen layers cost neither.
    pub fn trainable_grad(&self) -> Tensor {
        self.pack(&self.flat.grad())
    }

    /// Write a packed trainable gradient (as [`FlatParams::trainable_grad`] returns) back into the gradient
    /// buffer; frozen layers' gradients stay zero.
    pub fn set_trainable_grad(&mut self, packed: &Tensor) -> Result<()> {
        let grad = self.flat.grad();
        if !self.has_frozen() && packed.size() == grad.size() && packed.data_ptr() == grad.data_ptr() {
            return Ok(()); // the buffer itself, as `trainable_grad` handed it out
        }
        self.unpack(&grad, packed, "a packed gradient", |dst, src| {
            dst.copy_(src);
        })
    }

    /// Add a packed step (one value per trainable scalar) to the parameters: how an optimiser that keeps state
    /// for the trainable scalars only moves them.
    pub fn add_to_trainable(&mut self, packed: &Tensor) -> Result<()> {
        let flat = self.flat.shallow_clone();
        self.unpack(&flat, packed, "a packed update", |dst, src| {
            let _ = dst.g_add_(src);
        })
    }

    /// The trainable runs of `full` (a buffer-sized tensor), concatenated; `full` itself while nothing is frozen.
    fn pack(&self, full: &Tensor) -> Tensor {
        if !self.has_frozen() {
            return full.shallow_clone();
        }
        let parts: Vec<Tensor> = self.runs.iter().map(|&(offset, len)| full.narrow(0, offset, len)).collect();
        Tensor::cat(&parts, 0)
    }

    /// Apply `write(run of full, run of packed)` to every trainable run, under `no_grad`.
    fn unpack(&self, full: &Tensor, packed: &Tensor, what: &str, write: impl Fn(&mut Tensor, &Tensor)) -> Result<()> {
        let n = self.trainable_numel();
        if packed.size() != [n] {
            return Err(Error::length(what, packed.numel(), n as usize));
        }
        tch::no_grad(|| {
            let mut at = 0;
            for &(offset, len) in &self.runs {
                write(&mut full.narrow(0, offset, len), &packed.narrow(0, at, len));
                at += len;
            }
        });
        Ok(())
    }

    /// Zero the frozen parameters' gradients.
    fn zero_frozen_grads(&mut self) {
        tch::no_grad(|| {
            for (g, _) in self.grad_views.iter().zip(&self.frozen).filter(|(_, f)| **f) {
                let _ = g.shallow_clone().zero_();
            }
        });
    }

    /// Scale the gradient so its global L2 norm is at most `max_norm` (as `torch.nn.utils.clip_grad_norm_`,
    /// with its 1e-6 guard). Returns the norm before clipping.
    pub fn clip_grad_norm(&mut self, max_norm: f64) -> f64 {
        let mut g = self.flat.grad();
        if !g.defined() {
            return 0.0;
        }
        let norm = tch::no_grad(|| f64::try_from(g.norm()).unwrap_or(f64::NAN));
        let coef = max_norm / (norm + 1e-6);
        if coef < 1.0 {
            let _ = tch::no_grad(|| g.g_mul_scalar_(coef));
        }
        norm
    }

    /// Overwrite all values from another buffer of the same layout (e.g. a target network or a broadcast).
    pub fn copy_from(&mut self, values: &Tensor) -> Result<()> {
        if values.size() != self.flat.size() {
            return Err(Error::length("flat parameters", values.numel(), self.flat.numel()));
        }
        tch::no_grad(|| self.flat.copy_(values));
        Ok(())
    }

    /// A copy of these parameters (same names and layout) that never needs gradients: a target network.
    pub fn target_copy(&self) -> FlatParams {
        let named = self.entries.iter().zip(&self.views).map(|(e, v)| (e.name.clone(), v.detach().copy())).collect();
        let mut t = FlatParams::new(named, self.flat.device());
        t.flat = t.flat.detach();
        t.views = t.entries.iter().map(|e| t.flat.narrow(0, e.offset, e.numel).view(e.shape.as_slice())).collect();
        t.grad_views.clear();
        t
    }

    /// Polyak averaging towards `source`: `θ ← (1 − τ) θ + τ θ_source` (τ = 1 copies). One op for the whole
    /// network.
    pub fn polyak_from(&mut self, source: &FlatParams, tau: f64) {
        tch::no_grad(|| {
            if tau >= 1.0 {
                self.flat.copy_(source.flat());
            } else {
                let _ = self.flat.lerp_(source.flat(), tau);
            }
        });
    }

    /// Entries [`FlatParams::save`] writes into the file's safetensors `__metadata__` (the registry sets the
    /// architecture, [`crate::export::Architecture::to_metadata`]); none by default.
    pub fn set_metadata(&mut self, metadata: std::collections::BTreeMap<String, String>) {
        self.metadata = metadata;
    }

    /// The entries [`FlatParams::save`] writes as metadata.
    pub fn metadata(&self) -> &std::collections::BTreeMap<String, String> {
        &self.metadata
    }

    /// Write every parameter under its name, and the metadata, to a safetensors file, atomically.
    pub fn save(&self, path: &Path) -> Result<()> {
        let named: Vec<(&str, Tensor)> = self
            .entries
            .iter()
            .zip(&self.views)
            .map(|(e, v)| (e.name.as_str(), v.detach().to_device(Device::Cpu)))
            .collect();
        crate::weights_file::write_safetensors(path, &named, &self.metadata)
    }

    /// Read parameters saved by [`FlatParams::save`]; every name must be present with the same shape and finite
    /// values ([`read_safetensors`](crate::weights_file::read_safetensors)). Checked in full before any parameter
    /// changes: a file that fails leaves the parameters as they were.
    pub fn load(&mut self, path: &Path) -> Result<()> {
        let err = |source| Error::Weights { action: "loading", path: path.display().to_string(), source };
        let (stored, _) = crate::weights_file::read_safetensors(path)?;
        let mut values = Vec::with_capacity(self.entries.len());
        for e in &self.entries {
            let value = stored
                .iter()
                .find(|(n, _)| *n == e.name)
                .map(|(_, t)| t)
                .ok_or_else(|| err(tch::TchError::FileFormat(format!("parameter {:?} missing", e.name))))?;
            if value.size() != e.shape {
                return Err(err(tch::TchError::Shape(format!(
                    "parameter {:?} has shape {:?}, the model expects {:?}",
                    e.name,
                    value.size(),
                    e.shape
                ))));
            }
            values.push(value);
        }
        for (view, value) in self.views.iter().zip(values) {
            tch::no_grad(|| view.shallow_clone().copy_(value));
        }
        Ok(())
    }
}

#[cfg(test)]
/// Test check: `a`'s values within `rel` × (`b`'s largest magnitude) of `b`'s, scalar by scalar (a fused step
/// against the libtorch step it replaces). Returns `a`'s values.
pub(crate) fn assert_params_close(what: &str, a: &FlatParams, b: &FlatParams, rel: f32) -> Vec<f32> {
    let (a, b): (Vec<f32>, Vec<f32>) =
        (Vec::try_from(a.flat().detach()).unwrap(), Vec::try_from(b.flat().detach()).unwrap());
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(worst <= rel * scale, "{what}: parameters differ by {worst} (scale {scale})");
    a
}

#[cfg(test)]
impl FlatParams {
    /// Reset the accumulated gradient to zero (one op).
    pub(crate) fn zero_grad(&mut self) {
        let mut g = self.flat.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bf16 forward pass through the bf16 copy gives the outputs and f32 gradients that casting each weight
    /// at its use gives, bit for bit, and reads the values of the last refresh.
    #[test]
    fn the_bf16_copy_is_the_cast_at_each_use() {
        use crate::nn::nets::{Activation, FlatMlp, LayerInit};
        let (net, named) = crate::nn::nets::with_torch_seed(3, || {
            FlatMlp::init("q", 5, &[16, 16], 2, Activation::Relu, LayerInit::Torch, 0)
        });
        let mut params = FlatParams::new(named, Device::Cpu);
        let x = Tensor::randn([7, 5], (Kind::Float, Device::Cpu));
        let run = |p: &mut FlatParams| {
            let out = net.forward_in(p, &x, true);
            p.backward(&out.square().sum(Kind::Float));
            let bits = |t: &Tensor| Vec::<f32>::try_from(t.detach().flatten(0, -1)).unwrap();
            (bits(&out), bits(&p.flat().grad()))
        };
        let cast = run(&mut params);
        params.refresh_bf16();
        assert!(params.view_in(0, true).kind() == Kind::BFloat16 && params.view_in(0, false).kind() == Kind::Float);
        assert_eq!(run(&mut params), cast, "outputs and gradients through the bf16 copy");
        // After new values and a refresh, the same as a buffer of those values without a copy.
        let _ = tch::no_grad(|| params.flat().shallow_clone().g_mul_scalar_(0.5));
        params.refresh_bf16();
        let named = params.names().enumerate().map(|(i, n)| (n.to_string(), params.view(i).detach().copy())).collect();
        let fresh = run(&mut FlatParams::new(named, Device::Cpu));
        assert_ne!(fresh, cast);
        assert_eq!(run(&mut params), fresh, "a refresh brings the new values");
    }

    /// A two-layer network's parameters: `l.0.weight` [2, 3], `l.0.bias` [2], `l.1.weight` [1, 2], `l.1.bias` [1],
    /// every value `fill`.
    fn two_layers(fill: f32, out: i64) -> FlatParams {
        let t = |shape: &[i64]| Tensor::full(shape, fill as f64, (Kind::Float, Device::Cpu));
        let named = vec![
            ("l.0.weight".into(), t(&[2, 3])),
            ("l.0.bias".into(), t(&[2])),
            ("l.1.weight".into(), t(&[out, 2])),
            ("l.1.bias".into(), t(&[out])),
        ];
        FlatParams::new(named, Device::Cpu)
    }

    fn named(p: &FlatParams) -> Vec<(String, Tensor)> {
        p.names().map(String::from).zip((0..4).map(|i| p.view(i).detach().copy())).collect()
    }

    #[test]
    fn init_from_copies_all_but_reinit_layers_and_names_what_does_not_fit() {
        let source = named(&two_layers(7.0, 1));
        let mut p = two_layers(0.5, 1);
        assert_eq!(p.layers(), ["l.0", "l.1"]);
        assert_eq!(p.init_from("run A", &source, &["l.1".into()]).unwrap(), 2);
        assert!(p.view(0).equal(&source[0].1) && p.view(1).equal(&source[1].1), "l.0 copied");
        assert_eq!(p.view(2).double_value(&[0, 0]), 0.5, "l.1 kept its own initialisation");
        // Another action count: the output layer's shapes differ.
        let mut wider = two_layers(0.5, 3);
        let e = wider.init_from("run A", &source, &[]).unwrap_err().to_string();
        assert!(e.contains("run A") && e.contains("l.1.weight") && e.contains("[1, 2]") && e.contains("[3, 2]"), "{e}");
        assert_eq!(wider.init_from("run A", &source, &["l.1".into()]).unwrap(), 2, "reinit makes it fit");
        let e = p.init_from("run A", &source, &["l.7".into()]).unwrap_err().to_string();
        assert!(e.contains("no layer \"l.7\"") && e.contains("[\"l.0\", \"l.1\"]"), "{e}");
        let e = p.init_from("run B", &source[..2], &[]).unwrap_err().to_string();
        assert!(e.contains("has no l.1.weight"), "{e}");
    }

    #[test]
    fn frozen_layers_get_no_gradient_and_no_optimiser_state_so_adam_never_moves_them() {
        let mut p = two_layers(0.5, 1);
        // Adam made before freezing (as an algorithm builds its optimiser before `[init]` applies) re-sizes
        // its moments to the trainable scalars at its first step.
        let mut adam = crate::nn::optimiser::Adam::new(&p, 0.1, 1e-8);
        assert_eq!(adam.state[0].numel(), 11);
        assert_eq!(p.freeze("test", &["l.0".into()]).unwrap(), 8);
        assert_eq!((p.trainable_numel(), p.has_frozen()), (3, true));
        let before = p.flat().copy();
        for _ in 0..3 {
            let x = Tensor::ones([4, 3], (Kind::Float, Device::Cpu));
            let h = x.matmul(&p.view(0).tr()) + p.view(1);
            let loss = (h.tanh().matmul(&p.view(2).tr()) + p.view(3)).square().sum(Kind::Float);
            p.backward(&loss);
            assert_eq!(p.flat().grad().narrow(0, 0, 8).abs().sum(Kind::Float).double_value(&[]), 0.0);
            adam.step(&mut p);
            assert_eq!(adam.state[0].numel(), 3, "moments for l.1 only");
            assert_eq!(p.trainable_grad().size(), [3], "the wire carries l.1's gradient only");
        }
        assert_eq!(adam.steps(), 3);
        let moved = (p.flat() - &before).abs();
        assert_eq!(moved.narrow(0, 0, 8).sum(Kind::Float).double_value(&[]), 0.0, "l.0 stays where it was");
        assert!(moved.narrow(0, 8, 3).sum(Kind::Float).double_value(&[]) > 0.0, "l.1 trains");
        // A gradient written from elsewhere (an A3C actor's) is masked too.
        let _ = tch::no_grad(|| p.flat().grad().fill_(1.0));
        p.zero_frozen_grads();
        assert_eq!(p.flat().grad().sum(Kind::Float).double_value(&[]), 3.0);
        // A packed gradient goes back into the trainable slots only; a wrong length is refused.
        p.set_trainable_grad(&Tensor::from_slice(&[1.0f32, 2.0, 3.0])).unwrap();
        assert_eq!(Vec::<f32>::try_from(p.flat().grad()).unwrap()[7..], [0.0, 1.0, 2.0, 3.0]);
        assert!(p.set_trainable_grad(&Tensor::zeros([11], (Kind::Float, Device::Cpu))).is_err());
        // The moments round-trip through a checkpoint; a network with other frozen layers refuses them.
        let mut c = crate::checkpoint::Checkpoint::new();
        adam.write_to(&mut c, "adam").unwrap();
        let mut back = crate::nn::optimiser::Adam::new(&p, 0.1, 1e-8);
        back.read_from(&mut c, "adam", &p).unwrap();
        assert_eq!((back.steps(), back.state[0].numel()), (3, 3));
        adam.write_to(&mut c, "adam").unwrap();
        let e =
            crate::nn::optimiser::Adam::new(&p, 0.1, 1e-8).read_from(&mut c, "adam", &two_layers(0.5, 1)).unwrap_err();
        assert!(e.to_string().contains("adam.exp_avg") && e.to_string().contains("expected 11"), "{e}");
    }

    #[test]
    fn scattered_frozen_layers_pack_the_trainable_runs_in_order() {
        // l.0 trains, l.1.weight frozen, l.1.bias trains: two runs, [0, 8) and [10, 11).
        let mut p = two_layers(0.5, 1);
        p.freeze("test", &["l.1.weight".into()]).unwrap();
        assert_eq!(p.trainable_numel(), 9);
        tch::no_grad(|| p.flat().grad().copy_(&Tensor::arange(11, (Kind::Float, Device::Cpu))));
        let packed: Vec<f32> = Vec::try_from(p.trainable_grad()).unwrap();
        assert_eq!(packed, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 10.0]);
        p.add_to_trainable(&Tensor::ones([9], (Kind::Float, Device::Cpu))).unwrap();
        let values: Vec<f32> = Vec::try_from(p.flat().detach()).unwrap();
        assert_eq!(values, [1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 0.5, 0.5, 1.5]);
        // Nothing frozen: the packed gradient is the buffer itself, not a copy.
        let q = two_layers(0.5, 1);
        assert!(!q.has_frozen() && q.trainable_grad().data_ptr() == q.flat().grad().data_ptr());
    }

    #[test]
    fn views_share_the_buffer_and_gradients_accumulate_flat() {
        let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]).view([2, 2]);
        let b = Tensor::from_slice(&[5.0f32]);
        let mut p = FlatParams::new(vec![("a".into(), a), ("b".into(), b)], Device::Cpu);
        assert_eq!(p.numel(), 5);
        for _ in 0..2 {
            // Two forward/backward passes through the same views: gradients land in the flat tensor.
            p.zero_grad();
            let loss = (p.view(0).sum(Kind::Float) * p.view(1).sum(Kind::Float)).square();
            loss.backward();
            let g: Vec<f32> = Vec::try_from(p.flat().grad()).unwrap();
            // d/da (5 · 10)² = 2 · 50 · 5 = 500; d/db = 2 · 50 · 10 = 1000.
            assert_eq!(g, vec![500.0, 500.0, 500.0, 500.0, 1000.0]);
        }
        let norm = p.clip_grad_norm(1.0);
        assert!((norm - (4.0f64 * 500.0 * 500.0 + 1e6).sqrt()).abs() < 1e-2);
        let clipped = f64::try_from(p.flat().grad().norm()).unwrap();
        assert!((clipped - 1.0).abs() < 1e-5);
        // In-place updates of the buffer show through the views.
        let _ = tch::no_grad(|| p.flat().shallow_clone().fill_(0.5));
        assert_eq!(Vec::<f32>::try_from(p.view(0).flatten(0, -1)).unwrap(), vec![0.5; 4]);
    }

    #[test]
    fn backward_overwrites_the_gradient_like_zero_grad_then_backward() {
        let init = vec![
            ("a".into(), Tensor::from_slice(&[1.0f32, -2.0, 3.0]).view([3, 1])),
            ("b".into(), Tensor::from_slice(&[0.5f32])),
        ];
        let mut p =
            FlatParams::new(init.iter().map(|(n, t): &(String, Tensor)| (n.clone(), t.copy())).collect(), Device::Cpu);
        let mut q = FlatParams::new(init, Device::Cpu);
        let x = Tensor::from_slice(&[0.3f32, -1.0, 2.0]).view([1, 3]);
        for _ in 0..2 {
            let loss = |p: &FlatParams| (x.matmul(p.view(0)) + p.view(1)).square().sum(Kind::Float);
            p.zero_grad();
            loss(&p).backward();
            q.backward(&loss(&q));
            assert!(p.flat().grad().allclose(&q.flat().grad(), 1e-6, 1e-6, false));
        }
        // A parameter the loss does not touch gets a zero gradient.
        q.backward(&q.view(1).sum(Kind::Float));
        assert_eq!(Vec::<f32>::try_from(q.flat().grad()).unwrap(), vec![0.0, 0.0, 0.0, 1.0]);
    }

    #[test]
    fn target_updates_hard_and_polyak() {
        let online = FlatParams::new(vec![("w".into(), Tensor::from_slice(&[1.0f32, 2.0]))], Device::Cpu);
        let mut target = online.target_copy();
        assert!(!target.flat().requires_grad());
        tch::no_grad(|| online.flat().shallow_clone().copy_(&Tensor::from_slice(&[3.0f32, 6.0])));
        assert_eq!(Vec::<f32>::try_from(target.flat()).unwrap(), vec![1.0, 2.0], "a copy, not a view");
        target.polyak_from(&online, 0.25);
        // (1 − τ) θ' + τ θ = 0.75 · [1, 2] + 0.25 · [3, 6]
        assert_eq!(Vec::<f32>::try_from(target.flat()).unwrap(), vec![1.5, 3.0]);
        target.polyak_from(&online, 1.0);
        assert_eq!(Vec::<f32>::try_from(target.flat()).unwrap(), vec![3.0, 6.0]);
        assert_eq!(Vec::<f32>::try_from(target.view(0).flatten(0, -1)).unwrap(), vec![3.0, 6.0]);
    }

    #[test]
    fn save_load_round_trip_and_shape_mismatch() {
        let path = std::env::temp_dir().join(format!("flotilla-flat-{}.safetensors", std::process::id()));
        let p = FlatParams::new(vec![("w".into(), Tensor::from_slice(&[1.0f32, 2.0]))], Device::Cpu);
        p.save(&path).unwrap();
        let mut q = FlatParams::new(vec![("w".into(), Tensor::from_slice(&[0.0f32, 0.0]))], Device::Cpu);
        q.load(&path).unwrap();
        assert_eq!(Vec::<f32>::try_from(q.flat().detach()).unwrap(), vec![1.0, 2.0]);
        let mut r = FlatParams::new(vec![("w".into(), Tensor::from_slice(&[0.0f32, 0.0, 0.0]))], Device::Cpu);
        let e = r.load(&path).unwrap_err().to_string();
        assert!(e.contains("shape"), "{e}");
        let mut s = FlatParams::new(vec![("v".into(), Tensor::from_slice(&[0.0f32, 0.0]))], Device::Cpu);
        assert!(s.load(&path).unwrap_err().to_string().contains("\"v\" missing"));
        std::fs::remove_file(&path).unwrap();
    }

    /// A weights file whose values are not all finite (damaged on disk) is refused naming the tensor, and a file
    /// refused for any reason leaves every parameter as it was, the ones before the bad one included.
    #[test]
    fn a_damaged_file_is_refused_whole() {
        let path = std::env::temp_dir().join(format!("flotilla-flat-nan-{}.safetensors", std::process::id()));
        let bad = |b: f32| {
            let good = FlatParams::new(
                vec![("a".into(), Tensor::from_slice(&[1.0f32, 2.0])), ("b".into(), Tensor::from_slice(&[3.0f32, b]))],
                Device::Cpu,
            );
            good.save(&path).unwrap();
        };
        let mut q = FlatParams::new(
            vec![("a".into(), Tensor::from_slice(&[0.0f32, 0.0])), ("b".into(), Tensor::from_slice(&[0.0f32, 0.0]))],
            Device::Cpu,
        );
        for b in [f32::NAN, f32::INFINITY] {
            bad(b);
            let e = q.load(&path).unwrap_err().to_string();
            assert!(e.contains("tensor \"b\" holds a NaN or infinite value"), "{e}");
            assert_eq!(Vec::<f32>::try_from(q.flat().detach()).unwrap(), vec![0.0; 4], "nothing loaded");
        }
        let mut short = FlatParams::new(
            vec![("a".into(), Tensor::from_slice(&[0.0f32, 0.0])), ("c".into(), Tensor::from_slice(&[0.0f32]))],
            Device::Cpu,
        );
        bad(4.0);
        assert!(short.load(&path).unwrap_err().to_string().contains("\"c\" missing"));
        assert_eq!(Vec::<f32>::try_from(short.flat().detach()).unwrap(), vec![0.0; 3], "\"a\" not loaded either");
        q.load(&path).unwrap();
        assert_eq!(Vec::<f32>::try_from(q.flat().detach()).unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
        std::fs::remove_file(&path).unwrap();
    }
}
