//! The learner's side of data-parallel training: [`CollectiveSync`] implements the algorithms'
//! [`GradientSync`] on a c10d process group (flotilla-collective), with the configured gradient compression.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_algorithms::algorithm::Replicated;
use flotilla_algorithms::{Algorithm, DataParallel, Error as AlgorithmError, GradientSync, Metrics};
use flotilla_collective::codec::{Compression, GradientCodec};
use flotilla_collective::{Backend, GroupOptions, ProcessGroup, Rendezvous};
use tch::{Device, Kind, Tensor};
use tracing::info;

use crate::config::{CollectiveBackend, ExperimentConfig};
use crate::{Error, Result};

/// A process group shared by the algorithm's gradient sync and the learner's own collectives (parameter
/// broadcast, agreement checks, metric aggregation). All use it from the update thread, one at a time.
pub type SharedGroup = Arc<Mutex<ProcessGroup>>;

fn lock(group: &SharedGroup) -> std::sync::MutexGuard<'_, ProcessGroup> {
    group.lock().unwrap_or_else(|e| e.into_inner())
}

/// Seconds this learner has spent in collectives (gradient all-reduces, metric sums, parameter averages and
/// agreement checks), shared by the algorithm's gradient sync and the learner: logged as
/// `charts/collective_secs`.
#[derive(Debug, Clone, Default)]
pub struct CollectiveClock(Arc<std::sync::atomic::AtomicU64>);

impl CollectiveClock {
    /// Run `f`, adding its wall-clock time.
    fn time<T>(&self, f: impl FnOnce() -> T) -> T {
        let started = std::time::Instant::now();
        let out = f();
        self.0.fetch_add(started.elapsed().as_nanos() as u64, std::sync::atomic::Ordering::Relaxed);
        out
    }

    /// The seconds counted so far.
    pub fn secs(&self) -> f64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed) as f64 * 1e-9
    }
}

/// Averages gradients over the group's ranks (compressed as configured) and sums loss statistics.
#[derive(Debug)]
pub struct CollectiveSync {
    group: SharedGroup,
    compression: Compression,
    /// One codec per parameter set (slot), each with its own top-k residual.
    codecs: Vec<GradientCodec>,
    world: usize,
    clock: CollectiveClock,
}

impl CollectiveSync {
    /// A sync over `group`, compressing gradients with `compression`.
    pub fn new(group: SharedGroup, compression: Compression, clock: CollectiveClock) -> Self {
        let world = lock(&group).world_size();
        CollectiveSync { group, compression, codecs: Vec::new(), world, clock }
    }

    /// Payload bytes this learner has put on the wire for gradients so far (all slots).
    pub fn bytes_sent(&self) -> u64 {
        self.codecs.iter().map(GradientCodec::bytes_sent).sum()
    }
}

impl GradientSync for CollectiveSync {
    fn mean_gradient(&mut self, slot: usize, grad: &mut Tensor) -> flotilla_algorithms::Result<()> {
        while self.codecs.len() <= slot {
            self.codecs.push(GradientCodec::new(self.compression));
        }
        let (group, codec) = (&self.group, &mut self.codecs[slot]);
        self.clock
            .time(|| codec.all_reduce_mean(&mut lock(group), grad))
            .map_err(|e| AlgorithmError::Sync(e.to_string()))
    }

    fn sum(&mut self, values: &mut [f64]) -> flotilla_algorithms::Result<()> {
        let mut t = Tensor::from_slice(values).to_kind(Kind::Double).to_device(Device::Cpu);
        self.clock
            .time(|| lock(&self.group).all_reduce_sum(&mut t))
            .map_err(|e| AlgorithmError::Sync(e.to_string()))?;
        values.copy_from_slice(&Vec::<f64>::try_from(&t).map_err(AlgorithmError::from)?);
        Ok(())
    }

    fn replicas(&self) -> usize {
        self.world
    }
}

/// This learner's membership of a data-parallel group (several learners training one model), as the
/// distributed learner uses it around updates.
pub(crate) struct Replicas {
    group: SharedGroup,
    /// This learner's rank: 0 writes metrics, evaluations and checkpoints.
    pub(crate) rank: usize,
    /// Learners in the group.
    pub(crate) world: usize,
    /// On-policy env steps taken in since the last update; summed over the group at the next update, so that
    /// every learner's schedules (learning rate, clip range) and stopping point see the same global count.
    pub(crate) unsynced: u64,
    /// Episodes this learner's actors finished since the last update; summed over the group at the next one.
    pub(crate) episodes: EpisodeSums,
    /// Tasks of a multi-task run (0 without): each update's all-reduce carries a return and count per task.
    tasks: usize,
    updates: u64,
    /// Agreement points (updates, or averages with `average_every`) since the last check.
    checks_due: u64,
    check_every: u64,
    /// Updates between parameter averages (local SGD); 0: gradients are all-reduced at every step.
    average_every: u64,
    /// Time in collectives (shared with the gradient sync).
    clock: CollectiveClock,
}

