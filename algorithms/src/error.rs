//! The algorithms crate's error type.
use thiserror::Error as ThisError;

/// Errors from building, running, saving or loading an algorithm.
#[derive(Debug, ThisError)]
pub enum Error {
    /// The algorithm cannot work with this observation or action space.
    #[error("unsupported {which} space for {algorithm}: {detail}")]
    UnsupportedSpace {
        /// `"observation"` or `"action"`.
        which: &'static str,
        /// Algorithm name.
        algorithm: &'static str,
        /// What is wrong with the space.
        detail: String,
    },
    /// A configuration value out of its valid range.
    #[error("invalid {algorithm} config: {field} = {value}: {detail}")]
    InvalidConfig {
        /// Algorithm name.
        algorithm: &'static str,
        /// Field name as in the TOML file.
        field: &'static str,
        /// The offending value.
        value: String,
        /// The valid range.
        detail: String,
    },
    /// Input data of the wrong size.
    #[error("{what}: got {got} values, expected {expected}")]
    BadLength {
        /// What was being read.
        what: String,
        /// Number of values received.
        got: usize,
        /// Number of values expected.
        expected: usize,
    },
    /// Saving or loading weights failed.
    #[error("{action} weights at {path}: {source}")]
    Weights {
        /// `"saving"` or `"loading"`.
        action: &'static str,
        /// The file.
        path: String,
        /// What libtorch said.
        source: tch::TchError,
    },
    /// Starting from another run's weights, freezing or reinitialising layers failed (a missing layer, a shape
    /// that differs): the message names the layer and both shapes.
    #[error("{0}")]
    Init(String),
    /// A checkpoint that cannot be written, read, or does not match the agent.
    #[error("{0}")]
    Checkpoint(String),
    /// The algorithm has no such role (e.g. applying actors' gradients outside A3C).
    #[error("{0}")]
    Unsupported(String),
    /// An update produced a non-finite loss or gradient; nothing was applied.
    #[error("{0}")]
    NonFinite(String),
    /// Averaging over the replicas of a data-parallel group failed (a lost rank, a timeout).
    #[error("data-parallel sync: {0}")]
    Sync(String),
    /// A libtorch call failed.
    #[error(transparent)]
    Torch(#[from] tch::TchError),
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// [`Error::BadLength`].
    pub(crate) fn length(what: impl Into<String>, got: usize, expected: usize) -> Self {
        Error::BadLength { what: what.into(), got, expected }
    }

    /// [`Error::UnsupportedSpace`].
    pub(crate) fn space(which: &'static str, algorithm: &'static str, detail: impl Into<String>) -> Self {
        Error::UnsupportedSpace { which, algorithm, detail: detail.into() }
    }

    /// [`Error::InvalidConfig`].
    pub(crate) fn config(
        algorithm: &'static str,
        field: &'static str,
        value: impl ToString,
        detail: impl Into<String>,
    ) -> Self {
        Error::InvalidConfig { algorithm, field, value: value.to_string(), detail: detail.into() }
    }
}

impl From<flotilla_core::LengthMismatch> for Error {
    fn from(m: flotilla_core::LengthMismatch) -> Self {
        Error::length(m.what, m.got, m.expected)
    }
}

/// A config's range checks (what serde cannot express), written once for every kind: each names the field, its
/// value and the rule, and [`Checks::done`] returns the first that failed as [`Error::InvalidConfig`].
#[must_use = "the checks say nothing until `done`"]
pub(crate) struct Checks {
    /// The config's name in the errors (`"ppo"`, `"vtrace"`, …).
    section: &'static str,
    failed: Option<Error>,
}

impl Checks {
    /// No check failed yet, for the config named `section`.
    pub(crate) fn of(section: &'static str) -> Self {
        Checks { section, failed: None }
    }

    /// `ok`, or `field = value` breaks `rule` (the first failure is kept).
    pub(crate) fn that(mut self, ok: bool, field: &'static str, value: impl std::fmt::Display, rule: &str) -> Self {
        if self.failed.is_none() && !ok {
            self.failed = Some(Error::config(self.section, field, value, rule));
        }
        self
    }

