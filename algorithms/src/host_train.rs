//! A fused CPU training step for the small MLPs, without libtorch: forward with saved activations, backward,
//! gradient-norm clipping and Adam, over the same flat parameter buffer the libtorch path uses.
//!
//! Why: a PPO minibatch step on CartPole's 64-64 MLPs is ~14 MFLOP — about 0.1 ms of arithmetic — but ~80
//! libtorch ops at several microseconds of dispatch each. Here one step is a dozen `sgemm` calls
//! (`matrixmultiply`, which picks AVX/FMA kernels at run time) and a few loops over contiguous buffers, with
//! no allocation after the first step. Gradients agree with libtorch's autograd to float rounding (tests
//! here and in `ppo`); libtorch stays the path for GPUs, CNNs and everything this module does not cover.
//!
//! Layout: a twin MLP's layer `k` is a weight `[2, fan_in, fan_out]` and a bias `[2, 1, fan_out]` in the
//! buffer ([`crate::nets::TwinMlp`]); net `j`'s slice of each is contiguous, row-major, as `addmm` takes it.
use crate::activation::Activation;

/// One dense layer of a twin MLP: where its weight and bias start in the flat buffer, and its widths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TwinLayer {
    /// Offset of the `[2, fan_in, fan_out]` weight.
    pub w: usize,
    /// Offset of the `[2, 1, fan_out]` bias.
    pub b: usize,
    /// Input width.
    pub fan_in: usize,
    /// Output width (the padded width on the output layer).
    pub fan_out: usize,
}

impl TwinLayer {
    /// Layer `i` of `params` (`i` its weight, `i + 1` its bias): a twin's `[2, fan_in, fan_out]` or a plain
    /// MLP's `[fan_in, fan_out]`.
    pub(crate) fn of(params: &crate::params::FlatParams, i: usize) -> Self {
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
    /// [`own_kernel`]'s `δ · Wᵀ`: `δ` transposed, and the product transposed.
    delta_t: Vec<f32>,
    delta_in_t: Vec<f32>,
    rows: usize,
}

impl TwinTape {
    /// Net `j`'s output after [`twin_forward`]: `rows × padded width`, row-major.
    pub fn out(&self, j: usize) -> &[f32] {
        self.outs[j].last().map(Vec::as_slice).unwrap_or(&[])
    }

