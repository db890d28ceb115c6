//! A fused CPU training step for the small MLPs, without libtorch: forward with saved activations, backward,
//! gradient-norm clipping and Adam, over the same flat parameter buffer the libtorch path uses. A CartPole PPO
//! minibatch is ~0.1 ms of arithmetic but ~80 dispatched libtorch ops; here it is a dozen `sgemm` calls and a
//! few loops, allocation-free after the first step, with gradients equal to autograd's to float rounding.
//!
//! Layout: a twin MLP's layer `k` is a weight `[2, fan_in, fan_out]` and a bias `[2, 1, fan_out]` in the
//! buffer ([`crate::nn::nets::TwinMlp`]); net `j`'s slice of each is contiguous, row-major, as `addmm` takes it.
use crate::nn::activation::Activation;
use crate::nn::gemm::{Bf16Gemm, Operands, gemm};
use crate::nn::lanes::widest_lanes;

/// One dense layer of a twin MLP: the offsets of its `[2, fan_in, fan_out]` weight `w` and `[2, 1, fan_out]`
/// bias `b` in the flat buffer, and its widths (`fan_out` padded on the output layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TwinLayer {
    pub w: usize,
    pub b: usize,
    pub fan_in: usize,
    pub fan_out: usize,
}

impl TwinLayer {
    /// Layer `i` of `params` (`i` its weight, `i + 1` its bias): a twin's `[2, fan_in, fan_out]` or a plain
    /// MLP's `[fan_in, fan_out]`.
    pub(crate) fn of(params: &crate::nn::params::FlatParams, i: usize) -> Self {
        let shape = params.view(i).size();
        let n = shape.len();
        TwinLayer {
            w: params.offset(i),
            b: params.offset(i + 1),
            fan_in: shape[n - 2] as usize,
            fan_out: shape[n - 1] as usize,
        }
    }

    fn weight(self, j: usize) -> std::ops::Range<usize> {
        let start = self.w + j * self.fan_in * self.fan_out;
        start..start + self.fan_in * self.fan_out
    }

    fn bias(self, j: usize) -> std::ops::Range<usize> {
        let start = self.b + j * self.fan_out;
        start..start + self.fan_out
    }
}

/// The activations one forward pass saves for its backward pass, and the backward pass's buffers. Reused
/// from step to step, so a training loop allocates only on its first step.
#[derive(Debug, Default, Clone)]
pub(crate) struct TwinTape {
    /// Per net, per layer: the layer's output (after the nonlinearity on hidden layers), `rows × fan_out`.
    outs: [Vec<Vec<f32>>; 2],
    /// Per net: `∂loss/∂output` of the output layer, `rows × padded width`; the loss fills it.
    pub d_out: [Vec<f32>; 2],
    delta: Vec<f32>,
    delta_in: Vec<f32>,
    /// A narrow layer's weight transposed (`fan_out × fan_in`) and its gradient so.
    wt: Vec<f32>,
    dwt: Vec<f32>,
    rows: usize,
    /// With [`TwinTape::set_bf16`]: the wide layers' products in bf16, and their packing buffers.
    bf16: Option<Bf16Gemm>,
}

impl TwinTape {
    /// Net `j`'s output after [`twin_forward`]: `rows × padded width`, row-major.
    pub fn out(&self, j: usize) -> &[f32] {
        self.outs[j].last().map(Vec::as_slice).unwrap_or(&[])
    }

    /// Run the wide layers' products (forward, weight gradient, input gradient; not the narrow output layers'
    /// loops) in bf16 — operands rounded to bf16, products summed in f32, as PyTorch's CPU autocast runs a
    /// linear layer ([`Bf16Gemm`]) — or, with `false`, in f32.
    pub(crate) fn set_bf16(&mut self, on: bool) {
        if on != self.bf16.is_some() {
            self.bf16 = on.then(Bf16Gemm::default);
        }
    }

    /// Let [`twin_backward`] take only the first `rows` rows of the last forward pass: that pass ran on inputs
    /// stacked with rows that need no gradient (read through [`TwinTape::out`], which keeps them all).
    pub(crate) fn keep_rows(&mut self, rows: usize) {
        assert!(rows <= self.rows, "keep_rows: {rows} of {} rows", self.rows);
        self.rows = rows;
    }
}

