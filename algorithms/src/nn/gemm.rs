//! The matrix products of the fused host step: [`gemm`] in f32 (`matrixmultiply`'s `sgemm`) and [`Bf16Gemm`],
//! the same product with its operands rounded to bf16 and the products summed in f32 — PyTorch's CPU autocast
//! for a linear layer, on the host (one `vdpbf16ps` does twice the products of an f32 fused multiply-add).
//!
//! With AVX512-BF16 both operands are rounded (to nearest even) and packed in pairs along the summed index `k`
//! — the left one as rows of pairs, broadcast one pair at a time; the right one in panels of 64 columns, 16
//! pairs to a vector. Without it (or with the host kernels capped below AVX-512,
//! [`crate::nn::lanes::LANES_VAR`]) the operands are rounded to bf16 values in f32 and multiplied by [`gemm`]:
//! the same products, summed in another order.

/// A matrix product's operands: `a` (`m × k`) and `b` (`k × n`), each with its (row, column) strides so transposed
/// operands cost nothing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Operands<'a> {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub a: &'a [f32],
    pub sa: (usize, usize),
    pub b: &'a [f32],
    pub sb: (usize, usize),
}

impl Operands<'_> {
    /// Panics unless `a`, `b` and `c` (row-major `m × n`) hold their shapes and `a`, `b` each have a unit
    /// stride (row-major or transposed).
    fn check(&self, c: &[f32]) {
        let extent = |rows: usize, cols: usize, (rs, cs): (usize, usize)| {
            if rows == 0 || cols == 0 { 0 } else { (rows - 1) * rs + (cols - 1) * cs + 1 }
        };
        let Operands { m, k, n, a, sa, b, sb } = *self;
        assert!(
            a.len() >= extent(m, k, sa) && b.len() >= extent(k, n, sb) && c.len() >= m * n,
            "gemm operand too short"
        );
        assert!((sa.0 == 1 || sa.1 == 1) && (sb.0 == 1 || sb.1 == 1), "gemm operand without a unit stride");
    }
}

