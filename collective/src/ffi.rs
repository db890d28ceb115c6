//! The shim's C ABI (shim/c10d_shim.cpp). Every function that can fail returns a null pointer or -1 and leaves a
//! malloc'd message in `err`, which [`take_error`] turns into a `String` and frees.
use std::ffi::{CStr, c_char, c_int};

use tch::Tensor;

/// A TCPStore client (prefixed), owned by the shim.
#[repr(C)]
pub(crate) struct RawStore {
    _private: [u8; 0],
}

/// A c10d process group with its collective timeout, owned by the shim.
#[repr(C)]
pub(crate) struct RawGroup {
    _private: [u8; 0],
}

/// libtorch's `at::Tensor` (what `tch::Tensor::as_mut_ptr` points at).
pub(crate) type AtTensor = std::ffi::c_void;

unsafe extern "C" {
    pub(crate) fn flc_free_bytes(p: *mut std::ffi::c_void);
    pub(crate) fn flc_store_connect(
        addr: *const c_char,
        port: c_int,
        host: c_int,
        world: c_int,
        timeout_ms: i64,
        prefix: *const c_char,
        err: *mut *mut c_char,
    ) -> *mut RawStore;
    pub(crate) fn flc_store_clone(s: *mut RawStore, err: *mut *mut c_char) -> *mut RawStore;
    pub(crate) fn flc_store_free(s: *mut RawStore);
    pub(crate) fn flc_store_set(
        s: *mut RawStore,
        key: *const c_char,
        data: *const u8,
        len: usize,
        err: *mut *mut c_char,
    ) -> c_int;
    pub(crate) fn flc_store_get(
        s: *mut RawStore,
        key: *const c_char,
        timeout_ms: i64,
        data: *mut *mut u8,
        len: *mut usize,
        err: *mut *mut c_char,
    ) -> c_int;
    pub(crate) fn flc_store_add(
        s: *mut RawStore,
        key: *const c_char,
        delta: i64,
        out: *mut i64,
        err: *mut *mut c_char,
    ) -> c_int;
    pub(crate) fn flc_group_new(
        s: *mut RawStore,
        rank: c_int,
        world: c_int,
        backend: c_int,
        ifname: *const c_char,
        hostname: *const c_char,
        cuda_device: c_int,
        timeout_ms: i64,
        err: *mut *mut c_char,
    ) -> *mut RawGroup;
    pub(crate) fn flc_group_free(g: *mut RawGroup);
    pub(crate) fn flc_has_nccl() -> c_int;
    pub(crate) fn flc_all_reduce_sum(g: *mut RawGroup, t: *mut AtTensor, err: *mut *mut c_char) -> c_int;
    pub(crate) fn flc_broadcast(g: *mut RawGroup, t: *mut AtTensor, root: c_int, err: *mut *mut c_char) -> c_int;
    pub(crate) fn flc_all_gather(
        g: *mut RawGroup,
        output: *mut AtTensor,
        input: *mut AtTensor,
        err: *mut *mut c_char,
    ) -> c_int;
    pub(crate) fn flc_barrier(g: *mut RawGroup, err: *mut *mut c_char) -> c_int;
}

/// The message the shim left in `err` (freed here), or a placeholder if it left none.
pub(crate) fn take_error(err: *mut c_char) -> String {
    if err.is_null() {
        return "c10d failed without a message".to_string();
    }
    // SAFETY: the shim wrote a NUL-terminated string allocated with malloc.
    let message = unsafe { CStr::from_ptr(err) }.to_string_lossy().into_owned();
    unsafe { flc_free_bytes(err.cast()) };
    message
}

/// The `at::Tensor*` behind a tch tensor.
pub(crate) fn at(t: &mut Tensor) -> *mut AtTensor {
    t.as_mut_ptr().cast()
}
