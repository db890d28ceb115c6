//! Compiles `shim/c10d_shim.cpp` against the libtorch that `LIBTORCH` names (scripts/setup.sh writes it into
//! .cargo/config.toml, as for tch): C++17, the C++11 ABI, Gloo's c10d header behind `USE_C10D_GLOO`, and
//! `shim/gloo_decls` standing in for gloo's own headers, which the torch wheel does not ship. With the CUDA
//! libtorch (it has libtorch_cuda.so and ProcessGroupNCCL.hpp) and `FLOTILLA_CUDA=1`, the NCCL path is compiled
//! too (`FLOTILLA_NCCL`).
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=shim");
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=FLOTILLA_CUDA");
    let libtorch = PathBuf::from(
        std::env::var("LIBTORCH")
            .expect("LIBTORCH is not set: run `bash scripts/setup.sh`, which writes it into .cargo/config.toml"),
    );
    let include = libtorch.join("include");
    let lib = libtorch.join("lib");
    let cuda = std::env::var("FLOTILLA_CUDA").is_ok_and(|v| v == "1") && lib.join("libtorch_cuda.so").exists();
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .file("shim/c10d_shim.cpp")
        .std("c++17")
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .define("USE_C10D_GLOO", None)
        .include("shim/gloo_decls")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .warnings(false);
    if cuda {
        build.define("FLOTILLA_NCCL", None).define("USE_C10D_NCCL", None);
        // The CUDA runtime's and NCCL's headers come with their wheels beside torch (nvidia/*/include).
        if let Some(site) = libtorch.parent() {
            for sub in ["nvidia/cu13/include", "nvidia/cuda_runtime/include", "nvidia/nccl/include"] {
                let dir = site.join(sub);
                if dir.exists() {
                    build.include(dir);
                }
            }
        }
    }
    build.compile("flotilla_c10d");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    if cuda {
        println!("cargo:rustc-link-lib=dylib=torch_cuda");
    }
}