/// `c = a·b + beta·c` in f32, `c` row-major `m × n`.
pub(crate) fn gemm(x: Operands<'_>, beta: f32, c: &mut [f32]) {
    x.check(c);
    let Operands { m, k, n, a, sa, b, sb } = x;
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: `check` keeps every index sgemm forms (row·rs + col·cs within the given shapes) inside the slices;
    // `c` does not alias `a` or `b` (a `&mut` borrow).
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

/// `x` rounded to the nearest bf16 (ties to even), as a value in f32; NaN stays NaN (quiet).
pub(crate) fn round_bf16(x: f32) -> f32 {
    let bits = x.to_bits();
    let high = if x.is_nan() { (bits >> 16) | 0x40 } else { (bits + 0x7fff + ((bits >> 16) & 1)) >> 16 };
    f32::from_bits(high << 16)
}

/// The bf16 matrix product and the buffers its packed operands live in, reused from call to call (a
/// training loop allocates only on its first step).
#[derive(Debug, Default, Clone)]
pub(crate) struct Bf16Gemm {
    /// The left operand's bf16 pairs (AVX512-BF16), or its rounded values (the fallback).
    a: Vec<u32>,
    /// The right operand's bf16 pairs in panels (AVX512-BF16), or its rounded values (the fallback).
    b: Vec<u32>,
    /// One column of a transposed right operand, in pairs.
    column: Vec<u32>,
    fa: Vec<f32>,
    fb: Vec<f32>,
}

impl Bf16Gemm {
    /// `c = a·b + beta·c` as [`gemm`] takes it, with `a` and `b` rounded to bf16 and the products summed in
    /// f32.
    pub(crate) fn gemm(&mut self, x: Operands<'_>, beta: f32, c: &mut [f32]) {
        x.check(c);
        if x.m == 0 || x.n == 0 {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if native() {
            // SAFETY: `native` checked that the CPU has AVX-512F, AVX-512BW and AVX512-BF16; `check` checked the
            // shapes the packing reads.
            unsafe { self.native(x, beta, c) };
            return;
        }
        self.fallback(x, beta, c);
    }

    /// The operands rounded into contiguous f32 copies, multiplied by [`gemm`].
    fn fallback(&mut self, x: Operands<'_>, beta: f32, c: &mut [f32]) {
        let Operands { m, k, n, a, sa, b, sb } = x;
        self.fa.clear();
        self.fa.extend((0..m).flat_map(|i| (0..k).map(move |j| round_bf16(a[i * sa.0 + j * sa.1]))));
        self.fb.clear();
        self.fb.extend((0..k).flat_map(|i| (0..n).map(move |j| round_bf16(b[i * sb.0 + j * sb.1]))));
        let rounded = Operands { a: &self.fa, sa: (k, 1), b: &self.fb, sb: (n, 1), ..x };
        gemm(rounded, beta, c);
    }

    /// The AVX512-BF16 product: both operands packed in bf16 pairs along `k`, then tiles of [`native::MR`] rows
    /// by one panel of [`native::NR`] columns.
    ///
    /// # Safety
    /// The CPU has AVX-512F, AVX-512BW and AVX512-BF16, and the operands passed [`Operands::check`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn native(&mut self, x: Operands<'_>, beta: f32, c: &mut [f32]) {
        use native::{MR, NR, pack_a, pack_b, tile};
        let Operands { m, k, n, a, sa, b, sb } = x;
        let kp = k.div_ceil(2);
        // SAFETY (all calls below): the caller's CPU features; every pointer formed stays inside the buffers
        // sized here (`pack_*` fill `kp` pairs per row or column, the tiles read `kp` pairs and write `rows ×
        // cols` of `c`).
        unsafe {
            let (ra, pa) = pack_a(m, k, a, sa, &mut self.a);
            pack_b(k, n, b, sb, &mut self.b, &mut self.column);
            for panel in 0..n.div_ceil(NR) {
                let col0 = panel * NR;
                let cols = NR.min(n - col0);
                let bp = self.b.as_ptr().add(panel * kp * NR);
                let mut i = 0;
                while i < m {
                    let ap = self.a.as_ptr().add(i * ra);
                    let cp = c.as_mut_ptr().add(i * n + col0);
                    let rows = MR.min(m - i);
                    match rows {
                        MR => tile::<MR>(kp, ap, ra, pa, bp, cp, n, cols, beta),
                        5 => tile::<5>(kp, ap, ra, pa, bp, cp, n, cols, beta),
                        4 => tile::<4>(kp, ap, ra, pa, bp, cp, n, cols, beta),
                        3 => tile::<3>(kp, ap, ra, pa, bp, cp, n, cols, beta),
                        2 => tile::<2>(kp, ap, ra, pa, bp, cp, n, cols, beta),
                        _ => tile::<1>(kp, ap, ra, pa, bp, cp, n, cols, beta),
                    }
                    i += rows;
                }
            }
        }
    }
}

/// Whether [`Bf16Gemm`] runs the AVX512-BF16 kernel: the CPU has it and the host kernels are not capped below
/// AVX-512 ([`crate::nn::lanes::LANES_VAR`]).
#[cfg(target_arch = "x86_64")]
pub(crate) fn native() -> bool {
    static NATIVE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *NATIVE.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512bf16")
            && matches!(crate::nn::lanes::lanes(), Ok(crate::nn::lanes::Lanes::Avx512))
    })
}

#[cfg(target_arch = "x86_64")]
mod native {
    use std::arch::x86_64::*;

    /// Vectors of 16 columns per panel of the right operand.
    const NV: usize = 4;
    /// Columns per panel.
    pub(super) const NR: usize = 16 * NV;
    /// Rows per tile: `MR × NV` sums, `NV` panel vectors and one broadcast fill 29 of the 32 vector registers.
    pub(super) const MR: usize = 6;

