//! `ferry_proto::Cursor` against arbitrary sequences of chunks: it accepts
//! exactly the chunks that continue the transfer where it stands, and never a
//! byte outside the descriptor sizes, twice, or out of order; after any such
//! sequence, `next_chunk` finishes the transfer exactly.
#![no_main]

use ferry_proto::Cursor;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (Vec<u16>, Vec<(u8, u64, u32)>, u32)| {
    let (sizes, chunks, max) = input;
    if sizes.is_empty() || sizes.len() > 64 {
        return;
    }
    let sizes: Vec<u64> = sizes.into_iter().map(u64::from).collect();
    let total: u64 = sizes.iter().sum();
    let mut cursor = Cursor::new(sizes.clone());
    // How many bytes of each descriptor have been accepted, in order.
    let mut covered = vec![0u64; sizes.len()];
    // An independent model of where the transfer stands.
    let mut at = (0usize, 0u64);
    let skip = |at: &mut (usize, u64)| {
        while at.0 < sizes.len() && at.1 == sizes[at.0] {
            *at = (at.0 + 1, 0);
        }
    };
    skip(&mut at);

    for (d, o, len) in chunks {
        // With the high bit set, aim near the expected position so that
        // accepted chunks are common; otherwise take the fields as they are.
        let (desc, offset) = if d & 0x80 != 0 {
            (
                at.0 as u32 + u32::from(d & 1),
                at.1.wrapping_add(o % 4).wrapping_sub(1),
            )
        } else {
            (u32::from(d), o)
        };
        let expected = at.0 < sizes.len()
            && desc as usize == at.0
            && offset == at.1
            && len > 0
            && at.1 + u64::from(len) <= sizes[at.0];
        let accepted = cursor.accept(desc, offset, len).is_ok();
        assert_eq!(
            accepted, expected,
            "chunk ({desc}, {offset}, {len}) at {at:?}"
        );
        if accepted {
            let d = desc as usize;
            assert!(d < sizes.len());
            let end = offset.checked_add(u64::from(len)).expect("no overflow");
            assert!(end <= sizes[d], "beyond descriptor {d}");
            assert_eq!(offset, covered[d], "gap or overlap in descriptor {d}");
            assert!(covered[..d].iter().zip(&sizes).all(|(c, s)| c == s));
            covered[d] = end;
            at.1 = end;
            skip(&mut at);
        }
        assert_eq!(cursor.is_done(), at.0 >= sizes.len());
    }

    // The sender's side finishes what is left, exactly.
    // At least 1, and large enough that this loop stays short.
    let max = max.max(1).max((total / 1024) as u32 + 1);
    while let Some((d, o, l)) = cursor.next_chunk(max) {
        let d = d as usize;
        assert!(l > 0 && l <= max);
        assert_eq!(o, covered[d]);
        assert!(o + u64::from(l) <= sizes[d]);
        cursor
            .accept(d as u32, o, l)
            .expect("next_chunk's chunk is accepted");
        covered[d] += u64::from(l);
    }
    assert!(cursor.is_done());
    assert_eq!(covered, sizes);
    assert_eq!(covered.iter().sum::<u64>(), total);
});
