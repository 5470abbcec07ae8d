//! The secure channel of a connection between workers that share a secret.
//!
//! Right after the two plaintext `Hello`s, the active side sends the first
//! message of the Noise handshake [`PATTERN`] (the `snow` crate) in an
//! `Auth` frame, and the passive side answers with the second. The
//! pre-shared key is derived from the secret (`Secret::psk`); the prologue
//! is the active side's `Hello` (so that a relay cannot alter it without the
//! handshake failing), and the second message carries the passive side's
//! `Hello` as its encrypted payload (so that the active side knows it came
//! unaltered). A worker without the secret can produce neither message.
//!
//! Afterwards every byte of the connection, in both directions, travels in
//! Noise transport messages: a 2-byte big-endian length, then that many
//! bytes of ChaCha20-Poly1305 ciphertext and tag (at most 65,535). Each
//! direction numbers its messages from 0 (the AEAD nonce), so a message
//! that is altered, injected, dropped, replayed or reordered fails to
//! authenticate and closes the connection. The frames of `ferry_proto::wire`
//! are the plaintext stream they carry, cut at arbitrary points.
#![forbid(unsafe_code)]

use std::io;
use std::sync::Arc;

use ferry_proto::wire::MAX_HANDSHAKE;
use snow::{Builder, HandshakeState, StatelessTransportState};
use tokio::io::AsyncReadExt;
use tokio::net::tcp::OwnedReadHalf;

use super::error::ConnError;
use crate::auth::Secret;

/// The Noise protocol of the handshake and the channel.
pub(crate) const PATTERN: &str = "Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s";
/// Put in front of the active side's `Hello` in the prologue.
const PROLOGUE: &[u8] = b"ferry secure channel v1\0";
/// The authentication tag of each message.
const TAG: usize = 16;
/// The longest Noise message.
const MAX_MESSAGE: usize = 65535;
/// The most plaintext bytes of one transport message.
pub(crate) const MAX_PLAIN: usize = MAX_MESSAGE - TAG;
/// The length in front of each transport message.
const PREFIX: usize = 2;
/// The handshake failed: the peer does not have this secret (or the
/// handshake was altered on the way, which looks the same).
pub(crate) const MISMATCH: &str =
    "the proof does not match: the two workers have different secrets";

fn handshake(
    secret: &Secret,
    active_hello: &[u8],
    initiator: bool,
) -> Result<HandshakeState, String> {
    let params = PATTERN
        .parse()
        .map_err(|e| format!("noise parameters: {e}"))?;
    let psk = secret.psk(PATTERN);
    let prologue = [PROLOGUE, active_hello].concat();
    let b = Builder::new(params).psk(0, &psk).prologue(&prologue);
    let hs = if initiator {
        b.build_initiator()
    } else {
        b.build_responder()
    };
    hs.map_err(|e| format!("noise handshake: {e}"))
}

fn keys(hs: HandshakeState) -> Result<Keys, &'static str> {
    hs.into_stateless_transport_mode()
        .map(|k| Keys(Arc::new(k)))
        .map_err(|_| MISMATCH)
}

/// The active side's handshake, between its two messages.
pub(crate) struct Initiator(HandshakeState);

impl Initiator {
    /// Starts the handshake of a connection whose active side said
    /// `active_hello` (the whole frame); returns it and its first message.
    pub(crate) fn start(secret: &Secret, active_hello: &[u8]) -> Result<(Self, Vec<u8>), String> {
        let mut hs = handshake(secret, active_hello, true)?;
        let mut m = vec![0u8; MAX_HANDSHAKE];
        let n = hs
            .write_message(&[], &mut m)
            .map_err(|e| format!("noise handshake: {e}"))?;
        m.truncate(n);
        Ok((Initiator(hs), m))
    }

    /// Reads the passive side's answer, which must carry `passive_hello` (the
    /// frame this side received): the keys of the channel, or why not.
    pub(crate) fn finish(mut self, msg: &[u8], passive_hello: &[u8]) -> Result<Keys, &'static str> {
        let mut payload = vec![0u8; MAX_HANDSHAKE];
        let n = self
            .0
            .read_message(msg, &mut payload)
            .map_err(|_| MISMATCH)?;
        if payload[..n] != *passive_hello {
            return Err("the remote's hello was altered on the way");
        }
        keys(self.0)
    }
}

