//! The LSTM core of [`crate::nn::recurrent`] on host slices, for the fused CPU step: a sequence forward that
//! keeps what its backward pass needs, and backpropagation through time to the core's four parameters (a
//! recurrent minibatch is hundreds of dispatched libtorch ops for well under a millisecond of arithmetic).
//! The maths is `torch.nn.LSTM`'s (gates `i, f, g, o`; `c' = f c + i g`, `h' = o tanh c'`) with the state
//! zeroed before each step where an episode starts, as [`crate::nn::recurrent::RecurrentCore::sequence`]
//! computes it; the two agree to float rounding.
use crate::nn::activation::tanh_in_place;
use crate::nn::gemm::{Operands, gemm};
use crate::nn::lanes::{Lanes, lanes};
use crate::nn::params::FlatParams;
use crate::nn::recurrent::{Recurrence, RecurrentCore};

/// Where an LSTM core's parameters sit in the flat buffer, and its widths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HostLstm {
    /// Offsets of `weight_ih` `[4H, I]`, `weight_hh` `[4H, H]`, `bias_ih` `[4H]`, `bias_hh` `[4H]`.
    w_ih: usize,
    w_hh: usize,
    b_ih: usize,
    b_hh: usize,
    inputs: usize,
    hidden: usize,
}

/// What a sequence forward saves for its backward pass (rows are time-major, `t · B + b`), and the backward
/// pass's buffers. Reused from step to step.
#[derive(Debug, Clone, Default)]
pub(crate) struct LstmTape {
    /// The core's outputs `h` per row, `T·B × H`: the input of the layers after it.
    pub out: Vec<f32>,
    /// Gate activations `i, f, g, o` per row, `T·B × 4H` (after their sigmoid / tanh).
    gates: Vec<f32>,
    /// The state each step started from, after the episode-start reset: `h` and `c`, `T·B × H` each.
    h_prev: Vec<f32>,
    c_prev: Vec<f32>,
    /// The cell state after each step, and its tanh, `T·B × H`.
    c: Vec<f32>,
    tanh_c: Vec<f32>,
    /// `1 − start` per row: 0 where the state was zeroed before the step.
    keep: Vec<f32>,
    /// `weight_hhᵀ` `[H, 4H]`, for the step's `h W_hhᵀ` without packing.
    w_hh_t: Vec<f32>,
    /// `∂loss/∂(gate pre-activations)`, `T·B × 4H`.
    d_gates: Vec<f32>,
    /// The gradient flowing back into the state before a step, `B × H` each.
    d_h: Vec<f32>,
    d_c: Vec<f32>,
    steps: usize,
    batch: usize,
}

impl HostLstm {
    /// The host layout of `core` in `params`, when it is an LSTM whose parameters are a CPU f32 buffer; `None`
    /// otherwise (a GRU trains on libtorch).
    pub(crate) fn of(core: &RecurrentCore, params: &FlatParams) -> Option<Self> {
        if core.cell != Recurrence::Lstm {
            return None;
        }
        params.host_values()?;
        let first = core.first;
        Some(HostLstm {
            w_ih: params.offset(first),
            w_hh: params.offset(first + 1),
            b_ih: params.offset(first + 2),
            b_hh: params.offset(first + 3),
            inputs: core.inputs as usize,
            hidden: core.hidden() as usize,
        })
    }

