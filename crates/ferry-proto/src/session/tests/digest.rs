//! The integrity check (`session/digest.rs`): who compares, what a missing
//! or unexpected `Digest` is, and what a difference ends.

use super::*;
use crate::wire::Digest;

fn digest(req: u64, crc32: Option<u32>) -> Message {
    Message::Digest(Digest { req, crc32 })
}

/// A passive destination of a WRITE of 8 bytes in band, every byte landed.
fn landed(check: bool) -> (Session<F>, F) {
    let mut s = passive(NO_CAPS);
    s.set_digest(check);
    let o = open(1, OperationKind::Write, &[8]);
    let f = bind(&mut s, &o);
    take(&mut s);
    lands(&mut s, data(1, 0, 0, 8), &f);
    (s, f)
}

fn verify(step: Result<Step<F>, Violation>, f: &F) -> (u64, (u64, u64)) {
    match step {
        Ok(Step::Verify { req, target, range }) => {
            assert!(target.is(f));
            (req, range)
        }
        other => panic!("expected a verify, got {other:?}"),
    }
}

#[test]
fn an_equal_digest_commits_after_the_driver_digests_what_landed() {
    let (mut s, f) = landed(true);
    done(s.handle_frame(digest(1, Some(0xabcd))));
    let (req, range) = verify(s.handle_frame(finish(1)), &f);
    assert_eq!((req, range), (1, (0, u64::MAX)));
    // Nothing decided before the comparison.
    assert!(acts(&mut s).is_empty());
    done(s.verified(1, Some(0xabcd)));
    assert_eq!(acts(&mut s), ["Commit 1"]);
}

#[test]
fn a_different_digest_ends_the_request_on_both_sides_uncommitted() {
    let (mut s, f) = landed(true);
    done(s.handle_frame(digest(1, Some(1))));
    verify(s.handle_frame(finish(1)), &f);
    done(s.verified(1, Some(2)));
    let a = all_about(&mut s, &f);
    assert_eq!(a.len(), 2, "{a:?}");
    assert!(a[0].starts_with("Send Abort 1 DigestMismatch"), "{a:?}");
    assert!(a[1].starts_with("RemoteAbort DigestMismatch"), "{a:?}");
    assert!(!a.iter().any(|x| x.starts_with("Commit")));
    // The request is gone: a late `Finish` is ignored.
    done(s.handle_frame(finish(1)));
    assert_eq!(s.live(), 0);
}

#[test]
fn a_finish_without_a_digest_is_a_violation_where_the_check_is_on() {
    let (mut s, _) = landed(true);
    assert_eq!(
        s.handle_frame(finish(1)).unwrap_err(),
        Violation::MissingDigest { req: 1 }
    );
    // Off here: the same frames commit as they always did.
    let (mut s, _) = landed(false);
    done(s.handle_frame(finish(1)));
    assert_eq!(acts(&mut s), ["Commit 1"]);
}

#[test]
fn a_digest_from_the_peer_is_compared_even_where_the_check_is_off() {
    let (mut s, f) = landed(false);
    done(s.handle_frame(digest(1, Some(5))));
    verify(s.handle_frame(finish(1)), &f);
    done(s.verified(1, Some(6)));
    assert!(acts(&mut s)[0].starts_with("Send Abort 1 DigestMismatch"));
}

#[test]
fn an_unreadable_side_leaves_the_request_unchecked() {
    for (peer, local) in [(None, Some(1)), (Some(1), None)] {
        let (mut s, f) = landed(true);
        done(s.handle_frame(digest(1, peer)));
        verify(s.handle_frame(finish(1)), &f);
        done(s.verified(1, local));
        assert_eq!(acts(&mut s), ["Commit 1"]);
    }
}

#[test]
fn a_digest_is_unexpected_from_the_destination_or_twice() {
    // Twice.
    let (mut s, _) = landed(true);
    done(s.handle_frame(digest(1, Some(1))));
    assert_eq!(
        s.handle_frame(digest(1, Some(1))).unwrap_err(),
        Violation::UnexpectedDigest { req: 1 }
    );
    // To an in-band source (it sends the first `Finish`, never compares).
    let mut s = active(NO_CAPS);
    s.set_digest(true);
    let (req, _) = s.open(params(OperationKind::Write, &[8], false, (0, 1)), F::new());
    assert_eq!(
        s.handle_frame(digest(req, Some(1))).unwrap_err(),
        Violation::UnexpectedDigest { req }
    );
    // For a request that ended here: ignored, as its `Finish` is.
    let mut s = passive(NO_CAPS);
    done(s.handle_frame(digest(9, Some(1))));
}

#[test]
fn a_lending_source_compares_what_landed_at_the_copying_destination() {
    let mut s = passive(ATTACH);
    s.set_digest(true);
    let o = pulled(open(1, OperationKind::Read, &[8]));
    let f = bind(&mut s, &o);
    assert!(acts(&mut s).contains(&"SendLease 1".to_string()));
    // The destination copied, and says what landed.
    done(s.handle_frame(digest(1, Some(7))));
    verify(s.handle_frame(finish(1)), &f);
    done(s.verified(1, Some(7)));
    assert_eq!(acts(&mut s), ["GiveBack", "Commit 1 lent"]);
}

#[test]
fn a_copying_destination_sends_its_digest_before_its_finish() {
    let mut s: Session<F> = active(ATTACH);
    let on = |s: &mut Session<F>, req| s.pull_ended_digest(req, true, Some(3));
    assert_eq!(on(&mut s, 4), vec![finish(4)]);
    s.set_digest(true);
    assert_eq!(on(&mut s, 4), vec![digest(4, Some(3)), finish(4)]);
    // A copy that stopped sends no digest.
    assert!(s.pull_ended_digest(4, false, Some(3)).is_empty());
}

#[test]
fn each_part_of_a_striped_transfer_is_compared_over_its_own_range() {
    let mut s = passive(NO_CAPS);
    s.set_digest(true);
    let o = part(open(1, OperationKind::Write, &[10]), 1, 2);
    let f = bind(&mut s, &o);
    take(&mut s);
    lands(&mut s, data(1, 0, 5, 5), &f);
    done(s.handle_frame(digest(1, Some(1))));
    let (_, range) = verify(s.handle_frame(finish(1)), &f);
    assert_eq!(range, (5, 10));
    done(s.verified(1, Some(1)));
    assert_eq!(acts(&mut s), ["PartDone", "Send Finish 1 (reply)"]);
}