/// Layers at most this wide (output layers: a few logits, one value) skip `sgemm`, whose packing costs more
/// than their arithmetic, for plain loops over a transposed weight.
const NARROW: usize = 8;

/// `dst` (`cols × rows`) = `src` (`rows × cols`) transposed.
#[inline(always)]
fn transpose(src: &[f32], rows: usize, cols: usize, dst: &mut [f32]) {
    assert!(src.len() == rows * cols && dst.len() == rows * cols, "transpose: sizes");
    for (c, d) in dst.chunks_exact_mut(rows).enumerate() {
        for (r, v) in d.iter_mut().enumerate() {
            *v = src[r * cols + c];
        }
    }
}

/// `Σ a_i b_i` in 8 interleaved partial sums (so it vectorises).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// The first `nets` (1 or 2) nets of a twin MLP on `x` (`rows × layers[0].fan_in`), saving what
/// [`twin_backward`] needs; the outputs are [`TwinTape::out`]. A plain MLP ([`crate::nn::nets::FlatMlp`]: weight
/// `[fan_in, fan_out]`, bias `[fan_out]`) is net 0 of a "twin" with one net.
pub(crate) fn twin_forward(
    layers: &[TwinLayer],
    activation: Activation,
    theta: &[f32],
    x: &[f32],
    rows: usize,
    nets: usize,
    tape: &mut TwinTape,
) {
    widest_lanes(
        #[inline(always)]
        || forward_lanes(layers, activation, theta, x, rows, nets, tape),
    )
}

/// [`twin_forward`]'s body, inlined into each of [`widest_lanes`]' compilations.
#[inline(always)]
fn forward_lanes(
    layers: &[TwinLayer],
    activation: Activation,
    theta: &[f32],
    x: &[f32],
    rows: usize,
    nets: usize,
    tape: &mut TwinTape,
) {
    tape.rows = rows;
    let last = layers.len() - 1;
    let TwinTape { outs, wt, bf16, .. } = tape;
    for j in 0..nets.min(2) {
        let outs = &mut outs[j];
        outs.resize_with(layers.len(), Vec::new);
        for (k, &layer) in layers.iter().enumerate() {
            let (before, rest) = outs.split_at_mut(k);
            let input: &[f32] = if k == 0 { x } else { &before[k - 1] };
            let out = &mut rest[0];
            out.clear();
            let bias = &theta[layer.bias(j)];
            for _ in 0..rows {
                out.extend_from_slice(bias);
            }
            let (fi, fo) = (layer.fan_in, layer.fan_out);
            let w = &theta[layer.weight(j)];
            if fo <= NARROW {
                wt.resize(fi * fo, 0.0);
                transpose(w, fi, fo, wt);
                for (x, o) in input.chunks_exact(fi).zip(out.chunks_exact_mut(fo)) {
                    for (o, wt) in o.iter_mut().zip(wt.chunks_exact(fi)) {
                        *o += dot(x, wt);
                    }
                }
            } else {
                product(bf16, Operands { m: rows, k: fi, n: fo, a: input, sa: (fi, 1), b: w, sb: (fo, 1) }, 1.0, out);
            }
            if k < last {
                activation.apply_host(out);
            }
        }
    }
}

/// The gradient of the loss with respect to the first `nets` nets' parameters, written (not added) into
/// `grad` (the flat buffer's layout), from the `∂loss/∂output` the caller left in [`TwinTape::d_out`] after
/// [`twin_forward`] on the same `theta` and `x`; with `d_x`, also `∂loss/∂x` summed over the nets
/// (`rows × layers[0].fan_in`), for inputs a layer before the MLP computed (a recurrent core).
#[allow(clippy::too_many_arguments)]
pub(crate) fn twin_backward(
    layers: &[TwinLayer],
    activation: Activation,
    theta: &[f32],
    x: &[f32],
    nets: usize,
    tape: &mut TwinTape,
    grad: &mut [f32],
    d_x: Option<&mut Vec<f32>>,
) {
    widest_lanes(
        #[inline(always)]
        || backward_lanes(layers, activation, theta, x, nets, tape, grad, d_x),
    )
}