    /// Let [`twin_backward`] take only the first `rows` rows of the last forward pass: that pass ran on inputs
    /// stacked with rows that need no gradient (read through [`TwinTape::out`], which keeps them all).
    pub(crate) fn keep_rows(&mut self, rows: usize) {
        assert!(rows <= self.rows, "keep_rows: {rows} of {} rows", self.rows);
        self.rows = rows;
    }
}

/// What a product is added to: nothing, or a bias row (every row of `c` gets it).
#[derive(Debug, Clone, Copy)]
enum Init<'a> {
    Zero,
    Bias(&'a [f32]),
}

/// `c = a·b (+ bias)` for `a` `m × k` and `b` `k × n`, each given with its (row, column) strides so transposed
/// operands cost nothing; `c` is row-major `m × n`. Every element is `matrixmultiply::sgemm`'s, bit for bit:
/// on CPUs with AVX-512 and FMA (where `sgemm` multiplies with fused multiply-adds too) and a `b` with
/// contiguous rows, [`own_kernel`] computes it without packing the operands; else `sgemm` does.
#[allow(clippy::too_many_arguments)]
fn gemm(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    sa: (usize, usize),
    b: &[f32],
    sb: (usize, usize),
    init: Init<'_>,
    c: &mut [f32],
) {
    let extent = |rows: usize, cols: usize, (rs, cs): (usize, usize)| {
        if rows == 0 || cols == 0 { 0 } else { (rows - 1) * rs + (cols - 1) * cs + 1 }
    };
    assert!(a.len() >= extent(m, k, sa) && b.len() >= extent(k, n, sb) && c.len() >= m * n, "gemm operand too short");
    if let Init::Bias(bias) = init {
        assert!(bias.len() == n, "gemm: bias of {} for {n} columns", bias.len());
    }
    if m == 0 || n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if k > 0 && sb.1 == 1 && own_kernel() {
        // SAFETY: the CPU has AVX-512F and FMA (own_kernel); the assertions above keep every index the kernel
        // forms (row·stride + column within the given shapes, bias columns < n) inside the slices; `c` does
        // not alias `a`, `b` or the bias (a `&mut` borrow).
        unsafe { avx512::gemm(m, k, n, a.as_ptr(), sa, b.as_ptr(), sb.0, init, c.as_mut_ptr()) };
        return;
    }
    let beta = match init {
        Init::Zero => 0.0,
        Init::Bias(bias) => {
            c[..m * n].chunks_exact_mut(n).for_each(|row| row.copy_from_slice(bias));
            1.0
        }
    };
    // SAFETY: the assertion above keeps every index sgemm forms (row·rs + col·cs within the given shapes)
    // inside the slices; `c` does not alias `a` or `b` (a `&mut` borrow).
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            sa.0 as isize,
            sa.1 as isize,
            b.as_ptr(),
            sb.0 as isize,
            sb.1 as isize,
            beta,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

/// Whether [`gemm`] multiplies with its own AVX-512 kernel: x86-64 with AVX-512F and FMA.
fn own_kernel() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// [`gemm`]'s kernel without packing, and the transpose it needs for `δ · Wᵀ`.
///
/// Why: `sgemm` copies both operands into packed panels on every call, element by element wherever the
/// panel's direction is not the operand's contiguous one — the activations of every forward pass and both
/// operands of `δ · Wᵀ` (the 256 × 256 weight) — which was a sixth of CartPole's DQN run (perf). Here `b`'s rows
/// are read in place (16-float vectors) and `a`'s elements broadcast from wherever they are.
///
/// Equal to `sgemm` bit for bit: it computes each element as the AVX-512 kernel `matrixmultiply` 0.3 picks on
/// these CPUs (its default `avx512` feature) does — products accumulated from +0 by fused multiply-adds in
/// increasing `k`, in blocks of `KC` = 256 (`sgemm`'s `S_KC`), each block's sum added to what `c` held (the
/// bias, or the blocks before it; the first block's sum as it is without a bias). The order of rows and
/// columns does not matter: no element's sum depends on another's. Tested against `sgemm` over shapes,
/// strides, blocks, edges and underflow.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::Init;
    use std::arch::x86_64::*;

    /// `sgemm`'s `k` block.
    const KC: usize = 256;
    /// Rows of `c` per tile.
    const MR: usize = 6;
    /// 16-float vectors per tile row (24 accumulators with `MR`, of 32 registers).
    const NV: usize = 4;

    /// `c` (`m × n`, row-major) = `a·b` (+ bias); `a[i, k]` at `i·sa.0 + k·sa.1`, `b`'s row `k` at `k·ldb`.
    ///
    /// # Safety
    /// AVX-512F and FMA; every element of `a`, `b` (`n` per row), the bias and `c` those strides reach is in
    /// bounds; `k > 0`.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,avx512f,fma")]
    pub(super) unsafe fn gemm(
        m: usize,
        k: usize,
        n: usize,
        a: *const f32,
        sa: (usize, usize),
        b: *const f32,
        ldb: usize,
        init: Init<'_>,
        c: *mut f32,
    ) {
        let mut j = 0;
        while j < n {
            let w = (n - j).min(16 * NV);
            // SAFETY: the caller's bounds hold for columns j..j + w.
            unsafe {
                match w.div_ceil(16) {
                    4 => columns::<4>(m, k, n, j, w, a, sa, b, ldb, init, c),
                    3 => columns::<3>(m, k, n, j, w, a, sa, b, ldb, init, c),
                    2 => columns::<2>(m, k, n, j, w, a, sa, b, ldb, init, c),
                    _ => columns::<1>(m, k, n, j, w, a, sa, b, ldb, init, c),
                }
            }
            j += w;
        }
    }

    /// Columns `j..j + w` (`w ≤ 16·V`) of every row, in tiles of `MR`, then 4, then 1 rows.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx2,avx512f,fma")]
    unsafe fn columns<const V: usize>(
        m: usize,
        k: usize,
        ldc: usize,
        j: usize,
        w: usize,
        a: *const f32,
        sa: (usize, usize),
        b: *const f32,
        ldb: usize,
        init: Init<'_>,
        c: *mut f32,
    ) {
        // Lanes of each vector inside the w columns; every vector has at least one.
        let masks: [u16; V] = std::array::from_fn(|v| {
            let lanes = w.saturating_sub(16 * v).min(16);
            ((1u32 << lanes) - 1) as u16
        });
        let bias = match init {
            Init::Zero => None,
            // SAFETY: j < n = the bias's length.
            Init::Bias(bias) => Some(unsafe { bias.as_ptr().add(j) }),
        };
        let mut i = 0;
        // SAFETY (each tile): rows i.. of a and c, columns j.. of b and c, inside the caller's bounds.
        unsafe {
            while i + MR <= m {
                tile::<MR, V>(k, a.add(i * sa.0), sa, b.add(j), ldb, bias, c.add(i * ldc + j), ldc, &masks);
                i += MR;
            }
            while i + 4 <= m {
                tile::<4, V>(k, a.add(i * sa.0), sa, b.add(j), ldb, bias, c.add(i * ldc + j), ldc, &masks);
                i += 4;
            }
            while i < m {
                tile::<1, V>(k, a.add(i * sa.0), sa, b.add(j), ldb, bias, c.add(i * ldc + j), ldc, &masks);
                i += 1;
            }
        }
    }

    /// An `R × 16V` tile of `c`, kept in registers over all of `k`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx2,avx512f,fma")]
    unsafe fn tile<const R: usize, const V: usize>(
        k: usize,
        a: *const f32,
        sa: (usize, usize),
        b: *const f32,
        ldb: usize,
        bias: Option<*const f32>,
        c: *mut f32,
        ldc: usize,
        masks: &[u16; V],
    ) {
        let mut out = [[_mm512_setzero_ps(); V]; R];
        let mut k0 = 0;
        while k0 < k {
            let kc = KC.min(k - k0);
            let mut acc = [[_mm512_setzero_ps(); V]; R];
            // SAFETY: rows k0..k0 + kc of b and columns k0.. of a are inside the caller's bounds; masked
            // lanes are not read.
            unsafe {
                let (mut ap, mut bp) = (a.add(k0 * sa.1), b.add(k0 * ldb));
                for _ in 0..kc {
                    let bv: [__m512; V] = std::array::from_fn(|v| _mm512_maskz_loadu_ps(masks[v], bp.add(16 * v)));
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let av = _mm512_set1_ps(*ap.add(r * sa.0));
                        for (acc, bv) in acc.iter_mut().zip(bv) {
                            *acc = _mm512_fmadd_ps(av, bv, *acc);
                        }
                    }
                    ap = ap.add(sa.1);
                    bp = bp.add(ldb);
                }
            }
            for (out, acc) in out.iter_mut().zip(acc) {
                for (v, (out, acc)) in out.iter_mut().zip(acc).enumerate() {
                    *out = match (k0, bias) {
                        // As `sgemm`'s AVX-512 kernel stores α·sum for β = 0: a sum that underflowed to −0
                        // stays −0.
                        (0, None) => acc,
                        // SAFETY: columns of the bias inside the caller's bounds; masked lanes not read.
                        (0, Some(bias)) => {
                            _mm512_add_ps(acc, unsafe { _mm512_maskz_loadu_ps(masks[v], bias.add(16 * v)) })
                        }
                        _ => _mm512_add_ps(acc, *out),
                    };
                }
            }
            k0 += kc;
        }
        for (r, out) in out.iter().enumerate() {
            for (v, out) in out.iter().enumerate() {
                // SAFETY: row r, columns 16v.. of the tile, inside the caller's bounds; masked lanes not written.
                unsafe { _mm512_mask_storeu_ps(c.add(r * ldc + 16 * v), masks[v], *out) };
            }
        }
    }

