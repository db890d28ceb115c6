//! The experiment config: one TOML file, typed, every field defaulted, unknown keys refused.
//!
//! ```toml
//! [run]            # seed, total_env_steps, device, torch_threads
//! [env]            # id, num_envs, kwargs = { ... } (Gymnasium constructor arguments)
//! [algorithm]      # kind = "ppo", then that algorithm's fields (flotilla_algorithms::ppo::PpoConfig)
//! [eval]           # episodes, interval_steps, seed
//! [metrics]        # log_interval_steps
//! [checkpoint]     # interval_steps
//! ```
//!
//! `--set section.key=value` overrides are applied to the parsed TOML before it is typed, so they are checked
//! exactly like the file. The resolved config (defaults filled in) is saved with every run.
use std::path::{Path, PathBuf};
use std::str::FromStr;

use flotilla_algorithms::Algorithm;
/// The `[algorithm]` section and the families of algorithms live in the algorithm registry.
pub use flotilla_algorithms::registry::{AlgorithmConfig, Family};
use flotilla_core::Space;
use flotilla_envs::{EnvRole, KwargValue, Kwargs, make_vector};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{Error, Result};

/// Longest `[actors] reconnect_secs` accepted: about four months.
pub const MAX_RECONNECT_SECS: f64 = 1e7;

/// A whole experiment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentConfig {
    /// Seed, budget, device.
    #[serde(default)]
    pub run: RunConfig,
    /// Which environment, how many copies.
    pub env: EnvConfig,
    /// The learning algorithm and its hyperparameters.
    pub algorithm: AlgorithmConfig,
    /// Periodic deterministic evaluation.
    #[serde(default)]
    pub eval: EvalConfig,
    /// Logging.
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// Checkpoints for exact resume.
    #[serde(default)]
    pub checkpoint: CheckpointConfig,
    /// Actor processes (distributed runs: `flotilla train --actors N`, `flotilla learner`).
    #[serde(default)]
    pub actors: ActorsConfig,
    /// The learner's server and ingest queue (distributed runs).
    #[serde(default)]
    pub learner: LearnerConfig,
    /// Message limits of the wire (distributed runs).
    #[serde(default)]
    pub transport: TransportConfig,
    /// Transfer: start from another run's weights, freeze or reinitialise layers.
    #[serde(default)]
    pub init: InitConfig,
    /// Several tasks in one run (`[[tasks]]`): `[env] num_envs` is split evenly between them and each
    /// observation carries its task as a one-hot (see [`TaskConfig`]). Empty: the one env of `[env]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<TaskConfig>,
    /// Many members of this config trained as one run (`[population]`: seeds, sweeps, PBT); none: one run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub population: Option<crate::population::config::PopulationConfig>,
    /// Observation and reward normalisation around the agent (`[normalize]`, SB3's `VecNormalize`); none: off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub normalize: Option<flotilla_algorithms::normalize::NormalizeConfig>,
}

/// `[[tasks]]`: one task of a multi-task run. Its env is `id` (default `[env] id`) with `kwargs`; when it
/// keeps `[env]`'s id, `[env] kwargs` apply under its own. Tasks must share the action space (an error names
/// the two that differ); their observations meet the network as `[env] task_inputs` says (shared columns, or
/// columns of their own: an input layer per task, sizes may differ), with a one-hot of the task appended
/// (`flotilla_envs::TaskVecEnv`); evaluations and metrics are per task (`eval/<name>/mean_return`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskConfig {
    /// Name in metrics columns and logs (letters, digits, `_`, `-`).
    pub name: String,
    /// Registered env id; default `[env] id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Constructor arguments, as `[env] kwargs`.
    #[serde(default, skip_serializing_if = "toml::Table::is_empty")]
    pub kwargs: toml::Table,
}

/// `[init]`: transfer from a trained run. A fresh run copies the policy weights of `from` (its
/// `model.safetensors`) except the `reinit` layers; `freeze` layers then stay fixed for the whole run
/// (resumed runs too). Layers are named as the network's parameters are, without `.weight` / `.bias`
/// (`pi_vf.0` is the first layer of PPO/A2C's policy and value MLPs, `q.0` DQN's, `actor.0` TD3's); a prefix
/// names every layer under it. An unknown layer is an error listing the network's layers.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InitConfig {
    /// A run directory written by `flotilla train` (relative to the working directory), or none.
    pub from: Option<String>,
    /// Layers kept fixed: their gradient is zero, so no optimiser moves them.
    pub freeze: Vec<String>,
    /// Layers initialised afresh instead of copied (e.g. the output layer when the action count differs).
    pub reinit: Vec<String>,
}

/// A distributed run's shape, from [`ExperimentConfig::plan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// How chunks are used.
    pub family: Family,
    /// Actor processes.
    pub n_actors: usize,
    /// Envs per actor (`E` of a chunk).
    pub envs_per_actor: usize,
    /// Steps per chunk (`T`).
    pub chunk_steps: usize,
    /// On-policy: chunks per learner batch (`num_envs / E`).
    pub chunks_per_batch: usize,
}

/// `[actors]`: how actor processes collect data. Used only when the run has actors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ActorsConfig {
    /// Actor processes (0: single-process training). `--actors N` overrides it.
    pub count: usize,
    /// Slots for actor processes started elsewhere — on other hosts, by their own service manager (`flotilla
    /// actor --learner ADDR --index I` with `I` in `count..count + remote`): the learner takes `count + remote`
    /// actors, and `flotilla train` launches (and restarts) the first `count`. Needs `count > 0`.
    pub remote: usize,
    /// Envs each actor steps (0: `env.num_envs / count` for on-policy algorithms, so a learner batch of
    /// `env.num_envs × n_steps` is the single-process one; `env.num_envs` for off-policy ones).
    pub envs_per_actor: usize,
    /// Steps per chunk (0: the algorithm's `n_steps` for PPO/A2C/A3C; 32 for off-policy algorithms).
    pub chunk_steps: usize,
    /// Ape-X exploration for DQN: actor `i` of `N` acts ε-greedily with `ε_i = epsilon^(1 + epsilon_alpha · i/(N−1))`.
    pub epsilon: f64,
    /// See `epsilon`.
    pub epsilon_alpha: f64,
    /// Restarts allowed per actor slot over the run before the launcher gives up on it.
    pub max_restarts: u32,
    /// Seconds an actor keeps trying to reach a learner that went away before it exits.
    pub reconnect_secs: f64,
    /// `[[tasks]]` runs: the actor in slot `s` steps task `s mod T` only (all its envs), instead of every actor
    /// stepping every task (its envs split between them). Each learner's actors must then be a multiple of T.
    pub task_per_actor: bool,
}

impl Default for ActorsConfig {
    fn default() -> Self {
        ActorsConfig {
            count: 0,
            remote: 0,
            envs_per_actor: 0,
            chunk_steps: 0,
            epsilon: 0.4,
            epsilon_alpha: 7.0,
            max_restarts: 100,
            reconnect_secs: 60.0,
            task_per_actor: false,
        }
    }
}

