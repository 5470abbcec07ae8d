//! The staging pipelines, tested with `HostEngine` standing in for a GPU
//! (and, where there is one, with the driver).

use std::io;
use std::time::Duration;

use super::*;
use crate::cuda::engine::{Faults, HostEngine, HostMem};

const CHUNK: usize = 64;
const SENTINEL: u8 = 0xEE;

fn pattern(n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(7) as u8)
        .collect()
}

/// Outbound from one engine (the source's GPU) into Inbound on another
/// (the destination's), with offsets on both sides; checks every byte,
/// the chunk sizes, and that nothing outside the range was written.
fn round_trip(len: usize, depth: usize) {
    let (src_engine, dst_engine) = (
        HostEngine::new(Faults::default()),
        HostEngine::new(Faults::default()),
    );
    let data = pattern(len + 5);
    let src = HostMem::new(data.clone());
    let dst = HostMem::new(vec![SENTINEL; len + 7]);
    let mut out = Outbound::new(&src_engine, CHUNK, depth).unwrap();
    let mut inbound = Inbound::new(&dst_engine, &dst, 3, len, CHUNK, depth).unwrap();
    let mut sizes = Vec::new();
    out.send(&src, 5, len, |c| {
        sizes.push(c.len());
        inbound.push(c).map_err(io::Error::other)
    })
    .unwrap();
    inbound.finish().unwrap();
    assert_eq!(sizes.iter().sum::<usize>(), len, "len {len} depth {depth}");
    assert_eq!(sizes.len(), len.div_ceil(CHUNK));
    if let Some((last, full)) = sizes.split_last() {
        assert!(full.iter().all(|&s| s == CHUNK) && *last > 0 && *last <= CHUNK);
    }
    let got = dst.snapshot();
    assert!(got[..3].iter().all(|&b| b == SENTINEL));
    assert!(
        got[3..3 + len] == data[5..5 + len],
        "len {len} depth {depth}"
    );
    assert!(got[3 + len..].iter().all(|&b| b == SENTINEL));
    assert_eq!(src_engine.started(), src_engine.ended());
    assert_eq!(dst_engine.started(), dst_engine.ended());
}

#[test]
fn round_trips_every_byte() {
    for depth in [1, 2, 3] {
        for len in [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 7 * CHUNK + 13] {
            round_trip(len, depth);
        }
    }
}

#[test]
fn inbound_rechunks_pushes_of_any_size() {
    let engine = HostEngine::new(Faults::default());
    let len = 5 * CHUNK + 9;
    let data = pattern(len);
    let dst = HostMem::new(vec![0; len]);
    let mut inbound = Inbound::new(&engine, &dst, 0, len, CHUNK, 2).unwrap();
    for piece in data.chunks(7) {
        inbound.push(piece).unwrap();
    }
    inbound.push(&[]).unwrap();
    assert_eq!(inbound.accepted(), len);
    inbound.finish().unwrap();
    assert!(dst.snapshot() == data);
    // One copy per full staging buffer, plus the tail.
    assert_eq!(engine.started(), len.div_ceil(CHUNK));
}

#[test]
fn outbound_copies_ahead_while_a_chunk_is_handed_over() {
    for depth in [2, 3] {
        // Copy 1 is held on the worker until released: when chunk 0 reaches
        // the consumer, the copies of the next chunks have been started and
        // copy 1 has provably not ended.
        let engine = HostEngine::new(Faults {
            delay: Duration::from_millis(2),
            hold: Some(1),
            ..Faults::default()
        });
        let mem = HostMem::new(pattern(6 * CHUNK));
        let mut out = Outbound::new(&engine, CHUNK, depth).unwrap();
        let mut seen = Vec::new();
        out.send(&mem, 0, 6 * CHUNK, |c| {
            if seen.is_empty() {
                assert_eq!(engine.started(), depth, "chunks 1.. not started ahead");
                assert_eq!(engine.ended(), 1, "copy 1 should still be in flight");
                engine.release();
            }
            seen.extend_from_slice(c);
            Ok(())
        })
        .unwrap();
        assert!(seen == mem.snapshot());
    }
}

#[test]
fn depth_one_does_not_copy_ahead() {
    let engine = HostEngine::new(Faults::default());
    let mem = HostMem::new(pattern(3 * CHUNK));
    let mut out = Outbound::new(&engine, CHUNK, 1).unwrap();
    let mut k = 0;
    out.send(&mem, 0, 3 * CHUNK, |_| {
        k += 1;
        assert_eq!(engine.started(), k);
        Ok(())
    })
    .unwrap();
}