    /// Finite and `> 0` (rates, ε, norms, clip ranges).
    pub(crate) fn positive(self, field: &'static str, x: f64) -> Self {
        self.that(x.is_finite() && x > 0.0, field, x, "must be finite and > 0")
    }

    /// A limit `> 0`, `inf` for none (gradient-norm clipping).
    pub(crate) fn limit(self, field: &'static str, x: f64) -> Self {
        self.that(x > 0.0, field, x, "must be > 0 (inf: no limit)")
    }

    /// Finite and `≥ 0`.
    pub(crate) fn non_negative(self, field: &'static str, x: f64) -> Self {
        self.that(x.is_finite() && x >= 0.0, field, x, "must be finite and ≥ 0")
    }

    /// Finite (any sign).
    pub(crate) fn finite(self, field: &'static str, x: f64) -> Self {
        self.that(x.is_finite(), field, x, "must be finite")
    }

    /// In `[0, 1]` (discounts, λ, probabilities, fractions).
    pub(crate) fn unit(self, field: &'static str, x: f64) -> Self {
        self.that((0.0..=1.0).contains(&x), field, x, "must be in [0, 1]")
    }

    /// In `(0, 1]` (Polyak's τ).
    pub(crate) fn fraction(self, field: &'static str, x: f64) -> Self {
        self.that(x > 0.0 && x <= 1.0, field, x, "must be in (0, 1]")
    }

    /// A count of at least 1 (zero would never step, train or fill a batch).
    pub(crate) fn at_least_one<N: PartialOrd + From<u8> + std::fmt::Display>(self, field: &'static str, n: N) -> Self {
        self.that(n >= N::from(1), field, n, "must be at least 1")
    }

    /// Layer widths, each at least 1.
    pub(crate) fn widths(self, field: &'static str, widths: &[i64]) -> Self {
        self.that(widths.iter().all(|&w| w >= 1), field, format!("{widths:?}"), "widths must be at least 1")
    }

    /// Adam's learning rate and ε, each finite and `> 0`.
    pub(crate) fn adam(self, learning_rate: f64, adam_eps: f64) -> Self {
        self.positive("learning_rate", learning_rate).positive("adam_eps", adam_eps)
    }

    /// An off-policy kind's replay schedule: minibatches of at least 1 from a buffer that holds one, and at least
    /// one gradient step every `train_freq ≥ 1` steps (γ and τ: [`Checks::targets`]).
    pub(crate) fn replay(self, batch_size: usize, buffer_size: usize, train_freq: u64, gradient_steps: usize) -> Self {
        self.at_least_one("batch_size", batch_size)
            .that(buffer_size >= batch_size, "buffer_size", buffer_size, "must be at least batch_size")
            .at_least_one("train_freq", train_freq)
            .at_least_one("gradient_steps", gradient_steps)
    }

    /// A discount `gamma` in `[0, 1]` and Polyak's `tau` in `(0, 1]`.
    pub(crate) fn targets(self, gamma: f64, tau: f64) -> Self {
        self.unit("gamma", gamma).fraction("tau", tau)
    }

    /// `task_heads` needs a multi-task run (`tasks`, from `[[tasks]]`, two or more).
    pub(crate) fn task_heads(self, task_heads: bool, tasks: usize) -> Self {
        self.that(!task_heads || tasks >= 2, "task_heads", true, "a head per task needs [[tasks]] (two or more)")
    }

    /// `check` of `x` where it is set.
    pub(crate) fn set(self, x: Option<f64>, check: impl FnOnce(Self, f64) -> Self) -> Self {
        match x {
            Some(x) => check(self, x),
            None => self,
        }
    }

    /// A nested section's own checks (`[algorithm.vtrace]`), kept in order with these.
    pub(crate) fn and(mut self, nested: Result<()>) -> Self {
        if self.failed.is_none() {
            self.failed = nested.err();
        }
        self
    }

    /// The first failed check, or `Ok`.
    pub(crate) fn done(self) -> Result<()> {
        self.failed.map_or(Ok(()), Err)
    }
}