/// `[learner]`: the learner's server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LearnerConfig {
    /// Address to listen on. Loopback unless told otherwise; port 0 picks a free port.
    pub listen: String,
    /// Chunks (or gradients) older than this many parameter versions are not trained on; they are counted
    /// in `charts/stale_chunks` and logged. On-policy algorithms and A3C only.
    pub max_policy_lag: u64,
    /// On-policy algorithms (PPO, A2C): each actor's chunk is acknowledged only after the update it feeds, and
    /// the actor collects its next chunk with those new parameters — no policy lag, the single-process sample
    /// efficiency, but actors idle while the learner updates. Off: actors never wait (lag 1–`max_policy_lag`).
    /// A3C actors always wait for their gradient to be applied (A3C's own loop), whatever this says.
    pub synchronous: bool,
    /// Chunks (or gradients) the ingest queue holds before actors wait (back-pressure). 0: one learner batch
    /// (`chunks_per_batch`) for on-policy algorithms, one per actor for A3C, 64 for off-policy ones. A short
    /// queue keeps on-policy data fresh: what waits in the queue ages by one version per update.
    pub queue_chunks: usize,
    /// Assemble the next batch on a thread of its own while the update runs (double-buffered), or on the
    /// update thread between updates: on-policy algorithms (PPO, A2C) stack chunks and copy them to the device;
    /// DQN (uniform or frame replay) observes chunks into its replay and samples minibatches onto the device.
    pub assemble_ahead: AssembleAhead,
    /// Data-parallel learners training one model (each serving its own actors; gradients all-reduced on
    /// libtorch's c10d after every backward pass). `flotilla train --learners L` starts them; under torchrun,
    /// Kubeflow or Slurm this must equal the launcher's `WORLD_SIZE`.
    pub learners: usize,
    /// The collective backend: `auto` (NCCL for CUDA learners when built with it, else Gloo), `gloo`, `nccl`.
    pub backend: CollectiveBackend,
    /// Seconds a collective (or the rendezvous) may wait for the other learners before failing with an error
    /// naming the lost ones. Evaluations run on learner 0 alone while the others wait: keep this above an
    /// evaluation's length.
    pub collective_timeout_secs: f64,
    /// Micro-batches per optimiser step (gradient accumulation): each minibatch is split into this many equal
    /// parts whose gradients add up before the step.
    pub accumulate: usize,
    /// Gradient compression on the wire: `none`, `fp16`, `bf16` or `topk:<fraction>` (error feedback keeps
    /// what top-k does not send).
    pub compression: String,
    /// Updates between checks that every learner holds the same parameters (a checksum all-gather); 0: never.
    /// With `average_every`, counted in averages (the parameters agree right after each).
    pub check_every: u64,
    /// Periodic parameter averaging (local SGD) instead of a gradient all-reduce at every optimiser step: each
    /// learner trains alone (its own advantage normalisation, KL stop and Adam state) and every this many
    /// updates the parameters are averaged over the group (f32, uncompressed). An update is one PPO iteration
    /// (`n_epochs` × minibatches optimiser steps), one A2C step, or one chunk's DQN gradient steps. 0: off
    /// (synchronous gradient all-reduce).
    pub average_every: u64,
    /// `flotilla train --learners L`: times the whole group is restarted from its last checkpoint after a
    /// learner fails (as `torchrun --max-restarts`).
    pub max_restarts: u32,
    /// Serve Prometheus metrics at `http://ADDR/metrics` (`IP:PORT`, or `PORT` alone for loopback; learner r
    /// of a group listens on PORT + r): ingest, refusals, actors, queue depth, policy lag, update times and
    /// every logged metric. Off when absent.
    pub metrics_listen: Option<String>,
    /// A registered actor whose messages are refused this many times in a row (malformed, values outside the
    /// spaces) is disconnected: its next call is answered "unknown actor", which ends a Flotilla actor (the
    /// launcher restarts it); its slot is free for a new registration. The same count closes a gRPC connection
    /// whose calls are refused in a row, wire-level refusals included (bytes that do not decode, unknown
    /// dtypes, another protocol version, a wrong token). 0: never.
    pub max_refused_in_a_row: u32,
}

impl LearnerConfig {
    /// `metrics_listen` as an address: `IP:PORT`, or a bare `PORT` on loopback; `None` when off. The error names
    /// the key and the value.
    pub fn metrics_addr(&self) -> Result<Option<std::net::SocketAddr>> {
        let Some(text) = self.metrics_listen.as_deref() else { return Ok(None) };
        let parsed = match text.parse::<u16>() {
            Ok(port) => Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port))),
            Err(_) => text.parse::<std::net::SocketAddr>(),
        };
        parsed.map(Some).map_err(|_| {
            Error::Config(format!(
                "[learner] metrics_listen = {text:?}: expected IP:PORT (e.g. 127.0.0.1:9100) or a port number"
            ))
        })
    }
}

/// `[learner] backend`: which c10d backend carries the learners' collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveBackend {
    /// NCCL where the learner's device is CUDA and this build has NCCL, Gloo otherwise.
    Auto,
    /// Gloo: CPU tensors (CUDA ones staged through the host).
    Gloo,
    /// NCCL: one GPU per learner.
    Nccl,
}

/// `[learner] assemble_ahead`: where a distributed learner assembles its batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AssembleAhead {
    /// On its own thread for DQN (its replay sampling overlaps the update: measured 0–11 % more frames/s on
    /// Pong with 2 CPU cores) and for any learner on a GPU (the host work then overlaps the device's); for
    /// PPO/A2C on a CPU learner between updates, where that thread would take cores from the update
    /// (measured: 4–6 % fewer frames/s on 2 cores). BENCHMARKS.md has both.
    Auto,
    /// Always on its own thread; refused when the config is planned for an algorithm that cannot (A3C,
    /// DDPG/TD3, DQN with prioritized replay).
    On,
    /// Always between updates, on the update thread.
    Off,
}

/// Log what this config will do badly on this machine ([`machine_warnings`]).
pub(crate) fn warn_about_the_machine(config: &ExperimentConfig, device: tch::Device) {
    let native = flotilla_algorithms::nn::nets::cpu_has_native_bf16();
    for warning in machine_warnings(config, device, native) {
        tracing::warn!("{warning}");
    }
}

/// What this config will do badly on a CPU learner without native bf16 (`native`: AVX512-BF16 or AMX): bf16
/// convolutions, which libtorch then emulates, and bf16 MLP updates, which it emulates too (DQN's fused step
/// rounds its operands and multiplies in f32 instead: correct, and slower than f32).
pub(crate) fn machine_warnings(config: &ExperimentConfig, device: tch::Device, native: bool) -> Vec<String> {
    let mut warnings = Vec::new();
    if device != tch::Device::Cpu || native {
        return warnings;
    }
    if config.algorithm.cnn_options().is_some_and(|c| c.bf16) {
        warnings.push(
            "[algorithm.cnn] bf16 = true, but this CPU has no AVX512-BF16: libtorch emulates bf16 and the update \
             runs several times slower than f32 (measured > 8x on Pong PPO); set bf16 = false here"
                .to_string(),
        );
    }
    if config.algorithm.mlp_bf16() {
        warnings.push(format!(
            "[algorithm] bf16 = true, but this CPU has no AVX512-BF16: {}'s bf16 update is emulated and slower than \
             f32 (the default here is bf16 = false); set bf16 = false here",
            config.algorithm.name()
        ));
    }
    warnings
}

