//! Where training stands ([`Progress`]), for the schedules of every algorithm.

/// Where training stands, for schedules (learning-rate annealing, ε decay, β annealing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Env steps taken so far (all envs), including those just observed.
    pub env_steps: u64,
    /// The training budget.
    pub total_env_steps: u64,
}

impl Progress {
    /// `1 − env_steps / total`, clamped to [0, 1] (SB3's `progress_remaining`).
    pub fn remaining(&self) -> f64 {
        (1.0 - self.env_steps as f64 / self.total_env_steps.max(1) as f64).clamp(0.0, 1.0)
    }
}
