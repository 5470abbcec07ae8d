//! The cross-process suite between two hosts on one machine: this process
//! in the root network namespace, `ferry peer` processes in a namespace of
//! their own joined to it by a veth pair (`common/netns.rs`). READ and WRITE
//! in both directions, checked byte for byte, over every lane of [`LANES`];
//! a peer killed mid-transfer; and `ferry bench --role target` in the
//! namespace with the initiator here.
//!
//! Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2; elsewhere each
//! test prints `skipped: <reason>` and passes (set `FERRY_REQUIRE_NETNS` to
//! make that a failure).
#![forbid(unsafe_code)]

mod common;

use std::net::Ipv4Addr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::netns::{two_hosts, TwoHosts};
use common::*;
use ferry::{Error, OperationStatus, TransportKind};
use ferry_cli::peer::Cmd;
use tokio::io::{AsyncBufReadExt, BufReader};

/// One way to move bytes between the hosts.
struct Lane {
    /// The transports both sides enable.
    enable: &'static [TransportKind],
    /// TCP streams a transfer of 4 bytes or more is split over.
    streams: usize,
    /// The transport every operation must report.
    expect: TransportKind,
}

/// The lanes the suite runs over: TCP, and TCP striped over 4 streams, with
/// cross-memory attach enabled on both sides (for every size), which must
/// not be taken between two hosts. A new transport is one more line.
const LANES: &[Lane] = &[
    Lane {
        enable: &[TransportKind::Cma, TransportKind::Tcp],
        streams: 1,
        expect: TransportKind::Tcp,
    },
    Lane {
        enable: &[TransportKind::Cma, TransportKind::Tcp],
        streams: 4,
        expect: TransportKind::Tcp,
    },
];

