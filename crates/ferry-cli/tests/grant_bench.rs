//! `ferry bench --workload grant --quick` between two processes: every
//! row well formed (its numbers positive, its ratios present), every size
//! and in-flight count present, READ and WRITE, with the grant's rows next
//! to the per-operation and raw rows, and the owner's idle CPU. Shape
//! only, never speed: the run is a CI smoke test on shared cores. The
//! grant's first slice of every row is checked byte for byte by the bench
//! itself (READ here, WRITE at the owner), which fails the run otherwise.

use std::process::Command;

use serde_json::Value;

#[test]
fn the_quick_grant_workload_prints_well_formed_rows() {
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["bench", "--workload", "grant", "--quick", "--json", "-"])
        .output()
        .expect("ferry runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let objects: Vec<Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("a JSON row"))
        .collect();
    let of = |kind: &str| -> Vec<&Value> { objects.iter().filter(|r| r["kind"] == kind).collect() };
    let positive = |r: &Value, k: &str| r[k].as_f64().is_some_and(|x| x > 0.0 && x.is_finite());
    let idle = of("owner-idle");
    assert_eq!(idle.len(), 1, "{stdout}");
    for k in ["cpu_us", "grant_threads_cpu_us", "cpu_us_without_grant"] {
        assert!(
            idle[0][k].as_f64().is_some_and(|x| x >= 0.0),
            "{k}: {stdout}"
        );
    }
    assert!(
        idle[0]["grants_open"].as_u64().is_some_and(|n| n >= 1),
        "{stdout}"
    );
    // 4 KiB WRITEs one at a time, event-driven and low-latency: the
    // notification's latency without a queue before it.
    let paced = of("notify-paced");
    assert_eq!(paced.len(), 2, "{stdout}");
    for p in &paced {
        for k in ["ops", "lat_us_p50", "notify_us_p50", "notify_us_p99"] {
            assert!(positive(p, k), "{k} of {p}");
        }
    }
    let rows: Vec<&Value> = objects
        .iter()
        .filter(|r| r.get("workload").is_some())
        .collect();
    assert_eq!(
        rows.len() + idle.len() + paced.len(),
        objects.len(),
        "{stdout}"
    );
    for r in &rows {
        for k in [
            "lat_us_p50",
            "lat_us_p99",
            "gbps",
            "ops_per_s",
            "ops",
            "bytes",
            "block",
        ] {
            assert!(positive(r, k), "{k} of {r}");
        }
        assert!(r["lat_us_p99"].as_f64() >= r["lat_us_p50"].as_f64(), "{r}");
        let kind = r["kind"].as_str().unwrap_or_default();
        let write = r["op"] == "write";
        // The owner learns of every WRITE: per-op at its completion, a
        // grant by a notification.
        if write && kind != "raw" {
            assert!(
                positive(r, "notify_us_p50") && positive(r, "notify_us_p99"),
                "{r}"
            );
        } else {
            assert!(r.get("notify_us_p50").is_none(), "{r}");
        }
        if kind.starts_with("grant") {
            for base in ["vs_per_op", "vs_raw"] {
                assert!(
                    positive(&r[base], "gbps") && positive(&r[base], "lat_p50"),
                    "{r}"
                );
            }
        }
    }
    let has = |w: &str, op: &str, k: u64, kind: &str| {
        rows.iter()
            .any(|r| r["workload"] == w && r["op"] == op && r["inflight"] == k && r["kind"] == kind)
    };
    for w in ["4 KiB", "64 KiB", "1 MiB", "64 MiB"] {
        for op in ["read", "write"] {
            for kind in ["raw", "per-op", "grant"] {
                assert!(has(w, op, 1, kind), "{w} {op} {kind}\n{stdout}");
            }
        }
    }
    for k in [1, 8, 32] {
        for op in ["read", "write"] {
            for kind in ["raw", "per-op", "grant", "grant-spin"] {
                assert!(
                    has("4 KiB", op, k, kind),
                    "4 KiB {op} x{k} {kind}\n{stdout}"
                );
            }
        }
    }
    // The KV shapes on a grant, READ and WRITE.
    for (w, op) in [("kv-tp8/2k", "read"), ("kv-vllm-write/256", "write")] {
        for k in [1, 8, 32] {
            assert!(has(w, op, k, "grant"), "{w} x{k}\n{stdout}");
        }
    }
    // The table and the summary lines.
    assert!(
        stdout.contains("vs per-op") && stdout.contains("owner idle over"),
        "{stdout}"
    );
    assert!(stdout.contains("4 KiB read p50, 1 in flight:"), "{stdout}");
}
