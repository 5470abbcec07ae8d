//! `ferry bench --quick` at its smallest size has `ucx` rows where UCX runs:
//! Ferry's READ and WRITE carried by UCX, each next to the raw UCX baseline
//! (`ucx_get`, with its registration time), and the lines saying what UCX
//! ran over and how long registration took.
//! Without UCX the test prints `skipped: <reason>` and passes, and the
//! bench says why it has no ucx rows.

use std::process::Command;

use serde_json::Value;

#[test]
fn bench_has_ucx_rows_next_to_the_raw_ucx_baseline() {
    let ucx = ferry::ucx::status();
    let json = std::env::temp_dir().join(format!("ferry-ucx-bench-{}.json", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["bench", "--quick", "--blocks", "4KiB", "--batches", "1"])
        .arg("--json")
        .arg(&json)
        .output()
        .expect("ferry runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let text = std::fs::read_to_string(&json).unwrap_or_default();
    let _ = std::fs::remove_file(&json);
    if let Err(why) = ucx {
        assert!(stderr.contains("ucx rows skipped"), "{stderr}");
        eprintln!("skipped: no UCX ({why})");
        return;
    }
    let rows: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let field = |r: &Value, k: &str| r[k].as_str().unwrap_or_default().to_string();
    for op in ["read", "write"] {
        let find = |kind: &str| {
            rows.iter()
                .find(|r| {
                    field(r, "kind") == kind
                        && field(r, "op") == op
                        && field(r, "transport") == "ucx"
                        && r["block_size"].as_u64() == Some(4096)
                })
                .unwrap_or_else(|| panic!("no {kind} {op} row over ucx: {text}\n{stderr}"))
        };
        let raw = find("ucx_get");
        assert!(raw["gbps"].as_f64().unwrap_or(0.0) > 0.0, "{raw}");
        assert!(raw["reg_us"].as_f64().is_some(), "{raw}");
        let ferry = find("ferry");
        assert_eq!(field(ferry, "baseline"), format!("ucx_get {op}"), "{ferry}");
        assert!(ferry["ratio"].as_f64().unwrap_or(0.0) > 0.0, "{ferry}");
        assert!(ferry["iters"].as_u64().unwrap_or(0) >= 5, "{ferry}");
    }
    assert!(stdout.contains("ucx registration"), "{stdout}");
    assert!(stdout.contains("ucx endpoint lanes: "), "{stdout}");
}
