//! glibc malloc tuning for libtorch's CPU tensors.
//!
//! libtorch allocates every intermediate tensor with `malloc`. A PPO minibatch of 256 × 2 × 64 floats is
//! 128 KiB — exactly glibc's default mmap threshold — so each such tensor was `mmap`ed, page-faulted in and
//! `munmap`ed on every op. Raising the threshold keeps them on the heap; measured ~8 % off a PPO update.

/// Keep allocations up to 16 MiB on the heap and stop trimming it below 64 MiB. Process-wide, idempotent,
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
                mallopt(M_MMAP_THRESHOLD, 16 << 20);
                mallopt(M_TRIM_THRESHOLD, 64 << 20);
            }
        });
    }
}