impl std::fmt::Debug for Replicas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replicas").field("rank", &self.rank).field("world", &self.world).finish()
    }
}

/// Finished episodes, summed: returns, lengths, count; and per task of a multi-task run, return and count.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct EpisodeSums {
    pub(crate) returns: f64,
    pub(crate) lengths: f64,
    pub(crate) count: u64,
    pub(crate) tasks: Vec<(f64, u64)>,
}

impl EpisodeSums {
    pub(crate) fn add(&mut self, episode_return: f64, length: u64, task: Option<usize>) {
        self.returns += episode_return;
        self.lengths += length as f64;
        self.count += 1;
        if let Some(k) = task {
            if self.tasks.len() <= k {
                self.tasks.resize(k + 1, (0.0, 0));
            }
            self.tasks[k].0 += episode_return;
            self.tasks[k].1 += 1;
        }
    }
}

/// A stable fingerprint of the resolved config: learners started with different configs are refused at
/// rendezvous.
fn fingerprint(config: &ExperimentConfig) -> Vec<u8> {
    // FNV-1a: stable across processes and builds (std's hasher is not promised to be).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in config.to_toml().bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h.to_le_bytes().to_vec()
}

/// How many times torchrun has restarted the group this process is a rank of (`TORCHELASTIC_RESTART_COUNT`,
/// read and checked with the other rendezvous variables, [`Rendezvous::from_env`]); 0 outside a group.
pub fn restart_count() -> Result<u32> {
    let rendezvous = Rendezvous::from_env().map_err(|e| Error::Config(e.to_string()))?;
    Ok(rendezvous.map_or(0, |r| r.restart_count))
}

/// Whether this process is a rank that torchrun (or `flotilla train --learners L`) started, rather than the one
/// to launch a group: torchrun's variables are set ([`Rendezvous::torchrun_rank`], as the rendezvous reads them).
pub fn is_rank() -> bool {
    Rendezvous::torchrun_rank(|name| std::env::var(name).ok())
}

/// Join the data-parallel group the environment names (torchrun's variables; `flotilla train --learners L`
/// sets them), if `[learner] learners > 1`: connect, make `agent`'s updates average gradients over the group,
/// and start every learner from rank 0's parameters. `accumulate > 1` applies with or without a group.
pub(crate) fn join(config: &ExperimentConfig, agent: &mut dyn Algorithm, device: Device) -> Result<Option<Replicas>> {
    let l = &config.learner;
    let rendezvous = Rendezvous::from_env().map_err(|e| Error::Config(e.to_string()))?;
    let world = rendezvous.as_ref().map_or(1, |r| r.world_size);
    if world != l.learners {
        return Err(Error::Config(match &rendezvous {
            None => format!(
                "[learner] learners = {}: each learner needs its place in the group (MASTER_ADDR, MASTER_PORT, RANK, \
                 WORLD_SIZE, as torchrun sets them); `flotilla train --learners {}` starts them so",
                l.learners, l.learners
            ),
            Some(r) => {
                format!("[learner] learners = {} but the launcher says WORLD_SIZE = {}", l.learners, r.world_size)
            }
        }));
    }
    let compression = config.compression()?;
    let Some(rendezvous) = rendezvous.filter(|_| world > 1) else {
        accumulate_alone(config, agent)?;
        return Ok(None);
    };
    let backend = match l.backend {
        CollectiveBackend::Auto => Backend::auto(device),
        CollectiveBackend::Gloo => Backend::Gloo,
        CollectiveBackend::Nccl => Backend::Nccl,
    };
    let timeout = Duration::from_secs_f64(l.collective_timeout_secs);
    let options = GroupOptions { backend, timeout, rendezvous_timeout: timeout, ..GroupOptions::default() };
    let group = ProcessGroup::connect(&rendezvous, &options, &fingerprint(config))
        .map_err(|e| Error::Runtime(format!("joining the learner group: {e}")))?;
    let group: SharedGroup = Arc::new(Mutex::new(group));
    let clock = CollectiveClock::default();
    if l.average_every == 0 {
        let sync = CollectiveSync::new(group.clone(), compression, clock.clone());
        replicated(agent)?.set_data_parallel(DataParallel::new(Some(Box::new(sync)), l.accumulate)?)?;
    } else {
        // Local SGD: each learner's updates are its own until the next average.
        accumulate_alone(config, agent)?;
    }
    let mut replicas = Replicas {
        group,
        rank: rendezvous.rank,
        world,
        unsynced: 0,
        episodes: EpisodeSums::default(),
        tasks: config.tasks.len(),
        updates: 0,
        checks_due: 0,
        check_every: l.check_every,
        average_every: l.average_every,
        clock,
    };
    // Every learner starts from rank 0's parameters (the same seed builds the same ones; this makes sure).
    {
        let mut g = lock(&replicas.group);
        let mut flat = agent.policy_params().flat().detach();
        g.broadcast(&mut flat, 0).map_err(|e| Error::Runtime(format!("broadcasting rank 0's parameters: {e}")))?;
    }
    replicas.check(agent)?;
    info!(
        "learner {} of {world} joined (pid {}; {} over {}:{}, gradients {compression})",
        rendezvous.rank,
        std::process::id(),
        backend.name(),
        rendezvous.master_addr,
        rendezvous.master_port
    );
    Ok(Some(replicas))
}

