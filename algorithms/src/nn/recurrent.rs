//! Recurrent cores (LSTM, GRU) over [`FlatParams`], for policies that carry memory from step to step.
//!
//! The maths and the parameter layout are PyTorch's one-layer `nn.LSTM` / `nn.GRU` (`weight_ih_l0` `[G·H, I]`,
//! `weight_hh_l0` `[G·H, H]`, `bias_ih_l0`, `bias_hh_l0`; gates `i, f, g, o` and `r, z, n`). A state row is
//! `[h | c]` (`2H` floats) for the LSTM and `h` (`H`) for the GRU. Acting runs one [`RecurrentCore::step`] per
//! env step; training re-runs whole sequences ([`RecurrentCore::sequence`]) from the rollout's first state,
//! zeroing it where an episode starts: the same arithmetic in the same order as acting.
use serde::{Deserialize, Serialize};
use tch::nn::Init;
use tch::{Kind, Tensor};

use crate::nn::params::FlatParams;

/// Which recurrent core a policy has (`[algorithm] recurrent = "lstm"`): none (feed-forward), an LSTM or a GRU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Recurrence {
    /// Feed-forward: no state.
    #[default]
    None,
    /// Long short-term memory (Hochreiter & Schmidhuber 1997), as `torch.nn.LSTM`.
    Lstm,
    /// Gated recurrent unit (Cho et al. 2014), as `torch.nn.GRU`.
    Gru,
}

impl Recurrence {
    /// Whether there is a core at all.
    pub fn is_some(self) -> bool {
        self != Recurrence::None
    }

    /// Gates per hidden unit: 4 for the LSTM, 3 for the GRU.
    fn gates(self) -> i64 {
        match self {
            Recurrence::None => 0,
            Recurrence::Lstm => 4,
            Recurrence::Gru => 3,
        }
    }
}

/// One recurrent layer whose weights live in a [`FlatParams`] buffer.
#[derive(Debug, Clone)]
pub struct RecurrentCore {
    pub(crate) cell: Recurrence,
    /// Input width.
    pub(crate) inputs: i64,
    hidden: i64,
    /// Index of `weight_ih` in the buffer (`weight_hh`, `bias_ih`, `bias_hh` follow).
    pub(crate) first: usize,
}

impl RecurrentCore {
    /// Initial parameters named `{prefix}.weight_ih_l0`, `.weight_hh_l0`, `.bias_ih_l0`, `.bias_hh_l0`, to
    /// place in a [`FlatParams`] at index `first_index` onwards: orthogonal weights (gain 1, per gate block)
    /// and zero biases, as CleanRL's `ppo_atari_lstm` initialises its LSTM.
    pub fn init(
        prefix: &str,
        cell: Recurrence,
        inputs: i64,
        hidden: i64,
        first_index: usize,
    ) -> (Self, Vec<(String, Tensor)>) {
        assert!(cell.is_some(), "a recurrent core needs a cell");
        let cpu = tch::Device::Cpu;
        let g = cell.gates();
        let blocks = |fan_in: i64| {
            let parts: Vec<Tensor> =
                (0..g).map(|_| tch::nn::init(Init::Orthogonal { gain: 1.0 }, &[hidden, fan_in], cpu)).collect();
            Tensor::cat(&parts, 0)
        };
        let zeros = || Tensor::zeros([g * hidden], (Kind::Float, cpu));
        let named = vec![
            (format!("{prefix}.weight_ih_l0"), blocks(inputs)),
            (format!("{prefix}.weight_hh_l0"), blocks(hidden)),
            (format!("{prefix}.bias_ih_l0"), zeros()),
            (format!("{prefix}.bias_hh_l0"), zeros()),
        ];
        (RecurrentCore { cell, inputs, hidden, first: first_index }, named)
    }

    /// Hidden units `H` (the width of the core's output).
    pub fn hidden(&self) -> i64 {
        self.hidden
    }

    /// Floats of state per env: `2H` (`[h | c]`) for the LSTM, `H` for the GRU.
    pub fn state_dim(&self) -> usize {
        match self.cell {
            Recurrence::Lstm => 2 * self.hidden as usize,
            _ => self.hidden as usize,
        }
    }