    /// The core over `B` sequences of `T` steps: inputs `x` (`T·B × I`, time-major), `starts` (`T·B`, 1 where the
    /// state is zeroed before the step), `state0` (`B × 2H`, each row `[h | c]`) → [`LstmTape::out`].
    pub(crate) fn forward(&self, theta: &[f32], x: &[f32], starts: &[f32], state0: &[f32], tape: &mut LstmTape) {
        let (i_dim, h_dim) = (self.inputs, self.hidden);
        let g_dim = 4 * h_dim;
        let rows = starts.len();
        let b = state0.len() / (2 * h_dim);
        assert!(b > 0 && rows.is_multiple_of(b) && x.len() == rows * i_dim, "host lstm: sizes");
        let t_steps = rows / b;
        (tape.steps, tape.batch) = (t_steps, b);
        let w_ih = &theta[self.w_ih..self.w_ih + g_dim * i_dim];
        let w_hh = &theta[self.w_hh..self.w_hh + g_dim * h_dim];
        let (b_ih, b_hh) = (&theta[self.b_ih..self.b_ih + g_dim], &theta[self.b_hh..self.b_hh + g_dim]);
        // Every step's input projection at once: x W_ihᵀ + b_ih + b_hh.
        tape.gates.clear();
        for _ in 0..rows {
            tape.gates.extend(b_ih.iter().zip(b_hh).map(|(p, q)| p + q));
        }
        gemm(
            Operands { m: rows, k: i_dim, n: g_dim, a: x, sa: (i_dim, 1), b: w_ih, sb: (1, i_dim) },
            1.0,
            &mut tape.gates,
        );
        tape.keep.clear();
        tape.keep.extend(starts.iter().map(|s| 1.0 - s));
        tape.w_hh_t.resize(g_dim * h_dim, 0.0);
        for (n, row) in w_hh.chunks_exact(h_dim).enumerate() {
            for (k, &v) in row.iter().enumerate() {
                tape.w_hh_t[k * g_dim + n] = v;
            }
        }
        for v in [&mut tape.h_prev, &mut tape.c_prev, &mut tape.c, &mut tape.tanh_c, &mut tape.out] {
            v.clear();
            v.resize(rows * h_dim, 0.0);
        }
        for t in 0..t_steps {
            let span = t * b * h_dim..(t + 1) * b * h_dim;
            // The state before the step, zeroed where an episode starts.
            for r in 0..b {
                let keep = tape.keep[t * b + r];
                let dst = (t * b + r) * h_dim;
                let (h, c) = if t == 0 {
                    let s = &state0[r * 2 * h_dim..(r + 1) * 2 * h_dim];
                    (&s[..h_dim], &s[h_dim..])
                } else {
                    let src = ((t - 1) * b + r) * h_dim;
                    (&tape.out[src..src + h_dim], &tape.c[src..src + h_dim])
                };
                for j in 0..h_dim {
                    tape.h_prev[dst + j] = h[j] * keep;
                    tape.c_prev[dst + j] = c[j] * keep;
                }
            }
            let gates = &mut tape.gates[t * b * g_dim..(t + 1) * b * g_dim];
            small_gemm(b, h_dim, g_dim, &tape.h_prev[span.clone()], &tape.w_hh_t, gates, true);
            // σ(x) = ½ + ½ tanh(x/2), so one vectorised tanh serves all four gates (i, f, o halved; g not).
            let sigmoid_parts = |row: &mut [f32], f: fn(&mut f32)| {
                let (ifg, o) = row.split_at_mut(3 * h_dim);
                ifg[..2 * h_dim].iter_mut().for_each(f);
                o.iter_mut().for_each(f);
            };
            for row in gates.chunks_exact_mut(g_dim) {
                sigmoid_parts(row, |v| *v *= 0.5);
            }
            tanh_in_place(gates);
            for row in gates.chunks_exact_mut(g_dim) {
                sigmoid_parts(row, |v| *v = 0.5 + 0.5 * *v);
            }
            for r in 0..b {
                let g = &gates[r * g_dim..(r + 1) * g_dim];
                let at = (t * b + r) * h_dim;
                for j in 0..h_dim {
                    let (ig, fg, gg) = (g[j], g[h_dim + j], g[2 * h_dim + j]);
                    tape.c[at + j] = fg * tape.c_prev[at + j] + ig * gg;
                }
            }
            tape.tanh_c[span.clone()].copy_from_slice(&tape.c[span.clone()]);
            tanh_in_place(&mut tape.tanh_c[span.clone()]);
            for r in 0..b {
                let o = &gates[r * g_dim + 3 * h_dim..(r + 1) * g_dim];
                let at = (t * b + r) * h_dim;
                let (out, tanh_c) = (&mut tape.out[at..at + h_dim], &tape.tanh_c[at..at + h_dim]);
                for ((y, &o), &c) in out.iter_mut().zip(o).zip(tanh_c) {
                    *y = o * c;
                }
            }
        }
    }