    /// `dst` (`cols × rows`) = `src` (`rows × cols`) transposed: 16 × 16 blocks through registers, the edges
    /// element by element.
    ///
    /// # Safety
    /// AVX-512F.
    #[target_feature(enable = "avx2,avx512f")]
    pub(super) unsafe fn transpose(src: &[f32], rows: usize, cols: usize, dst: &mut [f32]) {
        assert!(src.len() == rows * cols && dst.len() == rows * cols, "transpose: sizes");
        let (rb, cb) = (rows / 16 * 16, cols / 16 * 16);
        for r0 in (0..rb).step_by(16) {
            for c0 in (0..cb).step_by(16) {
                // SAFETY: rows r0..r0 + 16 < rows, columns c0..c0 + 16 < cols of src (and so of dst).
                let mut x: [__m512; 16] =
                    std::array::from_fn(|i| unsafe { _mm512_loadu_ps(src.as_ptr().add((r0 + i) * cols + c0)) });
                let mut t = [_mm512_setzero_ps(); 16];
                for i in 0..8 {
                    t[2 * i] = _mm512_unpacklo_ps(x[2 * i], x[2 * i + 1]);
                    t[2 * i + 1] = _mm512_unpackhi_ps(x[2 * i], x[2 * i + 1]);
                }
                for i in 0..4 {
                    x[4 * i] = _mm512_shuffle_ps::<0x44>(t[4 * i], t[4 * i + 2]);
                    x[4 * i + 1] = _mm512_shuffle_ps::<0xEE>(t[4 * i], t[4 * i + 2]);
                    x[4 * i + 2] = _mm512_shuffle_ps::<0x44>(t[4 * i + 1], t[4 * i + 3]);
                    x[4 * i + 3] = _mm512_shuffle_ps::<0xEE>(t[4 * i + 1], t[4 * i + 3]);
                }
                for i in 0..4 {
                    t[i] = _mm512_shuffle_f32x4::<0x88>(x[i], x[i + 4]);
                    t[i + 4] = _mm512_shuffle_f32x4::<0xDD>(x[i], x[i + 4]);
                    t[i + 8] = _mm512_shuffle_f32x4::<0x88>(x[i + 8], x[i + 12]);
                    t[i + 12] = _mm512_shuffle_f32x4::<0xDD>(x[i + 8], x[i + 12]);
                }
                for i in 0..8 {
                    x[i] = _mm512_shuffle_f32x4::<0x88>(t[i], t[i + 8]);
                    x[i + 8] = _mm512_shuffle_f32x4::<0xDD>(t[i], t[i + 8]);
                }
                for (i, x) in x.iter().enumerate() {
                    // SAFETY: row c0 + i < cols of dst, columns r0..r0 + 16 < rows.
                    unsafe { _mm512_storeu_ps(dst.as_mut_ptr().add((c0 + i) * rows + r0), *x) };
                }
            }
        }
        for r in 0..rows {
            for c in if r < rb { cb } else { 0 }..cols {
                dst[c * rows + r] = src[r * cols + c];
            }
        }
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

/// `f`, compiled for the widest vectors the CPU has (AVX-512, AVX2, else the baseline's SSE2): the loops of
/// the forward and backward passes and the gradient norm are elementwise or keep their partial sums apart,
/// so every width computes the same floats in the same order (Rust never fuses a multiply and an add). With
/// the branch-free ReLU backward, this took those loops from ~14 % of CartPole's DQN run to ~6 % (perf). `f`
/// must be `#[inline(always)]` (and what it calls that should be vectorised), or it is compiled once, for the
/// baseline.
#[inline(always)]
fn widest_lanes<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { on_avx512(f) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { on_avx2(f) };
        }
    }
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f")]
unsafe fn on_avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn on_avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// The first `nets` (1 or 2) nets of a twin MLP on `x` (`rows × layers[0].fan_in`), saving what
/// [`twin_backward`] needs; the outputs are [`TwinTape::out`]. A plain MLP ([`crate::nets::FlatMlp`]: weight
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
    for j in 0..nets.min(2) {
        let outs = &mut tape.outs[j];
        outs.resize_with(layers.len(), Vec::new);
        for (k, &layer) in layers.iter().enumerate() {
            let (before, rest) = outs.split_at_mut(k);
            let input: &[f32] = if k == 0 { x } else { &before[k - 1] };
            let out = &mut rest[0];
            let bias = &theta[layer.bias(j)];
            let (fi, fo) = (layer.fan_in, layer.fan_out);
            let w = &theta[layer.weight(j)];
            if fo <= NARROW {
                out.clear();
                for _ in 0..rows {
                    out.extend_from_slice(bias);
                }
                tape.wt.resize(fi * fo, 0.0);
                transpose(w, fi, fo, &mut tape.wt);
                for (x, o) in input.chunks_exact(fi).zip(out.chunks_exact_mut(fo)) {
                    for (o, wt) in o.iter_mut().zip(tape.wt.chunks_exact(fi)) {
                        *o += dot(x, wt);
                    }
                }
            } else {
                out.resize(rows * fo, 0.0);
                gemm(rows, fi, fo, input, (fi, 1), w, (fo, 1), Init::Bias(bias), out);
            }
            if k < last {
                activate(activation, out);
            }
        }
    }
}