/// A learner alone: `[learner] accumulate = k` splits each minibatch into k micro-batches (the single-process
/// trainer's and a lone distributed learner's setting).
pub(crate) fn accumulate_alone(config: &ExperimentConfig, agent: &mut dyn Algorithm) -> Result<()> {
    if config.learner.accumulate > 1 {
        replicated(agent)?.set_data_parallel(DataParallel::new(None, config.learner.accumulate)?)?;
    }
    Ok(())
}

impl Replicas {
    /// `local` summed over the group.
    pub(crate) fn sum(&mut self, local: u64) -> Result<u64> {
        let mut t = Tensor::from_slice(&[local as i64]);
        self.clock.time(|| lock(&self.group).all_reduce_sum(&mut t)).map_err(|e| Error::Runtime(e.to_string()))?;
        Ok(t.int64_value(&[0]) as u64)
    }

    /// After an update (every learner makes the same number): average its metrics over the group; with
    /// `average_every`, average the parameters when due; and at every `check_every`-th point where the
    /// learners' parameters should agree (each update, or each average), check that they are identical.
    /// Returns the episodes every learner's actors finished since the last update, summed.
    /// `metrics` then also carries `charts/collective_secs`: this learner's seconds in collectives so far.
    pub(crate) fn after_update(&mut self, agent: &dyn Algorithm, metrics: &mut Metrics) -> Result<EpisodeSums> {
        let clock = self.clock.clone();
        let episodes = clock.time(|| self.sync_after_update(agent, metrics))?;
        metrics.push("charts/collective_secs", clock.secs());
        Ok(episodes)
    }

    fn sync_after_update(&mut self, agent: &dyn Algorithm, metrics: &mut Metrics) -> Result<EpisodeSums> {
        // One all-reduce (sum) of the metrics and this learner's episode sums.
        // Every learner sends the same number of values: each task's pair, present or not.
        let mut e = std::mem::take(&mut self.episodes);
        e.tasks.resize(self.tasks, (0.0, 0));
        let mut values: Vec<f64> = metrics.iter().map(|(_, v)| *v).collect();
        values.extend([e.returns, e.lengths, e.count as f64]);
        values.extend(e.tasks.iter().flat_map(|(r, n)| [*r, *n as f64]));
        let mut t = Tensor::from_slice(&values);
        lock(&self.group).all_reduce_sum(&mut t).map_err(|e| Error::Runtime(e.to_string()))?;
        let sums = Vec::<f64>::try_from(&t).map_err(|e| Error::Runtime(e.to_string()))?;
        let (metric_sums, episode_sums) = sums.split_at(sums.len() - 3 - 2 * self.tasks);
        for ((_, v), sum) in metrics.0.iter_mut().zip(metric_sums) {
            *v = sum / self.world as f64;
        }
        let episodes = EpisodeSums {
            returns: episode_sums[0],
            lengths: episode_sums[1],
            count: episode_sums[2].round() as u64,
            tasks: episode_sums[3..].chunks_exact(2).map(|p| (p[0], p[1].round() as u64)).collect(),
        };
        self.updates += 1;
        let agreed = match self.average_every {
            0 => true,
            h if self.updates.is_multiple_of(h) => {
                self.average_parameters(agent)?;
                true
            }
            _ => false,
        };
        if agreed {
            self.checks_due += 1;
            if self.check_every > 0 && self.checks_due >= self.check_every {
                self.checks_due = 0;
                self.check(agent)?;
            }
        }
        Ok(episodes)
    }

