//! How wide the fused host kernels' vectors are: the widest the CPU has (AVX-512, AVX2, else SSE2), or the
//! width [`LANES_VAR`] caps them to. Every width computes the same floats in the same order; the cap lets the
//! test suite prove it (scripts/test.sh runs the equivalence tests again with AVX2).

/// The environment variable that caps the fused host kernels' vector width (in f32 lanes): `16` (AVX-512),
/// `8` (AVX2) or `4` (the baseline's SSE2). Unset, the widest the CPU has is used.
pub const LANES_VAR: &str = "FLOTILLA_HOST_LANES";

/// Vector widths [`LANES_VAR`] may name, in f32 lanes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lanes {
    Avx512 = 16,
    Avx2 = 8,
    Baseline = 4,
}

/// The vector width the fused host kernels use: the widest the CPU has, capped by [`LANES_VAR`]. An
/// unreadable value, or a width the CPU does not have, is an error naming the variable and its value.
pub fn host_lanes() -> crate::error::Result<usize> {
    lanes().map(|l| l as usize)
}

pub(crate) fn lanes() -> crate::error::Result<Lanes> {
    static CHOSEN: std::sync::OnceLock<std::result::Result<Lanes, String>> = std::sync::OnceLock::new();
    CHOSEN
        .get_or_init(|| choose_lanes(std::env::var(LANES_VAR).ok().as_deref()))
        .clone()
        .map_err(crate::error::Error::Unsupported)
}

fn choose_lanes(cap: Option<&str>) -> std::result::Result<Lanes, String> {
    #[cfg(target_arch = "x86_64")]
    let (avx512, avx2) = (std::arch::is_x86_feature_detected!("avx512f"), std::arch::is_x86_feature_detected!("avx2"));
    #[cfg(not(target_arch = "x86_64"))]
    let (avx512, avx2) = (false, false);
    let widest = match (avx512, avx2) {
        (true, _) => Lanes::Avx512,
        (_, true) => Lanes::Avx2,
        _ => Lanes::Baseline,
    };
    let Some(cap) = cap.map(str::trim).filter(|c| !c.is_empty()) else { return Ok(widest) };
    let (wanted, has) = match cap {
        "16" => (Lanes::Avx512, avx512),
        "8" => (Lanes::Avx2, avx2),
        "4" => (Lanes::Baseline, true),
        _ => return Err(format!("{LANES_VAR}={cap:?}: expected 16 (AVX-512), 8 (AVX2) or 4 (SSE2)")),
    };
    if !has {
        return Err(format!("{LANES_VAR}={cap}: this CPU has no {wanted:?} vectors"));
    }
    Ok(wanted)
}

/// `f`, compiled for the widest vectors the CPU has, or those [`LANES_VAR`] caps it to; the loops are
/// elementwise or keep their partial sums apart, so every width computes the same floats in the same order.
/// `f` must be `#[inline(always)]` (and what it calls that should be vectorised), or it is compiled once, for the
/// baseline. A loop over several `&mut` slices captured by the closure may not vectorise (captures carry no
/// `noalias`): such a loop takes its slices as arguments of a `#[target_feature]` function of its own, chosen
/// by [`lanes`]. Panics if [`LANES_VAR`] is unreadable (binaries check [`host_lanes`] at start-up).
#[inline(always)]
pub(crate) fn widest_lanes<R>(f: impl FnOnce() -> R) -> R {
    let lanes = lanes().unwrap_or_else(|e| panic!("{e}"));
    match lanes {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `lanes` chose AVX-512 only where the CPU has AVX-512F.
        Lanes::Avx512 => unsafe { on_avx512(f) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `lanes` chose AVX2 only where the CPU has it.
        Lanes::Avx2 => unsafe { on_avx2(f) },
        _ => f(),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f")]
unsafe fn on_avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn on_avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lane_cap_is_read_and_bad_values_are_named() {
        assert!(choose_lanes(None).is_ok());
        assert!(choose_lanes(Some(" ")).is_ok(), "empty is unset");
        assert_eq!(choose_lanes(Some("4")), Ok(Lanes::Baseline));
        for bad in ["32", "avx2", "-1"] {
            let e = choose_lanes(Some(bad)).unwrap_err();
            assert!(e.contains(LANES_VAR) && e.contains(bad), "{e}");
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            assert_eq!(choose_lanes(Some("8")), Ok(Lanes::Avx2));
        }
    }
}
