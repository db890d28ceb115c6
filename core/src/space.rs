use serde::{Deserialize, Serialize};

/// Element type of a [`Space::Box`] (Gymnasium's `dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 32-bit float (classic control observations and actions).
    F32,
    /// 8-bit unsigned integer (image frames).
    U8,
}

/// An observation or action space, as Gymnasium's `Discrete` and `Box`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Space {
    /// Integers `start .. start + n`.
    Discrete {
        /// Number of values.
        n: usize,
        /// Smallest value (Gymnasium's `start`, usually 0).
        start: i64,
    },
    /// A box of `shape` with per-element bounds (flattened in row-major order; may be ±infinity).
    Box {
        /// Lower bounds, one per element.
        low: Vec<f32>,
        /// Upper bounds, one per element.
        high: Vec<f32>,
        /// Shape of one sample.
        shape: Vec<usize>,
        /// Element type.
        dtype: DType,
    },
}

impl Space {
    /// `Discrete(n)` starting at 0.
    pub fn discrete(n: usize) -> Self {
        Space::Discrete { n, start: 0 }
    }

    /// A 1-D f32 box with the given bounds.
    pub fn box1d(low: Vec<f32>, high: Vec<f32>) -> Self {
        assert_eq!(low.len(), high.len(), "box bounds of different lengths");
        let shape = vec![low.len()];
        Space::Box { low, high, shape, dtype: DType::F32 }
    }

    /// Shape of one sample: `[]` for `Discrete`.
    pub fn shape(&self) -> &[usize] {
        match self {
            Space::Discrete { .. } => &[],
            Space::Box { shape, .. } => shape,
        }
    }

    /// Number of scalars in one sample (1 for `Discrete`).
    pub fn flat_dim(&self) -> usize {
        self.shape().iter().product()
    }

    /// Whether a flattened f32 sample lies in the space (within bounds, finite where the bounds are).
    pub fn contains_f32(&self, x: &[f32]) -> bool {
        match self {
            Space::Discrete { n, start } => {
                x.len() == 1 && x[0].fract() == 0.0 && (x[0] as i64) >= *start && (x[0] as i64) < start + *n as i64
            }
            Space::Box { low, high, .. } => {
                x.len() == low.len() && x.iter().zip(low.iter().zip(high)).all(|(v, (l, h))| *v >= *l && *v <= *h)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_dim_and_contains() {
        let d = Space::discrete(2);
        assert_eq!(d.flat_dim(), 1);
        assert!(d.contains_f32(&[1.0]));
        assert!(!d.contains_f32(&[2.0]));
        let b = Space::box1d(vec![-1.0, -2.0], vec![1.0, 2.0]);
        assert_eq!(b.flat_dim(), 2);
        assert!(b.contains_f32(&[0.5, -2.0]));
        assert!(!b.contains_f32(&[0.5, 2.5]));
        assert!(!b.contains_f32(&[f32::NAN, 0.0]));
        assert!(!b.contains_f32(&[0.0]));
    }

    #[test]
    fn serde_round_trip() {
        let b = Space::box1d(vec![-1.0], vec![1.0]);
        let s = toml::to_string(&b).unwrap();
        assert_eq!(toml::from_str::<Space>(&s).unwrap(), b);
    }
}
