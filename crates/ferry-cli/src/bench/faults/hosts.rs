//! Two hosts on one machine for `ferry bench --faults`: a network namespace
//! joined to the root one by a veth pair (as the two-host tests make them,
//! `tests/common/netns.rs`), whose link the bench cuts and restores.
//!
//! The namespace is `ferry-faults-<pid>`, the veth pair `ferryf<i>` (here)
//! / `ferryf<i>ns` (there), on /30 subnet `i` of 10.203.0.0/16 (a range the
//! tests do not use): this host `.1`, the other `.2`. Deleted on drop.

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;

/// A namespace and its veth pair; deleted on drop.
#[derive(Debug)]
pub(super) struct Namespace {
    /// The namespace's name.
    pub(super) name: String,
    /// The veth end in the root namespace.
    veth: String,
    /// This host's address.
    pub(super) here: IpAddr,
    /// The other host's address.
    pub(super) there: IpAddr,
}

/// Runs `ip ARGS`; its stderr on failure.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("`ip` cannot be run: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Deletes the namespaces `ferry-faults-<pid>` of runs that no longer
/// run (interrupted before they could clean up).
fn delete_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for name in String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
    {
        let pid = name.strip_prefix("ferry-faults-");
        if pid.is_some_and(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()) {
            let _ = ip(&["netns", "delete", name]);
        }
    }
}

impl Namespace {
    /// Creates the namespace and the veth pair, or says why it cannot.
    pub(super) fn up() -> Result<Namespace, String> {
        // Root is what `ip netns add` and `ip link` need here.
        let uid = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Uid:"))
                    .and_then(|u| u.split_whitespace().nth(1).map(str::to_string))
            })
            .unwrap_or_default();
        if uid != "0" {
            return Err(format!(
                "namespaces need root (effective uid {uid}): run as root for the namespace rows"
            ));
        }
        delete_stale();
        let pid = std::process::id();
        let name = format!("ferry-faults-{pid}");
        ip(&["netns", "add", &name])?;
        let mut ns = Namespace {
            name,
            veth: String::new(),
            here: Ipv4Addr::UNSPECIFIED.into(),
            there: Ipv4Addr::UNSPECIFIED.into(),
        };
        for k in 0..64u32 {
            let i = (pid.wrapping_add(k)) % (1 << 14);
            let (veth, inside) = (format!("ferryf{i}"), format!("ferryf{i}ns"));
            match ip(&[
                "link", "add", &veth, "type", "veth", "peer", "name", &inside, "netns", &ns.name,
            ]) {
                Ok(()) => {}
                Err(e) if e.contains("File exists") => continue,
                Err(e) => return Err(e),
            }
            ns.veth = veth.clone();
            let base = u32::from(Ipv4Addr::new(10, 203, 0, 0)) + 4 * i;
            let (here, there) = (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2));
            let (h, t) = (format!("{here}/30"), format!("{there}/30"));
            let n = ns.name.clone();
            for step in [
                vec!["addr", "add", &h, "dev", &veth],
                vec!["link", "set", &veth, "up"],
                vec!["-n", &n, "addr", "add", &t, "dev", &inside],
                vec!["-n", &n, "link", "set", &inside, "up"],
                vec!["-n", &n, "link", "set", "lo", "up"],
            ] {
                ip(&step)?;
            }
            ns.here = here.into();
            ns.there = there.into();
            return Ok(ns);
        }
        Err("no free veth name among 64 tried".into())
    }

    /// The command that runs the rest of its arguments on the other host.
    pub(super) fn wrapper(&self) -> [&str; 4] {
        ["ip", "netns", "exec", &self.name]
    }

    /// Cuts the link (`ip link set <veth> down`): nothing passes either way.
    pub(super) fn cut(&self) -> Result<(), String> {
        ip(&["link", "set", &self.veth, "down"])
    }

    /// Restores the link, and the route to the other host with it.
    pub(super) fn restore(&self) -> Result<(), String> {
        ip(&["link", "set", &self.veth, "up"])
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        if !self.veth.is_empty() {
            let _ = ip(&["link", "delete", &self.veth]);
        }
        let _ = ip(&["netns", "delete", &self.name]);
    }
}
