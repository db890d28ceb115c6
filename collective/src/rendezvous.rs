//! Where a learner is in its group, read the torchrun way.
//!
//! torchrun, Kubeflow's PyTorchJob and Flotilla's own launcher set `MASTER_ADDR`, `MASTER_PORT`, `RANK`,
//! `WORLD_SIZE` and `LOCAL_RANK`; under torchrun's agent `TORCHELASTIC_USE_AGENT_STORE=True` says the agent
//! already serves the TCPStore (no rank hosts it) and `TORCHELASTIC_RESTART_COUNT` counts group restarts. Under
//! Slurm (`srun`), where `RANK`/`WORLD_SIZE` are absent, `SLURM_PROCID`/`SLURM_NTASKS`/`SLURM_LOCALID` stand in
//! for them. `GLOO_SOCKET_IFNAME` picks the network interface on multi-homed hosts.
use std::net::ToSocketAddrs;

use crate::{Error, Result};

/// torchrun's default `MASTER_PORT`.
pub const DEFAULT_PORT: u16 = 29500;

/// One rank's place in a data-parallel group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendezvous {
    /// Host of the rendezvous store (rank 0's host unless an agent serves it).
    pub master_addr: String,
    /// Port of the rendezvous store.
    pub master_port: u16,
    /// This process's rank, `0..world_size`.
    pub rank: usize,
    /// Number of ranks in the group.
    pub world_size: usize,
    /// This process's index among the ranks on its host (picks its CUDA device).
    pub local_rank: usize,
    /// torchrun's agent serves the store; otherwise rank 0 does.
    pub agent_store: bool,
    /// How many times the group has been restarted (keys of each attempt are kept apart by it).
    pub restart_count: u32,
    /// The interface Gloo binds to, if one is named (`GLOO_SOCKET_IFNAME`).
    pub ifname: Option<String>,
}

impl Rendezvous {
    /// A group of `world_size` ranks on this host, rank 0 serving the store at `127.0.0.1:port`.
    pub fn local(rank: usize, world_size: usize, port: u16) -> Self {
        Rendezvous {
            master_addr: "127.0.0.1".into(),
            master_port: port,
            rank,
            world_size,
            local_rank: rank,
            agent_store: false,
            restart_count: 0,
            ifname: None,
        }
    }

    /// Read this process's environment: `None` where it names no group (no `WORLD_SIZE`, `RANK` or Slurm task
    /// variables), an error naming the variable where one does not make sense.
    pub fn from_env() -> Result<Option<Self>> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// Whether `var` holds torchrun's rank variables (`WORLD_SIZE` or `RANK`): a process that torchrun (or
    /// `flotilla train --learners L`) started as a rank of its group. Slurm's task variables are not these.
    pub fn torchrun_rank(var: impl Fn(&str) -> Option<String>) -> bool {
        var("WORLD_SIZE").is_some() || var("RANK").is_some()
    }

