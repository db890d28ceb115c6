//! CPU accounting for the scaling table, from `/proc`: user + system seconds of the learner process and of the
//! actor processes (both children of the `flotilla train --actors N` supervisor) from `/proc/PID/stat`, and the busy jiffies of the whole machine from `/proc/stat`,
//! sampled at two moments and turned into cores busy in between.
use std::time::Instant;

/// User + system CPU seconds of process `pid` (`/proc/PID/stat`, assuming the usual 100 clock ticks/s).
fn process_cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name start at field 3 (state); utime and stime are 14 and 15.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i)?.parse::<f64>().ok();
    Some((ticks(11)? + ticks(12)?) / 100.0)
}

/// Child processes of `pid` (any of its threads may have spawned them).
fn child_pids(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| c.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<u32>>())
        .collect()
}

/// The learner and the actor processes of a `flotilla train --actors N` supervisor (`supervisor`): its children,
/// the learner being the one started as `flotilla learner`.
pub(crate) fn learner_and_actors(supervisor: u32) -> (Option<u32>, Vec<u32>) {
    let is_learner = |pid: &u32| {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        cmdline.split(|&b| b == 0).nth(1) == Some(b"learner".as_slice())
    };
    let (learner, actors): (Vec<u32>, Vec<u32>) = child_pids(supervisor).into_iter().partition(is_learner);
    (learner.first().copied(), actors)
}

/// CPU counters at one moment: the learner process, the actor processes, and the whole machine (jiffies).
pub(crate) struct CpuMark {
    at: Instant,
    learner: f64,
    actors: f64,
    machine_busy: f64,
}

impl CpuMark {
    /// The counters of a `flotilla train --actors N` run whose supervisor is `supervisor` (the supervisor's own
    /// CPU, next to none, counts as another process's).
    pub(crate) fn take(supervisor: u32) -> CpuMark {
        let (learner, actors) = learner_and_actors(supervisor);
        let actors = actors.into_iter().filter_map(process_cpu_secs).sum();
        let learner = learner.and_then(process_cpu_secs).unwrap_or(f64::NAN);
        let machine_busy = machine_jiffies().unwrap_or(f64::NAN);
        CpuMark { at: Instant::now(), learner, actors, machine_busy }
    }

    /// Cores busy from `self` to `later`: the learner's, the actors', and everyone else's on the machine.
    pub(crate) fn usage(&self, later: &CpuMark) -> (f64, f64, f64) {
        let wall = later.at.duration_since(self.at).as_secs_f64().max(1e-9);
        let (learner, actors) = ((later.learner - self.learner) / wall, (later.actors - self.actors) / wall);
        let machine = (later.machine_busy - self.machine_busy) / 100.0 / wall;
        (learner, actors, machine - learner - actors)
    }
}

/// Busy jiffies of the whole machine, all CPUs (`/proc/stat`: everything but idle and iowait).
fn machine_jiffies() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let v: Vec<f64> = stat.lines().next()?.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let total: f64 = v.iter().sum();
    Some(total - v.get(3)? - v.get(4).unwrap_or(&0.0))
}
