//! The acting forward pass of the MLP networks on the CPU without libtorch: a small batch is about a
//! microsecond here against tens through libtorch, and actors spend nearly all their CPU acting. These functions
//! read the networks' [`FlatParams`](crate::nn::params::FlatParams) buffer in place (new weights show at once);
//! results agree with the libtorch forward pass to float rounding.
use crate::nn::activation::Activation;

/// Buffers reused between forward passes (hidden activations), so acting does not allocate.
#[derive(Debug, Default, Clone)]
pub struct HostScratch {
    pub(crate) a: Vec<f32>,
    pub(crate) b: Vec<f32>,
}

/// `out = x · w + b` for `rows` rows: `x` is `rows × fan_in`, `w` is `fan_in × fan_out` (row-major, the layout
/// `addmm` takes), `b` is `fan_out`. The inner loop runs along a row of `w`, contiguous, so it vectorises.
pub(crate) fn dense(x: &[f32], rows: usize, w: &[f32], b: &[f32], out: &mut Vec<f32>) {
    let fan_out = b.len();
    let fan_in = w.len() / fan_out;
    debug_assert_eq!(x.len(), rows * fan_in);
    out.clear();
    out.resize(rows * fan_out, 0.0);
    for (xr, o) in x.chunks_exact(fan_in).zip(out.chunks_exact_mut(fan_out)) {
        o.copy_from_slice(b);
        for (xk, wk) in xr.iter().zip(w.chunks_exact(fan_out)) {
            for (oj, wj) in o.iter_mut().zip(wk) {
                *oj += xk * wj;
            }
        }
    }
}

/// An MLP of `layers.len()` dense layers, `(weight, bias)` each, on `x` (`rows × inputs`): `activation` after
/// every layer but the last; the output goes to `out`.
pub(crate) fn mlp<'w>(
    layers: impl ExactSizeIterator<Item = (&'w [f32], &'w [f32])>,
    activation: Activation,
    x: &[f32],
    rows: usize,
    scratch: &mut HostScratch,
    out: &mut Vec<f32>,
) {
    let last = layers.len() - 1;
    let HostScratch { a, b } = scratch;
    for (k, (w, bias)) in layers.enumerate() {
        let input: &[f32] = if k == 0 { x } else { a };
        if k == last {
            dense(input, rows, w, bias, out);
        } else {
            dense(input, rows, w, bias, b);
            activation.apply_host(b);
            std::mem::swap(a, b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_is_x_times_w_plus_b() {
        // x = [[1, 2], [3, 4]], w = [[1, 0, 2], [0, 1, 3]], b = [0.5, -1, 0]
        let (x, w, b) = ([1.0f32, 2.0, 3.0, 4.0], [1.0f32, 0.0, 2.0, 0.0, 1.0, 3.0], [0.5f32, -1.0, 0.0]);
        let mut out = Vec::new();
        dense(&x, 2, &w, &b, &mut out);
        assert_eq!(out, vec![1.5, 1.0, 8.0, 3.5, 3.0, 18.0]);
    }

    #[test]
    fn mlp_applies_the_activation_between_layers_only() {
        // 1 → 1 → 1: y = w2 · act(w1 x + b1) + b2 with w1 = −1, b1 = 0, w2 = 2, b2 = 1.
        let layers = [(&[-1.0f32][..], &[0.0f32][..]), (&[2.0f32][..], &[1.0f32][..])];
        let mut out = Vec::new();
        let mut s = HostScratch::default();
        mlp(layers.iter().copied(), Activation::Relu, &[3.0, -3.0], 2, &mut s, &mut out);
        assert_eq!(out, vec![1.0, 7.0]);
        mlp(layers.iter().copied(), Activation::Tanh, &[0.5], 1, &mut s, &mut out);
        assert!((out[0] - (2.0 * (-0.5f32).tanh() + 1.0)).abs() < 1e-7);
    }
}