impl ExperimentConfig {
    /// Whether a distributed learner of this config assembles batches on a thread of its own (where its
    /// algorithm can: [`flotilla_algorithms::AlgorithmKind::check_assemble_ahead`]).
    pub fn assembles_ahead(&self) -> bool {
        let wanted = match self.learner.assemble_ahead {
            AssembleAhead::On => true,
            AssembleAhead::Off => false,
            AssembleAhead::Auto => {
                self.algorithm.family() == Family::OffPolicy || self.run.device.resolve().is_ok_and(|d| d.is_cuda())
            }
        };
        // Several off-policy learners count env steps per transition in step with each other; the assembly
        // thread's own schedule is not (yet) kept in that step.
        let replicated_replay = self.learner.learners > 1 && self.algorithm.family() == Family::OffPolicy;
        wanted && self.algorithm.check_assemble_ahead().is_ok() && !replicated_replay
    }
}

impl Default for LearnerConfig {
    fn default() -> Self {
        LearnerConfig {
            listen: "127.0.0.1:0".into(),
            max_policy_lag: 4,
            synchronous: false,
            queue_chunks: 0,
            assemble_ahead: AssembleAhead::Auto,
            learners: 1,
            backend: CollectiveBackend::Auto,
            collective_timeout_secs: 300.0,
            accumulate: 1,
            compression: "none".into(),
            check_every: 100,
            average_every: 0,
            max_restarts: 3,
            metrics_listen: None,
            max_refused_in_a_row: 20,
        }
    }
}

/// `[transport]`: limits and security of the gRPC carrier. Paths are read by the process that uses them
/// (relative ones from its working directory), when it starts: the learner reads `tls_cert`, `tls_key` and
/// `client_ca`; the actors `flotilla train --actors N` launches get `tls_ca`, `actor_cert` and `actor_key`
/// (actors started elsewhere take `flotilla actor --tls-ca/--tls-cert/--tls-key`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TransportConfig {
    /// Largest message in MiB (parameters of a large network are one message).
    pub max_message_mib: usize,
    /// A connection to the learner that has made no call with the run token this many seconds after it was
    /// accepted (a TLS handshake included) is closed.
    pub auth_timeout_secs: f64,
    /// The learner's certificate chain (PEM): with `tls_key`, the learner serves gRPC over TLS only.
    pub tls_cert: Option<PathBuf>,
    /// The private key of `tls_cert` (PEM: PKCS#8, PKCS#1 or SEC1).
    pub tls_key: Option<PathBuf>,
    /// The CA certificate (PEM) actors trust to verify the learner's certificate; locally launched actors are
    /// given it.
    pub tls_ca: Option<PathBuf>,
    /// Mutual TLS: the learner accepts only clients whose certificate this CA (PEM) signed.
    pub client_ca: Option<PathBuf>,
    /// Under mutual TLS, the certificate (PEM) locally launched actors present.
    pub actor_cert: Option<PathBuf>,
    /// The private key of `actor_cert` (PEM).
    pub actor_key: Option<PathBuf>,
    /// The name actors check the learner's certificate against (default: the host they connect to).
    pub tls_domain: Option<String>,
    /// Listen in plaintext on an address other machines can reach (without TLS, anyone on the path can read
    /// the token and the run's traffic). Loopback needs no permission.
    pub insecure: bool,
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            max_message_mib: 256,
            auth_timeout_secs: 10.0,
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
            client_ca: None,
            actor_cert: None,
            actor_key: None,
            tls_domain: None,
            insecure: false,
        }
    }
}

impl TransportConfig {
    /// Keys that only make sense together, and plaintext only where allowed: a `listen` address that is not
    /// loopback needs TLS or `insecure = true`. Reads no files (see [`TransportConfig::server_tls`]).
    pub fn check(&self, listen: &str) -> Result<()> {
        let bad = |msg: String| Err(Error::Config(msg));
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return bad(
                "[transport] tls_cert and tls_key go together (--tls-cert, --tls-key): give both or neither".into()
            );
        }
        if self.actor_cert.is_some() != self.actor_key.is_some() {
            return bad("[transport] actor_cert and actor_key go together: give both or neither".into());
        }
        let tls_only = match (&self.client_ca, &self.actor_cert) {
            (Some(_), _) => Some("client_ca"),
            (None, Some(_)) => Some("actor_cert"),
            (None, None) => None,
        };
        if let (None, Some(key)) = (&self.tls_cert, tls_only) {
            return bad(format!(
                "[transport] {key} without tls_cert: it is part of TLS, which needs the learner's certificate and \
                 key (tls_cert, tls_key; --tls-cert, --tls-key)"
            ));
        }
        if self.tls_cert.is_some() && self.insecure {
            return bad("[transport] insecure = true (--insecure) with tls_cert: choose TLS or plaintext".into());
        }
        let Ok(addr) = listen.parse::<std::net::SocketAddr>() else { return Ok(()) };
        if self.tls_cert.is_none() && !self.insecure && !addr.ip().is_loopback() {
            return bad(format!(
                "[learner] listen = {listen:?} is not a loopback address, and without TLS anyone on the network \
                 could read the run token and the run's traffic: give the learner a certificate ([transport] \
                 tls_cert and tls_key, or --tls-cert and --tls-key), or accept plaintext explicitly with \
                 --insecure ([transport] insecure = true)"
            ));
        }
        Ok(())
    }

    /// The learner's TLS settings, read from `tls_cert`, `tls_key` and `client_ca`; `None` without TLS. An
    /// error names the file that is missing, is not PEM, or the key that is not the certificate's.
    pub fn server_tls(&self) -> Result<Option<flotilla_transport::tls::ServerTls>> {
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else { return Ok(None) };
        flotilla_transport::tls::ServerTls::from_files(cert, key, self.client_ca.as_deref())
            .map(Some)
            .map_err(|e| Error::Config(format!("[transport]: {}", e.message)))
    }
}

/// `[run]`: what the whole experiment shares.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    /// Seeds the envs (env `i` gets `seed + i`), the network initialisation and action sampling.
    pub seed: u64,
    /// Training budget in env steps (summed over all envs).
    pub total_env_steps: u64,
    /// `"auto"` (CUDA when available), `"cpu"` or `"cuda:N"`.
    pub device: DeviceSpec,
    /// libtorch intra-op threads. Small networks are dispatch-bound: 1 is fastest for MLPs.
    pub torch_threads: usize,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig { seed: 1, total_env_steps: 100_000, device: DeviceSpec::Auto, torch_threads: 1 }
    }
}

/// `[env]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvConfig {
    /// Registered id, e.g. `"CartPole-v1"`.
    pub id: String,
    /// Envs stepped in lock-step (RL Zoo's `n_envs`).
    #[serde(default = "default_num_envs")]
    pub num_envs: usize,
    /// Constructor arguments as Gymnasium names them (e.g. Pendulum's `g`), plus `max_episode_steps`.
    #[serde(default)]
    pub kwargs: toml::Table,
    /// How a multi-task run's observations meet the network's first layer (`[[tasks]]` only).
    #[serde(default, skip_serializing_if = "TaskInputsConfig::is_auto")]
    pub task_inputs: TaskInputsConfig,
    /// Partial observability: keep only these components of each (1-D) observation, in this order — e.g.
    /// `[0, 2]` is CartPole without its velocities ([`flotilla_envs::ObserveVecEnv`]). Absent: all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observe: Option<Vec<usize>>,
    /// The run's `[[tasks]]` (copied here when the config is parsed, so that everything that builds envs from
    /// `[env]` builds the tasks' batch).
    #[serde(skip)]
    pub tasks: Vec<TaskConfig>,
    /// Every task's observation space, probed once (one env each) the first time a tasks' batch is built.
    #[serde(skip)]
    task_spaces: SpacesCache,
}

