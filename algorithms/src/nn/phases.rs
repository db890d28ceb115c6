//! Opt-in timing of an update's phases (`FLOTILLA_PROFILE_UPDATE=1`, [`PROFILE_VAR`]): where a batched
//! update's (and a population's batched acting pass's) seconds go on its device, with no profiler installed.
//! Each mark waits for the device's queued work
//! (CUDA runs asynchronously, so a host timer alone would charge a phase's kernels to whichever later phase
//! first waits) and adds the seconds since the previous mark to the phase it names. The sums are kept per
//! thread (one lockstep group's updates run on its thread) until [`take`]n; the learner logs them.
//!
//! Off (the default), a mark is one thread-local read: the waits would slow every update, so a timed run
//! (a benchmark) leaves it off and a profiling run turns it on.
use std::cell::RefCell;
use std::time::Instant;

use tch::Device;

use crate::{Error, Result};

/// The environment variable that turns phase timing on (`1`) or leaves it off (`0`, or unset).
pub const PROFILE_VAR: &str = "FLOTILLA_PROFILE_UPDATE";

/// One thread's timing: the device and instant of the last mark while an update is being timed, and the
/// seconds summed per phase (in the order phases first appeared).
#[derive(Default)]
struct Phases {
    since: Option<(Device, Instant)>,
    sums: Vec<(&'static str, f64)>,
}

thread_local! {
    static PHASES: RefCell<Phases> = RefCell::default();
}

/// Whether [`PROFILE_VAR`] turns timing on; an unreadable value is an error naming the variable and its value
/// (the command line asks first, to refuse it before anything is written).
pub fn enabled() -> Result<bool> {
    static ON: std::sync::OnceLock<std::result::Result<bool, String>> = std::sync::OnceLock::new();
    ON.get_or_init(|| parse(std::env::var(PROFILE_VAR).ok().as_deref())).clone().map_err(Error::Unsupported)
}

fn parse(value: Option<&str>) -> std::result::Result<bool, String> {
    flotilla_core::parse_switch(PROFILE_VAR, value, false, "time an update's phases")
}

/// Waits for `device`'s queued kernels (CUDA runs asynchronously: a timer must not stop before they finish).
pub fn synchronize(device: Device) {
    if let Device::Cuda(index) = device {
        tch::Cuda::synchronize(index as i64);
    }
}

/// Start timing an update on `device` where timing is on and `due` says an update is due (asked only then: it
/// runs on every lockstep step), until the returned guard goes; the device's queued work waits first, so that
/// the first phase is charged only its own. Inside a timed update (an acting pass that its bootstrap runs) it
/// changes nothing: the inner marks are charged to their phases, and the outer timing goes on.
pub(crate) fn start(device: Device, due: impl FnOnce() -> bool) -> Result<Timing> {
    Ok(begin(device, enabled()?, due))
}

/// [`start`] with timing on or off (`on`).
fn begin(device: Device, on: bool, due: impl FnOnce() -> bool) -> Timing {
    if !on || PHASES.with_borrow(|p| p.since.is_some()) || !due() {
        return Timing { started: false };
    }
    synchronize(device);
    PHASES.with_borrow_mut(|p| p.since = Some((device, Instant::now())));
    Timing { started: true }
}

/// An update being timed (from [`start`]); timing stops when the guard that started it goes, whichever way the
/// update ends.
pub(crate) struct Timing {
    started: bool,
}

impl Drop for Timing {
    fn drop(&mut self) {
        if self.started {
            PHASES.with_borrow_mut(|p| p.since = None);
        }
    }
}

/// The seconds since the last mark (or [`start`]), once the device finished what they queued, added to
/// `phase`. Nothing while no update is being timed.
pub(crate) fn mark(phase: &'static str) {
    PHASES.with_borrow_mut(|p| {
        let Some((device, since)) = p.since else { return };
        synchronize(device);
        let now = Instant::now();
        let secs = now.duration_since(since).as_secs_f64();
        match p.sums.iter_mut().find(|(name, _)| *name == phase) {
            Some((_, sum)) => *sum += secs,
            None => p.sums.push((phase, secs)),
        }
        p.since = Some((device, now));
    });
}

/// This thread's phase sums since the last call, in seconds, in the order the phases first appeared (empty
/// where timing is off or nothing was timed).
pub fn take() -> Vec<(&'static str, f64)> {
    PHASES.with_borrow_mut(|p| std::mem::take(&mut p.sums))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_reads_one_or_zero_and_names_itself_otherwise() {
        assert_eq!(parse(None), Ok(false));
        assert_eq!(parse(Some("0")), Ok(false));
        assert_eq!(parse(Some(" 1 ")), Ok(true));
        let err = parse(Some("yes")).unwrap_err();
        assert!(err.contains(PROFILE_VAR) && err.contains("\"yes\""), "{err}");
    }

    #[test]
    fn marks_add_up_per_phase_between_a_start_and_a_stop() {
        // Driven directly (the variable is read once per process; the tests leave it unset).
        assert!(!begin(Device::Cpu, false, || true).started, "off: nothing starts");
        assert!(!begin(Device::Cpu, true, || false).started, "nothing due: nothing starts");
        let timing = begin(Device::Cpu, true, || true);
        std::thread::sleep(std::time::Duration::from_millis(20));
        mark("a");
        mark("b");
        // A timed pass inside (an acting pass of the update's bootstrap) neither restarts nor stops the timing.
        let inner = begin(Device::Cpu, true, || true);
        assert!(!inner.started);
        std::thread::sleep(std::time::Duration::from_millis(20));
        drop(inner);
        mark("a");
        drop(timing);
        let before = PHASES.with_borrow(|p| p.sums.clone());
        mark("b"); // not timed: stopped
        let sums = take();
        assert_eq!(sums, before, "a mark after the stop adds nothing");
        assert_eq!(sums.iter().map(|(n, _)| *n).collect::<Vec<_>>(), ["a", "b"]);
        assert!(sums[0].1 >= 0.04, "both sleeps are charged to a: {sums:?}");
        assert!(take().is_empty(), "taken once");
    }
}
