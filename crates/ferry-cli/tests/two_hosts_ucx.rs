//! The cross-process pairings between two hosts (this network namespace
//! and another, joined by a veth pair: see `two_hosts.rs`) over UCX, with
//! UCX restricted to TCP (`UCX_TLS=tcp`): the way UCX crosses hosts on a
//! machine with no RDMA NIC.
//!
//! UCX lists the network devices once, when the process first loads it,
//! and cannot start a worker once one of them is gone; so this runs in a
//! child process of its own, started after the namespace exists (and with
//! `UCX_TLS` set before UCX loads). Skips, saying why, where namespaces
//! cannot be made or UCX cannot start.
#![forbid(unsafe_code)]

mod common;

use common::netns::two_hosts;
use common::*;
use ferry::TransportKind;

/// The environment variable that marks the child process.
const CHILD: &str = "FERRY_TEST_TWO_HOSTS_UCX_CHILD";

#[test]
fn pairings_over_ucx_between_two_hosts() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    if ferry::ucx::status().is_err() {
        with_ucx(Vec::new()); // prints why, or fails where UCX is required
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("UCX_TLS", "tcp")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "the child did not run: {text}");
    eprint!(
        "{}",
        text.lines()
            .filter(|l| l.starts_with("skipped"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let Some(hosts) = two_hosts() else { return };
    let both = [TransportKind::Ucx, TransportKind::Tcp];
    for sizes in [vec![1u64], vec![4096], mixed16(), vec![64 << 20]] {
        let local = connector_on(hosts.here, &both, 1).await;
        let p = peer_on(&hosts.other(), &both, 1, &[], &[("UCX_TLS", "tcp")]).await;
        pairings_between(&local, &p, &sizes, TransportKind::Ucx, 1).await;
    }
}
