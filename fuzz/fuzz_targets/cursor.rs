//! `ferry_proto::Cursor` against arbitrary sequences of chunks: it accepts
//! exactly the chunks that continue the transfer where it stands (running on
//! into the descriptors that follow, protocol 7), and never a byte outside
//! the descriptor sizes, twice, or out of order; after any such sequence,
//! `next_chunk` or `next_span` finishes the transfer exactly.
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
    // An independent model of where the transfer stands: bytes accepted
    // (flat), and the descriptor and offset of the next one.
    let mut flat = 0u64;
    let at_of = |flat: u64| -> (usize, u64) {
        let (mut d, mut rest) = (0usize, flat);
        while d < sizes.len() && rest >= sizes[d] {
            rest -= sizes[d];
            d += 1;
        }
        (d, rest)
    };

    for (d, o, len) in chunks {
        let at = at_of(flat);
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
            && flat + u64::from(len) <= total;
        let accepted = cursor.accept(desc, offset, len).is_ok();
        assert_eq!(
            accepted, expected,
            "chunk ({desc}, {offset}, {len}) at {at:?}"
        );
        if accepted {
            flat += u64::from(len);
        }
        assert!(flat <= total);
        assert_eq!(cursor.is_done(), flat == total);
    }

    // The sender's side finishes what is left, exactly: per descriptor or
    // in spans, as the input's last bit says.
    // At least 1, and large enough that this loop stays short.
    let spans = max & 1 == 1;
    let max = max.max(1).max((total / 1024) as u32 + 1);
    loop {
        let next = if spans {
            cursor.next_span(max)
        } else {
            cursor.next_chunk(max)
        };
        let Some((d, o, l)) = next else { break };
        assert!(l > 0 && l <= max);
        assert_eq!((d as usize, o), at_of(flat), "starts where the transfer stands");
        if !spans {
            assert!(o + u64::from(l) <= sizes[d as usize]);
        }
        cursor.accept(d, o, l).expect("the sender's chunk is accepted");
        flat += u64::from(l);
    }
    assert!(cursor.is_done());
    assert_eq!(flat, total);
});