/// [`twin_backward`]'s body, inlined into each of [`widest_lanes`]' compilations.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn backward_lanes(
    layers: &[TwinLayer],
    activation: Activation,
    theta: &[f32],
    x: &[f32],
    nets: usize,
    tape: &mut TwinTape,
    grad: &mut [f32],
    mut d_x: Option<&mut Vec<f32>>,
) {
    let rows = tape.rows;
    let TwinTape { outs, d_out, delta, delta_in, wt, dwt, bf16, .. } = tape;
    for j in 0..nets.min(2) {
        delta.clear();
        delta.extend_from_slice(&d_out[j]);
        for (k, &layer) in layers.iter().enumerate().rev() {
            let (fi, fo) = (layer.fan_in, layer.fan_out);
            let input: &[f32] = if k == 0 { x } else { &outs[j][k - 1] };
            let narrow = fo <= NARROW;
            // ∂W = inputᵀ · δ, ∂b = Σ_rows δ.
            if narrow {
                // Column by column of ∂W (rows of ∂Wᵀ), each a sum of the input rows scaled by δ.
                dwt.clear();
                dwt.resize(fo * fi, 0.0);
                for (x, d) in input.chunks_exact(fi).zip(delta.chunks_exact(fo)) {
                    for (dw, &g) in dwt.chunks_exact_mut(fi).zip(d) {
                        dw.iter_mut().zip(x).for_each(|(a, &b)| *a += g * b);
                    }
                }
                transpose(dwt, fo, fi, &mut grad[layer.weight(j)]);
            } else {
                let x = Operands { m: fi, k: rows, n: fo, a: input, sa: (1, fi), b: delta, sb: (fo, 1) };
                product(bf16, x, 0.0, &mut grad[layer.weight(j)]);
            }
            let db = &mut grad[layer.bias(j)];
            db.fill(0.0);
            for row in delta.chunks_exact(fo) {
                for (g, d) in db.iter_mut().zip(row) {
                    *g += d;
                }
            }
            if k > 0 || d_x.is_some() {
                // δ_in = δ · Wᵀ ⊙ act'(input) (the network's input: no nonlinearity before it).
                delta_in.clear();
                delta_in.resize(rows * fi, 0.0);
                let w = &theta[layer.weight(j)];
                if narrow {
                    wt.resize(fi * fo, 0.0);
                    transpose(w, fi, fo, wt);
                    for (di, d) in delta_in.chunks_exact_mut(fi).zip(delta.chunks_exact(fo)) {
                        for (wt, &g) in wt.chunks_exact(fi).zip(d) {
                            di.iter_mut().zip(wt).for_each(|(a, &b)| *a += g * b);
                        }
                    }
                } else {
                    product(
                        bf16,
                        Operands { m: rows, k: fo, n: fi, a: delta, sa: (fo, 1), b: w, sb: (1, fo) },
                        0.0,
                        delta_in,
                    );
                }
                if k == 0 {
                    let d_x = d_x.as_deref_mut().expect("asked for");
                    if j == 0 {
                        d_x.clear();
                        d_x.extend_from_slice(delta_in);
                    } else {
                        d_x.iter_mut().zip(delta_in.iter()).for_each(|(a, b)| *a += b);
                    }
                    continue;
                }
                activation.backward_host(input, delta_in);
                std::mem::swap(delta, delta_in);
            }
        }
    }
}

/// [`gemm`], or with a bf16 product ([`TwinTape::set_bf16`]) [`Bf16Gemm::gemm`].
#[inline(always)]
fn product(bf16: &mut Option<Bf16Gemm>, x: Operands<'_>, beta: f32, c: &mut [f32]) {
    match bf16 {
        Some(g) => g.gemm(x, beta, c),
        None => gemm(x, beta, c),
    }
}

/// The global L2 norm of `grad` and, when it is above `max_norm`, `grad` scaled to it — as
/// `torch.nn.utils.clip_grad_norm_` (and [`crate::nn::params::FlatParams::clip_grad_norm`]): scale
/// `max_norm / (norm + 1e-6)` when below 1. Returns the norm before clipping.
pub(crate) fn clip_grad_norm(grad: &mut [f32], max_norm: f64) -> f64 {
    widest_lanes(
        #[inline(always)]
        || clip_lanes(grad, max_norm),
    )
}

