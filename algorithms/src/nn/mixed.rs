//! Mixed precision for the MLP updates: one dense layer in f32 or, as PyTorch's CPU autocast runs it, in bf16.
use tch::Tensor;

/// One dense layer of a training forward pass, `x · w + b`: `addmm`, or `baddbmm` for stacked members'
/// `[N, …]` operands. With `bf16` as PyTorch's CPU autocast runs a linear layer: `x`, `w` and `b` cast to bf16,
/// the product in bf16 (oneDNN's AVX512-BF16 kernels, accumulating in f32), a bf16 output; the cast is
/// differentiable, so gradients reach the f32 parameters as f32. Without it the layer is f32, its input cast
/// back from bf16 where the layer before ran in bf16. MLPs run their hidden layers with the setting and their
/// output layer in f32 (a Q-value or an action mean keeps f32's resolution).
pub(crate) fn dense(x: &Tensor, w: &Tensor, b: &Tensor, bf16: bool) -> Tensor {
    let kind = if bf16 { tch::Kind::BFloat16 } else { tch::Kind::Float };
    let cast = |t: &Tensor| if t.kind() == kind { t.shallow_clone() } else { t.to_kind(kind) };
    let (x, w, b) = (cast(x), cast(w), cast(b));
    if w.dim() == 3 { b.baddbmm(&x, &w, 1.0, 1.0) } else { b.addmm(&x, &w) }
}

/// An MLP's training forward pass on `x`: `layers` [`dense`] layers, layer `k`'s weight and bias
/// `param(k, low)` (`low`: that layer runs in bf16, the hidden layers where `bf16`), `activate` between them.
pub(crate) fn mlp(
    layers: usize,
    param: impl Fn(usize, bool) -> (Tensor, Tensor),
    activate: impl Fn(&Tensor) -> Tensor,
    x: &Tensor,
    bf16: bool,
) -> Tensor {
    let mut h = x.shallow_clone();
    for k in 0..layers {
        let low = bf16 && k + 1 < layers;
        let (w, b) = param(k, low);
        h = dense(&h, &w, &b, low);
        if k + 1 < layers {
            h = activate(&h);
        }
    }
    h
}