/// A cache of what the config's envs are (not part of the config: two configs compare equal whatever they
/// cached).
#[derive(Debug, Clone, Default)]
struct SpacesCache(std::sync::OnceLock<Vec<Space>>);

impl PartialEq for SpacesCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// `[env] task_inputs`: how the tasks of a `[[tasks]]` run share the network's input layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskInputsConfig {
    /// `shared` when every task has the same observation size, else `separate`.
    #[default]
    Auto,
    /// Every task's observation in the same columns: one input layer for all (sizes must be equal).
    Shared,
    /// Each task's observation in columns of its own, zeros in the others': an input layer per task (the
    /// first layer's weights on task k's columns see task k only); observation sizes may differ.
    Separate,
}

impl TaskInputsConfig {
    fn is_auto(&self) -> bool {
        *self == TaskInputsConfig::Auto
    }
}

impl EnvConfig {
    /// One env of this id and kwargs (one per task), built to check them (a batch of one for backends that
    /// build batches).
    fn probe(&self) -> Result<Box<dyn flotilla_envs::VectorEnv>> {
        let envs = if self.tasks.is_empty() { 1 } else { self.tasks.len() };
        self.make_vector(envs, EnvRole::Training)
    }

    /// `n` envs as `[env]` (or `[[tasks]]`, `n / tasks` each) says: what trainers, actors and evaluation step.
    pub fn make_vector(&self, n: usize, role: EnvRole) -> Result<Box<dyn flotilla_envs::VectorEnv>> {
        if self.tasks.is_empty() {
            let envs = make_vector(&self.id, &self.registry_kwargs()?, n, role)
                .map_err(|e| Error::Config(format!("[env]: {e}")))?;
            return match &self.observe {
                None => Ok(envs),
                Some(keep) => Ok(Box::new(
                    flotilla_envs::ObserveVecEnv::new(envs, keep.clone())
                        .map_err(|e| Error::Config(format!("[env] observe = {keep:?}: {e}")))?,
                )),
            };
        }
        if self.observe.is_some() {
            return Err(Error::Config(
                "[env] observe cannot be combined with [[tasks]] (each task's one-hot ends its observation)".into(),
            ));
        }
        let t = self.tasks.len();
        if n == 0 || !n.is_multiple_of(t) {
            return Err(Error::Config(format!(
                "{n} envs do not split evenly between {t} [[tasks]]: use a multiple of {t} ([env] num_envs, \
                 envs per actor)"
            )));
        }
        let inputs = self.task_inputs()?;
        let envs = (0..t).map(|k| Ok((k, self.task_vector(k, n / t, role)?))).collect::<Result<Vec<_>>>()?;
        Ok(Box::new(
            flotilla_envs::TaskVecEnv::with_inputs(envs, t, &inputs)
                .map_err(|e| Error::Config(format!("[[tasks]]: {e}")))?,
        ))
    }

    /// The observation layout `[env] task_inputs` names; `auto` decides from the tasks' observation sizes
    /// (each task is probed with one env, once per config).
    fn task_inputs(&self) -> Result<flotilla_envs::TaskInputs> {
        use flotilla_envs::TaskInputs;
        let spaces = match self.task_spaces.0.get() {
            Some(spaces) => spaces.clone(),
            None => {
                let probed: Vec<Space> = (0..self.tasks.len())
                    .map(|k| Ok(self.task_vector(k, 1, EnvRole::Training)?.observation_space().clone()))
                    .collect::<Result<_>>()?;
                self.task_spaces.0.get_or_init(|| probed).clone()
            }
        };
        let equal = spaces.iter().all(|s| s.flat_dim() == spaces[0].flat_dim());
        Ok(match self.task_inputs {
            TaskInputsConfig::Shared => TaskInputs::Shared(spaces),
            TaskInputsConfig::Auto if equal => TaskInputs::Shared(spaces),
            _ => TaskInputs::Separate(spaces),
        })
    }

    /// Task `k`'s own `n` envs, without the one-hot.
    fn task_vector(&self, k: usize, n: usize, role: EnvRole) -> Result<Box<dyn flotilla_envs::VectorEnv>> {
        let task = &self.tasks[k];
        let mut table =
            if task.id.as_ref().is_none_or(|id| *id == self.id) { self.kwargs.clone() } else { toml::Table::new() };
        table.extend(task.kwargs.clone());
        let kwargs = table_kwargs(&table, &format!("[[tasks]] {}: kwargs", task.name))?;
        let id = task.id.as_deref().unwrap_or(&self.id);
        make_vector(id, &kwargs, n, role).map_err(|e| Error::Config(format!("[[tasks]] {}: {e}", task.name)))
    }

    /// Task `k` alone, with the run's one-hot (`n` envs): what a per-task evaluation steps.
    pub fn make_task_vector(&self, k: usize, n: usize, role: EnvRole) -> Result<Box<dyn flotilla_envs::VectorEnv>> {
        let inputs = self.task_inputs()?;
        let env = self.task_vector(k, n, role)?;
        Ok(Box::new(
            flotilla_envs::TaskVecEnv::with_inputs(vec![(k, env)], self.tasks.len(), &inputs)
                .map_err(|e| Error::Config(format!("[[tasks]]: {e}")))?,
        ))
    }

    /// The observation and action spaces of one env.
    pub fn spaces(&self) -> Result<(Space, Space)> {
        let env = self.probe()?;
        Ok((env.observation_space().clone(), env.action_space().clone()))
    }

    /// Write the settings the env runs with but the config left out (e.g. Atari's sticky-action probability)
    /// into `kwargs`, so that the resolved config says everything.
    fn resolve_kwargs(&mut self, probe: &dyn flotilla_envs::VectorEnv) -> Result<()> {
        for (key, value) in probe.resolved_kwargs().iter() {
            if !self.kwargs.contains_key(key) {
                let v = match value {
                    KwargValue::Float(f) => toml::Value::Float(*f),
                    KwargValue::Int(i) => toml::Value::Integer(*i),
                    KwargValue::Bool(b) => toml::Value::Boolean(*b),
                    KwargValue::Str(s) => toml::Value::String(s.clone()),
                };
                self.kwargs.insert(key.to_string(), v);
            }
        }
        Ok(())
    }
}

fn default_num_envs() -> usize {
    8
}

impl EnvConfig {
    /// The kwargs as the env registry takes them. Arrays and tables are refused, naming the key.
    pub fn registry_kwargs(&self) -> Result<Kwargs> {
        table_kwargs(&self.kwargs, "[env] kwargs")
    }
}

/// A TOML table of env arguments as the registry takes them (`what` names the table in errors).
fn table_kwargs(table: &toml::Table, what: &str) -> Result<Kwargs> {
    let mut kwargs = Kwargs::new();
    for (key, value) in table {
        let v = match value {
            toml::Value::Float(f) => KwargValue::Float(*f),
            toml::Value::Integer(i) => KwargValue::Int(*i),
            toml::Value::Boolean(b) => KwargValue::Bool(*b),
            toml::Value::String(s) => KwargValue::Str(s.clone()),
            other => {
                return Err(Error::Config(format!(
                    "{what}.{key}: expected a number, boolean or string, got {}",
                    other.type_str()
                )));
            }
        };
        kwargs.insert(key.clone(), v);
    }
    Ok(kwargs)
}