/// [`clip_grad_norm`]'s body, inlined into each of [`widest_lanes`]' compilations.
#[inline(always)]
fn clip_lanes(grad: &mut [f32], max_norm: f64) -> f64 {
    // Eight f64 partial sums (so the loop vectorises), added at the end.
    let mut acc = [0f64; 8];
    let chunks = grad.chunks_exact(8);
    let tail: f64 = chunks.remainder().iter().map(|&g| (g as f64) * (g as f64)).sum();
    for c in chunks {
        for i in 0..8 {
            acc[i] += (c[i] as f64) * (c[i] as f64);
        }
    }
    let norm = (acc.iter().sum::<f64>() + tail).sqrt();
    let coef = max_norm / (norm + 1e-6);
    if coef < 1.0 {
        let c = coef as f32;
        grad.iter_mut().for_each(|g| *g *= c);
    }
    norm
}

/// The end of a fused step: clip `grad` to `max_grad_norm` and take `opt`'s step on `theta`. A
/// non-finite gradient norm is an error naming `algorithm`, and no step is taken.
pub(crate) fn clip_and_step(
    theta: &mut [f32],
    grad: &mut [f32],
    opt: &mut crate::nn::optimiser::Optimiser,
    max_grad_norm: f64,
    algorithm: &str,
) -> crate::Result<()> {
    crate::nn::members::finite_norm(clip_grad_norm(grad, max_grad_norm), algorithm)?;
    if !opt.step_host(theta, grad) {
        return Err(crate::Error::Unsupported(
            "fused CPU step: optimiser state is not a host buffer of the model's size".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::optimiser::adam_step;
    use crate::nn::params::FlatParams;
    use tch::{Device, Kind, Tensor};

    #[test]
    fn tanh_is_accurate_everywhere() {
        let mut worst = (0.0f64, 0.0f32);
        let mut x = -12.0f32;
        while x <= 12.0 {
            for v in [x, x * 1e-3, x * 1e-6] {
                let mut h = [v; 9]; // more than one AVX vector, and a tail
                crate::nn::activation::tanh_in_place(&mut h);
                let err = (h[8] as f64 - (v as f64).tanh()).abs();
                assert_eq!(h[0], h[8], "lanes agree");
                let rel = err / (v as f64).tanh().abs().max(1e-30);
                assert!(err < 1.5e-7 && (v == 0.0 || rel < 2.5e-7), "tanh({v}) = {} ({err:e} off)", h[8]);
                if err > worst.0 {
                    worst = (err, v);
                }
            }
            x += 1.0 / 1024.0;
        }
        let mut odd = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0];
        crate::nn::activation::tanh_in_place(&mut odd);
        assert!(odd[0].is_nan() && odd[1] == 1.0 && odd[2] == -1.0 && odd[3] == 0.0, "{odd:?}");
    }

    /// Standard normal draws from libtorch's global generator, under the lock every seeded draw in this crate
    /// holds (other tests build networks on other threads at the same time).
    fn randn(shape: &[i64], seed: u64) -> Tensor {
        crate::nn::nets::with_torch_seed(seed, || Tensor::randn(shape, (Kind::Float, Device::Cpu)))
    }

    /// A random twin MLP in a FlatParams buffer (as `TwinMlp` lays it out) and its TwinLayer list.
    fn random_twin(widths: &[usize], seed: i64) -> (FlatParams, Vec<TwinLayer>) {
        let mut named = Vec::new();
        let mut layers = Vec::new();
        let mut offset = 0;
        for (k, pair) in widths.windows(2).enumerate() {
            let (fi, fo) = (pair[0], pair[1]);
            named.push((format!("{k}.w"), randn(&[2, fi as i64, fo as i64], seed as u64 * 100 + 2 * k as u64) * 0.5));
            named.push((format!("{k}.b"), randn(&[2, 1, fo as i64], seed as u64 * 100 + 2 * k as u64 + 1) * 0.1));
            layers.push(TwinLayer { w: offset, b: offset + 2 * fi * fo, fan_in: fi, fan_out: fo });
            offset += 2 * fi * fo + 2 * fo;
        }
        (FlatParams::new(named, Device::Cpu), layers)
    }

    #[test]
    fn forward_and_backward_match_libtorch_autograd() {
        for (activation, seed) in [(Activation::Tanh, 1), (Activation::Relu, 2)] {
            let widths = [5, 32, 24, 3];
            let rows = 37;
            let (mut params, layers) = random_twin(&widths, seed);
            let x = randn(&[rows as i64, 5], 7000 + seed as u64).set_requires_grad(true);
            let up = randn(&[2, rows as i64, 3], 8000 + seed as u64); // ∂loss/∂out
            // libtorch: both nets, loss = Σ up ⊙ out.
            let mut h = x.unsqueeze(0).expand([2, -1, -1], false);
            for (k, _) in layers.iter().enumerate() {
                h = params.view(2 * k + 1).baddbmm(&h, params.view(2 * k), 1.0, 1.0);
                if k + 1 < layers.len() {
                    h = match activation {
                        Activation::Tanh => h.tanh(),
                        Activation::Relu => h.relu(),
                    };
                }
            }
            let loss = (&h * &up).sum(Kind::Float);
            let want_dx = Tensor::run_backward(&[&loss], &[&x], true, false).pop().unwrap();
            params.backward(&loss);
            let want_out: Vec<f32> = Vec::try_from(h.detach().flatten(0, -1)).unwrap();
            let want_grad: Vec<f32> = Vec::try_from(params.flat().grad().flatten(0, -1)).unwrap();
            // Host.
            let theta = params.host_values().unwrap().to_vec();
            let xs: Vec<f32> = Vec::try_from(x.detach().flatten(0, -1)).unwrap();
            let ups: Vec<f32> = Vec::try_from(up.flatten(0, -1)).unwrap();
            let mut tape = TwinTape::default();
            twin_forward(&layers, activation, &theta, &xs, rows, 2, &mut tape);
            let got_out: Vec<f32> = [tape.out(0), tape.out(1)].concat();
            tape.d_out = [ups[..rows * 3].to_vec(), ups[rows * 3..].to_vec()];
            let mut grad = vec![f32::NAN; theta.len()];
            let mut d_x = Vec::new();
            twin_backward(&layers, activation, &theta, &xs, 2, &mut tape, &mut grad, Some(&mut d_x));
            let want_dx: Vec<f32> = Vec::try_from(want_dx.flatten(0, -1)).unwrap();
            let mut plain = vec![f32::NAN; theta.len()];
            twin_forward(&layers, activation, &theta, &xs, rows, 2, &mut tape);
            tape.d_out = [ups[..rows * 3].to_vec(), ups[rows * 3..].to_vec()];
            twin_backward(&layers, activation, &theta, &xs, 2, &mut tape, &mut plain, None);
            assert_eq!(grad, plain, "the input gradient leaves the parameter gradient alone");
            let close = |a: &[f32], b: &[f32], what: &str| {
                let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (i, (p, q)) in a.iter().zip(b).enumerate() {
                    assert!((p - q).abs() <= 2e-6 * scale, "{what}[{i}] ({activation:?}): {p} vs {q}");
                }
            };
            assert_eq!(got_out.len(), want_out.len());
            close(&got_out, &want_out, "output");
            close(&grad, &want_grad, "gradient");
            close(&d_x, &want_dx, "input gradient");
        }
    }

    #[test]
    fn adam_and_clipping_match_the_libtorch_path() {
        let (mut params, _) = random_twin(&[3, 4, 2], 3);
        let mut theta = params.host_values().unwrap().to_vec();
        let mut adam = crate::nn::optimiser::Adam::new(&params, 3e-3, 1e-5);
        let (mut m, mut v) = (vec![0.0; theta.len()], vec![0.0; theta.len()]);
        for t in 1..=5u64 {
            let g = randn(&[theta.len() as i64], 9000 + t) * 2.0;
            let mut grad: Vec<f32> = Vec::try_from(&g).unwrap();
            tch::no_grad(|| params.flat().grad().copy_(&g));
            let want_norm = params.clip_grad_norm(0.5);
            adam.step(&mut params);
            let norm = clip_grad_norm(&mut grad, 0.5);
            assert!((norm - want_norm).abs() < 1e-5 * want_norm, "{norm} vs {want_norm}");
            adam_step(&mut theta, &grad, &mut m, &mut v, t, 3e-3, (0.9, 0.999, 1e-5));
            let want = params.host_values().unwrap();
            for (a, b) in theta.iter().zip(want) {
                assert!((a - b).abs() < 1e-6, "step {t}: {a} vs {b}");
            }
        }
    }
}
