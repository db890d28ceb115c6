//! Binaries and tests of this crate embed the interpreter `PYO3_PYTHON` names (set by scripts/setup.sh in
//! .cargo/config.toml): bake its libpython's directory into their rpath, so the venv's Python, not an older
//! system one, is loaded at run time.
fn main() {
    pyo3_build_config::add_libpython_rpath_link_args();
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    println!("cargo:rerun-if-env-changed=FLOTILLA_PYTHON");
}
