//! Python environments as Flotilla environments, through an embedded CPython interpreter (pyo3).
//!
//! * [`GymEnv`]: any Gymnasium env by id (`gymnasium.make(id, **kwargs)`) as a [`flotilla_core::Env`] with
//!   `Box` (f32 or u8) and `Discrete` spaces; observations and actions cross as NumPy arrays, read and
//!   written through their buffers, never element by element. [`register`] makes `"gymnasium:<id>"` a
//!   backend of [`flotilla_envs::make`], so configs can name them (`[env] id = "gymnasium:Acrobot-v1"`).
//! * [`AtariVecEnv`]: ale-py's C++ `AtariVectorEnv` (Gymnasium's `AtariPreprocessing` +
//!   `FrameStackObservation(4)` done in C++), batched u8 frames, with Flotilla's same-step auto-reset
//!   contract: the true final observation of each ended episode is kept, life losses end a *training*
//!   episode without resetting the game, and episode statistics report the raw game score.
//!
//! The interpreter is the venv `scripts/setup.sh` builds in the cache (gymnasium, ale-py with its ROMs,
//! NumPy): its path is baked in at build time from `.cargo/config.toml` (`FLOTILLA_PYTHON`), and
//! `FLOTILLA_PYTHON` in the environment overrides it at run time. ALE is GPL-2.0: it stays a Python package
//! that Flotilla calls; nothing of it is linked into Flotilla.
//!
//! Every Python exception becomes an [`flotilla_core::Error::Backend`] naming the env and carrying Python's
//! message; nothing here panics on a Python error.
#![deny(missing_docs)]

mod atari;
mod gym;
mod interpreter;

pub use atari::{AtariConfig, AtariVecEnv, rom_name};
pub use gym::{GymEnv, register};
pub use interpreter::python_error;