/// The passive side's handshake: checks the active side's first message
/// (for a connection whose active side said `active_hello`) and returns the
/// keys of the channel and the answer, which carries `passive_hello`.
pub(crate) fn respond(
    secret: &Secret,
    active_hello: &[u8],
    msg: &[u8],
    passive_hello: &[u8],
) -> Result<(Keys, Vec<u8>), &'static str> {
    let mut hs = handshake(secret, active_hello, false).map_err(|_| MISMATCH)?;
    let mut payload = vec![0u8; MAX_HANDSHAKE];
    hs.read_message(msg, &mut payload).map_err(|_| MISMATCH)?;
    let mut m = vec![0u8; MAX_HANDSHAKE];
    let n = hs
        .write_message(passive_hello, &mut m)
        .map_err(|_| MISMATCH)?;
    m.truncate(n);
    Ok((keys(hs)?, m))
}

/// The keys of an established channel, for both directions.
pub(crate) struct Keys(Arc<StatelessTransportState>);

impl Keys {
    /// The sending and the receiving half.
    pub(crate) fn split(self) -> (Sealer, Opener) {
        (
            Sealer {
                keys: self.0.clone(),
                nonce: 0,
            },
            Opener {
                keys: self.0,
                nonce: 0,
                raw: Vec::new(),
                start: 0,
                end: 0,
                plain: Vec::new(),
                pstart: 0,
                pend: 0,
            },
        )
    }
}

/// Encrypts the stream this side sends.
pub(crate) struct Sealer {
    keys: Arc<StatelessTransportState>,
    /// The number of the next message.
    nonce: u64,
}

impl Sealer {
    /// Appends `plain` as transport messages to `out[..*end]` (growing `out`
    /// if needed) and moves `end` past them.
    pub(crate) fn seal(
        &mut self,
        plain: &[u8],
        out: &mut Vec<u8>,
        end: &mut usize,
    ) -> io::Result<()> {
        for chunk in plain.chunks(MAX_PLAIN) {
            let at = *end + PREFIX;
            let stop = at + chunk.len() + TAG;
            if out.len() < stop {
                out.resize(stop, 0);
            }
            let n = self
                .keys
                .write_message(self.nonce, chunk, &mut out[at..stop])
                .map_err(|e| io::Error::other(format!("encryption failed: {e}")))?;
            out[*end..at].copy_from_slice(&(n as u16).to_be_bytes());
            self.nonce += 1;
            *end = at + n;
        }
        Ok(())
    }

    /// The number of the next message.
    pub(crate) fn nonce(&self) -> u64 {
        self.nonce
    }

    /// Forgets the messages sealed since [`nonce`](Self::nonce) returned
    /// `n`. Only for messages discarded before a byte of them left this
    /// process: no nonce is ever used for two ciphertexts that anyone else
    /// sees.
    pub(crate) fn forget_since(&mut self, n: u64) {
        self.nonce = n;
    }
}

/// The received ciphertext buffer grows, with bytes received, up to this:
/// two whole messages, so that one read may bring several.
const RAW_MAX: usize = 2 * (PREFIX + MAX_MESSAGE);
const RAW_INITIAL: usize = 4096;

/// Decrypts the stream this side receives.
pub(crate) struct Opener {
    keys: Arc<StatelessTransportState>,
    /// The number of the next message.
    nonce: u64,
    /// Ciphertext received and not yet opened: `raw[start..end]`.
    raw: Vec<u8>,
    start: usize,
    end: usize,
    /// Plaintext of the last message opened, not yet taken: `plain[pstart..pend]`.
    plain: Vec<u8>,
    pstart: usize,
    pend: usize,
}

impl Opener {
    /// Takes bytes that arrived after the handshake (read ahead with it) as
    /// the start of the ciphertext.
    pub(crate) fn received(&mut self, bytes: &[u8]) {
        if self.raw.len() - self.end < bytes.len() {
            self.raw.resize(self.end + bytes.len(), 0);
        }
        self.raw[self.end..self.end + bytes.len()].copy_from_slice(bytes);
        self.end += bytes.len();
    }

    /// The next plaintext bytes of the stream, at most `max` (at least 1),
    /// from a message that has been authenticated: the rest of the last one
    /// opened, else the next one (read from `rd` as needed).
    pub(crate) async fn next(
        &mut self,
        rd: &mut OwnedReadHalf,
        max: usize,
    ) -> Result<&[u8], ConnError> {
        while self.pstart == self.pend {
            self.open_one(rd).await?;
        }
        let n = max.min(self.pend - self.pstart);
        let s = &self.plain[self.pstart..self.pstart + n];
        self.pstart += n;
        Ok(s)
    }