    fn weights<'p>(&self, params: &'p FlatParams) -> [&'p Tensor; 4] {
        [0, 1, 2, 3].map(|k| params.view(self.first + k))
    }

    /// The input projection `x W_ihᵀ + b_ih` of a batch of inputs `[R, I]`, for every step at once.
    fn project(&self, params: &FlatParams, x: &Tensor) -> Tensor {
        let [w_ih, _, b_ih, _] = self.weights(params);
        x.matmul(&w_ih.tr()) + b_ih
    }

    /// One step from the projected input `gx` `[B, G·H]` and the state `[B, S]`: the output `h` `[B, H]` and
    /// the new state `[B, S]`.
    fn cell_step(&self, params: &FlatParams, gx: &Tensor, state: &Tensor) -> (Tensor, Tensor) {
        let [_, w_hh, _, b_hh] = self.weights(params);
        let h_dim = self.hidden;
        match self.cell {
            Recurrence::Lstm => {
                let (h, c) = (state.narrow(1, 0, h_dim), state.narrow(1, h_dim, h_dim));
                let gates = gx + h.matmul(&w_hh.tr()) + b_hh;
                let g = gates.chunk(4, 1);
                let c = g[1].sigmoid() * c + g[0].sigmoid() * g[2].tanh();
                let h = g[3].sigmoid() * c.tanh();
                let state = Tensor::cat(&[&h, &c], 1);
                (h, state)
            }
            Recurrence::Gru => {
                let gh = state.matmul(&w_hh.tr()) + b_hh;
                let (x3, h3) = (gx.chunk(3, 1), gh.chunk(3, 1));
                let r = (&x3[0] + &h3[0]).sigmoid();
                let z = (&x3[1] + &h3[1]).sigmoid();
                let n = (&x3[2] + r * &h3[2]).tanh();
                let h: Tensor = z.ones_like().g_sub(&z) * n + z * state;
                (h.shallow_clone(), h)
            }
            Recurrence::None => unreachable!("a core has a cell"),
        }
    }

    /// One step of a batch: inputs `[B, I]`, state `[B, S]` → output `[B, H]`, new state `[B, S]`.
    pub fn step(&self, params: &FlatParams, x: &Tensor, state: &Tensor) -> (Tensor, Tensor) {
        self.cell_step(params, &self.project(params, x), state)
    }

    /// A sequence: inputs `[T, B, I]`, `starts` `[T, B]` (1 where an episode starts at that step: the state is
    /// zeroed before it, 0 elsewhere), the state before the first step `[B, S]` → outputs `[T, B, H]` and the
    /// state after each step `[T, B, S]`.
    pub fn sequence(&self, params: &FlatParams, x: &Tensor, starts: &Tensor, state: &Tensor) -> (Tensor, Tensor) {
        let (t, b) = (x.size()[0], x.size()[1]);
        let gx = self.project(params, &x.reshape([t * b, self.inputs])).view([t, b, -1]);
        let keep = starts.ones_like().g_sub(starts).unsqueeze(2);
        let mut state = state.shallow_clone();
        let (mut outs, mut states) = (Vec::with_capacity(t as usize), Vec::with_capacity(t as usize));
        for k in 0..t {
            let (h, next) = self.cell_step(params, &gx.get(k), &(state * keep.get(k)));
            outs.push(h);
            states.push(next.shallow_clone());
            state = next;
        }
        (Tensor::stack(&outs, 0), Tensor::stack(&states, 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    fn core(cell: Recurrence) -> (RecurrentCore, FlatParams) {
        tch::manual_seed(3);
        let (core, mut named) = RecurrentCore::init("core", cell, 3, 5, 0);
        // Non-zero biases, so that a swapped bias would show.
        for (_, t) in named.iter_mut().skip(2) {
            *t = Tensor::randn(t.size(), (Kind::Float, Device::Cpu)) * 0.3;
        }
        (core, FlatParams::new(named, Device::Cpu))
    }

    /// Without episode starts the sequence is `torch.nn.LSTM` / `GRU` (ATen's `lstm` / `gru` with the same
    /// weights), and each step of it is [`RecurrentCore::step`] from the state before.
    #[test]
    fn the_cores_are_torch_lstm_and_gru() {
        for cell in [Recurrence::Lstm, Recurrence::Gru] {
            let (core, params) = core(cell);
            let (t, b, h) = (6, 4, 5);
            let x = Tensor::randn([t, b, 3], (Kind::Float, Device::Cpu));
            let s0 = Tensor::randn([b, core.state_dim() as i64], (Kind::Float, Device::Cpu)) * 0.5;
            let (out, states) = core.sequence(&params, &x, &Tensor::zeros([t, b], (Kind::Float, Device::Cpu)), &s0);
            let weights: Vec<Tensor> = (0..4).map(|k| params.view(k).shallow_clone()).collect();
            let want = match cell {
                Recurrence::Lstm => {
                    let hx = [s0.narrow(1, 0, h).unsqueeze(0), s0.narrow(1, h, h).unsqueeze(0)];
                    x.lstm(&hx, &weights, true, 1, 0.0, false, false, false).0
                }
                _ => x.gru(&s0.unsqueeze(0), &weights, true, 1, 0.0, false, false, false).0,
            };
            let diff = (&out - &want).abs().max().double_value(&[]);
            assert!(diff < 1e-5, "{cell:?}: {diff}");
            let mut s = s0.shallow_clone();
            for k in 0..t {
                let (o, next) = core.step(&params, &x.get(k), &s);
                assert!(o.allclose(&out.get(k), 1e-6, 1e-6, false), "{cell:?} step {k}");
                assert!(next.allclose(&states.get(k), 1e-6, 1e-6, false), "{cell:?} state {k}");
                s = next;
            }
        }
    }

    /// A start zeroes the state before its step: the rest of the sequence is a fresh sequence from zeros.
    #[test]
    fn an_episode_start_zeroes_the_state() {
        let (core, params) = core(Recurrence::Lstm);
        let x = Tensor::randn([5, 2, 3], (Kind::Float, Device::Cpu));
        let s0 = Tensor::ones([2, 10], (Kind::Float, Device::Cpu));
        let starts = Tensor::zeros([5, 2], (Kind::Float, Device::Cpu));
        let _ = starts.get(2).get(1).fill_(1.0);
        let (out, _) = core.sequence(&params, &x, &starts, &s0);
        let fresh = core.sequence(
            &params,
            &x.narrow(0, 2, 3).narrow(1, 1, 1),
            &Tensor::zeros([3, 1], (Kind::Float, Device::Cpu)),
            &Tensor::zeros([1, 10], (Kind::Float, Device::Cpu)),
        );
        assert!(out.narrow(0, 2, 3).narrow(1, 1, 1).allclose(&fresh.0, 1e-6, 1e-6, false));
        // Env 0 had no start: its steps after 2 differ from a fresh start.
        let env0 = core.sequence(
            &params,
            &x.narrow(0, 2, 3).narrow(1, 0, 1),
            &Tensor::zeros([3, 1], (Kind::Float, Device::Cpu)),
            &Tensor::zeros([1, 10], (Kind::Float, Device::Cpu)),
        );
        assert!(!out.narrow(0, 2, 3).narrow(1, 0, 1).allclose(&env0.0, 1e-4, 1e-4, false));
    }
}
