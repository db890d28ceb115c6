//! `flotilla` embeds the venv's Python (flotilla-envs-python, for "gymnasium:" envs): bake the directory of its
//! libpython (`PYO3_PYTHON`, set by scripts/setup.sh in .cargo/config.toml) into the binaries' rpath.
fn main() {
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    let python = std::env::var("PYO3_PYTHON").unwrap_or_else(|_| "python3".into());
    let libdir = std::process::Command::new(&python)
        .args(["-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if let Some(libdir) = libdir.filter(|d| !d.is_empty()) {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{libdir}");
    }
}