    async fn open_one(&mut self, rd: &mut OwnedReadHalf) -> Result<(), ConnError> {
        self.fill(rd, PREFIX).await?;
        let len = usize::from(u16::from_be_bytes([
            self.raw[self.start],
            self.raw[self.start + 1],
        ]));
        if len < TAG {
            return Err(ConnError::Channel(
                "a message of the secure channel is shorter than its tag".into(),
            ));
        }
        self.fill(rd, PREFIX + len).await?;
        // All its bytes have arrived: the plaintext buffer grows with them.
        if self.plain.len() < len - TAG {
            self.plain.resize(len - TAG, 0);
        }
        let ct = &self.raw[self.start + PREFIX..self.start + PREFIX + len];
        let n = self
            .keys
            .read_message(self.nonce, ct, &mut self.plain)
            .map_err(|_| {
                ConnError::Channel(
                    "a message of the secure channel failed authentication \
                     (altered, injected, replayed or reordered on the way)"
                        .into(),
                )
            })?;
        self.nonce += 1;
        self.start += PREFIX + len;
        self.pstart = 0;
        self.pend = n;
        Ok(())
    }

    /// Reads until `need` bytes of ciphertext are buffered. The buffer grows
    /// only when it is full of bytes received.
    async fn fill(&mut self, rd: &mut OwnedReadHalf, need: usize) -> Result<(), ConnError> {
        while self.end - self.start < need {
            if self.raw.len() - self.start < need || self.end == self.raw.len() {
                self.raw.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            if self.end == self.raw.len() {
                let len = (self.raw.len() * 2).clamp(RAW_INITIAL, RAW_MAX);
                self.raw.resize(len, 0);
            }
            let n = rd.read(&mut self.raw[self.end..]).await?;
            if n == 0 {
                return Err(ConnError::Io(io::ErrorKind::UnexpectedEof.into()));
            }
            self.end += n;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &[u8] = b"hello of the active side";
    const P: &[u8] = b"hello of the passive side";

    fn pair(a: &Secret, p: &Secret) -> Result<(Keys, Keys), &'static str> {
        let (i, m1) = Initiator::start(a, A).unwrap();
        let (kp, m2) = respond(p, A, &m1, P)?;
        Ok((i.finish(&m2, P)?, kp))
    }

    #[test]
    fn the_handshake_needs_the_same_secret_and_unaltered_hellos() {
        let s = Secret::new(b"sixteen bytes at least");
        let t = Secret::new(b"sixteen bytes at least, other");
        assert!(pair(&s, &s).is_ok());
        assert_eq!(pair(&s, &t).err(), Some(MISMATCH));
        // The relay altered the active side's hello...
        let (i, m1) = Initiator::start(&s, A).unwrap();
        assert_eq!(respond(&s, b"altered", &m1, P).err(), Some(MISMATCH));
        // ...or the passive side's...
        let (_, m2) = respond(&s, A, &m1, P).unwrap();
        assert!(i.finish(&m2, b"altered").is_err());
        // ...or a byte of a handshake message.
        let (_, mut m1) = Initiator::start(&s, A).unwrap();
        m1[40] ^= 1;
        assert!(respond(&s, A, &m1, P).is_err());
        let (i, m1) = Initiator::start(&s, A).unwrap();
        let (_, mut m2) = respond(&s, A, &m1, P).unwrap();
        m2[0] ^= 1;
        assert!(i.finish(&m2, P).is_err());
    }

    #[test]
    fn messages_open_once_in_order_and_only_at_the_other_side() {
        let s = Secret::new(b"sixteen bytes at least");
        let (ka, kp) = pair(&s, &s).unwrap();
        let (mut tx, rx_self) = ka.split();
        let (_, rx) = kp.split();
        let (mut out, mut end) = (Vec::new(), 0);
        tx.seal(&vec![7u8; MAX_PLAIN + 10], &mut out, &mut end)
            .unwrap();
        assert_eq!(end, 2 * (PREFIX + TAG) + MAX_PLAIN + 10);
        let first = &out[PREFIX..PREFIX + MAX_MESSAGE];
        let second = &out[2 * PREFIX + MAX_MESSAGE..end];
        let mut plain = vec![0u8; MAX_PLAIN];
        // Out of order, or replayed, a message does not open.
        assert!(rx.keys.read_message(0, second, &mut plain).is_err());
        assert_eq!(
            rx.keys.read_message(0, first, &mut plain).unwrap(),
            MAX_PLAIN
        );
        assert!(rx.keys.read_message(1, first, &mut plain).is_err());
        assert_eq!(rx.keys.read_message(1, second, &mut plain).unwrap(), 10);
        // Nor is one reflected to its sender or taken to another connection.
        assert!(rx_self.keys.read_message(0, first, &mut plain).is_err());
        let (_, rx_other) = pair(&s, &s).unwrap().1.split();
        assert!(rx_other.keys.read_message(0, first, &mut plain).is_err());
    }
}
