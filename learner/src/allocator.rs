//! glibc malloc tuning for libtorch's CPU tensors.
//!
//! libtorch allocates every intermediate tensor with `malloc`. With glibc's defaults a tensor above the mmap
//! threshold (128 KiB at first, a PPO minibatch of 256 × 2 × 64 floats) is `mmap`ed, page-faulted in and
//! `munmap`ed on every op, and freed heap above the trim threshold goes back to the kernel only to fault in again
//! on the next update. A Nature-CNN update's tensors reach 29 MB (a minibatch of 256 frames in f32): with the
//! mmap threshold at glibc's largest allowed value (32 MiB) and heap kept up to 1 GiB, its page faults fell from
//! 7.1 M to 2.7 M per `flotilla-bench-atari` learner table and its f32 updates ran ~20 % faster
//! (docs/benchmarks/atari.md). [`ALLOCATOR_TUNABLES`] is the same setting for a peer process.

/// The mmap threshold: glibc's maximum on 64-bit targets (`DEFAULT_MMAP_THRESHOLD_MAX`).
const MMAP_THRESHOLD: i32 = 32 << 20;
/// Freed heap kept before trimming.
const TRIM_THRESHOLD: i32 = 1 << 30;

/// [`tune_allocator`]'s setting as a `GLIBC_TUNABLES` value, for peer processes (PyTorch) that a benchmark
/// compares under the same allocator.
pub const ALLOCATOR_TUNABLES: &str = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824";

/// Keep allocations up to 32 MiB on the heap and stop trimming it below 1 GiB. Process-wide, idempotent,
/// a no-op off glibc.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // From glibc's <malloc.h>.
            const M_TRIM_THRESHOLD: i32 = -1;
            const M_MMAP_THRESHOLD: i32 = -3;
            unsafe extern "C" {
                fn mallopt(param: i32, value: i32) -> i32;
            }
            // SAFETY: mallopt only changes allocator parameters; glibc documents it as callable at any time.
            unsafe {
                mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD);
                mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_peer_setting_is_the_processes_own() {
        let expected = format!(
            "glibc.malloc.mmap_threshold={}:glibc.malloc.trim_threshold={}",
            super::MMAP_THRESHOLD,
            super::TRIM_THRESHOLD
        );
        assert_eq!(super::ALLOCATOR_TUNABLES, expected);
    }
}