/// `[eval]`: deterministic evaluation of the current policy during and after training.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalConfig {
    /// Episodes per evaluation (each in its own env copy, run to the end).
    pub episodes: usize,
    /// Evaluate every this many env steps during training (0: only at the end).
    pub interval_steps: u64,
    /// Evaluation `k` during training seeds its env `i` with `seed + k · episodes + i` (fresh start states each
    /// time, never a training seed); `flotilla eval` starts from `seed`.
    pub seed: u64,
}

impl Default for EvalConfig {
    fn default() -> Self {
        EvalConfig { episodes: 10, interval_steps: 10_000, seed: 1_000_000 }
    }
}

/// `[metrics]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Write a metrics row and a progress line at most every this many env steps (after an update).
    pub log_interval_steps: u64,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig { log_interval_steps: 5_000 }
    }
}

/// `[checkpoint]`: periodic snapshots of the whole training state (agent, envs, counters) for exact resume.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointConfig {
    /// Write `RUN_DIR/checkpoint.safetensors` every this many env steps (0: never during training; the
    /// final state is always written when a run ends).
    pub interval_steps: u64,
    /// Envs that cannot save their state (ale-py's Atari, Python Gymnasium envs) are resumed exactly by
    /// replaying the run's recorded actions from its seed (8 bytes per env step in the checkpoint; a resume
    /// replays every env step so far). `false`: a resume starts new episodes instead.
    pub replay_envs: bool,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig { interval_steps: 0, replay_envs: true }
    }
}

/// Where tensors live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSpec {
    /// CUDA device 0 when libtorch sees one, else the CPU.
    Auto,
    /// The CPU.
    Cpu,
    /// CUDA device N.
    Cuda(usize),
}