#[test]
fn outbound_stops_at_a_failed_copy() {
    let engine = HostEngine::new(Faults {
        fail_copy: Some(3),
        ..Faults::default()
    });
    let data = pattern(7 * CHUNK);
    let mem = HostMem::new(data.clone());
    let mut out = Outbound::new(&engine, CHUNK, 2).unwrap();
    let mut seen = Vec::new();
    let e = out
        .send(&mem, 0, data.len(), |c| {
            seen.extend_from_slice(c);
            Ok(())
        })
        .unwrap_err();
    assert!(
        matches!(&e, StagingError::Engine(CudaError::Copy(m)) if m.contains("copy 3")),
        "{e}"
    );
    // Chunks 0..3 and nothing past them; copy 4 was in flight (depth 2),
    // none started after the failure, and every started copy ended.
    assert!(seen == data[..3 * CHUNK]);
    assert_eq!(engine.started(), 5);
    assert_eq!(engine.ended(), engine.started());
    // The pipeline is reusable: its staging buffers came back.
    assert_eq!(out.free.len(), 2);
}

#[test]
fn outbound_stops_at_a_copy_that_cannot_start() {
    let engine = HostEngine::new(Faults {
        fail_start: Some(3),
        ..Faults::default()
    });
    let data = pattern(7 * CHUNK);
    let mem = HostMem::new(data.clone());
    let mut out = Outbound::new(&engine, CHUNK, 2).unwrap();
    let mut seen = Vec::new();
    let e = out
        .send(&mem, 0, data.len(), |c| {
            seen.extend_from_slice(c);
            Ok(())
        })
        .unwrap_err();
    assert!(matches!(e, StagingError::Engine(CudaError::Copy(_))), "{e}");
    // Copy 3 is started once chunk 1 is handed over: chunk 2 was in flight
    // and is not handed over after the failure.
    assert!(seen == data[..2 * CHUNK]);
    assert_eq!(engine.started(), 3);
    assert_eq!(engine.ended(), 3);
    assert_eq!(out.free.len(), 2);
}

#[test]
fn outbound_stops_at_a_consumer_error() {
    let engine = HostEngine::new(Faults {
        delay: Duration::from_millis(1),
        ..Faults::default()
    });
    let mem = HostMem::new(pattern(7 * CHUNK));
    let mut out = Outbound::new(&engine, CHUNK, 2).unwrap();
    let mut calls = 0;
    let mut started_at_error = 0;
    let e = out
        .send(&mem, 0, 7 * CHUNK, |_| {
            calls += 1;
            if calls == 3 {
                started_at_error = engine.started();
                return Err(io::Error::new(io::ErrorKind::BrokenPipe, "peer gone"));
            }
            Ok(())
        })
        .unwrap_err();
    assert!(
        matches!(&e, StagingError::Consumer(io) if io.kind() == io::ErrorKind::BrokenPipe),
        "{e}"
    );
    assert_eq!(calls, 3);
    assert_eq!(started_at_error, 4);
    assert_eq!(
        engine.started(),
        started_at_error,
        "a copy started after the error"
    );
    assert_eq!(engine.ended(), engine.started());
    // Reusable after the error.
    let mut n = 0;
    out.send(&mem, CHUNK, 2 * CHUNK, |c| {
        n += c.len();
        Ok(())
    })
    .unwrap();
    assert_eq!(n, 2 * CHUNK);
}

#[test]
fn inbound_stops_at_a_failed_copy_and_nothing_past_it_lands() {
    let engine = HostEngine::new(Faults {
        fail_copy: Some(2),
        ..Faults::default()
    });
    let data = pattern(7 * CHUNK);
    let dst = HostMem::new(vec![SENTINEL; data.len()]);
    let mut inbound = Inbound::new(&engine, &dst, 0, data.len(), CHUNK, 2).unwrap();
    let mut first_err = None;
    for c in data.chunks(CHUNK) {
        if let Err(e) = inbound.push(c) {
            first_err = Some(e);
            break;
        }
    }
    let e = match first_err {
        Some(e) => e,
        None => inbound.finish().unwrap_err(),
    };
    assert!(
        matches!(&e, StagingError::Engine(CudaError::Copy(m)) if m.contains("copy 2")),
        "{e}"
    );
    let started = engine.started();
    assert_eq!(
        engine.ended(),
        started,
        "a copy still in flight after the error"
    );
    assert!(matches!(
        inbound.push(&data[..1]),
        Err(StagingError::Closed)
    ));
    assert!(matches!(inbound.finish(), Err(StagingError::Closed)));
    assert_eq!(engine.started(), started);
    let got = dst.snapshot();
    assert!(got[..2 * CHUNK] == data[..2 * CHUNK]);
    assert!(got[2 * CHUNK..].iter().all(|&b| b == SENTINEL));
}

