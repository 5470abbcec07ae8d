//! A hand-driven connection to a connector, blocking (the roles that use it
//! run no runtime, so that they may fork), and the attach cookie such a
//! peer must present: for tests that play a same-host peer frame by frame.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use ferry_proto::wire::{self, Hello, Message, PROTOCOL_VERSION};

/// The cookie the passive side expects from the active side of the
/// connection `act` -> `pas` (see `cma::cookie`).
pub fn active_cookie(na: &[u8; 16], np: &[u8; 16], act: SocketAddr, pas: SocketAddr) -> [u8; 16] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"ferry-cma-cookie-v1\0");
    h.update([1u8]);
    h.update(na);
    h.update(np);
    h.update(act.to_string().as_bytes());
    h.update([0u8]);
    h.update(pas.to_string().as_bytes());
    let mut o = [0u8; 16];
    o.copy_from_slice(&h.finalize()[..16]);
    o
}

/// A connection driven frame by frame; each test binary adds the steps it
/// needs in an `impl Wire` of its own.
pub struct Wire {
    pub s: TcpStream,
    pub buf: Vec<u8>,
}

impl Wire {
    /// Connects to a connector and exchanges hellos.
    pub fn hello(addr: SocketAddr, name: &str) -> Wire {
        let s = TcpStream::connect(addr).unwrap();
        s.set_nodelay(true).unwrap();
        let mut w = Wire { s, buf: Vec::new() };
        w.send(&Message::Hello(Hello {
            version: PROTOCOL_VERSION,
            worker_id: name.into(),
        }));
        assert!(matches!(w.next(), Some(Message::Hello(_))));
        w
    }

    pub fn send(&mut self, m: &Message) {
        self.s.write_all(&m.to_vec()).unwrap();
    }

    /// The next frame (payloads skipped), or `None` once the connection is
    /// closed or quiet for the read timeout.
    pub fn next(&mut self) -> Option<Message> {
        loop {
            if let Ok(Some((msg, used))) = wire::decode_frame(&self.buf) {
                let payload = match &msg {
                    Message::Data(d) => d.len as usize,
                    _ => 0,
                };
                if self.buf.len() >= used + payload {
                    self.buf.drain(..used + payload);
                    return Some(msg);
                }
            }
            let mut tmp = [0u8; 4096];
            match self.s.read(&mut tmp) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&tmp[..n]),
            }
        }
    }
}