impl DeviceSpec {
    /// The libtorch device; asking for a CUDA device that is not there is an error.
    pub fn resolve(self) -> Result<tch::Device> {
        match self {
            DeviceSpec::Auto => Ok(tch::Device::cuda_if_available()),
            DeviceSpec::Cpu => Ok(tch::Device::Cpu),
            DeviceSpec::Cuda(n) => {
                let count = tch::Cuda::device_count() as usize;
                if n < count {
                    Ok(tch::Device::Cuda(n))
                } else {
                    Err(Error::Config(format!("[run] device = \"cuda:{n}\", but libtorch sees {count} CUDA device(s)")))
                }
            }
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(DeviceSpec::Auto),
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" => Ok(DeviceSpec::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceSpec::Cuda)
                .ok_or_else(|| format!("invalid device {s:?}: expected \"auto\", \"cpu\" or \"cuda:N\"")),
        }
    }
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSpec::Auto => f.write_str("auto"),
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl Serialize for DeviceSpec {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DeviceSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

impl ExperimentConfig {
    /// Read `path`, apply `--set key=value` overrides, type-check and validate. Errors name the file and the
    /// offending key or value.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("cannot read config {}: {e}", path.display())))?;
        Self::parse(&text, overrides).map_err(|e| Error::Config(format!("config {}: {e}", path.display())))
    }

    /// Parse TOML text with overrides (see [`ExperimentConfig::load`]).
    pub fn parse(text: &str, overrides: &[String]) -> Result<Self> {
        let mut table: toml::Table = text.parse().map_err(|e: toml::de::Error| Error::Config(e.to_string()))?;
        for o in overrides {
            apply_override(&mut table, o)?;
        }
        let mut config: ExperimentConfig = if overrides.is_empty() {
            // Parse from the text so errors carry line and column.
            toml::from_str(text).map_err(|e| Error::Config(e.to_string()))?
        } else {
            table.try_into().map_err(|e: toml::de::Error| Error::Config(format!("{e} (after --set overrides)")))?
        };
        config.env.tasks = config.tasks.clone();
        config.algorithm.set_tasks(config.tasks.len());
        // One probe env both checks the id and kwargs and tells the settings to write out.
        let probe = config.checked_probe()?;
        config.env.resolve_kwargs(probe.as_ref())?;
        Ok(config)
    }

    /// Range checks serde cannot express, and that the env id and kwargs are known.
    pub fn validate(&self) -> Result<()> {
        self.checked_probe().map(drop)
    }

    /// `[[tasks]]`: at least two, named uniquely and plainly, splitting `[env] num_envs` evenly.
    fn check_tasks(&self) -> Result<()> {
        let t = self.tasks.len();
        if t == 0 && !self.env.task_inputs.is_auto() {
            return Err(Error::Config(format!(
                "[env] task_inputs = \"{}\" without [[tasks]]: it lays out several tasks' observations",
                if self.env.task_inputs == TaskInputsConfig::Shared { "shared" } else { "separate" }
            )));
        }
        if t == 0 {
            return Ok(());
        }
        if t == 1 {
            return Err(Error::Config(format!(
                "[[tasks]]: one task ({}); a single task is [env] itself — name two or more, or none",
                self.tasks[0].name
            )));
        }
        for (i, task) in self.tasks.iter().enumerate() {
            let plain =
                !task.name.is_empty() && task.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !plain {
                return Err(Error::Config(format!(
                    "[[tasks]] name = {:?}: use letters, digits, '_' and '-' (it names metrics columns)",
                    task.name
                )));
            }
            if self.tasks[..i].iter().any(|other| other.name == task.name) {
                return Err(Error::Config(format!("[[tasks]] name = {:?} appears twice", task.name)));
            }
        }
        if !self.env.num_envs.is_multiple_of(t) {
            return Err(Error::Config(format!(
                "[env] num_envs = {} does not split evenly between {t} [[tasks]]",
                self.env.num_envs
            )));
        }
        Ok(())
    }

    /// [`ExperimentConfig::validate`], handing back the env it built to check the id and kwargs.
    fn checked_probe(&self) -> Result<Box<dyn flotilla_envs::VectorEnv>> {
        if self.env.num_envs == 0 {
            return Err(Error::Config("[env] num_envs = 0: need at least one env".into()));
        }
        if self.run.total_env_steps == 0 {
            return Err(Error::Config("[run] total_env_steps = 0: nothing to train".into()));
        }
        if self.eval.episodes == 0 {
            return Err(Error::Config("[eval] episodes = 0: need at least one episode".into()));
        }
        self.check_tasks()?;
        if let Some(norm) = &self.normalize {
            norm.validate().map_err(|e| Error::Config(e.to_string()))?;
            let why = if !self.tasks.is_empty() && norm.obs {
                Some("[[tasks]] (the task one-hot would be normalised too)".to_string())
            } else if self.learner.learners > 1 {
                Some(format!(
                    "{} data-parallel learners (each would keep statistics of its own)",
                    self.learner.learners
                ))
            } else if self.algorithm.family() == flotilla_algorithms::Family::Gradients {
                Some("A3C (its actors compute gradients on observations the learner never sees)".to_string())
            } else {
                None
            };
            if let Some(why) = why {
                return Err(Error::Config(format!("[normalize] is not supported with {why}; drop [normalize]")));
            }
        }
        if let Some(population) = &self.population {
            population.check()?;
            if self.actors.count > 0 || self.learner.learners > 1 {
                return Err(Error::Config(format!(
                    "[population] size = {} with {}: a population trains in one process (its members on threads); \
                     distributed populations are not supported yet — drop --actors / --learners",
                    population.size,
                    if self.actors.count > 0 {
                        format!("{} actor processes ([actors] count / --actors)", self.actors.count)
                    } else {
                        format!("{} data-parallel learners", self.learner.learners)
                    }
                )));
            }
        }
        let teachers = self.algorithm.teachers().len();
        if teachers > 1 && teachers != self.tasks.len() {
            return Err(Error::Config(format!(
                "[algorithm] teachers: {teachers} teachers need {teachers} [[tasks]] (one each, in order), the \
                 config has {}",
                self.tasks.len()
            )));
        }
        if teachers == 1 && !self.tasks.is_empty() {
            return Err(Error::Config(format!(
                "[algorithm] teachers: one teacher for {} [[tasks]]: name one teacher per task, in order",
                self.tasks.len()
            )));
        }
        let probe = self.env.probe()?;
        self.algorithm.validate(self.env.num_envs).map_err(|e| Error::Config(format!("[algorithm]: {e}")))?;
        if self.run.torch_threads == 0 {
            return Err(Error::Config("[run] torch_threads = 0: need at least one thread".into()));
        }
        let a = &self.actors;
        if !(a.reconnect_secs.is_finite() && a.reconnect_secs > 0.0 && a.reconnect_secs <= MAX_RECONNECT_SECS) {
            return Err(Error::Config(format!(
                "[actors] reconnect_secs = {}: must be a number of seconds in (0, {MAX_RECONNECT_SECS}]",
                a.reconnect_secs
            )));
        }
        for (key, value) in [("epsilon", a.epsilon), ("epsilon_alpha", a.epsilon_alpha)] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(Error::Config(format!("[actors] {key} = {value}: must be finite and ≥ 0")));
            }
        }
        if a.epsilon > 1.0 {
            return Err(Error::Config(format!("[actors] epsilon = {}: a probability, must be ≤ 1", a.epsilon)));
        }
        self.learner.metrics_addr()?;
        if !self.learner.listen.contains(':') {
            return Err(Error::Config(format!("[learner] listen = {:?}: expected HOST:PORT", self.learner.listen)));
        }
        self.transport.check(&self.learner.listen)?;
        self.check_data_parallel()?;
        if self.init.from.is_none() && !self.init.reinit.is_empty() {
            return Err(Error::Config(format!(
                "[init] reinit = {:?} without [init] from: there is nothing to start from",
                self.init.reinit
            )));
        }
        if self.transport.max_message_mib == 0 {
            return Err(Error::Config("[transport] max_message_mib = 0".into()));
        }
        let t = self.transport.auth_timeout_secs;
        if !(t.is_finite() && t > 0.0 && t <= 86_400.0) {
            return Err(Error::Config(format!("[transport] auth_timeout_secs = {t}: give seconds in (0, 86400]")));
        }
        if self.actors.remote > 0 && self.actors.count == 0 {
            return Err(Error::Config(format!(
                "[actors] remote = {} without [actors] count: remote actor slots belong to a distributed run; set \
                 count (or --actors N) to the actors flotilla launches itself",
                self.actors.remote
            )));
        }
        if self.actors.remote > 0 && self.learner.learners > 1 {
            return Err(Error::Config(format!(
                "[actors] remote = {} with [learner] learners = {}: remote actor slots are for a single learner",
                self.actors.remote, self.learner.learners
            )));
        }
        if self.actors.count > 0 {
            self.plan(self.actor_slots())?;
        } else if self.algorithm.family() == Family::Gradients {
            return Err(Error::Config(format!(
                "[algorithm] kind = {:?} needs actor processes: pass --actors N or set [actors] count",
                self.algorithm.name()
            )));
        }
        Ok(probe)
    }

    /// `[learner] learners`, `accumulate`, `compression`, `collective_timeout_secs`: values that make sense,
    /// for an algorithm whose updates can be spread.
    fn check_data_parallel(&self) -> Result<()> {
        let l = &self.learner;
        let bad = |msg: String| Err(Error::Config(msg));
        if l.learners == 0 {
            return bad("[learner] learners = 0: need at least one learner".into());
        }
        if l.accumulate == 0 {
            return bad("[learner] accumulate = 0: a step needs at least one micro-batch".into());
        }
        if !(l.collective_timeout_secs.is_finite() && l.collective_timeout_secs > 0.0) {
            return bad(format!("[learner] collective_timeout_secs = {}: must be > 0", l.collective_timeout_secs));
        }
        let compression = self.compression()?;
        if l.average_every > 0 && l.learners < 2 {
            return bad(format!(
                "[learner] average_every = {}: averaging parameters needs learners > 1 (learners = {})",
                l.average_every, l.learners
            ));
        }
        if l.average_every > 0 && compression != flotilla_collective::codec::Compression::None {
            return bad(format!(
                "[learner] compression = {:?} compresses gradients, which average_every = {} does not send (it \
                 averages parameters in f32): set one of them",
                l.compression, l.average_every
            ));
        }
        if l.learners > 1 || l.accumulate > 1 {
            let what = if l.learners > 1 {
                format!("learners = {}", l.learners)
            } else {
                format!("accumulate = {}", l.accumulate)
            };
            if let Err(why) = self.algorithm.check_data_parallel() {
                return bad(format!("[learner] {what}: {why}"));
            }
        }
        if l.backend == CollectiveBackend::Nccl && !self.run.device.resolve().is_ok_and(|d| d.is_cuda()) {
            return bad("[learner] backend = \"nccl\" needs CUDA learners ([run] device = \"cuda\"); use gloo".into());
        }
        Ok(())
    }

    /// `[learner] compression`, parsed.
    pub fn compression(&self) -> Result<flotilla_collective::codec::Compression> {
        flotilla_collective::codec::Compression::parse(&self.learner.compression)
            .map_err(|e| Error::Config(format!("[learner] {e}")))
    }

    /// Actor slots of the learner: the actors `flotilla train` launches (`[actors] count`) and those started
    /// elsewhere (`[actors] remote`).
    pub fn actor_slots(&self) -> usize {
        self.actors.count + self.actors.remote
    }

    /// How a run with `n_actors` actor processes splits the work, checked against the algorithm.
    pub fn plan(&self, n_actors: usize) -> Result<Plan> {
        let bad = |msg: String| Err(Error::Config(msg));
        if n_actors == 0 {
            return bad("a distributed run needs at least one actor".into());
        }
        let a = &self.actors;
        let num_envs = self.env.num_envs;
        let on_policy = |n_steps: usize, family: Family| -> Result<Plan> {
            let per_actor = if a.envs_per_actor > 0 { a.envs_per_actor } else { (num_envs / n_actors).max(1) };
            let chunk_steps = if a.chunk_steps > 0 { a.chunk_steps } else { n_steps };
            if chunk_steps != n_steps {
                return bad(format!(
                    "[actors] chunk_steps = {chunk_steps}: on-policy chunks must be the algorithm's n_steps = {n_steps}"
                ));
            }
            let chunks_per_batch = match family {
                Family::Gradients => 1,
                _ if !num_envs.is_multiple_of(per_actor) => {
                    return bad(format!(
                        "[env] num_envs = {num_envs} is not a multiple of {per_actor} envs per actor; a learner \
                         batch is num_envs × n_steps, made of whole chunks (set [actors] envs_per_actor)"
                    ));
                }
                _ => num_envs / per_actor,
            };
            if self.learner.synchronous && family == Family::OnPolicy && chunks_per_batch > n_actors {
                return bad(format!(
                    "[learner] synchronous = true needs a chunk from each of {chunks_per_batch} actors per batch, \
                     but the run has {n_actors} (each waits for the update its chunk feeds)"
                ));
            }
            Ok(Plan { family, n_actors, envs_per_actor: per_actor, chunk_steps, chunks_per_batch })
        };
        let off_policy = || -> Result<Plan> {
            let per_actor = if a.envs_per_actor > 0 { a.envs_per_actor } else { num_envs };
            let chunk_steps = if a.chunk_steps > 0 { a.chunk_steps } else { 32 };
            Ok(Plan {
                family: Family::OffPolicy,
                n_actors,
                envs_per_actor: per_actor,
                chunk_steps,
                chunks_per_batch: 1,
            })
        };
        self.algorithm.check_distributed().map_err(|e| Error::Config(format!("[algorithm]: {e}")))?;
        if self.learner.assemble_ahead == AssembleAhead::On {
            self.algorithm.check_assemble_ahead().map_err(|e| {
                Error::Config(format!("[learner] assemble_ahead = \"on\": {e}; use \"auto\" or \"off\""))
            })?;
        }
        let plan = match (self.algorithm.family(), self.algorithm.rollout_steps()) {
            (Family::OffPolicy, _) => off_policy(),
            (family, Some(n_steps)) => on_policy(n_steps, family),
            (family, None) => bad(format!("{family:?} algorithm {} has no rollout length", self.algorithm.name())),
        }?;
        let t = self.tasks.len();
        if self.actors.task_per_actor {
            // Each actor steps one task: every task needs as many actors.
            if t == 0 {
                return bad("[actors] task_per_actor = true without [[tasks]]: there are no tasks to assign".into());
            }
            if !plan.n_actors.is_multiple_of(t) {
                return bad(format!(
                    "[actors] task_per_actor: {} actors per learner do not split evenly between {t} [[tasks]] (actor \
                     s steps task s mod {t}): use a multiple of {t} actors per learner",
                    plan.n_actors
                ));
            }
            return Ok(plan);
        }
        // Every actor steps every task: its envs split evenly between them.
        if t > 0 && !plan.envs_per_actor.is_multiple_of(t) {
            return bad(format!(
                "{} envs per actor do not split evenly between {t} [[tasks]] (every actor steps every task): set \
                 [actors] envs_per_actor to a multiple of {t}",
                plan.envs_per_actor
            ));
        }
        Ok(plan)
    }

    /// The resolved config as TOML (every default written out).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("an experiment config always serialises")
    }

    /// Short algorithm name (`"ppo"`).
    pub fn algorithm_name(&self) -> &'static str {
        self.algorithm.name()
    }

    /// A fresh agent for these spaces, as `[algorithm]` says, fed by `[env] num_envs` envs and seeded with
    /// `[run] seed` (the single-process trainer's and `flotilla eval`'s agent).
    pub fn build_agent(
        &self,
        observation_space: &Space,
        action_space: &Space,
        device: tch::Device,
    ) -> Result<Box<dyn Algorithm>> {
        let agent =
            self.algorithm.build_learner(observation_space, action_space, self.env.num_envs, device, self.run.seed)?;
        Ok(flotilla_algorithms::normalize::wrap_learner(agent, self.normalize.as_ref(), observation_space)?)
    }
}

