//! Paged READ and WRITE between two processes: `ferry bench --workload kv
//! --quick` moves 16,384 random blocks of 4 KiB (READ) and 16,384 blocks of
//! 2 KiB in shuffled runs (WRITE), by cross-memory attach and over TCP,
//! with 1 and 8 requests in flight, and checks every byte of the first
//! round of each row (the reader checks its blocks; for a WRITE the target
//! does), failing on any block that does not hold the other side's; the
//! `contiguous` rows (one plain descriptor of the same bytes on each side)
//! are checked the same way.

use std::process::Command;

#[test]
fn paged_transfers_between_two_processes_are_byte_exact() {
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["bench", "--workload", "kv", "--quick", "--inflight", "1,8"])
        .output()
        .expect("ferry runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for (shape, via) in [
        ("kv-tp8 ", "cma"),
        ("kv-tp8 ", "tcp"),
        ("kv-sglang-page1-runs/16k ", "cma"),
        ("kv-sglang-page1-runs/16k ", "tcp"),
    ] {
        let rows = stdout
            .lines()
            .filter(|l| l.starts_with(shape) && l.split_whitespace().nth(1) == Some(via))
            .count();
        assert_eq!(
            rows, 2,
            "{shape}over {via}: one row per in-flight count\n{stdout}"
        );
        // And the baseline: the same bytes as one plain descriptor on each
        // side, checked byte for byte as well.
        let base = format!("{}/contiguous ", shape.trim_end());
        let rows = stdout
            .lines()
            .filter(|l| l.starts_with(&base) && l.split_whitespace().nth(1) == Some(via))
            .count();
        assert_eq!(rows, 1, "{base}over {via}\n{stdout}");
    }
}

#[test]
fn shapes_and_transports_can_be_picked() {
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args([
            "bench",
            "--workload",
            "kv",
            "--shapes",
            "kv-tp8",
            "--via",
            "cma",
        ])
        .args(["--inflight", "1", "--json", "-"])
        .output()
        .expect("ferry runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with('{')).collect();
    // Over cma only: the two raw baselines, the contiguous operation and
    // the shape itself.
    assert_eq!(rows.len(), 4, "{stdout}");
    assert!(
        rows.iter().all(|r| r.contains("\"transport\":\"cma\"")),
        "{stdout}"
    );
    for (row, shape) in rows.iter().zip([
        "kv-tp8/raw-contiguous",
        "kv-tp8/raw-blocks",
        "kv-tp8/contiguous",
        "kv-tp8",
    ]) {
        assert!(row.contains(&format!("\"shape\":\"{shape}\"")), "{stdout}");
    }

    let bad = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["bench", "--workload", "kv", "--shapes", "kv-nope"])
        .output()
        .expect("ferry runs");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown shape"));
}