/// The gradient of the loss with respect to the first `nets` nets' parameters, written (not added) into
/// `grad` (the flat buffer's layout), from the `∂loss/∂output` the caller left in [`TwinTape::d_out`] after
/// [`twin_forward`] on the same `theta` and `x`.
pub(crate) fn twin_backward(
    layers: &[TwinLayer],
    activation: Activation,
    theta: &[f32],
    x: &[f32],
    nets: usize,
    tape: &mut TwinTape,
    grad: &mut [f32],
) {
    widest_lanes(
        #[inline(always)]
        || backward_lanes(layers, activation, theta, x, nets, tape, grad),
    )
}

/// [`twin_backward`]'s body, inlined into each of [`widest_lanes`]' compilations.
#[inline(always)]
fn backward_lanes(
    layers: &[TwinLayer],
    activation: Activation,
    theta: &[f32],
    x: &[f32],
    nets: usize,
    tape: &mut TwinTape,
    grad: &mut [f32],
) {
    let rows = tape.rows;
    let TwinTape { outs, d_out, delta, delta_in, wt, dwt, delta_t, delta_in_t, .. } = tape;
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
                gemm(fi, rows, fo, input, (1, fi), delta, (fo, 1), Init::Zero, &mut grad[layer.weight(j)]);
            }
            let db = &mut grad[layer.bias(j)];
            db.fill(0.0);
            for row in delta.chunks_exact(fo) {
                for (g, d) in db.iter_mut().zip(row) {
                    *g += d;
                }
            }
            if k > 0 {
                // δ_in = δ · Wᵀ ⊙ act'(input).
                let w = &theta[layer.weight(j)];
                if narrow {
                    delta_in.clear();
                    delta_in.resize(rows * fi, 0.0);
                    wt.resize(fi * fo, 0.0);
                    transpose(w, fi, fo, wt);
                    for (di, d) in delta_in.chunks_exact_mut(fi).zip(delta.chunks_exact(fo)) {
                        for (wt, &g) in wt.chunks_exact(fi).zip(d) {
                            di.iter_mut().zip(wt).for_each(|(a, &b)| *a += g * b);
                        }
                    }
                } else {
                    delta_in.resize(rows * fi, 0.0);
                    delta_product(rows, fi, fo, delta, w, delta_t, delta_in_t, delta_in);
                }
                activation_backward(activation, input, delta_in);
                std::mem::swap(delta, delta_in);
            }
        }
    }
}

