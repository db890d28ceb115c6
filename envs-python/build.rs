//! Binaries and tests embed the interpreter `PYO3_PYTHON` names (set by scripts/setup.sh in
//! .cargo/config.toml): bake its libpython's directory into this crate's own targets, and hand it to dependent
//! packages as `DEP_FLOTILLA_PYTHON_LIBDIR` (`links = "flotilla_python"`) so their binaries do the same.
fn main() {
    pyo3_build_config::add_libpython_rpath_link_args();
    if let Some(dir) = pyo3_build_config::get().lib_dir() {
        println!("cargo:libdir={dir}");
    }
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
}
