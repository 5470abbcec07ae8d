//! `ferry bench --faults --quick --json -`: a 4 KiB READ from a peer
//! process, over TCP and by cross-memory attach, the peer killed or stopped
//! mid-transfer. Checks the rows' structure, that a killed peer is seen by
//! the survivor (a final state other than COMPLETE, with its cause, within
//! the fault's timeout), that nothing lands in its memory after its
//! operation ended, and that every fault is bounded (a stopped peer not
//! detected is reported so, never waited on for ever). No speed is asserted.

use std::process::Command;

use serde_json::Value;

#[test]
fn quick_faults_rows_are_well_formed_and_a_kill_is_seen() {
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["bench", "--faults", "--quick", "--json", "-"])
        .output()
        .expect("ferry runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let rows: Vec<Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("a JSON row"))
        .collect();
    let ctx = format!("{stdout}\n{stderr}");
    // kill and stop, over tcp and cma, at 4 KiB.
    assert_eq!(rows.len(), 4, "{ctx}");
    for r in &rows {
        for key in [
            "fault",
            "hosts",
            "transport",
            "shape",
            "bytes",
            "applicable",
            "mid_transfer",
            "bound_ms",
            "timeout_ms",
            "detected",
            "survivor_state",
            "landed_after_end",
        ] {
            assert!(r.get(key).is_some(), "no {key} in {r}\n{ctx}");
        }
        assert_eq!(r["hosts"], "processes", "{r}");
        assert_eq!(r["bytes"], 4096, "{r}");
        assert_eq!(r["applicable"], true, "{r}");
        assert!(r["note"].is_null(), "not measured: {r}\n{ctx}");
        assert_eq!(r["landed_after_end"], 0, "bytes landed after the end: {r}");
        // Every fault ends: detected, or cancelled by the bench at its timeout.
        let state = r["survivor_state"].as_str().expect("a state");
        assert_ne!(state, "IN_PROGRESS", "{r}");
        if r["detected"] == true {
            let ms = r["survivor_ms"].as_f64().expect("a time");
            assert!(ms <= r["timeout_ms"].as_f64().unwrap() + 1000.0, "{r}");
        }
    }
    for via in ["tcp", "cma"] {
        let kill = rows
            .iter()
            .find(|r| r["fault"] == "kill" && r["transport"] == via)
            .unwrap_or_else(|| panic!("no kill row over {via}\n{ctx}"));
        assert_eq!(kill["detected"], true, "{kill}");
        let state = kill["survivor_state"].as_str().unwrap();
        assert!(
            state == "ERRORED" || state == "CANCELLED",
            "a killed peer's READ ends not complete: {kill}"
        );
        assert!(kill["survivor_cause"].is_string(), "{kill}");
        // A killed process reports nothing.
        assert!(kill["faulted_state"].is_null(), "{kill}");
    }
    assert!(stdout.contains("liveness bound 500 ms"), "{stdout}");
}