/// `δ_in = δ · Wᵀ` for `δ` `rows × fo` and `W` `fi × fo`. [`own_kernel`] wants its right operand's rows
/// contiguous, which `Wᵀ`'s are not: it computes `(W · δᵀ)ᵀ` instead (each element the same sum of the same
/// products), transposing `δ` into `delta_t` and the product out of `delta_in_t`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn delta_product(
    rows: usize,
    fi: usize,
    fo: usize,
    delta: &[f32],
    w: &[f32],
    delta_t: &mut Vec<f32>,
    delta_in_t: &mut Vec<f32>,
    delta_in: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if own_kernel() {
        delta_t.resize(rows * fo, 0.0);
        delta_in_t.resize(rows * fi, 0.0);
        // SAFETY: the CPU has AVX-512F (own_kernel).
        unsafe { avx512::transpose(delta, rows, fo, delta_t) };
        gemm(fi, fo, rows, w, (fo, 1), delta_t, (rows, 1), Init::Zero, delta_in_t);
        // SAFETY: as above.
        unsafe { avx512::transpose(delta_in_t, fi, rows, delta_in) };
        return;
    }
    let _unused_without_the_kernel = (delta_t, delta_in_t);
    gemm(rows, fo, fi, delta, (fo, 1), w, (1, fo), Init::Zero, delta_in);
}

/// Apply the nonlinearity in place.
#[inline(always)]
fn activate(activation: Activation, h: &mut [f32]) {
    match activation {
        Activation::Tanh => tanh_in_place(h),
        Activation::Relu => h.iter_mut().for_each(|v| *v = v.max(0.0)),
    }
}

/// `d ← d ⊙ act'` given the activation's output `y` (tanh' = 1 − y², relu' = [y > 0], as libtorch's
/// backward kernels compute them from the output).
#[inline(always)]
fn activation_backward(activation: Activation, y: &[f32], d: &mut [f32]) {
    match activation {
        Activation::Tanh => d.iter_mut().zip(y).for_each(|(d, y)| *d *= 1.0 - y * y),
        // A select, not a conditional store: the store's branch kept this loop scalar (half the backward
        // pass's time on CartPole's DQN). Same values either way.
        Activation::Relu => d.iter_mut().zip(y).for_each(|(d, &y)| *d = if y <= 0.0 { 0.0 } else { *d }),
    }
}

/// `tanh` of every element, vectorised (16 lanes with AVX-512, 8 with AVX2). Within 2 ulp-ish of the true
/// value (absolute error < 1.5e-7 everywhere; tested against `f64::tanh`); same results with and without
/// AVX (no fused multiply-adds).
pub(crate) fn tanh_in_place(h: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            unsafe { tanh_avx512(h) };
            return;
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            unsafe { tanh_avx2(h) };
            return;
        }
    }
    h.iter_mut().for_each(|v| *v = tanh_lane(*v));
}