/// The four directed pairings for one set of sizes over each lane.
async fn pairings(hosts: &TwoHosts, sizes: &[u64]) {
    for lane in LANES {
        let local = connector_on(hosts.here, lane.enable, lane.streams).await;
        let p = peer_on(&hosts.other(), lane.enable, lane.streams, &[], &[]).await;
        pairings_between(&local, &p, sizes, lane.expect, lane.streams).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_byte() {
    let Some(hosts) = two_hosts() else { return };
    pairings(&hosts, &[1]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_kib() {
    let Some(hosts) = two_hosts() else { return };
    pairings(&hosts, &[4096]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_descriptors_of_mixed_sizes() {
    let Some(hosts) = two_hosts() else { return };
    pairings(&hosts, &mixed16()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_mib() {
    let Some(hosts) = two_hosts() else { return };
    pairings(&hosts, &[64 << 20]).await;
}

/// The peer really is on the other host: its connector listens on the
/// namespace's address, which this host reaches only through the veth pair.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_advertises_the_other_hosts_address() {
    let Some(hosts) = two_hosts() else { return };
    let lane = &LANES[0];
    let p = peer_on(&hosts.other(), lane.enable, 1, &[], &[]).await;
    let (_a, meta) = expose(&p, Cmd::Readable, &[1], 1).await;
    let addrs = meta.addresses();
    assert!(!addrs.is_empty());
    assert!(addrs.iter().all(|a| a.ip() == hosts.there), "{addrs:?}");
    assert_ne!(hosts.here, hosts.there);
}

/// The control of the suite's `tcp` assertions: with the same settings,
/// two processes on one host (loopback) do copy by attach, so it is the
/// namespaces (two addresses) that keep `cma` out, not the configuration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_is_taken_on_one_host_and_not_between_the_two() {
    let Some(hosts) = two_hosts() else { return };
    let lane = &LANES[0];
    for (host, ip, want) in [
        (
            Host::loopback(),
            Ipv4Addr::LOCALHOST.into(),
            TransportKind::Cma,
        ),
        (hosts.other(), hosts.here, lane.expect),
    ] {
        let local = connector_on(ip, lane.enable, 1).await;
        let p = peer_on(&host, lane.enable, 1, &[], &[]).await;
        let (mut a, meta) = expose(&p, Cmd::Readable, &[4096], 3).await;
        let read = local.begin_read(&meta, zeroed(&[4096])).await.unwrap();
        read.wait_for_completion().await.unwrap();
        assert_eq!(read.transport(), Some(want), "from {}", host.ip);
        assert_eq!(done(&mut a).await.transport.as_deref(), Some(want.name()));
    }
}

/// Long enough that the kill lands mid-transfer even on a loaded machine.
const BIG: u64 = 1 << 30;

/// A peer killed with SIGKILL mid-transfer: the operation of this side
/// (passive, then active) ends with a lost connection within 5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_killed_mid_transfer_fails_the_survivors_operation() {
    let Some(hosts) = two_hosts() else { return };
    for lane in LANES {
        let local = connector_on(hosts.here, lane.enable, lane.streams).await;

        // The peer reads this process's readable, and dies.
        let mut victim = peer_on(&hosts.other(), lane.enable, lane.streams, &[], &[]).await;
        let readable = local.create_readable(zeroed(&[BIG])).await.unwrap();
        let r = with_meta(req(Cmd::Read, &[BIG], 0), readable.metadata());
        let _a = victim.request(r).await.unwrap();
        let t = Instant::now();
        while readable.status() != OperationStatus::InProgress {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "the read never began"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        victim.kill().await.unwrap();
        let err = readable
            .wait_for_completion_timeout(Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::ConnectionLost { .. }), "{err}");
        assert_eq!(readable.status(), OperationStatus::Errored);
        assert_eq!(readable.transport(), Some(lane.expect));
        drop(readable);
        assert_eq!(local.exposed_count(), 0);

        // This process writes the peer's writable, and the peer dies.
        let mut victim = peer_on(&hosts.other(), lane.enable, lane.streams, &[], &[]).await;
        let (_a, m) = expose(&victim, Cmd::Writable, &[BIG], 0).await;
        let write = local.begin_write(zeroed(&[BIG]), &m).await.unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(write.transport(), Some(lane.expect));
        victim.kill().await.unwrap();
        let err = write
            .wait_for_completion_timeout(Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::ConnectionLost { .. }), "{err}");
        assert_eq!(write.status(), OperationStatus::Errored);
    }
}

/// `ferry bench --role target` on the other host (listening on all of its
/// addresses), the initiator here: one short round, every Ferry row carried
/// by TCP, striped rows included (both hosts share a kernel, so the library
/// keeps one stream by itself), and no cross-memory-attach row (the `ucx`
/// rows, where UCX runs, are carried by UCX).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_between_two_hosts() {
    let Some(hosts) = two_hosts() else { return };
    let control = format!("{}:0", hosts.there);
    let [program, rest @ ..] = hosts.wrapper();
    let mut target = tokio::process::Command::new(program)
        .args(rest)
        .arg(exe())
        .args(["bench", "--role", "target", "--control", &control])
        .args(["--listen", "0.0.0.0:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(target.stderr.take().unwrap()).lines();
    let wait = async {
        while let Some(l) = lines.next_line().await.unwrap() {
            eprintln!("target: {l}");
            if let Some(a) = l.strip_prefix("target: waiting for an initiator on ") {
                return a.to_string();
            }
        }
        panic!("the target exited before listening");
    };
    let control = tokio::time::timeout(Duration::from_secs(30), wait)
        .await
        .expect("the target listens within 30 s");
    let json = std::env::temp_dir().join(format!("ferry-two-hosts-{}.json", std::process::id()));
    let initiator = tokio::process::Command::new(exe())
        .args(["bench", "--quick", "--control", &control])
        .args(["--listen", &format!("{}:0", hosts.here)])
        .args(["--blocks", "4KiB,8MiB", "--batches", "1", "--json"])
        .arg(&json)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(180), initiator)
        .await
        .expect("the initiator ends within 180 s")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{stderr}", out.status);
    assert!(
        stderr.contains("cross-memory attach is not possible with this target"),
        "{stderr}"
    );
    // The target serves one initiator, and ends when it leaves.
    let status = tokio::time::timeout(Duration::from_secs(30), target.wait())
        .await
        .expect("the target ends within 30 s")
        .unwrap();
    assert!(status.success(), "target: {status}");

    let text = std::fs::read_to_string(&json).unwrap();
    let _ = std::fs::remove_file(&json);
    let rows: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let field = |r: &serde_json::Value, k: &str| r[k].as_str().unwrap_or_default().to_string();
    assert!(
        rows.iter().all(|r| field(r, "transport") != "cma"),
        "{text}"
    );
    // The `ucx` rows (when UCX runs on both hosts) are UCX's own.
    let is_ucx = |r: &serde_json::Value| field(r, "baseline").starts_with("ucx_get");
    assert!(
        rows.iter()
            .filter(|r| field(r, "kind") == "ferry" && is_ucx(r))
            .all(|r| field(r, "transport") == "ucx"),
        "{text}"
    );
    let ferry: Vec<_> = rows
        .iter()
        .filter(|r| field(r, "kind") == "ferry" && !is_ucx(r))
        .collect();
    for op in ["read", "write"] {
        for (block, streams) in [(4096, None), (8 << 20, None), (8 << 20, Some(4))] {
            let row = ferry.iter().find(|r| {
                field(r, "op") == op
                    && r["block_size"].as_u64() == Some(block)
                    && r["streams"].as_u64() == streams
            });
            let row = row.unwrap_or_else(|| panic!("no {op} row of {block} B {streams:?}: {text}"));
            assert_eq!(field(row, "transport"), "tcp", "{row}");
            assert!(row["iters"].as_u64().unwrap_or(0) >= 5, "{row}");
            assert!(row["gbps"].as_f64().unwrap_or(0.0) > 0.0, "{row}");
        }
    }
    assert!(
        ferry.iter().all(|r| field(r, "transport") == "tcp"),
        "{text}"
    );
}
