//! Named scalar metrics returned by updates.
//!
//! Names are stable and follow CleanRL's: `losses/policy_loss`, `losses/value_loss`, `losses/entropy`,
//! `losses/approx_kl`, `losses/clip_fraction`, `losses/explained_variance`, `charts/learning_rate`, ...

/// An ordered list of `(name, value)` pairs; the order is stable for one algorithm, so it can head a CSV.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics(pub Vec<(&'static str, f64)>);

impl Metrics {
    /// Append a metric.
    pub fn push(&mut self, name: &'static str, value: f64) {
        self.0.push((name, value));
    }

    /// The value of a metric, if present.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.0.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }

    /// Iterate over `(name, value)` pairs.
    pub fn iter(&self) -> impl Iterator<Item = &(&'static str, f64)> {
        self.0.iter()
    }
}