// The same loop compiled for wider vectors; lane for lane the same operations (no fused multiply-adds), so
// the same results on every CPU.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f")]
unsafe fn tanh_avx512(h: &mut [f32]) {
    h.iter_mut().for_each(|v| *v = tanh_lane(*v));
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn tanh_avx2(h: &mut [f32]) {
    h.iter_mut().for_each(|v| *v = tanh_lane(*v));
}

/// One lane of [`tanh_in_place`], branch-free so loops over it vectorise: `tanh a = m / (m + 2)` with
/// `m = e^{2a} − 1` for `a = |x|`, the sign put back at the end.
#[inline(always)]
fn tanh_lane(x: f32) -> f32 {
    let a = x.abs().min(10.0); // tanh(10) rounds to 1 in f32
    let m = expm1_lane(2.0 * a);
    let t = m / (m + 2.0);
    // `min` above turned NaN into 10; keep NaN (a non-finite loss must stay visible).
    if x.is_nan() { x } else { t.copysign(x) }
}

/// `e^y − 1` for `0 ≤ y ≤ 20`, branch-free and accurate near 0: `y = n ln 2 + r` with |r| ≤ ln2/2,
/// `e^r − 1` by its Taylor polynomial to r⁷, then `2ⁿ(e^r − 1) + (2ⁿ − 1)` with `2ⁿ` put in the exponent bits.
#[inline(always)]
fn expm1_lane(y: f32) -> f32 {
    const SHIFTER: f32 = 12_582_912.0; // 1.5 · 2²³: adding it rounds to an integer, kept in the low bits
    let shifted = y * std::f32::consts::LOG2_E + SHIFTER;
    let n = shifted - SHIFTER;
    // ln 2 split in two so n·LN2_HI is exact.
    let r = (y - n * 0.693_145_75) - n * 1.428_606_8e-6;
    let mut p = 1.0 / 5040.0f32;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    let em1_r = r + r * r * p;
    // 2ⁿ from the integer in `shifted`'s mantissa (no float→int conversion, which would not vectorise).
    let two_n = f32::from_bits(shifted.to_bits().wrapping_sub(SHIFTER.to_bits()).wrapping_add(127) << 23);
    two_n * em1_r + (two_n - 1.0)
}

/// The global L2 norm of `grad` and, when it is above `max_norm`, `grad` scaled to it — as
/// `torch.nn.utils.clip_grad_norm_` (and [`crate::params::FlatParams::clip_grad_norm`]): scale
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

/// The end of a fused step: clip `grad` to `max_grad_norm` and take `opt`'s Adam step on `theta`. A
/// non-finite gradient norm is an error naming `algorithm`, and no step is taken.
pub(crate) fn clip_and_step(
    theta: &mut [f32],
    grad: &mut [f32],
    opt: &mut crate::adam::Adam,
    max_grad_norm: f64,
    algorithm: &str,
) -> crate::Result<()> {
    let norm = clip_grad_norm(grad, max_grad_norm);
    if !norm.is_finite() {
        return Err(crate::Error::NonFinite(format!(
            "{algorithm}: gradient norm {norm} (non-finite loss); step not taken"
        )));
    }
    if !opt.step_host(theta, grad) {
        return Err(crate::Error::Unsupported(
            "fused CPU step: Adam moments are not host buffers of the model's size".into(),
        ));
    }
    Ok(())
}

/// One Adam step on host slices, the same arithmetic as [`crate::adam::Adam::step`] (`torch.optim.Adam`):
/// `m ← m + (1−β₁)(g − m)`, `v ← β₂v + (1−β₂)g²`, `θ ← θ − (lr/(1−β₁ᵗ)) · m / (√v/√(1−β₂ᵗ) + ε)`, with `t`
/// the step number (from 1).
#[allow(clippy::too_many_arguments)]
pub(crate) fn adam_step(
    theta: &mut [f32],
    grad: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    t: u64,
    lr: f64,
    (beta1, beta2, eps): (f64, f64, f64),
) {
    let bias1 = 1.0 - beta1.powi(t as i32);
    let bias2 = 1.0 - beta2.powi(t as i32);
    let k = AdamConstants {
        w1: (1.0 - beta1) as f32,
        b2: beta2 as f32,
        w2: (1.0 - beta2) as f32,
        step: (-lr / bias1) as f32,
        sqrt_bias2: bias2.sqrt() as f32,
        eps: eps as f32,
    };
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked just above).
            return unsafe { adam_avx512(theta, grad, m, v, &k) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { adam_avx2(theta, grad, m, v, &k) };
        }
    }
    adam_lanes(theta, grad, m, v, &k)
}