/// Apply one `a.b.c=value` override; `value` is read as a TOML value, or as a string if it is not one.
fn apply_override(table: &mut toml::Table, spec: &str) -> Result<()> {
    let (key, raw) = spec.split_once('=').ok_or_else(|| {
        Error::Config(format!("--set {spec:?}: expected key=value, e.g. algorithm.learning_rate=3e-4"))
    })?;
    let key = key.trim();
    let value = match format!("v = {raw}").parse::<toml::Table>() {
        Ok(mut t) => t.remove("v").expect("parsed key"),
        Err(_) => toml::Value::String(raw.to_string()),
    };
    let mut parts: Vec<&str> = key.split('.').collect();
    let last =
        parts.pop().filter(|s| !s.is_empty()).ok_or_else(|| Error::Config(format!("--set {spec:?}: empty key")))?;
    let mut cursor = table;
    for part in parts {
        let entry = cursor.entry(part.to_string()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cursor = entry
            .as_table_mut()
            .ok_or_else(|| Error::Config(format!("--set {spec:?}: {part:?} is not a table in the config")))?;
    }
    cursor.insert(last.to_string(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use flotilla_algorithms::ppo::PpoConfig;

    use super::*;

    const BASE: &str = r#"
[env]
id = "CartPole-v1"

[algorithm]
kind = "ppo"
"#;

    #[test]
    fn defaults_are_rl_zoo_and_resolved_config_round_trips() {
        let c = ExperimentConfig::parse(BASE, &[]).unwrap();
        assert_eq!(c.env.num_envs, 8);
        assert_eq!(c.algorithm, AlgorithmConfig::Ppo(PpoConfig::default()));
        let again = ExperimentConfig::parse(&c.to_toml(), &[]).unwrap();
        assert_eq!(again, c);
    }

    #[test]
    fn overrides_apply_and_are_checked() {
        let c =
            ExperimentConfig::parse(BASE, &["algorithm.learning_rate=3e-4".into(), "run.device=cpu".into()]).unwrap();
        let AlgorithmConfig::Ppo(p) = &c.algorithm else { panic!("a PPO config") };
        assert_eq!(p.learning_rate, 3e-4);
        assert_eq!(c.run.device, DeviceSpec::Cpu);
        let e = ExperimentConfig::parse(BASE, &["algorithm.learnin_rate=3e-4".into()]).unwrap_err().to_string();
        assert!(e.contains("learnin_rate"), "{e}");
        let e = ExperimentConfig::parse(BASE, &["no_equals_sign".into()]).unwrap_err().to_string();
        assert!(e.contains("key=value"), "{e}");
    }

    /// bf16 on a CPU without native bf16 is named, for the CNN and for an MLP update, and nothing else is: not
    /// f32 configs, not a CPU with native bf16, not a GPU.
    #[test]
    fn bf16_without_native_bf16_is_warned_about() {
        let cpu = tch::Device::Cpu;
        let config = |kind: &str, sets: &[&str]| {
            let text = format!("[env]\nid = \"Pendulum-v1\"\n[algorithm]\nkind = \"{kind}\"\n");
            ExperimentConfig::parse(&text, &sets.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
        };
        for kind in ["td3", "ddpg", "sac"] {
            let w = machine_warnings(&config(kind, &["algorithm.bf16=true"]), cpu, false);
            assert!(w.len() == 1 && w[0].contains("[algorithm] bf16 = true") && w[0].contains(kind), "{kind}: {w:?}");
            assert!(machine_warnings(&config(kind, &["algorithm.bf16=true"]), cpu, true).is_empty(), "{kind}");
            assert!(machine_warnings(&config(kind, &["algorithm.bf16=false"]), cpu, false).is_empty(), "{kind}");
            let gpu = tch::Device::Cuda(0);
            assert!(machine_warnings(&config(kind, &["algorithm.bf16=true"]), gpu, false).is_empty(), "{kind}");
        }
        let text =
            "[env]\nid = \"CartPole-v1\"\n[algorithm]\nkind = \"dqn\"\nbf16 = true\n[algorithm.cnn]\nbf16 = true\n";
        let w = machine_warnings(&ExperimentConfig::parse(text, &[]).unwrap(), cpu, false);
        assert!(w.len() == 2 && w[0].contains("[algorithm.cnn]") && w[1].contains("dqn"), "{w:?}");
        let ppo = ExperimentConfig::parse(BASE, &[]).unwrap();
        assert!(
            machine_warnings(&ppo, cpu, false).iter().all(|w| w.contains("[algorithm.cnn]")),
            "PPO has no MLP bf16"
        );
    }

    /// `[algorithm.cnn] bf16`: on by default exactly where the CPU computes bf16 natively (the choice is written
    /// into the resolved config, so a resumed run keeps it), for every kind with a Nature CNN; an explicit value
    /// wins either way.
    #[test]
    fn cnn_bf16_follows_the_cpu_unless_set() {
        let native = flotilla_algorithms::nn::nets::cpu_has_native_bf16();
        for kind in ["ppo", "a2c", "dqn"] {
            let text = format!("[env]\nid = \"CartPole-v1\"\n\n[algorithm]\nkind = \"{kind}\"\n");
            let c = ExperimentConfig::parse(&text, &[]).unwrap();
            assert_eq!(c.algorithm.cnn_options().map(|o| o.bf16), Some(native), "{kind}");
            assert!(c.to_toml().contains(&format!("bf16 = {native}")), "{kind}: {}", c.to_toml());
            assert_eq!(ExperimentConfig::parse(&c.to_toml(), &[]).unwrap(), c, "{kind}");
            for set in [true, false] {
                let c = ExperimentConfig::parse(&text, &[format!("algorithm.cnn.bf16={set}")]).unwrap();
                assert_eq!(c.algorithm.cnn_options().map(|o| o.bf16), Some(set), "{kind}");
            }
            // Another `[algorithm.cnn]` key alone leaves the choice to the CPU.
            let c = ExperimentConfig::parse(&text, &["algorithm.cnn.channels_last=true".into()]).unwrap();
            assert_eq!(c.algorithm.cnn_options().map(|o| (o.channels_last, o.bf16)), Some((true, native)), "{kind}");
        }
    }

    /// `[normalize]`: defaults as SB3's `VecNormalize`; refused, by name, where its statistics could not be the
    /// one set the whole run shares, and with bad values.
    #[test]
    fn normalisation_defaults_and_refusals() {
        let c = ExperimentConfig::parse(BASE, &["normalize.obs=true".into()]).unwrap();
        assert_eq!(c.normalize, Some(flotilla_algorithms::normalize::NormalizeConfig::default()));
        assert_eq!(ExperimentConfig::parse(&c.to_toml(), &[]).unwrap(), c);
        let tasks = "\n[[tasks]]\nname = \"a\"\n\n[[tasks]]\nname = \"b\"\n";
        for (text, sets, needle) in [
            (format!("{BASE}{tasks}"), vec!["normalize.obs=true"], "[[tasks]]"),
            (BASE.to_string(), vec!["normalize.obs=true", "learner.learners=2"], "data-parallel"),
            (BASE.replace("\"ppo\"", "\"a3c\""), vec!["normalize.obs=true"], "A3C"),
            (BASE.to_string(), vec!["normalize.clip_obs=0"], "clip_obs"),
            (BASE.to_string(), vec!["normalize.gama=0.9"], "gama"),
        ] {
            let sets: Vec<String> = sets.into_iter().map(String::from).collect();
            let e = ExperimentConfig::parse(&text, &sets).unwrap_err().to_string();
            assert!(e.contains(needle), "{needle}: {e}");
        }
    }

    #[test]
    fn bad_configs_name_the_problem() {
        let cases = [
            (format!("{BASE}\n[run]\nsede = 3\n"), "sede"),
            (format!("{BASE}\n[run]\nseed = \"three\"\n"), "seed"),
            (BASE.replace("CartPole-v1", "CartPole-v9"), "CartPole-v9"),
            (BASE.replace("\"ppo\"", "\"pop\""), "pop"),
            (format!("{BASE}n_stepz = 3\n"), "n_stepz"),
            (format!("{BASE}batch_size = 100\n"), "batch_size"),
            (format!("{BASE}\n[run]\ndevice = \"gpu\"\n"), "gpu"),
            (format!("{BASE}\n[env.kwargs]\nlength = [1]\n"), "length"),
            (format!("{BASE}\n[actors]\nreconnect_secs = inf\n"), "actors] reconnect_secs"),
            (format!("{BASE}\n[actors]\nreconnect_secs = nan\n"), "actors] reconnect_secs"),
            (format!("{BASE}\n[actors]\nreconnect_secs = -1.0\n"), "actors] reconnect_secs"),
            (format!("{BASE}\n[actors]\nepsilon = 1.5\n"), "actors] epsilon"),
            (format!("{BASE}\n[run]\ntorch_threads = 0\n"), "torch_threads"),
            (format!("{BASE}\n[transport]\nauth_timeout_secs = 0.0\n"), "transport] auth_timeout_secs"),
            (format!("{BASE}\n[transport]\nauth_timeout_secs = nan\n"), "transport] auth_timeout_secs"),
            (format!("{BASE}\n[actors]\nremote = 2\n"), "actors] remote = 2 without [actors] count"),
            (format!("{BASE}\n[actors]\ncount = 2\nremote = 1\n[learner]\nlearners = 2\n"), "actors] remote = 1 with"),
        ];
        for (text, needle) in cases {
            let e = ExperimentConfig::parse(&text, &[]).unwrap_err().to_string();
            assert!(e.contains(needle), "error for {needle:?} does not name it: {e}");
        }
    }

    #[test]
    fn remote_actor_slots_add_to_the_launched_ones() {
        let c = ExperimentConfig::parse(&format!("{BASE}\n[actors]\ncount = 2\nremote = 2\n"), &[]).unwrap();
        assert_eq!(c.actor_slots(), 4);
        let plan = c.plan(c.actor_slots()).unwrap();
        // The batch's envs are split over every slot, launched or remote.
        assert_eq!((plan.n_actors, plan.envs_per_actor), (4, c.env.num_envs / 4));
    }

    #[test]
    fn load_names_the_file() {
        let e = ExperimentConfig::load(Path::new("/nonexistent/x.toml"), &[]).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/x.toml"), "{e}");
    }

    #[test]
    fn device_specs() {
        assert_eq!("cuda:1".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(1));
        assert!("cuda:x".parse::<DeviceSpec>().is_err());
        assert_eq!(DeviceSpec::Cpu.resolve().unwrap(), tch::Device::Cpu);
        // A device that is not there is an error naming it (the trainer and the distributed learner resolve the
        // device before anything is written; actors, which act on the CPU, never do).
        let e = DeviceSpec::Cuda(64).resolve().unwrap_err().to_string();
        assert!(e.contains("cuda:64"), "{e}");
    }
}
