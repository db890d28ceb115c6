//! Per-environment random streams, the counterpart of Gymnasium's `Env.np_random`
//! (`gymnasium/utils/seeding.py`).
//!
//! Gymnasium draws reset noise from NumPy's PCG64 seeded through a `SeedSequence`; that stream is not
//! reproduced here (so a seed gives a different, but equally distributed, start state than in Python).
//! What is kept: `reset(Some(seed))` reseeds, `reset(None)` continues the stream, and the first
//! `reset(None)` of an unseeded environment seeds from entropy. Uniform draws use NumPy's formula
//! `low + (high - low) * u` with `u` the top 53 bits of a 64-bit draw over 2^53.
//!
//! For snapshots the stream and its `seeded` flag are written as one JSON string (rand_pcg's serde
//! form, `{"rng":{"state":..,"increment":..},"seeded":..}` with the 128-bit words as JSON integers).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use rand::{RngCore, SeedableRng};
use rand_pcg::Pcg64;
use serde::{Deserialize, Serialize};

/// The reset-noise stream of one environment.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EnvRng {
    rng: Pcg64,
    seeded: bool,
}

impl Default for EnvRng {
    fn default() -> Self {
        EnvRng { rng: Pcg64::seed_from_u64(0), seeded: false }
    }
}

impl EnvRng {
    /// Gymnasium's `super().reset(seed=seed)`: reseed on `Some`, seed from entropy on the first `None`.
    pub(crate) fn reseed(&mut self, seed: Option<u64>) {
        match seed {
            Some(seed) => {
                self.rng = Pcg64::seed_from_u64(seed);
                self.seeded = true;
            }
            None if !self.seeded => {
                self.rng = Pcg64::seed_from_u64(entropy_seed());
                self.seeded = true;
            }
            None => {}
        }
    }

    /// `np_random.uniform(low, high)`: NumPy's formula, so the range is `[low, high)` up to rounding.
    #[inline]
    pub(crate) fn uniform(&mut self, low: f64, high: f64) -> f64 {
        let u = (self.rng.next_u64() >> 11) as f64 * (1.0 / 9_007_199_254_740_992.0);
        low + (high - low) * u
    }
}

impl EnvRng {
    /// The stream and its `seeded` flag as an opaque string, for [`EnvSnapshot::rng`].
    ///
    /// [`EnvSnapshot::rng`]: flotilla_core::EnvSnapshot::rng
    pub(crate) fn to_snapshot(&self) -> String {
        // Only integers and a bool: serialising cannot fail.
        serde_json::to_string(self).expect("an EnvRng serialises to JSON")
    }

    /// The stream written by [`to_snapshot`](EnvRng::to_snapshot); `Err` says what was wrong.
    pub(crate) fn from_snapshot(text: &str) -> Result<Self, String> {
        serde_json::from_str(text).map_err(|e| format!("RNG stream {text:?} is not a serialised Pcg64 stream: {e}"))
    }
}

/// 64 bits from the OS-seeded keys of std's `RandomState`, the clock and a process-wide counter: enough
/// to make unseeded environments differ, without a dependency on `getrandom`.
fn entropy_seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    if let Ok(since) = SystemTime::now().duration_since(UNIX_EPOCH) {
        hasher.write_u128(since.as_nanos());
    }
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_unseeded_streams_differ() {
        let mut a = EnvRng::default();
        let mut b = EnvRng::default();
        a.reseed(Some(7));
        b.reseed(Some(7));
        for _ in 0..10 {
            let x = a.uniform(-0.05, 0.05);
            assert_eq!(x, b.uniform(-0.05, 0.05));
            assert!((-0.05..=0.05).contains(&x));
        }
        let mut c = EnvRng::default();
        let mut d = EnvRng::default();
        c.reseed(None);
        d.reseed(None);
        assert_ne!(c.uniform(0.0, 1.0), d.uniform(0.0, 1.0));
        // A later `None` continues the stream instead of reseeding.
        let mut e = a.clone();
        e.reseed(None);
        assert_eq!(e.uniform(0.0, 1.0), a.uniform(0.0, 1.0));
    }

    #[test]
    fn a_snapshot_continues_the_stream_and_keeps_the_seeded_flag() {
        let mut a = EnvRng::default();
        a.reseed(Some(u64::MAX));
        a.uniform(0.0, 1.0);
        let mut b = EnvRng::from_snapshot(&a.to_snapshot()).unwrap();
        assert!(b.seeded);
        // A `None` reseed continues the restored stream (it does not draw entropy).
        b.reseed(None);
        for _ in 0..10 {
            assert_eq!(a.uniform(0.0, 1.0).to_bits(), b.uniform(0.0, 1.0).to_bits());
        }
        let unseeded = EnvRng::from_snapshot(&EnvRng::default().to_snapshot()).unwrap();
        assert!(!unseeded.seeded);
        assert!(EnvRng::from_snapshot("{\"rng\":1}").is_err());
    }
}