    /// Mask of the first `n` (≤ 16) lanes.
    #[inline(always)]
    fn first(n: usize) -> __mmask16 {
        if n >= 16 { 0xffff } else { (1u16 << n) - 1 }
    }

    /// `out[j]` = the pair (`r0[j]`, `r1[j]`) in bf16 (`r0` in the low half; 0 for a missing `r1`), for
    /// `j < out.len()`.
    ///
    /// # Safety
    /// AVX-512F/BW/BF16; `r0` (and `r1`) hold at least `out.len()` values.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn pairs_of_rows(r0: *const f32, r1: Option<*const f32>, out: &mut [u32]) {
        // Word 2j from the first row's bf16 (words 0–15 after the conversion), 2j + 1 from the second's (16–31).
        let idx: [i16; 32] = [
            0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14,
            30, 15, 31,
        ];
        unsafe {
            let idx = _mm512_loadu_si512(idx.as_ptr() as *const _);
            let mut j = 0;
            while j < out.len() {
                let mask = first(out.len() - j);
                let lo = _mm512_maskz_loadu_ps(mask, r0.add(j));
                let hi = match r1 {
                    Some(r1) => _mm512_maskz_loadu_ps(mask, r1.add(j)),
                    None => _mm512_setzero_ps(),
                };
                let both: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
                let pairs = _mm512_permutexvar_epi16(idx, both);
                _mm512_mask_storeu_epi32(out.as_mut_ptr().add(j) as *mut _, mask, pairs);
                j += 16;
            }
        }
    }

    /// `out[j]` = the pair (`r[2j]`, `r[2j + 1]`) in bf16, for the `len` values of `r` (`out.len()` =
    /// ⌈len / 2⌉; 0 in the high half past the end).
    ///
    /// # Safety
    /// AVX-512F/BF16; `r` holds `len` values.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn pairs_in_row(r: *const f32, len: usize, out: &mut [u32]) {
        debug_assert_eq!(out.len(), len.div_ceil(2));
        unsafe {
            let mut j = 0;
            while j < out.len() {
                let at = 2 * j;
                let left = len - at;
                let lo = _mm512_maskz_loadu_ps(first(left), r.add(at));
                let hi = _mm512_maskz_loadu_ps(first(left.saturating_sub(16)), r.add(at + 16.min(left)));
                // The 32 values in order: word 2i and 2i + 1 are values 2i and 2i + 1, one pair per u32.
                let pairs: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
                _mm512_mask_storeu_epi32(out.as_mut_ptr().add(j) as *mut _, first(out.len() - j), pairs);
                j += 16;
            }
        }
    }

    /// `a` (`m × k`, strides `sa`) packed in bf16 pairs along `k` into `out`; returns the strides (row, pair)
    /// of the packing: rows of pairs for a row-major `a`, pairs of rows for a transposed one.
    ///
    /// # Safety
    /// AVX-512F/BW/BF16; `a` holds its shape.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn pack_a(
        m: usize,
        k: usize,
        a: &[f32],
        (rs, cs): (usize, usize),
        out: &mut Vec<u32>,
    ) -> (usize, usize) {
        let kp = k.div_ceil(2);
        out.resize(m * kp, 0);
        unsafe {
            if cs == 1 {
                for (i, row) in out.chunks_exact_mut(kp).enumerate() {
                    pairs_in_row(a.as_ptr().add(i * rs), k, row);
                }
                (kp, 1)
            } else {
                // `rs == 1` (`Operands::check`).
                for (p, row) in out.chunks_exact_mut(m).enumerate() {
                    let r0 = a.as_ptr().add(2 * p * cs);
                    let r1 = (2 * p + 1 < k).then(|| a.as_ptr().add((2 * p + 1) * cs));
                    pairs_of_rows(r0, r1, row);
                }
                (1, m)
            }
        }
    }

    /// `b` (`k × n`, strides `sb`) packed into panels of [`NR`] columns, each `⌈k / 2⌉` rows of `NR` bf16 pairs
    /// (columns past `n` zero).
    ///
    /// # Safety
    /// AVX-512F/BW/BF16; `b` holds its shape.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn pack_b(
        k: usize,
        n: usize,
        b: &[f32],
        (rs, cs): (usize, usize),
        out: &mut Vec<u32>,
        column: &mut Vec<u32>,
    ) {
        let kp = k.div_ceil(2);
        let panels = n.div_ceil(NR);
        out.resize(panels * kp * NR, 0);
        let tail = n - (panels - 1) * NR;
        if tail < NR {
            // The last panel's columns past `n`: zero, so its sums there are zero (never stored).
            for p in 0..kp {
                out[((panels - 1) * kp + p) * NR + tail..][..NR - tail].fill(0);
            }
        }
        unsafe {
            if cs == 1 {
                for p in 0..kp {
                    let r0 = b.as_ptr().add(2 * p * rs);
                    let r1 = (2 * p + 1 < k).then(|| b.as_ptr().add((2 * p + 1) * rs));
                    for panel in 0..panels {
                        let cols = NR.min(n - panel * NR);
                        let dst = &mut out[(panel * kp + p) * NR..][..cols];
                        pairs_of_rows(r0.add(panel * NR), r1.map(|r| r.add(panel * NR)), dst);
                    }
                }
            } else {
                // `rs == 1` (`Operands::check`): column `j`'s values are contiguous: pair them along it, then
                // scatter into the panel.
                column.resize(kp, 0);
                for j in 0..n {
                    pairs_in_row(b.as_ptr().add(j * cs), k, column);
                    let (panel, c) = (j / NR, j % NR);
                    let base = panel * kp * NR + c;
                    for (p, &v) in column.iter().enumerate() {
                        *out.get_unchecked_mut(base + p * NR) = v;
                    }
                }
            }
        }
    }

    /// `ROWS` rows × one panel of `c` (`cols` ≤ [`NR`] valid columns, row stride `ldc`) = `beta·c` + the sums
    /// over `kp` pairs of `ap` (row `r`, pair `p` at `ap[r·ra + p·pa]`) and the panel `bp`.
    ///
    /// # Safety
    /// AVX-512F/BW/BF16; `ap`, `bp` and `c` hold what those strides reach.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tile<const ROWS: usize>(
        kp: usize,
        ap: *const u32,
        ra: usize,
        pa: usize,
        bp: *const u32,
        c: *mut f32,
        ldc: usize,
        cols: usize,
        beta: f32,
    ) {
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); NV]; ROWS];
            for p in 0..kp {
                let row = bp.add(p * NR);
                let mut b = [std::mem::transmute::<__m512i, __m512bh>(_mm512_setzero_si512()); NV];
                for (v, b) in b.iter_mut().enumerate() {
                    *b = std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(row.add(16 * v) as *const _));
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let pair = *ap.add(r * ra + p * pa);
                    let a = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(pair as i32));
                    for v in 0..NV {
                        acc[v] = _mm512_dpbf16_ps(acc[v], a, b[v]);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                for (v, &sum) in acc.iter().enumerate() {
                    let col = 16 * v;
                    if col >= cols {
                        break;
                    }
                    let mask = first(cols - col);
                    let dst = c.add(r * ldc + col);
                    let out = if beta == 0.0 {
                        sum
                    } else {
                        _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(mask, dst), sum)
                    };
                    _mm512_mask_storeu_ps(dst, mask, out);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reproducible value in about [−2, 2) for index `i` of stream `seed`.
    fn value(seed: u64, i: usize) -> f32 {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (i as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x ^= x >> 31;
        x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^= x >> 29;
        (x >> 40) as f32 / (1u64 << 22) as f32 - 2.0
    }

    #[test]
    fn rounding_to_bf16_is_to_nearest_even() {
        assert_eq!(round_bf16(1.0), 1.0);
        // 1 + 2⁻⁸ is halfway between 1 and 1 + 2⁻⁷: ties go to the even mantissa (1).
        assert_eq!(round_bf16(1.0 + 1.0 / 256.0), 1.0);
        assert_eq!(round_bf16(1.0 + 3.0 / 256.0), 1.0 + 4.0 / 256.0);
        assert_eq!(round_bf16(1.0 + 1.0 / 256.0 + 1e-6), 1.0 + 2.0 / 256.0);
        assert_eq!(round_bf16(-3.0), -3.0);
        assert!(round_bf16(f32::NAN).is_nan());
        assert_eq!(round_bf16(f32::INFINITY), f32::INFINITY);
    }

    /// Every shape and stride the fused step uses (and tails of rows, columns and an odd `k`): the product
    /// equals the exact sums of the bf16-rounded operands to f32 summation rounding, both with the CPU's kernel
    /// (AVX512-BF16 where it has it) and the fallback; and it differs from the f32 product (bf16 ran).
    #[test]
    fn the_bf16_product_is_the_product_of_the_rounded_operands() {
        let mut g = Bf16Gemm::default();
        // (m, k, n, a transposed, b transposed, beta)
        let cases = [
            (64, 256, 256, false, false, 1.0),
            (128, 4, 256, false, false, 1.0),
            (256, 64, 256, true, false, 0.0),
            (4, 64, 256, true, false, 0.0),
            (64, 256, 256, false, true, 0.0),
            (7, 33, 19, false, false, 0.5),
            (13, 17, 70, true, true, 1.0),
            (1, 1, 1, false, false, 0.0),
            (9, 5, 130, false, true, 1.0),
        ];
        for (case, &(m, k, n, at, bt, beta)) in cases.iter().enumerate() {
            let a: Vec<f32> = (0..m * k).map(|i| value(2 * case as u64, i)).collect();
            let b: Vec<f32> = (0..k * n).map(|i| value(2 * case as u64 + 1, i) * 0.1).collect();
            let c0: Vec<f32> = (0..m * n).map(|i| value(99, i)).collect();
            let sa = if at { (1, m) } else { (k, 1) };
            let sb = if bt { (1, k) } else { (n, 1) };
            let mut exact = vec![0f64; m * n];
            let mut scale = vec![0f64; m * n];
            for i in 0..m {
                for j in 0..n {
                    let mut s = beta as f64 * c0[i * n + j] as f64;
                    let mut abs = s.abs();
                    for l in 0..k {
                        let p = round_bf16(a[i * sa.0 + l * sa.1]) as f64 * round_bf16(b[l * sb.0 + j * sb.1]) as f64;
                        s += p;
                        abs += p.abs();
                    }
                    exact[i * n + j] = s;
                    scale[i * n + j] = abs;
                }
            }
            let x = Operands { m, k, n, a: &a, sa, b: &b, sb };
            let mut f32s = c0.clone();
            gemm(x, beta, &mut f32s);
            let mut runs = vec![("cpu", {
                let mut c = c0.clone();
                g.gemm(x, beta, &mut c);
                c
            })];
            let mut c = c0.clone();
            g.fallback(x, beta, &mut c);
            runs.push(("fallback", c));
            for (name, c) in runs {
                for i in 0..m * n {
                    let tol = 1e-6 * (k as f64 + 2.0) * scale[i] + 1e-30;
                    assert!(
                        (c[i] as f64 - exact[i]).abs() <= tol,
                        "case {case} {name} [{i}]: {} vs exact {} (tol {tol})",
                        c[i],
                        exact[i]
                    );
                }
                if k > 1 {
                    assert_ne!(c, f32s, "case {case} {name}: bf16 rounding shows");
                }
            }
        }
    }
}
