//! `ferry bench --device sim --quick` at its smallest size: GPU memory
//! (host memory standing in, both processes simulating a GPU) moved over
//! TCP, staged through host memory, each row next to Ferry's host-memory
//! TCP row of the same run, and the device's copies (`memcpy` here). A
//! real device (`--device cuda:0`) is refused clearly without a GPU.

use std::process::Command;

use serde_json::Value;

#[test]
fn the_device_sweep_has_staged_rows_next_to_host_memory_rows() {
    let json = std::env::temp_dir().join(format!("ferry-dev-bench-{}.json", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["bench", "--quick", "--device", "sim"])
        .args(["--blocks", "4KiB,1MiB", "--batches", "1"])
        .arg("--json")
        .arg(&json)
        .output()
        .expect("ferry runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let text = std::fs::read_to_string(&json).unwrap_or_default();
    let _ = std::fs::remove_file(&json);
    let rows: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let field = |r: &Value, k: &str| r[k].as_str().unwrap_or_default().to_string();
    for block in [4096u64, 1 << 20] {
        let find = |kind: &str, op: &str| {
            rows.iter()
                .find(|r| {
                    field(r, "kind") == kind
                        && field(r, "op") == op
                        && r["block_size"].as_u64() == Some(block)
                })
                .unwrap_or_else(|| panic!("no {kind} {op} row of {block}: {text}\n{stderr}"))
        };
        assert!(find("memcpy (sim)", "copy")["gbps"].as_f64().unwrap_or(0.0) > 0.0);
        for op in ["read", "write"] {
            let host = find("ferry", op);
            assert_eq!(field(host, "transport"), "tcp", "{host}");
            let staged = find("ferry sim", op);
            assert_eq!(field(staged, "transport"), "tcp", "{staged}");
            assert_eq!(
                field(staged, "baseline"),
                format!("ferry tcp {op} (host memory)"),
                "{staged}"
            );
            assert!(staged["ratio"].as_f64().unwrap_or(0.0) > 0.0, "{staged}");
            assert!(staged["iters"].as_u64().unwrap_or(0) >= 8, "{staged}");
        }
    }
    assert!(
        stdout.contains("host memory stood in for the GPU"),
        "{stdout}"
    );
}

#[test]
fn a_real_device_without_a_gpu_is_refused_with_the_reason() {
    if ferry::cuda::available() {
        return println!("skipped: CUDA is here");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["bench", "--quick", "--device", "cuda:0", "--blocks", "4KiB"])
        .args(["--batches", "1"])
        .output()
        .expect("ferry runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("CUDA unavailable"), "{stderr}");
}
