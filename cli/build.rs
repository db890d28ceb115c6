//! `flotilla` embeds the venv's Python (flotilla-envs-python, for "gymnasium:" envs): put the libpython
//! directory envs-python found into the binary's rpath.
fn main() {
    if let Ok(dir) = std::env::var("DEP_FLOTILLA_PYTHON_LIBDIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
