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
    pub(crate) fn of(mut values: impl ExactSizeIterator<Item = f64>, device: tch::Device) -> Coef {
        if values.len() == 1 {
            return Coef::One(values.next().expect("one value"));
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
    to_device_async(Tensor::from_slice(&v), device)
}

/// A host tensor onto `device` without waiting for the GPU's stream (a non-blocking copy from pageable memory is
/// staged by the CUDA driver at once, so the host buffer may go right away); as it is on the CPU.
pub(crate) fn to_device_async(t: Tensor, device: tch::Device) -> Tensor {
    match device {
        tch::Device::Cuda(_) => t.to_device_(device, t.kind(), true, false),
        _ => t.to_device(device),
    }
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

/// Clip each member's gradient (a row of `grad`, `[N, P]`) to its own global-norm limit: [`clip_per_member_lazily`]
/// and an immediate [`check_finite`].
pub(crate) fn clip_per_member(grad: &Tensor, max_norms: &[f64], algorithm: &str) -> Result<()> {
    let mut nonfinite = Tensor::zeros([max_norms.len() as i64], (Kind::Bool, grad.device()));
    clip_per_member_lazily(grad, max_norms, &mut nonfinite);
    check_finite(&nonfinite, algorithm)
}

/// Each member's gradient clipped without waiting for the GPU: every row scaled by `min(1, max_norm / (norm +
/// 1e-6))` computed on the device in f64 (`FlatParams::clip_grad_norm`'s arithmetic), a non-finite norm recorded
/// in `nonfinite` (`[N]` bool) for the caller to check ([`check_finite`]) before it applies the update.
pub(crate) fn clip_per_member_lazily(grad: &Tensor, max_norms: &[f64], nonfinite: &mut Tensor) {
    tch::no_grad(|| {
        let norms = grad.norm_scalaropt_dim(2, [1i64].as_slice(), false).to_kind(Kind::Double);
        let limits = to_device_async(Tensor::from_slice(max_norms), grad.device());
        let coef = (limits / (&norms + 1e-6)).clamp_max(1.0).to_kind(Kind::Float).unsqueeze(1);
        let mut g = grad.shallow_clone();
        let _ = g.g_mul_(&coef);
        let _ = nonfinite.logical_or_(&norms.isfinite().logical_not());
    });
}

/// An error naming the first member whose gradient norm [`clip_per_member_lazily`] found non-finite (one
/// copy to the host: call it once per update, before the update is applied).
pub(crate) fn check_finite(nonfinite: &Tensor, algorithm: &str) -> Result<()> {
    let flags = Vec::<bool>::try_from(nonfinite.to_device(tch::Device::Cpu))?;
    match flags.iter().position(|&bad| bad) {
        None => Ok(()),
        Some(k) => Err(Error::NonFinite(format!(
            "{algorithm} population member {k}: non-finite gradient norm (non-finite loss); update not applied"
        ))),
    }
}

/// The `[N, P]` tensor (no gradient) whose rows `buffers` are, in order: each a contiguous `[P]` view of one
/// storage, buffer `k` at `k · P` elements from the first; `None` where they are not.
fn rows_base(buffers: &[&Tensor]) -> Option<Tensor> {
    let first = buffers.first()?;
    let (n, p) = (buffers.len() as i64, first.numel() as i64);
    let row_bytes = first.kind().elt_size_in_bytes() * p as usize;
    let start = first.data_ptr() as usize;
    let in_place = |(k, b): (usize, &&Tensor)| {
        b.dim() == 1
            && b.numel() as i64 == p
            && b.is_contiguous()
            && b.kind() == first.kind()
            && b.device() == first.device()
            && b.data_ptr() as usize == start + k * row_bytes
    };
    if p == 0 || !buffers.iter().enumerate().all(in_place) {
        return None;
    }
    // libtorch refuses a view past the end of the first's storage: where it allows `[N, P]` from there, every
    // buffer's address lies inside that one storage (another live allocation cannot), so each is its row.
    first.detach().f_as_strided([n, p], [p, 1], None).ok()
}

/// The members' parameter buffers (one layout) as the rows of one `[N, P]` tensor (no gradient) that each buffer
/// is a view of: the stack they are rows of already (the last batched update's), else a new one that each
/// buffer moves into once ([`FlatParams::move_into`]). Writing a row in place writes that member's parameters:
/// a batched update steps the members themselves, with nothing to stack before it or write back after.
pub(crate) fn shared_rows(members: &mut [&mut FlatParams]) -> Tensor {
    shared(members, FlatParams::flat, FlatParams::move_into)
}

/// [`shared_rows`] for plain `[P]` tensors (optimiser states): where they are not rows of one stack already, each
/// is replaced by its row (a view) of a new stack of their values.
pub(crate) fn shared_tensor_rows(tensors: &mut [&mut Tensor]) -> Tensor {
    shared(
        tensors,
        |t| t,
        |t, row| {
            tch::no_grad(|| row.shallow_clone().copy_(t));
            *t = row.shallow_clone();
        },
    )
}

/// The stack that `items`' buffers (`buffer`) are rows of ([`rows_base`]), else a new one that each moves into
/// (`move_into`: its values copied into its row, and it is that row from then on).
fn shared<T>(items: &mut [&mut T], buffer: fn(&T) -> &Tensor, move_into: fn(&mut T, &Tensor)) -> Tensor {
    let buffers: Vec<&Tensor> = items.iter().map(|i| buffer(i)).collect();
    if let Some(base) = rows_base(&buffers) {
        return base;
    }
    let first = buffers[0];
    let base = Tensor::empty([items.len() as i64, first.numel() as i64], (first.kind(), first.device()));
    for (k, item) in items.iter_mut().enumerate() {
        move_into(item, &base.get(k as i64));
    }
    base
}

/// Copies of tensors that an update changes in place (the members' shared rows, their optimiser states), to put
/// back if it fails: what keeps a batched update all or nothing without a copy per member.
pub(crate) struct Snapshot(Vec<(Tensor, Tensor)>);

impl Snapshot {
    /// The values of `tensors` now.
    pub(crate) fn of(tensors: &[&Tensor]) -> Snapshot {
        Snapshot(tch::no_grad(|| tensors.iter().map(|t| (t.shallow_clone(), t.detach().copy())).collect()))
    }

    /// Every tensor back to its value when the snapshot was taken.
    pub(crate) fn restore(&self) {
        tch::no_grad(|| {
            for (t, before) in &self.0 {
                t.shallow_clone().copy_(before);
            }
        });
    }
}

/// Members' parameter buffers of one layout as one `[N, P]` leaf that shares their storage ([`shared_rows`]),
/// seen as each parameter's `[N, …]` view ([`member_views`]), with a `[N, P]` gradient buffer beside it.
pub(crate) struct Rows {
    /// Every member's parameters, `[N, P]`, requiring grad: the members' own buffers (in place steps of it
    /// are theirs).
    pub(crate) params: Tensor,
    /// Every member's gradient after [`Rows::backward`], `[N, P]`.
    pub(crate) grad: Tensor,
    /// Each parameter's `[N, …]` view of `params`.
    pub(crate) views: Vec<Tensor>,
    grad_views: Vec<Tensor>,
    /// Per member (`[N]` bool): a gradient norm was non-finite since the rows were made
    /// ([`clip_per_member_lazily`]).
    pub(crate) nonfinite: Tensor,
}

impl Rows {
    /// The members' parameters as rows of one leaf (one layout: the first's), their storage shared.
    pub(crate) fn of(members: &mut [&mut FlatParams]) -> Rows {
        let params = shared_rows(members).detach().set_requires_grad(true);
        let grad = params.zeros_like().detach();
        let views = member_views(&params, members[0]);
        let grad_views = member_views(&grad, members[0]);
        let nonfinite = Tensor::zeros([members.len() as i64], (Kind::Bool, params.device()));
        Rows { params, grad, views, grad_views, nonfinite }
    }

    /// Each member's gradient of its loss (`losses`, `[N]`; the gradient of their sum) into [`Rows::grad`] (zero
    /// where a loss does not reach), as `FlatParams::backward`.
    pub(crate) fn backward(&self, losses: &Tensor) {
        let grads = Tensor::run_backward(&[losses.sum(Kind::Float)], &self.views, false, false);
        tch::no_grad(|| {
            for (dst, g) in self.grad_views.iter().zip(&grads) {
                let mut dst = dst.shallow_clone();
                if g.defined() {
                    dst.copy_(g);
                } else {
                    let _ = dst.zero_();
                }
            }
        });
    }
}

/// A copy of the members' current parameters to run forward only (acting and valuing passes: no `[N, P]` rows,
/// no gradient): each parameter as one contiguous `[N, …]` tensor, so that a pass merges its leading axes for
/// free (a view of `[N, P]` rows is strided by a whole buffer: every pass would copy it).
pub(crate) fn frozen(members: &[&FlatParams]) -> Vec<Tensor> {
    // The members' shared rows where a batched update made them ([`shared_rows`]): no stack to make. Else
    // stacked without a graph, so without a detached handle per member first (~0.3 µs each: ~1.2 ms of host
    // time per stack of 2,048 members' two nets).
    let flats: Vec<&Tensor> = members.iter().map(|m| m.flat()).collect();
    tch::no_grad(|| {
        let rows = rows_base(&flats).unwrap_or_else(|| Tensor::stack(&flats, 0));
        member_views(&rows, members[0]).iter().map(Tensor::contiguous).collect()
    })
}

/// Members' parameters stacked to run forward only ([`frozen`]), kept from one pass to the next while no
/// member's buffer changed. What a population acting in one batched pass per env step holds: its members'
/// parameters change only at updates, tens of passes apart, and each stack is a copy of all of them (75 MB for
/// 2,048 CartPole members).
#[derive(Default)]
pub struct MemberStack {
    /// Per member: a handle on the buffer that was stacked (it keeps the storage alive, so a buffer at the
    /// same address is the same buffer) and its [`FlatParams::generation`] then.
    stacked: Vec<(Tensor, (i64, u64))>,
    views: Option<Vec<Tensor>>,
    /// How many stacks were made (what the tests count to see a stack kept or rebuilt).
    pub(crate) made: u64,
}

impl MemberStack {
    /// The members' parameters stacked ([`frozen`]): the kept stack where every member is the buffer stacked
    /// then, at the same generation; else stacked afresh (and kept).
    pub(crate) fn views(&mut self, members: &[&FlatParams]) -> Vec<Tensor> {
        let unchanged = |(held, generation): &(Tensor, (i64, u64)), m: &&FlatParams| {
            held.data_ptr() == m.flat().data_ptr() && *generation == m.generation()
        };
        let kept =
            self.stacked.len() == members.len() && self.stacked.iter().zip(members).all(|(h, m)| unchanged(h, m));
        if !kept || self.views.is_none() {
            self.views = None; // the old stack goes before the new one is made
            self.stacked = members.iter().map(|m| (m.flat().shallow_clone(), m.generation())).collect();
            self.views = Some(frozen(members));
            self.made += 1;
        }
        self.views.iter().flatten().map(Tensor::shallow_clone).collect()
    }
}

/// One member's gradient of `scale · loss` (`losses`, its `[1]` loss on the member axis) into its buffer, added
/// to what is there with `add` (micro-batches after the first).
pub(crate) fn backward_alone(params: &mut FlatParams, losses: &Tensor, scale: f64, add: bool) {
    let loss = losses.sum(Kind::Float) * scale;
    params.backward_into(&loss, add)
}

/// One member's gradient averaged over its replicas and clipped to `max_norm`; a non-finite norm is an error
/// naming `algorithm` (the step is not taken).
pub(crate) fn reduce_and_clip_alone(
    params: &mut FlatParams,
    parallel: &mut crate::nn::data_parallel::DataParallel,
    max_norm: f64,
    algorithm: &str,
) -> Result<()> {
    parallel.reduce_slot(0, params)?;
    finite_norm(params.clip_grad_norm(max_norm), algorithm)
}

/// An error naming `algorithm` where a gradient's norm is not finite (the step is not taken).
pub(crate) fn finite_norm(norm: f64, algorithm: &str) -> Result<()> {
    if !norm.is_finite() {
        return Err(Error::NonFinite(format!("{algorithm}: gradient norm {norm} (non-finite loss); step not taken")));
    }
    Ok(())
}

/// A member-stacked MLP's parameter views ([`member_views`]) as [`batched_mlp`] takes them: biases `[N, 1, out]`,
/// weights `[N, in, out]` copied contiguous (a batched matmul on views strided by a whole buffer runs at half speed).
pub(crate) fn mlp_operands(views: &[Tensor]) -> Vec<Tensor> {
    views.iter().map(|v| if v.dim() == 3 { v.contiguous() } else { v.unsqueeze(1) }).collect()
}

/// The members' MLPs on `x` (`[N, B, in]`) → `[N, B, out]` as batched matmuls, with `params` from
/// [`mlp_operands`], `layers` the weights' indices (each bias follows) and `bf16` for the hidden layers.
pub(crate) fn batched_mlp(
    params: &[Tensor],
    layers: &[usize],
    activate: &dyn Fn(&Tensor) -> Tensor,
    x: &Tensor,
    bf16: bool,
) -> Tensor {
    let param = |k: usize, _| (params[layers[k]].shallow_clone(), params[layers[k] + 1].shallow_clone());
    crate::nn::mixed::mlp(layers.len(), param, activate, x, bf16)
}

#[cfg(test)]
/// Largest |a − b| over the largest |b|, of two flat buffers (the tests' measure of "matches its run alone").
pub(crate) fn rel_diff(a: &Tensor, b: &Tensor) -> f64 {
    let d = f64::try_from((a - b).abs().max()).unwrap();
    d / f64::try_from(b.abs().max()).unwrap().max(1e-30)
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind, Tensor};

    use super::*;

    fn buffer(values: &[f32]) -> FlatParams {
        let w = Tensor::from_slice(values).view([1, values.len() as i64]);
        let b = Tensor::from_slice(&[0.5f32]);
        FlatParams::new(vec![("w".into(), w), ("b".into(), b)], Device::Cpu)
    }

    /// Members' buffers move into one stack once and are found there after: same storage, in order, writes
    /// through a row are the member's (values, views and gradient buffer intact), and what is not a stack's
    /// rows in order — separate buffers, another order, a member replaced — is not taken for one.
    #[test]
    fn shared_rows_are_made_once_and_are_the_members_own_buffers() {
        let mut members: Vec<FlatParams> = (0..3).map(|k| buffer(&[k as f32, 1.0, 2.0])).collect();
        let before: Vec<Tensor> = members.iter().map(|m| m.flat().detach().copy()).collect();
        let flats = |m: &[FlatParams]| m.iter().map(|m| m.flat().shallow_clone()).collect::<Vec<_>>();
        assert!(rows_base(&flats(&members).iter().collect::<Vec<_>>()).is_none(), "separate buffers");
        let base = shared_rows(&mut members.iter_mut().collect::<Vec<_>>());
        assert_eq!(base.size(), [3, 4]);
        for (k, (m, b)) in members.iter().zip(&before).enumerate() {
            assert!(m.flat().equal(b) && base.get(k as i64).equal(b), "member {k}'s values moved with it");
            assert!(m.flat().requires_grad() && m.flat().is_leaf(), "still a leaf of its own");
            assert_eq!(m.view(0).size(), [1, 3]);
        }
        // Found again, not remade.
        let again = shared_rows(&mut members.iter_mut().collect::<Vec<_>>());
        assert_eq!(again.data_ptr(), base.data_ptr());
        // A step of the stack is the members' step; a member's own write is in the stack.
        let _ = tch::no_grad(|| base.shallow_clone().g_add_scalar_(1.0));
        assert_eq!(Vec::<f32>::try_from(members[1].view(0).flatten(0, -1)).unwrap(), vec![2.0, 2.0, 3.0]);
        members[2].copy_from(&Tensor::from_slice(&[9.0f32; 4])).unwrap();
        assert_eq!(f64::try_from(base.get(2).sum(Kind::Float)).unwrap(), 36.0);
        // A member's own backward still fills its own gradient.
        let loss = (members[0].view(0).sum(Kind::Float) * 2.0) + members[0].view(1).sum(Kind::Float);
        members[0].backward(&loss);
        assert_eq!(Vec::<f32>::try_from(members[0].flat().grad()).unwrap(), vec![2.0, 2.0, 2.0, 1.0]);
        // Another order, a prefix, a member replaced.
        let f = flats(&members);
        assert!(rows_base(&[&f[1], &f[0], &f[2]]).is_none(), "out of order");
        assert!(rows_base(&[&f[0], &f[1]]).is_some(), "the first rows of a stack are rows");
        assert!(rows_base(&[&f[1], &f[2]]).is_some(), "so are its later rows");
        members[1] = buffer(&[7.0, 7.0, 7.0]);
        let remade = shared_rows(&mut members.iter_mut().collect::<Vec<_>>());
        assert_ne!(remade.data_ptr(), base.data_ptr());
        assert_eq!(Vec::<f32>::try_from(remade.get(1)).unwrap(), vec![7.0, 7.0, 7.0, 0.5]);
        assert_eq!(Vec::<f32>::try_from(remade.get(2)).unwrap(), vec![9.0; 4]);
    }

    /// A snapshot puts in-place changes back.
    #[test]
    fn a_snapshot_restores_what_changed_in_place() {
        let t = Tensor::from_slice(&[1.0f32, 2.0]);
        let undo = Snapshot::of(&[&t]);
        let _ = tch::no_grad(|| t.shallow_clone().g_mul_scalar_(3.0));
        undo.restore();
        assert_eq!(Vec::<f32>::try_from(&t).unwrap(), vec![1.0, 2.0]);
    }
}
