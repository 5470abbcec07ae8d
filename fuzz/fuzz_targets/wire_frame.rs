//! `ferry_proto::wire::decode_frame` over arbitrary bytes, frame after frame
//! (skipping `Data` payloads as a receiver does): never panics, never claims
//! more bytes than it was given, and every message it accepts re-encodes to
//! exactly the bytes it came from and decodes back to the same message.
#![no_main]

use ferry_proto::wire::{decode_frame, Message, HEADER_LEN, MAX_BODY, MAX_CHUNK};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    loop {
        let (msg, used) = match decode_frame(rest) {
            Ok(Some(x)) => x,
            Ok(None) | Err(_) => return,
        };
        assert!(used >= HEADER_LEN && used <= rest.len());
        assert!(used - HEADER_LEN <= MAX_BODY as usize);

        // Decoding is exact: the encoder produces the same bytes...
        let enc = msg.to_vec();
        assert_eq!(&enc[..], &rest[..used], "{msg:?}");
        // ...which decode to the same message, and no prefix of them decodes.
        assert_eq!(decode_frame(&enc), Ok(Some((msg.clone(), enc.len()))));
        for cut in [0, HEADER_LEN - 1, HEADER_LEN, enc.len() - 1] {
            if cut < enc.len() {
                assert_eq!(decode_frame(&enc[..cut]), Ok(None), "cut at {cut}");
            }
        }

        let payload = match &msg {
            Message::Data(d) => {
                assert!(d.len <= MAX_CHUNK);
                d.len as usize
            }
            _ => 0,
        };
        let Some(next) = rest.get(used + payload..) else {
            return;
        };
        rest = next;
    }
});