    /// As [`Rendezvous::from_env`], reading variables through `var`.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>> {
        let torchrun = Self::torchrun_rank(&var);
        let slurm = !torchrun && var("SLURM_PROCID").is_some() && var("SLURM_NTASKS").is_some();
        if !torchrun && !slurm {
            return Ok(None);
        }
        let (rank_var, world_var, local_var) = if torchrun {
            ("RANK", "WORLD_SIZE", "LOCAL_RANK")
        } else {
            ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")
        };
        let number = |name: &str| -> Result<Option<u64>> {
            match var(name) {
                None => Ok(None),
                Some(text) => text
                    .trim()
                    .parse::<u64>()
                    .map(Some)
                    .map_err(|_| Error::Rendezvous(format!("{name}={text:?} is not a non-negative integer"))),
            }
        };
        let required = |name: &str| -> Result<u64> {
            number(name)?
                .ok_or_else(|| Error::Rendezvous(format!("{name} is not set (the other torchrun variables are)")))
        };
        let rank = required(rank_var)? as usize;
        let world_size = required(world_var)? as usize;
        let local_rank = number(local_var)?.map_or(rank, |r| r as usize);
        let master_addr = var("MASTER_ADDR").ok_or_else(|| {
            Error::Rendezvous(format!(
                "MASTER_ADDR is not set: {rank_var} and {world_var} are, and the ranks need the rendezvous host"
            ))
        })?;
        let master_port = match var("MASTER_PORT") {
            None => DEFAULT_PORT,
            Some(text) => match text.trim().parse::<u16>() {
                Ok(p) if p > 0 => p,
                _ => return Err(Error::Rendezvous(format!("MASTER_PORT={text:?} is not a port number (1-65535)"))),
            },
        };
        let agent_store = match var("TORCHELASTIC_USE_AGENT_STORE").as_deref().map(str::trim) {
            None | Some("") => false,
            Some(v) if v.eq_ignore_ascii_case("true") || v == "1" => true,
            Some(v) if v.eq_ignore_ascii_case("false") || v == "0" => false,
            Some(v) => {
                return Err(Error::Rendezvous(format!("TORCHELASTIC_USE_AGENT_STORE={v:?} is not True or False")));
            }
        };
        let restart_count = number("TORCHELASTIC_RESTART_COUNT")?.unwrap_or(0) as u32;
        let ifname = var("GLOO_SOCKET_IFNAME").filter(|s| !s.trim().is_empty());
        let rendezvous =
            Rendezvous { master_addr, master_port, rank, world_size, local_rank, agent_store, restart_count, ifname };
        rendezvous.check().map_err(|e| match e {
            Error::Rendezvous(msg) => Error::Rendezvous(format!("{msg} (from {rank_var}/{world_var})")),
            other => other,
        })?;
        Ok(Some(rendezvous))
    }

    /// Refuse a place that cannot make a group: an empty world, a rank outside it, a master address that does
    /// not resolve.
    pub fn check(&self) -> Result<()> {
        if self.world_size == 0 {
            return Err(Error::Rendezvous("world size 0: a group needs at least one rank".into()));
        }
        if self.rank >= self.world_size {
            return Err(Error::Rendezvous(format!(
                "rank {} is outside a world of {} ranks (ranks are 0..{})",
                self.rank,
                self.world_size,
                self.world_size - 1
            )));
        }
        if self.master_addr.trim().is_empty() {
            return Err(Error::Rendezvous("MASTER_ADDR is empty".into()));
        }
        if self.master_port == 0 {
            return Err(Error::Rendezvous("MASTER_PORT 0 is not a port".into()));
        }
        match (self.master_addr.as_str(), self.master_port).to_socket_addrs().map(|a| a.count()) {
            Ok(n) if n > 0 => Ok(()),
            Ok(_) => Err(Error::Rendezvous(format!("MASTER_ADDR {:?} resolves to no address", self.master_addr))),
            Err(e) => Err(Error::Rendezvous(format!("MASTER_ADDR {:?} does not resolve: {e}", self.master_addr))),
        }
    }

    /// Whether this rank serves the rendezvous store.
    pub fn hosts_store(&self) -> bool {
        self.rank == 0 && !self.agent_store
    }

    /// Whether the master address is this host's loopback (then Gloo binds to it too).
    pub fn is_loopback(&self) -> bool {
        let a = self.master_addr.trim();
        a == "localhost" || a.starts_with("127.") || a == "::1"
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn read(vars: &[(&str, &str)]) -> Result<Option<Rendezvous>> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Rendezvous::from_vars(|name| map.get(name).cloned())
    }

    #[test]
    fn torchrun_variables_make_a_place() {
        let r = read(&[
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29511"),
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
            ("TORCHELASTIC_RESTART_COUNT", "2"),
            ("GLOO_SOCKET_IFNAME", "eth1"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((r.rank, r.world_size, r.local_rank, r.master_port), (3, 4, 1, 29511));
        assert!(r.agent_store && !r.hosts_store());
        assert_eq!(r.restart_count, 2);
        assert_eq!(r.ifname.as_deref(), Some("eth1"));
        // Without an agent, rank 0 serves the store; MASTER_PORT defaults to torchrun's.
        let r0 = read(&[("MASTER_ADDR", "localhost"), ("RANK", "0"), ("WORLD_SIZE", "2")]).unwrap().unwrap();
        assert!(r0.hosts_store() && r0.is_loopback());
        assert_eq!((r0.master_port, r0.local_rank), (DEFAULT_PORT, 0));
    }

    #[test]
    fn slurm_task_variables_stand_in_when_torchrun_s_are_absent() {
        let r =
            read(&[("MASTER_ADDR", "127.0.0.1"), ("SLURM_PROCID", "5"), ("SLURM_NTASKS", "8"), ("SLURM_LOCALID", "1")])
                .unwrap()
                .unwrap();
        assert_eq!((r.rank, r.world_size, r.local_rank), (5, 8, 1));
        assert_eq!(read(&[]).unwrap(), None, "no variables: no group");
        assert_eq!(read(&[("SLURM_PROCID", "0")]).unwrap(), None, "one Slurm variable alone is not a group");
        // A torchrun rank is one with torchrun's variables; a Slurm task is not one (it runs its learner in place).
        let torchrun = |vars: &[(&str, &str)]| {
            Rendezvous::torchrun_rank(|name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string()))
        };
        assert!(torchrun(&[("RANK", "0")]) && torchrun(&[("WORLD_SIZE", "2")]));
        assert!(!torchrun(&[("SLURM_PROCID", "5"), ("SLURM_NTASKS", "8")]) && !torchrun(&[]));
    }

    #[test]
    fn places_that_make_no_sense_are_refused_naming_the_variable() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("MASTER_ADDR", "127.0.0.1"), ("RANK", "2"), ("WORLD_SIZE", "2")], "rank 2 is outside a world of 2"),
            (&[("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("WORLD_SIZE", "0")], "world size 0"),
            (&[("MASTER_ADDR", "127.0.0.1"), ("RANK", "-1"), ("WORLD_SIZE", "2")], "RANK=\"-1\""),
            (&[("MASTER_ADDR", "127.0.0.1"), ("RANK", "0")], "WORLD_SIZE is not set"),
            (&[("RANK", "0"), ("WORLD_SIZE", "2")], "MASTER_ADDR is not set"),
            (
                &[("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "70000"), ("RANK", "0"), ("WORLD_SIZE", "2")],
                "MASTER_PORT",
            ),
            (&[("MASTER_ADDR", "no-such-host.invalid"), ("RANK", "0"), ("WORLD_SIZE", "2")], "does not resolve"),
            (
                &[
                    ("MASTER_ADDR", "127.0.0.1"),
                    ("RANK", "0"),
                    ("WORLD_SIZE", "2"),
                    ("TORCHELASTIC_USE_AGENT_STORE", "maybe"),
                ],
                "TORCHELASTIC_USE_AGENT_STORE",
            ),
            (&[("MASTER_ADDR", "127.0.0.1"), ("SLURM_PROCID", "4"), ("SLURM_NTASKS", "4")], "SLURM_PROCID"),
            (
                &[
                    ("MASTER_ADDR", "127.0.0.1"),
                    ("RANK", "0"),
                    ("WORLD_SIZE", "2"),
                    ("TORCHELASTIC_RESTART_COUNT", "two"),
                ],
                "TORCHELASTIC_RESTART_COUNT=\"two\"",
            ),
        ];
        for (vars, needle) in cases {
            let err = read(vars).unwrap_err().to_string();
            assert!(err.contains(needle), "{vars:?}: {err:?} should name {needle:?}");
        }
    }
}
