//! Protobuf messages ↔ `flotilla_core` types. Tensors travel as raw little-endian bytes with dtype and shape;
//! `u8` observations stay `u8`. Decoding checks what the wire can get wrong (dtype, byte counts against
//! the shape, flag bytes) and names the field; [`flotilla_core::Chunk::validate`] then checks the chunk as a
//! whole against the run.
use std::sync::Arc;

use bytes::Bytes;
use flotilla_core::{Chunk, EpisodeStats, Gradient, ObsBuf, Params, Space, Versioned};

use crate::error::RpcError;
use crate::proto;
use crate::service::{Ack, MessageKey, Registered, Registration, RunInfo};

/// f32 values as a little-endian tensor of `shape`.
pub fn f32_tensor(values: &[f32], shape: Vec<u64>) -> proto::Tensor {
    let mut data = Vec::with_capacity(values.len() * 4);
    for v in values {
        data.extend_from_slice(&v.to_le_bytes());
    }
    proto::Tensor { dtype: proto::DType::DtypeF32 as i32, shape, data: Bytes::from(data) }
}

fn obs_tensor(buf: &ObsBuf, mut shape: Vec<u64>, obs_dim: usize) -> proto::Tensor {
    shape.push(obs_dim as u64);
    match buf {
        ObsBuf::F32(v) => f32_tensor(v, shape),
        ObsBuf::U8(v) => proto::Tensor { dtype: proto::DType::DtypeU8 as i32, shape, data: Bytes::copy_from_slice(v) },
    }
}

fn elements(t: &proto::Tensor, field: &str) -> Result<usize, RpcError> {
    t.shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d as usize))
        .ok_or_else(|| RpcError::invalid(format!("{field}: shape {:?} overflows", t.shape)))
}

