//! The `session` fuzz target's checks (`support/session_fuzz.rs` and
//! `support/session_fuzz_checks.rs`), run on stable: on proptest's random
//! scripts, on long pseudo-random scripts, and on those scripts' totals, to
//! show that the scripts reach every kind of action and many kinds of
//! violation (a harness that never got past the `Open` would check
//! nothing).

#[path = "support/session_fuzz.rs"]
mod session_fuzz;

use proptest::prelude::*;
use session_fuzz::{run, Stats};

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn sessions_keep_their_rules_on_any_script(
        data in proptest::collection::vec(any::<u8>(), 0..2048)) {
        run(&data);
    }
}

/// xorshift64*: deterministic scripts, the same on every run.
fn script(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
        })
        .collect()
}

#[test]
fn long_scripts_reach_every_action() {
    let mut total = Stats::default();
    for seed in 0..300 {
        total.add(&run(&script(seed, 8192)));
    }
    println!("{total:#?}");
    for action in [
        "Send",
        "Stream",
        "Via",
        "Lend",
        "LendFellBack",
        "LendFailed",
        "SendLease",
        "GiveBack",
        "Pull",
        "PartDone",
        "Commit",
        "Complete",
        "RemoteAbort",
    ] {
        assert!(
            total.actions.get(action).copied().unwrap_or(0) > 0,
            "no {action}: {total:#?}"
        );
    }
    assert!(total.payloads > 1000, "{total:#?}");
    assert!(total.discards > 0, "{total:#?}");
    // Most rules are broken somewhere.
    assert!(total.violations.len() >= 12, "{:#?}", total.violations);
}