#[test]
fn abort_waits_for_copies_in_flight_and_stops_there() {
    let engine = HostEngine::new(Faults {
        delay: Duration::from_millis(5),
        ..Faults::default()
    });
    let data = pattern(7 * CHUNK);
    let dst = HostMem::new(vec![SENTINEL; data.len()]);
    let mut inbound = Inbound::new(&engine, &dst, 0, data.len(), CHUNK, 2).unwrap();
    // Three whole chunks (copies started) and half of the fourth (staged
    // only).
    inbound.push(&data[..3 * CHUNK + CHUNK / 2]).unwrap();
    assert_eq!(engine.started(), 3);
    inbound.abort();
    // Nothing in flight any more, and nothing more will land.
    assert_eq!(engine.ended(), 3);
    assert_eq!(engine.landed(), 3);
    let got = dst.snapshot();
    assert!(got[..3 * CHUNK] == data[..3 * CHUNK]);
    assert!(got[3 * CHUNK..].iter().all(|&b| b == SENTINEL));
    assert!(matches!(
        inbound.push(&data[..1]),
        Err(StagingError::Closed)
    ));
    assert!(matches!(inbound.finish(), Err(StagingError::Closed)));
    inbound.abort();
    drop(inbound);
    assert_eq!(engine.started(), 3);
    assert!(dst.snapshot() == got);
}

#[test]
fn dropping_an_inbound_waits_for_its_copies() {
    let engine = HostEngine::new(Faults {
        delay: Duration::from_millis(5),
        ..Faults::default()
    });
    let data = pattern(4 * CHUNK);
    let dst = HostMem::new(vec![0; data.len()]);
    let mut inbound = Inbound::new(&engine, &dst, 0, data.len(), CHUNK, 3).unwrap();
    inbound.push(&data[..3 * CHUNK]).unwrap();
    drop(inbound);
    assert_eq!(engine.ended(), engine.started());
    assert!(dst.snapshot()[..3 * CHUNK] == data[..3 * CHUNK]);
}

#[test]
fn inbound_refuses_too_many_or_too_few_bytes() {
    let engine = HostEngine::new(Faults::default());
    let dst = HostMem::new(vec![0; 100]);
    let mut inbound = Inbound::new(&engine, &dst, 10, 50, CHUNK, 2).unwrap();
    inbound.push(&[1; 40]).unwrap();
    let e = inbound.push(&[1; 11]).unwrap_err();
    assert!(
        matches!(e, StagingError::TooLong { got: 51, want: 50 }),
        "{e}"
    );
    assert!(matches!(inbound.push(&[1]), Err(StagingError::Closed)));

    let mut inbound = Inbound::new(&engine, &dst, 10, 50, CHUNK, 2).unwrap();
    inbound.push(&[1; 49]).unwrap();
    let e = inbound.finish().unwrap_err();
    assert!(
        matches!(e, StagingError::Incomplete { got: 49, want: 50 }),
        "{e}"
    );
    // Nothing was copied: the 49 bytes never filled a staging buffer.
    assert!(dst.snapshot().iter().all(|&b| b == 0));
}

#[test]
fn ranges_outside_the_memory_are_refused() {
    let engine = HostEngine::new(Faults::default());
    let mem = HostMem::new(vec![0; 100]);
    assert!(matches!(
        Inbound::new(&engine, &mem, 60, 41, CHUNK, 2),
        Err(CudaError::OutOfRange {
            offset: 60,
            len: 41,
            size: 100
        })
    ));
    assert!(Inbound::new(&engine, &mem, usize::MAX, 2, CHUNK, 2).is_err());
    let mut out = Outbound::new(&engine, CHUNK, 2).unwrap();
    let e = out.send(&mem, 99, 2, |_| Ok(())).unwrap_err();
    assert!(
        matches!(e, StagingError::Engine(CudaError::OutOfRange { .. })),
        "{e}"
    );
    assert_eq!(engine.started(), 0);
}

#[test]
fn defaults_are_two_buffers_of_two_mib() {
    let engine = HostEngine::new(Faults::default());
    let out = Outbound::with_defaults(&engine).unwrap();
    assert_eq!(out.chunk, 2 * 1024 * 1024);
    assert_eq!(out.free.len(), 2);
    assert!(out.free.iter().all(|b| b.len() == 2 * 1024 * 1024));
}

/// The same round trip through the driver, on a machine with a GPU:
/// device → pinned → "socket" → pinned → device. Passes at once without.
#[test]
fn cuda_round_trip_where_there_is_a_gpu() {
    use crate::cuda::engine::CudaEngine;
    use crate::cuda::DeviceBuffer;

    if !crate::cuda::available() {
        println!("skipped: needs a GPU: {:?}", crate::cuda::status());
        return;
    }
    let len = 7 * CHUNK * 1024 + 13;
    let data = pattern(len);
    let mut src = DeviceBuffer::new(0, len).unwrap();
    src.copy_from_host(&data).unwrap();
    let dst = DeviceBuffer::new(0, len).unwrap();
    let (a, b) = (CudaEngine::new(0).unwrap(), CudaEngine::new(0).unwrap());
    let mut out = Outbound::new(&a, CHUNK * 1024, 2).unwrap();
    let mut inbound = Inbound::new(&b, &dst, 0, len, CHUNK * 1024, 2).unwrap();
    out.send(&src, 0, len, |c| inbound.push(c).map_err(io::Error::other))
        .unwrap();
    inbound.finish().unwrap();
    drop(inbound);
    let mut back = vec![0u8; len];
    dst.copy_to_host(&mut back).unwrap();
    assert!(back == data);
}
