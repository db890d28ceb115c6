//! The member axis: a population's parameter buffers stacked as the rows of one `[N, P]` tensor, so that one
//! update trains every member at once (a single run is a population of one). Knows no network and no
//! algorithm: per-member coefficients ([`Coef`]), each parameter's `[N, …]` view of the rows, the members'
//! gradients from one backward pass, and per-member gradient clipping.
use tch::{Kind, Tensor};

use crate::nn::params::FlatParams;
use crate::{Error, Result};

/// A coefficient of an update on the member axis: one value for every member (`One`, applied as a scalar, op
/// for op as a single run's update), or each member's own (`Each`, an `[N]` tensor, applied along the leading
/// axis of whatever it meets).
#[derive(Debug)]
pub(crate) enum Coef {
    /// The same value for all members.
    One(f64),
    /// Member `k`'s value at `[k]`.
    Each(Tensor),
}

impl Coef {
    /// Each member's value from `values`: [`Coef::One`] for a single member, else [`Coef::Each`] on `device`.
    pub(crate) fn of(values: impl ExactSizeIterator<Item = f64>, device: tch::Device) -> Coef {
        if values.len() == 1 {
            let v: Vec<f64> = values.collect();
            return Coef::One(v[0]);
        }
        Coef::Each(per_member(values, device))
    }

    /// A member's value where it meets `t` (`[N, …]`): shaped `[N, 1, …]` to broadcast over `t`'s other axes.
    fn along(c: &Tensor, t: &Tensor) -> Tensor {
        let mut shape = vec![1i64; t.dim().max(1)];
        shape[0] = -1;
        c.view(shape.as_slice())
    }

    /// `t · c`, member by member.
    pub(crate) fn mul(&self, t: &Tensor) -> Tensor {
        match self {
            Coef::One(c) => t * *c,
            Coef::Each(c) => t * Coef::along(c, t),
        }
    }

    /// `t ← t · c` in place, member by member.
    pub(crate) fn mul_(&self, t: &mut Tensor) {
        let _ = match self {
            Coef::One(c) => t.g_mul_scalar_(*c),
            Coef::Each(c) => t.g_mul_(&Coef::along(c, t)),
        };
    }

    /// `t + c`, member by member.
    pub(crate) fn add(&self, t: &Tensor) -> Tensor {
        match self {
            Coef::One(c) => t + *c,
            Coef::Each(c) => t + Coef::along(c, t),
        }
    }

    /// `t` clamped to `[c₀ − c, c₀ + c]` (`c` ≥ 0), member by member.
    pub(crate) fn clamp_around(&self, t: &Tensor, centre: f64) -> Tensor {
        match self {
            Coef::One(c) => t.clamp(centre - c, centre + c),
            Coef::Each(c) => {
                let c = Coef::along(c, t);
                t.clamp_tensor(Some(&(-&c + centre)), Some(&(&c + centre)))
            }
        }
    }
}

/// `[N]` f32 values on `device`.
pub(crate) fn per_member(values: impl Iterator<Item = f64>, device: tch::Device) -> Tensor {
    let v: Vec<f32> = values.map(|x| x as f32).collect();
    Tensor::from_slice(&v).to_device(device)
}

/// A `[N]` (or `[N, …]`) tensor's values on the host, as f64.
pub(crate) fn host(t: &Tensor) -> Result<Vec<f64>> {
    Ok(Vec::<f64>::try_from(t.detach().to_kind(Kind::Double).flatten(0, -1))?)
}

/// Tensors of one shape stacked on a new leading member axis; one alone gets a view, not a copy.
pub(crate) fn stack(mut v: Vec<Tensor>) -> Tensor {
    if v.len() == 1 {
        return v.pop().expect("one").unsqueeze(0);
    }
    Tensor::stack(&v, 0)
}

/// Each row of `x` (`[N, B]`) to zero mean and unit variance (unbiased std, 1e-8 guard), as a single run
/// normalises advantages.
pub(crate) fn normalize_rows(x: &Tensor) -> Tensor {
    (x - x.mean_dim(1, true, Kind::Float)) / (x.std_dim(1, true, true) + 1e-8)
}

/// Each parameter of `layout` (a member's buffer) as a view `[N, shape…]` of `stacked` (`[N, P]`, the members'
/// buffers as rows).
pub(crate) fn member_views(stacked: &Tensor, layout: &FlatParams) -> Vec<Tensor> {
    let n_members = stacked.size()[0];
    (0..layout.names().count())
        .map(|i| {
            let v = layout.view(i);
            let mut shape = vec![n_members];
            shape.extend(v.size());
            stacked.narrow(1, layout.offset(i) as i64, v.numel() as i64).view(shape.as_slice())
        })
        .collect()
}

/// The gradient of the members' summed losses (`losses`, `[N]`: each member's gradient is its own) with
/// respect to `views`, written into `grad_views` (zero where a loss does not reach), as `FlatParams::backward`.
pub(crate) fn backward_into(losses: &Tensor, views: &[Tensor], grad_views: &[Tensor]) {
    let grads = Tensor::run_backward(&[losses.sum(Kind::Float)], views, false, false);
    tch::no_grad(|| {
        for (dst, g) in grad_views.iter().zip(&grads) {
            let mut dst = dst.shallow_clone();
            if g.defined() {
                dst.copy_(g);
            } else {
                let _ = dst.zero_();
            }
        }
    });
}

/// Clip each member's gradient (a row of `grad`, `[N, P]`) to its own global-norm limit, as
/// `FlatParams::clip_grad_norm` does (1e-6 guard); a non-finite norm is an error naming the member.
pub(crate) fn clip_per_member(grad: &Tensor, max_norms: &[f64], algorithm: &str) -> Result<()> {
    let norms = Vec::<f32>::try_from(tch::no_grad(|| grad.norm_scalaropt_dim(2, [1i64].as_slice(), false)))?;
    let mut coefs = Vec::with_capacity(norms.len());
    for (k, (&norm, &max_norm)) in norms.iter().zip(max_norms).enumerate() {
        let norm = norm as f64;
        if !norm.is_finite() {
            return Err(Error::NonFinite(format!(
                "{algorithm} population member {k}: gradient norm {norm} (non-finite loss); step not taken"
            )));
        }
        let coef = max_norm / (norm + 1e-6);
        coefs.push(if coef < 1.0 { coef } else { 1.0 });
    }
    if coefs.iter().any(|&c| c < 1.0) {
        let coef = per_member(coefs.into_iter(), grad.device()).unsqueeze(1);
        let mut g = grad.shallow_clone();
        let _ = tch::no_grad(|| g.g_mul_(&coef));
    }
    Ok(())
}

/// Largest |a − b| over the largest |b|, of two flat buffers (the tests' measure of "matches its run alone").
#[cfg(test)]
pub(crate) fn rel_diff(a: &Tensor, b: &Tensor) -> f64 {
    let d = f64::try_from((a - b).abs().max()).unwrap();
    d / f64::try_from(b.abs().max()).unwrap().max(1e-30)
}
