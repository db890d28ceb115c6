//! The Atari benchmark embeds the venv's Python (flotilla-envs-python): put the libpython directory
//! envs-python found into the binaries' rpath.
fn main() {
    if let Ok(dir) = std::env::var("DEP_FLOTILLA_PYTHON_LIBDIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
