//! The embedded interpreter: started once, with the cache venv's site-packages on its path.
use std::path::PathBuf;
use std::sync::OnceLock;

use flotilla_core::Error;
use pyo3::prelude::*;

/// The venv's Python: `FLOTILLA_PYTHON` at run time, else the one `.cargo/config.toml` named at build time.
fn venv_python() -> Option<PathBuf> {
    std::env::var_os("FLOTILLA_PYTHON").map(PathBuf::from).or_else(|| option_env!("FLOTILLA_PYTHON").map(PathBuf::from))
}

/// `<venv>/lib/python3.X/site-packages` of the venv whose `bin/python` is `python`.
fn site_packages(python: &std::path::Path) -> Option<PathBuf> {
    let venv = python.parent()?.parent()?;
    std::fs::read_dir(venv.join("lib"))
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("site-packages"))
        .find(|p| p.is_dir())
}

/// Make the venv's packages importable (once per process). The embedded interpreter starts from the base
/// installation, which does not see a venv by itself.
pub(crate) fn ensure_venv(py: Python<'_>) -> PyResult<()> {
    static DONE: OnceLock<Option<PathBuf>> = OnceLock::new();
    let site = DONE.get_or_init(|| venv_python().as_deref().and_then(site_packages));
    if let Some(site) = site {
        let sys_path = py.import("sys")?.getattr("path")?;
        let entry = site.to_string_lossy().to_string();
        if !sys_path.call_method1("__contains__", (entry.clone(),))?.extract::<bool>()? {
            py.import("site")?.call_method1("addsitedir", (entry,))?;
        }
    }
    Ok(())
}

/// A Python exception as an env error: the env's id, what was being done, and Python's own message. A
/// missing package (a `ModuleNotFoundError`, or Gymnasium's `DependencyNotInstalled` for an env family's extra
/// such as MuJoCo) names the set-up script that installs it.
pub fn python_error(env: &str, doing: &str, e: PyErr) -> Error {
    let detail = Python::attach(|py| {
        let missing = e.is_instance_of::<pyo3::exceptions::PyModuleNotFoundError>(py)
            || e.get_type(py).name().is_ok_and(|n| n == "DependencyNotInstalled");
        if missing {
            format!(
                "{doing}: {e} (run `bash scripts/setup.sh`, which installs gymnasium, ale-py and mujoco into the \
                 cache venv)"
            )
        } else {
            format!("{doing}: {e}")
        }
    });
    Error::Backend { env: env.to_string(), detail }
}

/// Run `f` with the interpreter attached and the venv importable; Python errors become env errors.
pub(crate) fn with_python<T>(
    env: &str,
    doing: &str,
    f: impl FnOnce(Python<'_>) -> PyResult<T>,
) -> flotilla_core::Result<T> {
    Python::attach(|py| ensure_venv(py).and_then(|()| f(py))).map_err(|e| python_error(env, doing, e))
}
