//! Linux network namespaces as hosts on one machine, and a userspace TCP proxy with latency that can stall: the
//! multi-host test (`cli/tests/netns.rs`) and the chaos soak (`flotilla-soak`) break the network between a learner
//! and its actors with them. Everything here needs root (CAP_NET_ADMIN) and iproute2's `ip`.
//!
//! Namespaces are named after the creating process (`flt<pid>-<role>`), so parallel runs do not collide; a
//! [`Hosts`] deletes its namespaces when dropped (their veths go with them), and the next [`Hosts::new`] deletes
//! those of processes that died before cleaning up.
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

/// Run `ip ARGS`; its stderr on failure.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Why this machine cannot make namespaces, if it cannot: it needs root and iproute2.
pub fn missing_prerequisite() -> Option<String> {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not running as root (network namespaces need CAP_NET_ADMIN)".into());
    }
    match Command::new("ip").arg("-V").output() {
        Ok(o) if o.status.success() => None,
        _ => Some("iproute2's `ip` command is missing".into()),
    }
}

/// Namespaces as hosts, deleted when dropped (a namespace's veths go with it).
pub struct Hosts {
    prefix: String,
    made: Vec<String>,
}

impl Hosts {
    /// Hosts named `flt<pid>-<role>`; first deletes those left behind by processes that no longer exist.
    pub fn new() -> Hosts {
        if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let name = line.split_whitespace().next().unwrap_or_default();
                let pid = name.strip_prefix("flt").and_then(|rest| rest.split('-').next()?.parse::<u32>().ok());
                if pid.is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists()) {
                    let _ = ip(&["netns", "del", name]);
                }
            }
        }
        Hosts { prefix: format!("flt{}", std::process::id()), made: Vec::new() }
    }

    /// A new namespace with its loopback up.
    pub fn add(&mut self, role: &str) -> Result<String, String> {
        let name = format!("{}-{role}", self.prefix);
        ip(&["netns", "add", &name])?;
        self.made.push(name.clone());
        ip(&["-n", &name, "link", "set", "lo", "up"])?;
        Ok(name)
    }

    /// A veth pair between two namespaces: `a_if` with `a_addr` (CIDR) in `a`, `b_if` with `b_addr` in `b`.
    pub fn link(a: &str, a_if: &str, a_addr: &str, b: &str, b_if: &str, b_addr: &str) -> Result<(), String> {
        ip(&["link", "add", a_if, "netns", a, "type", "veth", "peer", "name", b_if, "netns", b])?;
        for (ns, dev, addr) in [(a, a_if, a_addr), (b, b_if, b_addr)] {
            ip(&["-n", ns, "addr", "add", addr, "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        Ok(())
    }

    /// A veth pair between this process's own namespace (`here_if` with `here_addr`, CIDR) and namespace `ns`
    /// (`ns_if` with `ns_addr`): a host that reaches this one, and only this one. `here_if` must be unique on
    /// the machine (at most 15 characters); it goes when `ns` is deleted.
    pub fn link_here(here_if: &str, here_addr: &str, ns: &str, ns_if: &str, ns_addr: &str) -> Result<(), String> {
        ip(&["link", "add", here_if, "type", "veth", "peer", "name", ns_if, "netns", ns])?;
        ip(&["addr", "add", here_addr, "dev", here_if])?;
        ip(&["link", "set", here_if, "up"])?;
        ip(&["-n", ns, "addr", "add", ns_addr, "dev", ns_if])?;
        ip(&["-n", ns, "link", "set", ns_if, "up"])?;
        Ok(())
    }

    /// The name [`Hosts::add`] gives `role`'s namespace.
    pub fn name(&self, role: &str) -> String {
        format!("{}-{role}", self.prefix)
    }
}

impl Default for Hosts {
    fn default() -> Self {
        Hosts::new()
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for name in self.made.iter().rev() {
            if let Err(e) = ip(&["netns", "del", name]) {
                eprintln!("cleaning up: {e}");
            }
        }
    }
}

/// Move the calling thread into namespace `ns`; sockets it creates from then on live there (threads it spawns
/// start there too).
pub fn enter(ns: &str) -> std::io::Result<()> {
    let file = std::fs::File::open(format!("/run/netns/{ns}"))?;
    // SAFETY: setns(2) on an open namespace file; it changes only this thread's network namespace.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A userspace TCP proxy: every byte it forwards waits `delay` in each direction, and while `stalled` is set it
/// forwards nothing (a congested or flapping path). Stopped when dropped.
pub struct Proxy {
    stop: Arc<AtomicBool>,
    /// Set to hold every byte (in both directions) until cleared.
    pub stalled: Arc<AtomicBool>,
    /// Both ends of every connection, shut down on drop so that the pump threads end.
    streams: Arc<Mutex<Vec<TcpStream>>>,
    /// Connections forwarded so far.
    pub connections: Arc<AtomicU64>,
}

impl Proxy {
    /// Listen on `listen` (inside namespace `ns`, or this process's own with `None`) and forward each connection
    /// to `upstream` (dialled from the same namespace), `delay` each way.
    pub fn start(ns: Option<&str>, listen: SocketAddr, upstream: SocketAddr, delay: Duration) -> Result<Proxy, String> {
        let proxy = Proxy {
            stop: Arc::new(AtomicBool::new(false)),
            stalled: Arc::new(AtomicBool::new(false)),
            streams: Arc::new(Mutex::new(Vec::new())),
            connections: Arc::new(AtomicU64::new(0)),
        };
        let (stop, stalled, streams, connections) =
            (proxy.stop.clone(), proxy.stalled.clone(), proxy.streams.clone(), proxy.connections.clone());
        let (ready_tx, ready) = mpsc::channel();
        let ns = ns.map(str::to_string);
        thread::spawn(move || {
            let bound = ns.as_deref().map_or(Ok(()), enter).and_then(|()| TcpListener::bind(listen)).and_then(|l| {
                l.set_nonblocking(true)?;
                Ok(l)
            });
            let where_ = ns.as_deref().unwrap_or("this namespace");
            let listener = match bound {
                Ok(l) => l,
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("proxy in {where_} on {listen}: {e}")));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(()));
            while !stop.load(Ordering::SeqCst) {
                let client = match listener.accept() {
                    Ok((client, _)) => client,
                    Err(_) => {
                        thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                };
                // Dialled from this thread, which is in `ns`.
                let Ok(server) = TcpStream::connect_timeout(&upstream, Duration::from_secs(5)) else { continue };
                connections.fetch_add(1, Ordering::SeqCst);
                let mut kept = streams.lock().expect("proxy streams");
                // Connections both of whose ends are closed are forgotten, so a long run keeps no dead sockets.
                kept.retain(|s| s.peer_addr().is_ok());
                for s in [&client, &server] {
                    let _ = s.set_nonblocking(false);
                    let _ = s.set_nodelay(true);
                    if let Ok(clone) = s.try_clone() {
                        kept.push(clone);
                    }
                }
                drop(kept);
                if let (Ok(c), Ok(s)) = (client.try_clone(), server.try_clone()) {
                    pump(c, s, stalled.clone(), delay);
                    pump(server, client, stalled.clone(), delay);
                }
            }
        });
        ready.recv().map_err(|e| e.to_string())??;
        Ok(proxy)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.stalled.store(false, Ordering::SeqCst);
        for s in self.streams.lock().expect("proxy streams").iter() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// Forward `from` ─► `to` with `delay`: a reader stamps each read with when it may leave, a writer sends it then
/// (in order; held while `stalled`). End of stream (or an error) on either side is passed on as a shutdown of
/// both, so neither thread outlives its connection.
fn pump(mut from: TcpStream, mut to: TcpStream, stalled: Arc<AtomicBool>, delay: Duration) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let reader_end = from.try_clone();
    thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf) {
            if tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    });
    thread::spawn(move || {
        for (due, bytes) in rx {
            thread::sleep(due.saturating_duration_since(Instant::now()));
            while stalled.load(Ordering::SeqCst) {
                thread::sleep(Duration::from_millis(10));
            }
            if to.write_all(&bytes).is_err() {
                // The far side is gone: stop reading the near side too.
                if let Ok(r) = &reader_end {
                    let _ = r.shutdown(Shutdown::Read);
                }
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