/// Adam's per-step scalars in f32.
struct AdamConstants {
    w1: f32,
    b2: f32,
    w2: f32,
    step: f32,
    sqrt_bias2: f32,
    eps: f32,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f")]
unsafe fn adam_avx512(theta: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32], k: &AdamConstants) {
    adam_lanes(theta, grad, m, v, k)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn adam_avx2(theta: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32], k: &AdamConstants) {
    adam_lanes(theta, grad, m, v, k)
}

/// The Adam loop, branch-free (it vectorises). Moments that decay below the smallest normal f32 are set to
/// 0: a parameter whose gradient stays 0 (a dead ReLU unit) would otherwise carry subnormal moments, on which
/// x86 arithmetic is ~100× slower; the step they would give is < 1e-30.
#[inline(always)]
fn adam_lanes(theta: &mut [f32], grad: &[f32], m: &mut [f32], v: &mut [f32], k: &AdamConstants) {
    for (((th, &g), m), v) in theta.iter_mut().zip(grad).zip(m.iter_mut()).zip(v.iter_mut()) {
        let mut m1 = *m + k.w1 * (g - *m);
        let mut v1 = *v * k.b2 + g * (g * k.w2);
        m1 = if m1.abs() < f32::MIN_POSITIVE { 0.0 } else { m1 };
        v1 = if v1 < f32::MIN_POSITIVE { 0.0 } else { v1 };
        *m = m1;
        *v = v1;
        *th += (m1 * k.step) / (v1.sqrt() / k.sqrt_bias2 + k.eps);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::FlatParams;
    use tch::{Device, Kind, Tensor};

    #[test]
    fn tanh_is_accurate_everywhere() {
        let mut worst = (0.0f64, 0.0f32);
        let mut x = -12.0f32;
        while x <= 12.0 {
            for v in [x, x * 1e-3, x * 1e-6] {
                let mut h = [v; 9]; // more than one AVX vector, and a tail
                tanh_in_place(&mut h);
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
        tanh_in_place(&mut odd);
        assert!(odd[0].is_nan() && odd[1] == 1.0 && odd[2] == -1.0 && odd[3] == 0.0, "{odd:?}");
    }

    /// Standard normal draws from libtorch's global generator, under the lock every seeded draw in this crate
    /// holds (other tests build networks on other threads at the same time).
    fn randn(shape: &[i64], seed: u64) -> Tensor {
        crate::nets::with_torch_seed(seed, || Tensor::randn(shape, (Kind::Float, Device::Cpu)))
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
            let x = randn(&[rows as i64, 5], 7000 + seed as u64);
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
            params.backward(&(&h * &up).sum(Kind::Float));
            let want_out: Vec<f32> = Vec::try_from(h.detach().flatten(0, -1)).unwrap();
            let want_grad: Vec<f32> = Vec::try_from(params.flat().grad().flatten(0, -1)).unwrap();
            // Host.
            let theta = params.host_values().unwrap().to_vec();
            let xs: Vec<f32> = Vec::try_from(x.flatten(0, -1)).unwrap();
            let ups: Vec<f32> = Vec::try_from(up.flatten(0, -1)).unwrap();
            let mut tape = TwinTape::default();
            twin_forward(&layers, activation, &theta, &xs, rows, 2, &mut tape);
            let got_out: Vec<f32> = [tape.out(0), tape.out(1)].concat();
            tape.d_out = [ups[..rows * 3].to_vec(), ups[rows * 3..].to_vec()];
            let mut grad = vec![f32::NAN; theta.len()];
            twin_backward(&layers, activation, &theta, &xs, 2, &mut tape, &mut grad);
            let close = |a: &[f32], b: &[f32], what: &str| {
                let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (i, (p, q)) in a.iter().zip(b).enumerate() {
                    assert!((p - q).abs() <= 2e-6 * scale, "{what}[{i}] ({activation:?}): {p} vs {q}");
                }
            };
            assert_eq!(got_out.len(), want_out.len());
            close(&got_out, &want_out, "output");
            close(&grad, &want_grad, "gradient");
        }
    }

    /// `sgemm` itself, for reference: `c = a·b + beta·c`.
    #[allow(clippy::too_many_arguments)]
    fn sgemm(
        m: usize,
        k: usize,
        n: usize,
        a: &[f32],
        sa: (usize, usize),
        b: &[f32],
        sb: (usize, usize),
        beta: f32,
        c: &mut [f32],
    ) {
        // SAFETY: the callers' operands are exactly these shapes.
        unsafe {
            matrixmultiply::sgemm(
                m,
                k,
                n,
                1.0,
                a.as_ptr(),
                sa.0 as isize,
                sa.1 as isize,
                b.as_ptr(),
                sb.0 as isize,
                sb.1 as isize,
                beta,
                c.as_mut_ptr(),
                n as isize,
                1,
            )
        }
    }

    /// Reproducible values in [−1, 1), some exactly 0 and some negative 0 (their signs must survive too).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                match i % 23 {
                    5 => 0.0,
                    11 => -0.0,
                    _ => (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0,
                }
            })
            .collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// [`gemm`] (its own kernel where the CPU has one) gives `sgemm`'s bits: shapes with tile and vector edges,
    /// `k` over one `sgemm` block (256), `a` either way round, with and without a bias; and `δ · Wᵀ`.
    #[test]
    fn gemm_is_sgemm_bit_for_bit() {
        let shapes = [
            (64, 256, 256),
            (256, 64, 256),
            (4, 64, 256),
            (64, 4, 256),
            (37, 5, 32),
            (24, 37, 33),
            (7, 300, 17),
            (13, 600, 70),
            (1, 1, 1),
            (9, 513, 49),
            (512, 64, 64),
        ];
        for (s, &(m, k, n)) in shapes.iter().enumerate() {
            let seed = 10 * s as u64;
            let (b, bias) = (values(k * n, seed + 1), values(n, seed + 2));
            for a_transposed in [false, true] {
                let a = values(m * k, seed + 3 + u64::from(a_transposed));
                let sa = if a_transposed { (1, m) } else { (k, 1) };
                let mut want = vec![0.0; m * n];
                sgemm(m, k, n, &a, sa, &b, (n, 1), 0.0, &mut want);
                let mut got = vec![f32::NAN; m * n];
                gemm(m, k, n, &a, sa, &b, (n, 1), Init::Zero, &mut got);
                assert_eq!(bits(&got), bits(&want), "{m}×{k}×{n}, a transposed {a_transposed}");
                let mut want: Vec<f32> = (0..m).flat_map(|_| bias.iter().copied()).collect();
                sgemm(m, k, n, &a, sa, &b, (n, 1), 1.0, &mut want);
                let mut got = vec![f32::NAN; m * n];
                gemm(m, k, n, &a, sa, &b, (n, 1), Init::Bias(&bias), &mut got);
                assert_eq!(bits(&got), bits(&want), "{m}×{k}×{n} + bias, a transposed {a_transposed}");
            }
        }
        // Products that underflow: the sums round to −0, which `sgemm` (AVX-512) keeps.
        for k in [1, 3] {
            let (a, b) = (vec![1e-30f32; 2 * k], vec![-1e-30f32; k * 17]);
            let mut want = vec![0.0; 2 * 17];
            sgemm(2, k, 17, &a, (k, 1), &b, (17, 1), 0.0, &mut want);
            let mut got = vec![f32::NAN; 2 * 17];
            gemm(2, k, 17, &a, (k, 1), &b, (17, 1), Init::Zero, &mut got);
            assert_eq!(bits(&got), bits(&want), "underflow, k = {k}");
        }
        for &(rows, fi, fo) in &[(64, 256, 256), (37, 24, 33), (64, 64, 64), (256, 300, 17), (5, 9, 16)] {
            let (delta, w) = (values(rows * fo, 7), values(fi * fo, 8));
            let mut want = vec![0.0; rows * fi];
            sgemm(rows, fo, fi, &delta, (fo, 1), &w, (1, fo), 0.0, &mut want);
            let (mut dt, mut dit, mut got) = (Vec::new(), Vec::new(), vec![f32::NAN; rows * fi]);
            delta_product(rows, fi, fo, &delta, &w, &mut dt, &mut dit, &mut got);
            assert_eq!(bits(&got), bits(&want), "δ·Wᵀ {rows}×{fo} · ({fi}×{fo})ᵀ");
        }
    }

    #[test]
    fn adam_and_clipping_match_the_libtorch_path() {
        let (mut params, _) = random_twin(&[3, 4, 2], 3);
        let mut theta = params.host_values().unwrap().to_vec();
        let mut adam = crate::adam::Adam::new(&params, 3e-3, 1e-5);
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
