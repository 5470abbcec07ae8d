//! Two hosts on one machine: this process, in the root network namespace,
//! and a network namespace of its own joined to it by a veth pair, for
//! processes started through `ip netns exec` (see `scripts/two-hosts` for the
//! same by hand).
//!
//! Each [`TwoHosts`] has a namespace `ferry-<pid>-<n>` (tests run in
//! parallel, in one process or in several), a veth pair `ferry<i>` (here) /
//! `ferry<i>ns` (there) and the /30 subnet number `i` of `10.201.0.0/16`:
//! this host is `10.201.x.y+1`, the other `10.201.x.y+2`. Two processes that
//! try the same `i` race on creating the veth `ferry<i>`, which the kernel
//! gives to one of them; the other tries the next. Subnets 0 to 63
//! (`10.201.0.0/24`) are left to `scripts/two-hosts`. The two ends have
//! different addresses and are not loopback, so cross-memory attach is never
//! set up between them, although both share the kernel's boot id (host id).
//!
//! Everything is torn down on drop, also when a test panics; namespaces left
//! behind by a process that was killed are deleted by the next one.
#![forbid(unsafe_code)]

use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Set (to anything) to make a missing namespace facility fail the test
/// instead of skipping it.
pub const REQUIRE_ENV: &str = "FERRY_REQUIRE_NETNS";

/// The first and one past the last /30 subnet number the tests use.
const SUBNETS: (u32, u32) = (64, 1 << 14);
/// Subnets tried before giving up (each one taken is skipped).
const TRIES: u32 = 256;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A network namespace joined to this one by a veth pair; deleted on drop.
#[derive(Debug)]
pub struct TwoHosts {
    /// The namespace's name.
    pub name: String,
    /// The veth end in this (the root) namespace.
    veth: String,
    /// This host's address (the veth end in the root namespace).
    pub here: IpAddr,
    /// The other host's address (the veth end in the namespace).
    pub there: IpAddr,
}

/// A new pair of hosts, or `None` after printing `skipped: <reason>` to
/// stderr where this machine does not let this process create one (with
/// [`REQUIRE_ENV`] set, that panics instead).
pub fn two_hosts() -> Option<TwoHosts> {
    match TwoHosts::up() {
        Ok(h) => Some(h),
        Err(reason) if std::env::var_os(REQUIRE_ENV).is_some() => {
            panic!("{reason} ({REQUIRE_ENV} is set)")
        }
        Err(reason) => {
            eprintln!("skipped: {reason}");
            None
        }
    }
}