    /// Backpropagation through the sequences of the last [`HostLstm::forward`] (same `theta` and `x`), from
    /// `d_out` (`∂loss/∂h` per row, `T·B × H`): the core's parameter gradients, written (not added) into
    /// their slots of `grad`. The initial states are data: no gradient flows into them.
    pub(crate) fn backward(&self, theta: &[f32], x: &[f32], d_out: &[f32], tape: &mut LstmTape, grad: &mut [f32]) {
        let (i_dim, h_dim) = (self.inputs, self.hidden);
        let g_dim = 4 * h_dim;
        let (t_steps, b) = (tape.steps, tape.batch);
        let rows = t_steps * b;
        assert!(d_out.len() == rows * h_dim && x.len() == rows * i_dim, "host lstm backward: sizes");
        let w_hh = &theta[self.w_hh..self.w_hh + g_dim * h_dim];
        let LstmTape { gates, h_prev, c_prev, tanh_c, keep, d_gates, d_h, d_c, .. } = tape;
        d_gates.clear();
        d_gates.resize(rows * g_dim, 0.0);
        for v in [&mut *d_h, &mut *d_c] {
            v.clear();
            v.resize(b * h_dim, 0.0);
        }
        for t in (0..t_steps).rev() {
            for r in 0..b {
                let row = t * b + r;
                let g = &gates[row * g_dim..(row + 1) * g_dim];
                let dg = &mut d_gates[row * g_dim..(row + 1) * g_dim];
                let at = row * h_dim;
                let keep = keep[row];
                for j in 0..h_dim {
                    let (ig, fg, gg, og) = (g[j], g[h_dim + j], g[2 * h_dim + j], g[3 * h_dim + j]);
                    let tc = tanh_c[at + j];
                    let dh = d_out[at + j] + d_h[r * h_dim + j];
                    let dc = d_c[r * h_dim + j] + dh * og * (1.0 - tc * tc);
                    dg[j] = dc * gg * ig * (1.0 - ig);
                    dg[h_dim + j] = dc * c_prev[at + j] * fg * (1.0 - fg);
                    dg[2 * h_dim + j] = dc * ig * (1.0 - gg * gg);
                    dg[3 * h_dim + j] = dh * tc * og * (1.0 - og);
                    // Into the cell state before the step (nothing where it was zeroed).
                    d_c[r * h_dim + j] = dc * fg * keep;
                }
            }
            // Into h before the step: δ_gates · W_hh, nothing where the state was zeroed.
            let dg = &d_gates[t * b * g_dim..(t + 1) * b * g_dim];
            small_gemm(b, g_dim, h_dim, dg, w_hh, d_h, false);
            for (r, row) in d_h.chunks_exact_mut(h_dim).enumerate() {
                let keep = keep[t * b + r];
                row.iter_mut().for_each(|v| *v *= keep);
            }
        }
        // ∂W_ih = δᵀ x, ∂W_hh = δᵀ h_prev, ∂b_ih = ∂b_hh = Σ_rows δ.
        let d = Operands { m: g_dim, k: rows, n: i_dim, a: d_gates, sa: (1, g_dim), b: x, sb: (i_dim, 1) };
        gemm(d, 0.0, &mut grad[self.w_ih..self.w_ih + g_dim * i_dim]);
        let d = Operands { n: h_dim, b: h_prev, sb: (h_dim, 1), ..d };
        gemm(d, 0.0, &mut grad[self.w_hh..self.w_hh + g_dim * h_dim]);
        let db = &mut grad[self.b_ih..self.b_ih + g_dim];
        db.fill(0.0);
        for row in d_gates.chunks_exact(g_dim) {
            db.iter_mut().zip(row).for_each(|(a, d)| *a += d);
        }
        grad.copy_within(self.b_ih..self.b_ih + g_dim, self.b_hh);
    }
}

