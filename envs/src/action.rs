//! Checking an [`Action`] against an environment's action space before anything is mutated.
//!
//! Gymnasium asserts `action_space.contains(action)` (discrete envs) or silently clips (continuous envs);
//! here a bad action is an [`Error::InvalidAction`] that names the env and what was wrong, and the
//! environment is left untouched. Finite out-of-range continuous actions are still clipped by the
//! envs themselves, as in Gymnasium.

use flotilla_core::{Action, Error, Result};

/// The index of a `Discrete(n)` action, or an error for an out-of-range index or a continuous action.
#[inline]
pub(crate) fn discrete(env: &str, action: Action<'_>, n: i64) -> Result<i64> {
    match action {
        Action::Discrete(a) if (0..n).contains(&a) => Ok(a),
        Action::Discrete(a) => {
            Err(Error::InvalidAction { env: env.to_string(), detail: format!("discrete action {a} is outside 0..{n}") })
        }
        Action::Continuous(x) => Err(Error::InvalidAction {
            env: env.to_string(),
            detail: format!("expected a discrete action in 0..{n}, got a continuous action {x:?}"),
        }),
    }
}

/// The single element of a 1-D continuous action, or an error for a wrong length, a non-finite value or
/// a discrete action. Finite values outside the bounds pass: the envs clip them as Gymnasium does.
#[inline]
pub(crate) fn continuous_scalar(env: &str, action: Action<'_>) -> Result<f32> {
    match action {
        Action::Continuous(&[a]) if a.is_finite() => Ok(a),
        Action::Continuous(&[a]) => {
            Err(Error::InvalidAction { env: env.to_string(), detail: format!("continuous action {a} is not finite") })
        }
        Action::Continuous(x) => Err(Error::InvalidAction {
            env: env.to_string(),
            detail: format!("continuous action has {} elements, expected 1", x.len()),
        }),
        Action::Discrete(a) => Err(Error::InvalidAction {
            env: env.to_string(),
            detail: format!("expected a continuous action of 1 element, got the discrete action {a}"),
        }),
    }
}

/// Checks that a caller's observation buffer has the observation's length.
#[inline]
pub(crate) fn obs_buffer(env: &str, obs: &[f32], dim: usize) -> Result<()> {
    if obs.len() == dim {
        Ok(())
    } else {
        Err(Error::BadArgument {
            env: env.to_string(),
            key: "obs".into(),
            detail: format!("observation buffer has {} elements, expected {dim}", obs.len()),
        })
    }
}

/// Checks a physical state given to `set_state`: its length and that every value is finite.
pub(crate) fn state<const N: usize>(env: &str, state: &[f64]) -> Result<[f64; N]> {
    let array: [f64; N] = state.try_into().map_err(|_| Error::InvalidState {
        env: env.to_string(),
        detail: format!("state has {} elements, expected {N}", state.len()),
    })?;
    if let Some(i) = array.iter().position(|v| !v.is_finite()) {
        return Err(Error::InvalidState {
            env: env.to_string(),
            detail: format!("state element {i} is {}, expected a finite number", array[i]),
        });
    }
    Ok(array)
}