    /// Local SGD's synchronisation: every learner's policy parameters replaced by their mean over the group
    /// (one f32 all-reduce of the flat buffer, in place; optimiser state stays each learner's own).
    fn average_parameters(&mut self, agent: &dyn Algorithm) -> Result<()> {
        let mut flat = agent.policy_params().flat().shallow_clone();
        tch::no_grad(|| lock(&self.group).all_reduce_mean(&mut flat))
            .map_err(|e| Error::Runtime(format!("averaging the learners' parameters: {e}")))
    }

    /// Error unless every learner holds the same policy parameters.
    fn check(&mut self, agent: &dyn Algorithm) -> Result<()> {
        lock(&self.group)
            .check_identical("the learners' parameters", agent.policy_params().flat())
            .map_err(|e| Error::Runtime(e.to_string()))
    }
}

/// The agent as [`Replicated`], or an error naming its kind (config validation refuses such settings first:
/// `AlgorithmKind::check_data_parallel`).
fn replicated(agent: &mut dyn Algorithm) -> Result<&mut dyn Replicated> {
    let name = agent.name();
    agent
        .replicated()
        .ok_or_else(|| Error::Config(format!("{name} updates cannot be spread over learners or micro-batches")))
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use flotilla_algorithms::AlgorithmConfig;
    use flotilla_algorithms::ppo::PpoConfig;
    use flotilla_core::Space;

    use super::*;

    /// Two ranks (threads) whose PPO agents start from different parameters, with `average_every = 2` and a
    /// check at every agreement point: the first update neither averages nor checks (the parameters differ, so
    /// a check would fail), the second averages them to their exact mean on both ranks and the check passes.
    #[test]
    fn local_sgd_averages_the_parameters_every_h_updates_and_checks_only_then() {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let config =
            AlgorithmConfig::Ppo(PpoConfig { n_steps: 8, batch_size: 16, hidden_sizes: vec![8], ..Default::default() });
        let (obs, act) = (Space::box1d(vec![-1.0; 3], vec![1.0; 3]), Space::discrete(2));
        let build = move |seed| config.build_learner(&obs, &act, 2, Device::Cpu, seed).unwrap();
        let (a, b) = (build(10).policy_params().flat().copy(), build(11).policy_params().flat().copy());
        assert!(!a.equal(&b), "different seeds start apart");
        let mean = (&a + &b) / 2.0;
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                let build = build.clone();
                std::thread::spawn(move || {
                    let agent = build(10 + rank as u64);
                    let options = GroupOptions { timeout: Duration::from_secs(30), ..GroupOptions::default() };
                    let group = ProcessGroup::connect(&Rendezvous::local(rank, 2, port), &options, b"t").unwrap();
                    let mut replicas = Replicas {
                        group: Arc::new(Mutex::new(group)),
                        rank,
                        world: 2,
                        unsynced: 0,
                        episodes: EpisodeSums {
                            returns: 10.0 * (rank + 1) as f64,
                            lengths: 5.0,
                            count: 1,
                            tasks: vec![(10.0 * (rank + 1) as f64, 1)],
                        },
                        tasks: 2,
                        updates: 0,
                        checks_due: 0,
                        check_every: 1,
                        average_every: 2,
                        clock: CollectiveClock::default(),
                    };
                    let mut metrics = Metrics::default();
                    metrics.push("losses/x", rank as f64);
                    let first = replicas.after_update(agent.as_ref(), &mut metrics).unwrap();
                    // Both learners' episodes, summed, on every learner; then none until more finish.
                    // Task 0's episodes summed too; task 1's pair travels (as zeros) though no rank had one.
                    let tasks = vec![(30.0, 2), (0.0, 0)];
                    assert_eq!(first, EpisodeSums { returns: 30.0, lengths: 10.0, count: 2, tasks });
                    let after_one = agent.policy_params().flat().copy();
                    let second = replicas.after_update(agent.as_ref(), &mut metrics).unwrap();
                    assert_eq!(second, EpisodeSums { tasks: vec![(0.0, 0); 2], ..EpisodeSums::default() });
                    (after_one, agent.policy_params().flat().copy(), metrics)
                })
            })
            .collect();
        let results: Vec<_> = ranks.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(results[0].0.equal(&a) && results[1].0.equal(&b), "no average after one update");
        for (_, after_two, metrics) in &results {
            let diff = (after_two - &mean).abs().max().double_value(&[]);
            assert!(diff < 1e-7, "averaged to the mean (off by {diff})");
            assert_eq!(metrics.iter().next().unwrap().1, 0.5, "metrics averaged over the ranks: (0 + 1) / 2");
            assert!(metrics.get("charts/collective_secs").is_some_and(|s| s > 0.0), "time in collectives is logged");
        }
        assert!(results[0].1.equal(&results[1].1), "both ranks hold the same bits");
    }
}
