//! CPU accounting for the scaling table, from `/proc`: user + system seconds of the learner process and of the
//! actor processes (both children of the `flotilla train --actors N` supervisor) from `/proc/PID/stat`, and the busy jiffies of the whole machine from `/proc/stat`,
//! sampled at two moments and turned into cores busy in between.
use std::time::Instant;

use flotilla_tests::procfs::{self, learner_and_actors};

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
        let cpu_secs = |pid: u32| procfs::stat(pid).map(|s| s.cpu_secs);
        let actors = actors.into_iter().filter_map(cpu_secs).sum();
        let learner = learner.and_then(cpu_secs).unwrap_or(f64::NAN);
        let machine_busy = procfs::machine_busy_jiffies().unwrap_or(f64::NAN);
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
