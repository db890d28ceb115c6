//! Processes as Linux's `/proc` shows them, for the integration tests, the soak and the distributed benchmark:
//! a process's state, parent, CPU seconds, arguments, resident memory and open files, its children, and the
//! learner and actors of a `flotilla train --actors N` supervisor. Every reader returns `None` (or nothing)
//! for a process that is gone: callers poll processes that they kill.

/// What `/proc/PID/stat` says of a process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stat {
    /// The state letter (`R`, `S`, `D`, `Z` for a zombie not yet reaped, …).
    pub state: char,
    /// The parent's pid.
    pub parent: u32,
    /// User + system CPU seconds so far (at the usual 100 clock ticks per second).
    pub cpu_secs: f64,
}

/// `/proc/PID/stat` of `pid`, if it exists.
pub fn stat(pid: u32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "PID (comm) S PPID …": comm may hold spaces and parentheses; what follows its last ')' does not.
    // Counted from the state (field 3), utime and stime are fields 14 and 15.
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    let number = |i: usize| fields.get(i)?.parse::<f64>().ok();
    Some(Stat {
        state: fields.first()?.chars().next()?,
        parent: fields.get(1)?.parse().ok()?,
        cpu_secs: (number(11)? + number(12)?) / 100.0,
    })
}

/// Whether `pid` is running: it exists and is not a zombie waiting to be reaped.
pub fn alive(pid: u32) -> bool {
    stat(pid).is_some_and(|s| s.state != 'Z')
}

/// The command line of `pid`, one string per argument (empty if it is gone).
pub fn args(pid: u32) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    raw.split(|&b| b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect()
}

/// The value in kB of `key` in a `/proc` file of `key: N kB` lines (`/proc/PID/status`, `/proc/meminfo`).
pub fn kib(path: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let value = text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?;
    value.trim().trim_end_matches("kB").trim().parse().ok()
}

/// Resident memory of `pid` in KiB (`VmRSS`).
pub fn rss_kib(pid: u32) -> Option<u64> {
    kib(&format!("/proc/{pid}/status"), "VmRSS")
}

/// Open file descriptors of `pid`.
pub fn fd_count(pid: u32) -> Option<u64> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64)
}

/// The running (not zombie) processes whose parent is `parent`, in pid order: from the `children` file of
/// each of its threads (a child belongs to the thread that forked it), or, on a kernel without those files
/// (`CONFIG_PROC_CHILDREN`), by reading every process's parent.
pub fn children(parent: u32) -> Vec<u32> {
    let mut pids = threads_children(parent).unwrap_or_else(|| {
        let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
        entries.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect()
    });
    pids.retain(|&pid| stat(pid).is_some_and(|s| s.parent == parent && s.state != 'Z'));
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// The pids in `/proc/{parent}/task/*/children`; `None` where the kernel has no such files (or `parent` is gone).
fn threads_children(parent: u32) -> Option<Vec<u32>> {
    let mut pids = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{parent}/task")).ok()?.flatten() {
        match std::fs::read_to_string(task.path().join("children")) {
            Ok(text) => pids.extend(text.split_whitespace().filter_map(|p| p.parse::<u32>().ok())),
            // A thread that exited meanwhile; no file at all means no such files on this kernel.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && task.path().exists() => return None,
            Err(_) => {}
        }
    }
    Some(pids)
}

/// The learner and the actors (in pid order) among the children of a `flotilla train --actors N` supervisor:
/// the processes it started as `flotilla learner …` and `flotilla actor …`.
pub fn learner_and_actors(supervisor: u32) -> (Option<u32>, Vec<u32>) {
    let (mut learner, mut actors) = (None, Vec::new());
    for pid in children(supervisor) {
        match args(pid).get(1).map(String::as_str) {
            Some("learner") => learner = Some(pid),
            Some("actor") => actors.push(pid),
            _ => {}
        }
    }
    (learner, actors)
}

/// Busy jiffies of the whole machine so far, all CPUs (`/proc/stat`: everything but idle and iowait).
pub fn machine_busy_jiffies() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let v: Vec<f64> = text.lines().next()?.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    Some(v.iter().sum::<f64>() - v.get(3)? - v.get(4).unwrap_or(&0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_read_and_a_child_is_found_then_gone() {
        let me = std::process::id();
        let s = stat(me).unwrap();
        assert!(alive(me) && s.state != 'Z' && s.parent > 0, "{s:?}");
        assert!(rss_kib(me).unwrap() > 1024, "a test binary holds more than 1 MiB");
        assert!(fd_count(me).unwrap() >= 3);
        assert!(args(me)[0].contains("flotilla_tests"), "{:?}", args(me));
        assert!(kib("/proc/meminfo", "MemTotal").unwrap() > 0);
        assert_eq!(kib("/proc/meminfo", "NoSuchKey"), None);
        assert!(machine_busy_jiffies().unwrap() > 0.0);
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        assert!(children(me).contains(&pid));
        // `spawn` returns once the child has dropped our memory in exec, which is before the kernel has set up the
        // new argument area: /proc/PID/cmdline reads empty for that moment.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while args(pid).is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(args(pid), ["sleep", "30"]);
        child.kill().unwrap();
        // Killed but not yet reaped: a zombie, no longer alive nor counted among the children.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while alive(pid) {
            assert!(std::time::Instant::now() < deadline, "the killed child never died");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!children(me).contains(&pid));
        child.wait().unwrap();
        assert!(stat(pid).is_none() && args(pid).is_empty());
    }
}