/// `c` (`m × n`) `= a · b` (`accumulate`: `c + a · b`) for a small `m` (a recurrent step's batch of envs), all
/// row-major: each row of `b` is read once per block of four rows of `a` and added, scaled, into their rows of
/// `c` — no packing, which `sgemm` would redo for the same weights at every step. Elementwise in a fixed order,
/// so every vector width gives the same floats.
#[allow(clippy::too_many_arguments)]
fn small_gemm(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32], accumulate: bool) {
    assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n, "small_gemm: operand too short");
    match lanes().unwrap_or_else(|e| panic!("{e}")) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `lanes` chose AVX-512 only where the CPU has AVX-512F.
        Lanes::Avx512 => unsafe { small_gemm_avx512(m, k, n, a, b, c, accumulate) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `lanes` chose AVX2 only where the CPU has it.
        Lanes::Avx2 => unsafe { small_gemm_avx2(m, k, n, a, b, c, accumulate) },
        _ => small_gemm_body(m, k, n, a, b, c, accumulate),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f")]
unsafe fn small_gemm_avx512(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32], accumulate: bool) {
    small_gemm_body(m, k, n, a, b, c, accumulate)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn small_gemm_avx2(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32], accumulate: bool) {
    small_gemm_body(m, k, n, a, b, c, accumulate)
}

/// Columns of `c` [`small_gemm`] keeps in registers at once (two AVX-512 vectors per row).
const TILE: usize = 32;