/// A tensor's values as f32 (it must be `DTYPE_F32` with `4 · product(shape)` bytes). An absent tensor is empty.
pub fn tensor_f32(t: Option<&proto::Tensor>, field: &str) -> Result<Vec<f32>, RpcError> {
    let Some(t) = t else { return Ok(Vec::new()) };
    if t.dtype != proto::DType::DtypeF32 as i32 {
        return Err(RpcError::invalid(format!("{field}: dtype {}, expected DTYPE_F32", dtype_name(t.dtype))));
    }
    let n = elements(t, field)?;
    if t.data.len() != n * 4 {
        return Err(RpcError::invalid(format!(
            "{field}: {} bytes for shape {:?} of f32 ({} expected)",
            t.data.len(),
            t.shape,
            n * 4
        )));
    }
    Ok(t.data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
}

fn tensor_obs(t: Option<&proto::Tensor>, field: &str) -> Result<ObsBuf, RpcError> {
    match t {
        Some(t) if t.dtype == proto::DType::DtypeU8 as i32 => {
            let n = elements(t, field)?;
            if t.data.len() != n {
                return Err(RpcError::invalid(format!(
                    "{field}: {} bytes for shape {:?} of u8 ({n} expected)",
                    t.data.len(),
                    t.shape
                )));
            }
            Ok(ObsBuf::U8(t.data.to_vec()))
        }
        other => Ok(ObsBuf::F32(tensor_f32(other, field)?)),
    }
}

fn dtype_name(d: i32) -> String {
    proto::DType::try_from(d).map(|d| d.as_str_name().to_string()).unwrap_or_else(|_| format!("unknown ({d})"))
}

fn flags(b: &[u8], field: &str) -> Result<Vec<bool>, RpcError> {
    b.iter()
        .enumerate()
        .map(|(i, &x)| match x {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(RpcError::invalid(format!("{field}[{i}] is {x}, expected 0 or 1"))),
        })
        .collect()
}

fn episodes_to_proto(episodes: &[EpisodeStats]) -> Vec<proto::EpisodeStats> {
    episodes
        .iter()
        .map(|e| proto::EpisodeStats {
            episode_return: e.episode_return,
            length: e.length,
            env_index: e.env_index as u32,
            truncated: e.truncated,
            task: e.task,
        })
        .collect()
}

fn episodes_from_proto(episodes: &[proto::EpisodeStats]) -> Vec<EpisodeStats> {
    episodes
        .iter()
        .map(|e| EpisodeStats {
            episode_return: e.episode_return,
            length: e.length,
            env_index: e.env_index as usize,
            truncated: e.truncated,
            task: e.task,
        })
        .collect()
}

/// Encode a chunk (observation rows of `obs_dim` values) with its idempotency key ([`MessageKey::NONE`]: none).
pub fn chunk_to_proto(c: &Chunk, protocol_version: u32, key: MessageKey) -> proto::Chunk {
    let (t, e) = (c.n_steps as u64, c.n_envs as u64);
    let n = c.n_steps * c.n_envs;
    let obs_dim = c.obs.len().checked_div(n).unwrap_or(0);
    let act_dim = c.actions.len().checked_div(n).unwrap_or(0);
    let opt = |v: &[f32]| (!v.is_empty()).then(|| f32_tensor(v, vec![t, e]));
    proto::Chunk {
        protocol_version,
        actor_id: c.actor_id,
        policy_version: c.policy_version,
        n_steps: c.n_steps as u32,
        n_envs: c.n_envs as u32,
        obs: Some(obs_tensor(&c.obs, vec![t, e], obs_dim)),
        bootstrap_obs: Some(obs_tensor(&c.bootstrap_obs, vec![e], obs_dim)),
        actions: Some(f32_tensor(&c.actions, vec![t, e, act_dim as u64])),
        rewards: Some(f32_tensor(&c.rewards, vec![t, e])),
        terminated: c.terminated.iter().map(|&b| u8::from(b)).collect(),
        truncated: c.truncated.iter().map(|&b| u8::from(b)).collect(),
        log_probs: opt(&c.log_probs),
        values: opt(&c.values),
        initial_state: (!c.initial_state.is_empty())
            .then(|| f32_tensor(&c.initial_state, vec![e, (c.initial_state.len() / c.n_envs.max(1)) as u64])),
        final_index: c.final_index.clone(),
        final_obs: Some(obs_tensor(&c.final_obs, vec![c.final_index.len() as u64], obs_dim)),
        episodes: episodes_to_proto(&c.episodes),
        sender: key.sender,
        seq: key.seq,
    }
}

/// A tensor's shape must start with `dims` (the layout the chunk's `n_steps` and `n_envs` give it): the same bytes
/// under another shape — `[E, T]` for `[T, E]`, say — would be read in the wrong order.
fn leading(t: Option<&proto::Tensor>, dims: &[u64], field: &str, what: &str) -> Result<(), RpcError> {
    match t {
        Some(t) if !t.data.is_empty() && !t.shape.starts_with(dims) => {
            Err(RpcError::invalid(format!("{field}: shape {:?}, expected {dims:?}… ({what})", t.shape)))
        }
        _ => Ok(()),
    }
}

/// Decode a chunk and its idempotency key; [`Chunk::validate`] checks the chunk against the run afterwards.
pub fn chunk_from_proto(p: &proto::Chunk) -> Result<(Chunk, MessageKey), RpcError> {
    let (t, e, ends) = (u64::from(p.n_steps), u64::from(p.n_envs), p.final_index.len() as u64);
    for (tensor, field) in [
        (&p.obs, "obs"),
        (&p.actions, "actions"),
        (&p.rewards, "rewards"),
        (&p.log_probs, "log_probs"),
        (&p.values, "values"),
    ] {
        leading(tensor.as_ref(), &[t, e], field, "n_steps × n_envs")?;
    }
    leading(p.bootstrap_obs.as_ref(), &[e], "bootstrap_obs", "n_envs")?;
    leading(p.initial_state.as_ref(), &[e], "initial_state", "n_envs")?;
    leading(p.final_obs.as_ref(), &[ends], "final_obs", "one row per final_index")?;
    let chunk = Chunk {
        actor_id: p.actor_id,
        policy_version: p.policy_version,
        n_steps: p.n_steps as usize,
        n_envs: p.n_envs as usize,
        obs: tensor_obs(p.obs.as_ref(), "obs")?,
        bootstrap_obs: tensor_obs(p.bootstrap_obs.as_ref(), "bootstrap_obs")?,
        actions: tensor_f32(p.actions.as_ref(), "actions")?,
        rewards: tensor_f32(p.rewards.as_ref(), "rewards")?,
        terminated: flags(&p.terminated, "terminated")?,
        truncated: flags(&p.truncated, "truncated")?,
        log_probs: tensor_f32(p.log_probs.as_ref(), "log_probs")?,
        values: tensor_f32(p.values.as_ref(), "values")?,
        initial_state: tensor_f32(p.initial_state.as_ref(), "initial_state")?,
        final_index: p.final_index.clone(),
        final_obs: tensor_obs(p.final_obs.as_ref(), "final_obs")?,
        episodes: episodes_from_proto(&p.episodes),
    };
    Ok((chunk, MessageKey { sender: p.sender, seq: p.seq }))
}

/// Encode an A3C gradient with its idempotency key.
pub fn gradient_to_proto(g: &Gradient, protocol_version: u32, key: MessageKey) -> proto::Gradient {
    proto::Gradient {
        protocol_version,
        actor_id: g.actor_id,
        policy_version: g.policy_version,
        values: Some(f32_tensor(&g.values, vec![g.values.len() as u64])),
        env_steps: g.env_steps,
        episodes: episodes_to_proto(&g.episodes),
        sender: key.sender,
        seq: key.seq,
    }
}

/// Decode an A3C gradient and its idempotency key.
pub fn gradient_from_proto(p: &proto::Gradient) -> Result<(Gradient, MessageKey), RpcError> {
    let gradient = Gradient {
        actor_id: p.actor_id,
        policy_version: p.policy_version,
        values: tensor_f32(p.values.as_ref(), "gradient values")?,
        env_steps: p.env_steps,
        episodes: episodes_from_proto(&p.episodes),
    };
    Ok((gradient, MessageKey { sender: p.sender, seq: p.seq }))
}

/// Encode a parameter reply (`None`: the actor is up to date).
pub fn params_to_proto(p: Option<&Params>) -> proto::ParamsReply {
    match p {
        None => proto::ParamsReply { modified: false, version: 0, values: None },
        Some(p) => proto::ParamsReply {
            modified: true,
            version: p.version,
            values: Some(f32_tensor(&p.value, vec![p.value.len() as u64])),
        },
    }
}

/// Decode a parameter reply.
pub fn params_from_proto(p: &proto::ParamsReply) -> Result<Option<Params>, RpcError> {
    if !p.modified {
        return Ok(None);
    }
    let values = tensor_f32(p.values.as_ref(), "params")?;
    if let Some(i) = values.iter().position(|v| !v.is_finite()) {
        return Err(RpcError::invalid(format!("params[{i}] is {}, must be finite", values[i])));
    }
    Ok(Some(Versioned { version: p.version, value: Arc::new(values) }))
}

/// Encode a registration.
pub fn registration_to_proto(r: &Registration, protocol_version: u32) -> Result<proto::Registration, RpcError> {
    let text = |s: &Space| toml::to_string(s).map_err(|e| RpcError::invalid(format!("space: {e}")));
    Ok(proto::Registration {
        protocol_version,
        run_id: r.run_id.clone(),
        observation_space_toml: text(&r.observation_space)?,
        action_space_toml: text(&r.action_space)?,
        n_envs: r.n_envs as u32,
        actor_index: r.actor_index.map_or(-1, |i| i as i32),
        host: r.host.clone(),
        pid: r.pid,
    })
}

/// Decode a registration.
pub fn registration_from_proto(p: &proto::Registration) -> Result<Registration, RpcError> {
    let space = |s: &str, field: &str| {
        toml::from_str::<Space>(s).map_err(|e| RpcError::invalid(format!("{field}: not a space ({e}): {s}")))
    };
    Ok(Registration {
        run_id: p.run_id.clone(),
        observation_space: space(&p.observation_space_toml, "observation_space_toml")?,
        action_space: space(&p.action_space_toml, "action_space_toml")?,
        n_envs: p.n_envs as usize,
        actor_index: u32::try_from(p.actor_index).ok(),
        host: p.host.clone(),
        pid: p.pid,
    })
}

/// Encode a registration reply.
pub fn registered_to_proto(r: &Registered) -> proto::Registered {
    proto::Registered {
        actor_id: r.actor_id,
        actor_index: r.actor_index,
        n_actors: r.n_actors,
        seed: r.seed,
        chunk_steps: r.chunk_steps as u32,
        policy_version: r.policy_version,
        synchronous: r.synchronous,
    }
}

/// Decode a registration reply.
pub fn registered_from_proto(p: &proto::Registered) -> Registered {
    Registered {
        actor_id: p.actor_id,
        actor_index: p.actor_index,
        n_actors: p.n_actors,
        seed: p.seed,
        chunk_steps: p.chunk_steps as usize,
        policy_version: p.policy_version,
        synchronous: p.synchronous,
    }
}

/// Encode run info.
pub fn run_info_to_proto(r: &RunInfo, protocol_version: u32) -> proto::RunInfo {
    proto::RunInfo { protocol_version, run_id: r.run_id.clone(), config_toml: r.config_toml.clone() }
}

/// Decode run info.
pub fn run_info_from_proto(p: &proto::RunInfo) -> RunInfo {
    RunInfo { run_id: p.run_id.clone(), config_toml: p.config_toml.clone() }
}

/// Encode an ack.
pub fn ack_to_proto(a: Ack) -> proto::Ack {
    proto::Ack {
        finished: a.finished,
        policy_version: a.policy_version,
        env_steps: a.env_steps,
        total_env_steps: a.total_env_steps,
        accepted: a.accepted,
    }
}

/// Decode an ack.
pub fn ack_from_proto(p: &proto::Ack) -> Ack {
    Ack {
        finished: p.finished,
        policy_version: p.policy_version,
        env_steps: p.env_steps,
        total_env_steps: p.total_env_steps,
        accepted: p.accepted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(obs: ObsBuf, final_obs: ObsBuf, bootstrap: ObsBuf) -> Chunk {
        Chunk {
            actor_id: 7,
            policy_version: 2,
            n_steps: 2,
            n_envs: 1,
            obs,
            bootstrap_obs: bootstrap,
            actions: vec![1.0, 0.0],
            rewards: vec![1.0, -0.5],
            terminated: vec![true, false],
            truncated: vec![false, false],
            log_probs: vec![-0.1, -0.2],
            values: vec![],
            initial_state: Vec::new(),
            final_index: vec![0],
            final_obs,
            episodes: vec![EpisodeStats { episode_return: 3.5, length: 4, env_index: 0, truncated: false, task: None }],
        }
    }

    #[test]
    fn chunks_round_trip_and_u8_stays_u8() {
        for c in [
            chunk(ObsBuf::F32(vec![0.5, -1.0, 2.0, 3.0]), ObsBuf::F32(vec![9.0, 8.0]), ObsBuf::F32(vec![4.0, 5.0])),
            chunk(ObsBuf::U8(vec![0, 255, 7, 8]), ObsBuf::U8(vec![1, 2]), ObsBuf::U8(vec![3, 4])),
        ] {
            let key = MessageKey { sender: 0xfeed, seq: 42 };
            let p = chunk_to_proto(&c, 1, key);
            assert_eq!(p.obs.as_ref().unwrap().shape, vec![2, 1, 2]);
            if let ObsBuf::U8(_) = c.obs {
                assert_eq!(p.obs.as_ref().unwrap().data.len(), 4, "one byte per u8 observation element");
            }
            assert_eq!(chunk_from_proto(&p).unwrap(), (c, key));
        }
        // A recurrent policy's initial state ([E, state_dim]) crosses the wire too.
        let mut c = chunk(ObsBuf::F32(vec![0.0; 4]), ObsBuf::F32(vec![0.0; 2]), ObsBuf::F32(vec![0.0; 2]));
        c.initial_state = vec![0.25, -0.5, 1.5];
        let p = chunk_to_proto(&c, 1, MessageKey::NONE);
        assert_eq!(p.initial_state.as_ref().unwrap().shape, vec![1, 3]);
        assert_eq!(chunk_from_proto(&p).unwrap().0, c);
        // An episode's task (multi-task runs) crosses the wire too.
        let mut c = chunk(ObsBuf::F32(vec![0.0; 4]), ObsBuf::F32(vec![0.0; 2]), ObsBuf::F32(vec![0.0; 2]));
        c.episodes[0].task = Some(2);
        assert_eq!(chunk_from_proto(&chunk_to_proto(&c, 1, MessageKey::NONE)).unwrap().0.episodes[0].task, Some(2));
    }

    #[test]
    fn wire_defects_are_named() {
        let c = chunk(ObsBuf::F32(vec![0.0; 4]), ObsBuf::F32(vec![0.0; 2]), ObsBuf::F32(vec![0.0; 2]));
        let mut p = chunk_to_proto(&c, 1, MessageKey::NONE);
        p.rewards.as_mut().unwrap().data = Bytes::from_static(&[0, 0, 128]);
        assert!(chunk_from_proto(&p).unwrap_err().message.contains("rewards: 3 bytes for shape [2, 1] of f32"));
        let mut p = chunk_to_proto(&c, 1, MessageKey::NONE);
        p.terminated = Bytes::from_static(&[1, 2]);
        assert!(chunk_from_proto(&p).unwrap_err().message.contains("terminated[1] is 2"));
        let mut p = chunk_to_proto(&c, 1, MessageKey::NONE);
        p.actions.as_mut().unwrap().dtype = proto::DType::DtypeU8 as i32;
        assert!(chunk_from_proto(&p).unwrap_err().message.contains("actions: dtype DTYPE_U8, expected DTYPE_F32"));
    }

    #[test]
    fn a_tensor_under_another_shape_is_refused_even_with_the_right_byte_count() {
        let c = Chunk {
            actor_id: 1,
            policy_version: 0,
            n_steps: 4,
            n_envs: 2,
            obs: ObsBuf::F32(vec![0.0; 4 * 2 * 3]),
            bootstrap_obs: ObsBuf::F32(vec![0.0; 2 * 3]),
            actions: vec![0.0; 8],
            rewards: vec![0.0; 8],
            terminated: vec![false; 8],
            truncated: vec![false; 8],
            log_probs: vec![0.0; 8],
            values: vec![0.0; 8],
            initial_state: Vec::new(),
            final_index: vec![],
            final_obs: ObsBuf::F32(vec![]),
            episodes: vec![],
        };
        assert!(chunk_from_proto(&chunk_to_proto(&c, 1, MessageKey::NONE)).is_ok());
        type Corrupt = fn(&mut proto::Chunk);
        let cases: [(Corrupt, &str); 4] = [
            (|p| p.rewards.as_mut().unwrap().shape = vec![2, 4], "rewards: shape [2, 4], expected [4, 2]"),
            (|p| p.values.as_mut().unwrap().shape = vec![8], "values: shape [8], expected [4, 2]"),
            (|p| p.obs.as_mut().unwrap().shape = vec![2, 4, 3], "obs: shape [2, 4, 3]"),
            (|p| p.bootstrap_obs.as_mut().unwrap().shape = vec![1, 6], "bootstrap_obs: shape [1, 6], expected [2]"),
        ];
        for (edit, needle) in cases {
            let mut p = chunk_to_proto(&c, 1, MessageKey::NONE);
            edit(&mut p);
            let e = chunk_from_proto(&p).unwrap_err();
            assert!(e.message.contains(needle), "{needle:?} not in {:?}", e.message);
        }
    }

    #[test]
    fn an_a3c_gradient_and_its_idempotency_key_round_trip() {
        let g =
            Gradient { actor_id: 3, policy_version: 9, values: vec![0.5, -1.5], env_steps: 8, episodes: Vec::new() };
        let key = MessageKey { sender: 0xbeef, seq: 7 };
        assert_eq!(gradient_from_proto(&gradient_to_proto(&g, 1, key)).unwrap(), (g, key));
    }

    #[test]
    fn params_and_registration_round_trip() {
        let p = Versioned { version: 5, value: Arc::new(vec![1.0f32, -2.0]) };
        assert_eq!(params_from_proto(&params_to_proto(Some(&p))).unwrap(), Some(p));
        assert_eq!(params_from_proto(&params_to_proto(None)).unwrap(), None);
        let r = Registration {
            run_id: "r".into(),
            observation_space: Space::box1d(vec![f32::NEG_INFINITY], vec![1.0]),
            action_space: Space::discrete(2),
            n_envs: 4,
            actor_index: Some(3),
            host: "h".into(),
            pid: 9,
        };
        assert_eq!(registration_from_proto(&registration_to_proto(&r, 1).unwrap()).unwrap(), r);
    }
}
