//! The few NumPy 2 scalar semantics that Gymnasium's classic-control sources rely on without saying so.
//!
//! Reproducing `gymnasium/envs/classic_control/*.py` to the last bit needs three facts about NumPy 2.x
//! (checked against NumPy 2.4 on glibc):
//!
//! * `x ** 2` on a NumPy scalar calls libm `pow(x, 2.0)` (or `powf`), which is not always the correctly
//!   rounded `x * x` (it differs about once in a thousand draws), while `np.square(x)` is `x * x`.
//!   LLVM rewrites `pow(x, 2.0)` into `x * x`, so [`pow2`] hides the exponent from the optimiser.
//! * Python's `%` on floats (and NumPy's `remainder`) takes the sign of the divisor: [`py_mod`].
//! * NEP 50 promotion: a Python float meeting a `np.float32` is cast to f32 first, in arithmetic *and* in
//!   comparisons, while a `np.float64` meeting a `np.float32` promotes to f64. `Continuous_MountainCarEnv`
//!   mixes all three kinds, so its step is written with [`Scalar`], which carries the kind along.

use std::hint::black_box;

/// NumPy's `x ** 2` for an f64 scalar: libm `pow(x, 2.0)`, not `x * x`.
#[inline]
pub(crate) fn pow2(x: f64) -> f64 {
    x.powf(black_box(2.0))
}

/// NumPy's `x ** 2` for an f32 scalar: libm `powf(x, 2.0)`.
#[inline]
pub(crate) fn pow2_f32(x: f32) -> f32 {
    x.powf(black_box(2.0))
}

/// Python's / NumPy's float `a % b`: the result has the sign of `b` (NumPy's `npy_divmod`).
#[inline]
pub(crate) fn py_mod(a: f64, b: f64) -> f64 {
    let m = a % b;
    if m != 0.0 { if (b < 0.0) != (m < 0.0) { m + b } else { m } } else { 0.0f64.copysign(b) }
}

/// A number as the Python source holds it: a `np.float32`, a `np.float64`, or a plain Python float or int
/// (a "weak" scalar under NEP 50, which takes the other operand's precision).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Scalar {
    /// `np.float32`.
    F32(f32),
    /// `np.float64`.
    F64(f64),
    /// Python `float` or `int`.
    Py(f64),
}

/// The precision an operation between two scalars runs in.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    F32,
    F64,
    Py,
}

impl Scalar {
    fn kind(self) -> Kind {
        match self {
            Scalar::F32(_) => Kind::F32,
            Scalar::F64(_) => Kind::F64,
            Scalar::Py(_) => Kind::Py,
        }
    }

    /// The value, widened to f64 (exact).
    #[inline]
    pub(crate) fn value(self) -> f64 {
        match self {
            Scalar::F32(v) => v as f64,
            Scalar::F64(v) | Scalar::Py(v) => v,
        }
    }

    /// `np.array([...], dtype=np.float32)` of this value: round to nearest.
    #[inline]
    pub(crate) fn to_f32(self) -> f32 {
        match self {
            Scalar::F32(v) => v,
            Scalar::F64(v) | Scalar::Py(v) => v as f32,
        }
    }

    /// NEP 50: f64 wins over f32, f32 wins over a Python number, two Python numbers stay Python.
    #[inline]
    fn join(a: Scalar, b: Scalar) -> Kind {
        match (a.kind(), b.kind()) {
            (Kind::F64, _) | (_, Kind::F64) => Kind::F64,
            (Kind::F32, _) | (_, Kind::F32) => Kind::F32,
            (Kind::Py, Kind::Py) => Kind::Py,
        }
    }

    #[inline]
    fn binop(self, other: Scalar, f32op: fn(f32, f32) -> f32, f64op: fn(f64, f64) -> f64) -> Scalar {
        match Scalar::join(self, other) {
            Kind::F32 => Scalar::F32(f32op(self.to_f32(), other.to_f32())),
            Kind::F64 => Scalar::F64(f64op(self.value(), other.value())),
            Kind::Py => Scalar::Py(f64op(self.value(), other.value())),
        }
    }

    #[inline]
    fn cmp(self, other: Scalar, f32op: fn(&f32, &f32) -> bool, f64op: fn(&f64, &f64) -> bool) -> bool {
        match Scalar::join(self, other) {
            Kind::F32 => f32op(&self.to_f32(), &other.to_f32()),
            Kind::F64 | Kind::Py => f64op(&self.value(), &other.value()),
        }
    }

    /// `self + other`.
    #[inline]
    pub(crate) fn add(self, other: Scalar) -> Scalar {
        self.binop(other, |a, b| a + b, |a, b| a + b)
    }

    /// `self - other`.
    #[inline]
    pub(crate) fn sub(self, other: Scalar) -> Scalar {
        self.binop(other, |a, b| a - b, |a, b| a - b)
    }

    /// `self * other`.
    #[inline]
    pub(crate) fn mul(self, other: Scalar) -> Scalar {
        self.binop(other, |a, b| a * b, |a, b| a * b)
    }

    /// `self > other`.
    #[inline]
    pub(crate) fn gt(self, other: Scalar) -> bool {
        self.cmp(other, PartialOrd::gt, PartialOrd::gt)
    }

    /// `self < other`.
    #[inline]
    pub(crate) fn lt(self, other: Scalar) -> bool {
        self.cmp(other, PartialOrd::lt, PartialOrd::lt)
    }

    /// `self >= other`.
    #[inline]
    pub(crate) fn ge(self, other: Scalar) -> bool {
        self.cmp(other, PartialOrd::ge, PartialOrd::ge)
    }

    /// `self == other`.
    #[inline]
    pub(crate) fn eq(self, other: Scalar) -> bool {
        self.cmp(other, PartialEq::eq, PartialEq::eq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pow2_is_libm_pow_not_the_product() {
        // Found with NumPy 2.4 on glibc 2.36: np.float64(x) ** 2 == math.pow(x, 2) != x * x.
        let x = -0.761693179121179f64;
        assert_eq!(pow2(x), 0.5801764991197285);
        assert_eq!(x * x, 0.5801764991197284);
    }

    #[test]
    fn py_mod_takes_the_divisor_sign() {
        assert_eq!(py_mod(-1.0, 3.0), 2.0);
        assert_eq!(py_mod(7.0, 3.0), 1.0);
        assert_eq!(py_mod(-6.0, 3.0).to_bits(), 0.0f64.to_bits());
    }

    #[test]
    fn nep50_promotion() {
        // np.float32(0.07) > 0.07 is False: the Python float is cast to f32 first.
        assert!(!Scalar::F32(0.07).gt(Scalar::Py(0.07)));
        // np.float32(0.45) >= 0.45 is True.
        assert!(Scalar::F32(0.45).ge(Scalar::Py(0.45)));
        // np.float64 + np.float32 -> np.float64.
        assert!(matches!(Scalar::F64(1.0).add(Scalar::F32(0.1)), Scalar::F64(v) if v == 1.0 + 0.1f32 as f64));
        // np.float32 * Python float -> np.float32.
        assert!(matches!(Scalar::F32(0.5).mul(Scalar::Py(0.0015)), Scalar::F32(_)));
        assert!(matches!(Scalar::Py(1.0).sub(Scalar::Py(0.5)), Scalar::Py(v) if v == 0.5));
    }
}