/// [`small_gemm`]'s loops, inlined into each width's compilation.
#[inline(always)]
fn small_gemm_body(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], c: &mut [f32], accumulate: bool) {
    let c = &mut c[..m * n];
    if !accumulate {
        c.fill(0.0);
    }
    for (block, c_rows) in c.chunks_mut(4 * n).enumerate() {
        let r0 = block * 4;
        if c_rows.len() == 4 * n && n.is_multiple_of(TILE) {
            // A 4 × TILE block of `c` stays in registers while the k rows of `b` stream past it.
            let a_rows: [&[f32]; 4] = [0, 1, 2, 3].map(|r| &a[(r0 + r) * k..(r0 + r + 1) * k]);
            for j0 in (0..n).step_by(TILE) {
                let mut acc = [[0f32; TILE]; 4];
                for (r, acc) in acc.iter_mut().enumerate() {
                    acc.copy_from_slice(&c_rows[r * n + j0..r * n + j0 + TILE]);
                }
                for kk in 0..k {
                    let w: &[f32; TILE] = b[kk * n + j0..kk * n + j0 + TILE].try_into().expect("a tile");
                    for (acc, a_row) in acc.iter_mut().zip(&a_rows) {
                        let s = a_row[kk];
                        for (x, &wj) in acc.iter_mut().zip(w) {
                            *x += s * wj;
                        }
                    }
                }
                for (r, acc) in acc.iter().enumerate() {
                    c_rows[r * n + j0..r * n + j0 + TILE].copy_from_slice(acc);
                }
            }
        } else {
            for (r, row) in c_rows.chunks_exact_mut(n).enumerate() {
                for (kk, w) in b.chunks_exact(n).take(k).enumerate() {
                    let s = a[(r0 + r) * k + kk];
                    row.iter_mut().zip(w).for_each(|(x, &wj)| *x += s * wj);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind, Tensor};

    /// The small-batch product equals a plain triple loop, with and without accumulating, for batches that fill
    /// the 4-row blocks and ones that do not.
    #[test]
    fn small_gemm_is_a_matrix_product() {
        for (m, n) in [(1usize, 7usize), (3, 7), (4, 7), (4, 64), (6, 32), (9, 96)] {
            let k = 5;
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.25).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 13) as f32 - 6.0) * 0.5).collect();
            let c0: Vec<f32> = (0..m * n).map(|i| i as f32 * 0.1).collect();
            for accumulate in [false, true] {
                let mut c = c0.clone();
                small_gemm(m, k, n, &a, &b, &mut c, accumulate);
                for r in 0..m {
                    for j in 0..n {
                        let dot: f32 = (0..k).map(|q| a[r * k + q] * b[q * n + j]).sum();
                        let want = if accumulate { c0[r * n + j] + dot } else { dot };
                        assert!((c[r * n + j] - want).abs() < 1e-4, "m {m} ({r}, {j}): {} vs {want}", c[r * n + j]);
                    }
                }
            }
        }
    }

    /// The host forward equals the libtorch core's sequence (episode starts inside it, a non-zero initial
    /// state), and its backward equals autograd's gradient of `Σ up ⊙ h` for every parameter.
    #[test]
    fn forward_and_backward_match_libtorch() {
        let (t, b, i_dim, h_dim) = (7usize, 3usize, 4i64, 6i64);
        let (core, mut named) = crate::nn::nets::with_torch_seed(11, || {
            let (core, mut named) = RecurrentCore::init("core", Recurrence::Lstm, i_dim, h_dim, 0);
            for (_, p) in named.iter_mut().skip(2) {
                *p = Tensor::randn(p.size(), (Kind::Float, Device::Cpu)) * 0.3;
            }
            (core, named)
        });
        named.push(("other".into(), Tensor::ones([3], (Kind::Float, Device::Cpu))));
        let mut params = FlatParams::new(named, Device::Cpu);
        let (x, state0, up) = crate::nn::nets::with_torch_seed(12, || {
            (
                Tensor::randn([t as i64, b as i64, i_dim], (Kind::Float, Device::Cpu)),
                Tensor::randn([b as i64, 2 * h_dim], (Kind::Float, Device::Cpu)) * 0.5,
                Tensor::randn([t as i64, b as i64, h_dim], (Kind::Float, Device::Cpu)),
            )
        });
        let mut starts = vec![0f32; t * b];
        starts[2 * b + 1] = 1.0;
        starts[5 * b] = 1.0;
        let starts_t = Tensor::from_slice(&starts).view([t as i64, b as i64]);
        let (out, _) = core.sequence(&params, &x, &starts_t, &state0);
        params.backward(&(&out * &up).sum(Kind::Float));
        let want_out: Vec<f32> = Vec::try_from(out.detach().flatten(0, -1)).unwrap();
        let want_grad: Vec<f32> = Vec::try_from(params.flat().grad().flatten(0, -1)).unwrap();

        let host = HostLstm::of(&core, &params).unwrap();
        let theta = params.host_values().unwrap().to_vec();
        let flat = |t: &Tensor| Vec::<f32>::try_from(t.flatten(0, -1)).unwrap();
        let (xs, s0, ups) = (flat(&x), flat(&state0), flat(&up));
        let mut tape = LstmTape::default();
        host.forward(&theta, &xs, &starts, &s0, &mut tape);
        let mut grad = vec![f32::NAN; theta.len()];
        host.backward(&theta, &xs, &ups, &mut tape, &mut grad);
        let close = |got: &[f32], want: &[f32], what: &str| {
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (k, (p, q)) in got.iter().zip(want).enumerate() {
                assert!((p - q).abs() <= 3e-6 * scale.max(1.0), "{what}[{k}]: {p} vs {q}");
            }
        };
        assert_eq!(tape.out.len(), want_out.len());
        close(&tape.out, &want_out, "output");
        let core_len = params.offset(4);
        close(&grad[..core_len], &want_grad[..core_len], "gradient");
        assert!(grad[core_len..].iter().all(|g| g.is_nan()), "slots outside the core are not written");
        // The reset matters: without it the outputs after the starts differ.
        let mut no_reset = LstmTape::default();
        host.forward(&theta, &xs, &vec![0.0; t * b], &s0, &mut no_reset);
        assert!(no_reset.out[(2 * b + 1) * h_dim as usize] != tape.out[(2 * b + 1) * h_dim as usize]);
    }
}