/// Runs `ip ARGS`; its stderr on failure.
fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip").args(args).output().map_err(|e| {
        if e.kind() == ErrorKind::NotFound {
            "`ip` (iproute2) is not installed: not found in PATH".to_string()
        } else {
            format!("`ip` cannot be run: {e}")
        }
    })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`ip {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Why this process may not create namespaces and veth pairs, if its
/// effective capabilities say so (CAP_NET_ADMIN is 12, CAP_SYS_ADMIN 21).
fn missing_capabilities() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    let eff = u64::from_str_radix(field("CapEff:")?, 16).ok()?;
    let uid = field("Uid:").and_then(|u| u.split_whitespace().nth(1));
    let missing: Vec<&str> = [(21, "CAP_SYS_ADMIN"), (12, "CAP_NET_ADMIN")]
        .into_iter()
        .filter(|(bit, _)| eff & (1 << bit) == 0)
        .map(|(_, name)| name)
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "creating a network namespace needs CAP_SYS_ADMIN and CAP_NET_ADMIN; \
             this process (effective uid {}) lacks {}: run the tests as root, with them",
            uid.unwrap_or("?"),
            missing.join(" and ")
        )
    })
}

/// Deletes the namespaces `ferry-<pid>-<n>` of processes that no longer run
/// (killed before their guards could drop).
fn delete_stale() {
    let Ok(list) = ip(&["netns", "list"]) else {
        return;
    };
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let pid = name
            .strip_prefix("ferry-")
            .and_then(|r| r.split_once('-'))
            .and_then(|(pid, n)| n.parse::<u32>().ok().and(pid.parse::<u32>().ok()));
        if let Some(pid) = pid {
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                let _ = ip(&["netns", "delete", name]);
            }
        }
    }
}

/// The two addresses of /30 subnet number `i` of 10.201.0.0/16.
fn subnet(i: u32) -> (Ipv4Addr, Ipv4Addr) {
    let base = u32::from(Ipv4Addr::new(10, 201, 0, 0)) + 4 * i;
    (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2))
}

impl TwoHosts {
    /// Creates the namespace and the veth pair; the reason it could not.
    pub fn up() -> Result<TwoHosts, String> {
        ip(&["-V"])?;
        if let Some(reason) = missing_capabilities() {
            return Err(reason);
        }
        let routes = ip(&["-4", "-o", "route", "show", "root", "10.201.0.0/16"])?;
        if let Some(r) = routes.lines().find(|r| !r.contains(" dev ferry")) {
            return Err(format!(
                "10.201.0.0/16 is in use on this machine (route {r:?}): the two-host tests need it"
            ));
        }
        delete_stale();
        let pid = std::process::id();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("ferry-{pid}-{n}");
        ip(&["netns", "add", &name])
            .map_err(|e| format!("this process may not create network namespaces here: {e}"))?;
        // From here on, dropping the guard deletes the namespace.
        let mut hosts = TwoHosts {
            name,
            veth: String::new(),
            here: Ipv4Addr::UNSPECIFIED.into(),
            there: Ipv4Addr::UNSPECIFIED.into(),
        };
        let span = SUBNETS.1 - SUBNETS.0;
        let first = pid
            .wrapping_mul(2_654_435_761)
            .wrapping_add(n.wrapping_mul(97))
            % span;
        for k in 0..TRIES {
            let i = SUBNETS.0 + (first + k) % span;
            let (veth, inside) = (format!("ferry{i}"), format!("ferry{i}ns"));
            let add = [
                "link",
                "add",
                &veth,
                "type",
                "veth",
                "peer",
                "name",
                &inside,
                "netns",
                &hosts.name,
            ];
            match ip(&add) {
                Ok(_) => {}
                Err(e) if e.contains("File exists") => continue,
                Err(e) => return Err(format!("no veth pair can be created here: {e}")),
            }
            let (here, there) = subnet(i);
            hosts.veth = veth.clone();
            let (h, t) = (format!("{here}/30"), format!("{there}/30"));
            let ns = hosts.name.clone();
            for step in [
                vec!["addr", "add", &h, "dev", &veth],
                vec!["link", "set", &veth, "up"],
                vec!["-n", &ns, "addr", "add", &t, "dev", &inside],
                vec!["-n", &ns, "link", "set", &inside, "up"],
                vec!["-n", &ns, "link", "set", "lo", "up"],
            ] {
                // Not a missing facility: the machine let us create both.
                if let Err(e) = ip(&step) {
                    panic!("setting up the two hosts: {e}");
                }
            }
            hosts.here = here.into();
            hosts.there = there.into();
            return Ok(hosts);
        }
        Err(format!(
            "the {TRIES} veth names tried (among ferry{} to ferry{}) are all taken",
            SUBNETS.0,
            SUBNETS.1 - 1
        ))
    }

    /// The command that runs the rest of its arguments on the other host.
    pub fn wrapper(&self) -> [&str; 4] {
        ["ip", "netns", "exec", &self.name]
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        // Deleting the root end deletes the pair at once, even while
        // processes still run in the namespace (which then keeps existing,
        // unnamed, until they exit).
        if !self.veth.is_empty() {
            let _ = ip(&["link", "delete", &self.veth]);
        }
        if let Err(e) = ip(&["netns", "delete", &self.name]) {
            eprintln!("leaving network namespace {}: {e}", self.name);
        }
    }
}
