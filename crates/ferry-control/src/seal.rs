//! The control plane's cryptography, with a shared secret: a fetcher proves
//! it holds the secret in its request, and the publisher answers with the
//! metadata sealed for that one request. IO-free.
//!
//! The construction (nothing here is home-made; RustCrypto crates):
//!
//! - **Keys.** HKDF-SHA-256 of the secret, salt `ferry control plane v1`,
//!   gives two 32-byte keys: info `request proof` and info `answer seal`.
//!   They serve nothing else (the data connections' Noise key is HKDF of the
//!   same secret with another salt).
//! - **Request.** For each attempt the fetcher draws a 24-byte random
//!   challenge (the OS's secure source) and sends
//!   `FCQ1 ‖ challenge ‖ tag`, where `tag` is XChaCha20-Poly1305 under the
//!   request key, nonce = the challenge, of an empty message with the
//!   associated data `context(request, channel, name)`. The publisher answers
//!   only a request whose tag verifies.
//! - **Answer.** `FCS1 ‖ nonce ‖ XChaCha20-Poly1305(answer key, nonce,
//!   metadata JSON, associated data = context(answer, channel, name) ‖
//!   challenge)`, with a fresh 24-byte random nonce per answer (XChaCha's
//!   192-bit nonces are safe to draw at random).
//! - `context(direction, channel, name)` is the label `ferry control v1`,
//!   the direction (`q` or `a`), then the channel (`http` or `nats`) and the
//!   name (the key over HTTP, the whole subject over NATS), each preceded by
//!   its length in two bytes.
//!
//! - **Stored value** (etcd, where no request reaches the publisher):
//!   `FCE1 ‖ nonce ‖ XChaCha20-Poly1305(store key, nonce, metadata JSON,
//!   associated data = context(stored, etcd, the whole etcd key))`, under a
//!   third key (info `stored seal`), a fresh random nonce per publication.
//!   It opens only with the secret and only under the key it was stored
//!   at; there is no challenge, so freshness is the store's: whoever may
//!   write to the store can put back a value sealed earlier for the same
//!   key (keys name one request, so that is the same request's metadata).
//!
//! So an answer opens only with the secret, only for the channel, name and
//! challenge it was sealed for: another key's answer, an answer recorded
//! earlier (even for the same key: its challenge was another), or bytes of
//! anyone without the secret are refused. Freshness comes from the
//! fetcher's challenge, so no clock is shared and nothing is remembered.

use chacha20poly1305::aead::{Aead, Payload};
use chacha20poly1305::{KeyInit, XChaCha20Poly1305, XNonce};
use hkdf::Hkdf;
use sha2::Sha256;

/// The first bytes of a request proof.
pub(crate) const REQUEST_MAGIC: &[u8; 4] = b"FCQ1";
/// The first bytes of a sealed answer.
pub(crate) const ANSWER_MAGIC: &[u8; 4] = b"FCS1";
/// The first bytes of a value sealed for a store (etcd).
pub(crate) const STORED_MAGIC: &[u8; 4] = b"FCE1";
/// The challenge and nonce length (XChaCha20-Poly1305's nonce).
pub(crate) const NONCE: usize = 24;
const TAG: usize = 16;
/// A request proof's length.
pub(crate) const PROOF_LEN: usize = 4 + NONCE + TAG;
/// What sealing adds to the metadata JSON.
pub(crate) const SEAL_OVERHEAD: usize = 4 + NONCE + TAG;

/// Where a request or an answer travels: the channel and the name in it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scope<'a> {
    /// `http`, `nats` or `etcd`.
    pub channel: &'static str,
    /// The key (HTTP), the subject (NATS) or the whole key (etcd).
    pub name: &'a str,
}

/// A fetcher's challenge for one request.
pub(crate) type Challenge = [u8; NONCE];

/// Why a proof or an answer was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Not in the expected format (wrong magic, too short).
    Malformed,
    /// It does not authenticate: made without the secret, for another name
    /// or channel, for another request, or altered.
    Forged,
}

impl Refusal {
    pub(crate) fn describe(self, what: &str) -> String {
        match self {
            Refusal::Malformed => {
                format!("{what} is not sealed (a publisher without the secret, or not Ferry's)")
            }
            Refusal::Forged => format!(
                "{what} does not authenticate (made without the secret, for another key, \
                 replayed from another request, or altered)"
            ),
        }
    }
}

/// The two keys derived from a deployment's secret.
#[derive(Clone)]
pub(crate) struct Keys {
    request: XChaCha20Poly1305,
    answer: XChaCha20Poly1305,
    stored: XChaCha20Poly1305,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys(<redacted>)")
    }
}

fn context(direction: u8, scope: Scope<'_>, extra: &[u8]) -> Vec<u8> {
    let mut aad = Vec::with_capacity(24 + scope.channel.len() + scope.name.len() + extra.len());
    aad.extend_from_slice(b"ferry control v1");
    aad.push(direction);
    for field in [scope.channel.as_bytes(), scope.name.as_bytes()] {
        // Keys are at most 128 bytes and subjects short; a longer field
        // would only make the context ambiguous, never unsafe to encode.
        let len = u16::try_from(field.len()).unwrap_or(u16::MAX);
        aad.extend_from_slice(&len.to_be_bytes());
        aad.extend_from_slice(field);
    }
    aad.extend_from_slice(extra);
    aad
}

fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    // The OS's secure random source; failing it is not recoverable.
    getrandom::fill(&mut b).unwrap_or_else(|e| panic!("the OS random source failed: {e}"));
    b
}

impl Keys {
    /// Derives the control plane's keys from the deployment's secret.
    pub(crate) fn derive(secret: &[u8]) -> Keys {
        let hk = Hkdf::<Sha256>::new(Some(b"ferry control plane v1"), secret);
        let key = |info: &[u8]| {
            let mut k = [0u8; 32];
            hk.expand(info, &mut k)
                // 32 bytes is far below HKDF-SHA-256's limit of 255 * 32.
                .unwrap_or_else(|_| unreachable!("32 bytes of HKDF-SHA-256 output"));
            XChaCha20Poly1305::new(&k.into())
        };
        Keys {
            request: key(b"request proof"),
            answer: key(b"answer seal"),
            stored: key(b"stored seal"),
        }
    }

    /// A fresh challenge and the proof to send with the request.
    pub(crate) fn prove(&self, scope: Scope<'_>) -> (Challenge, [u8; PROOF_LEN]) {
        let challenge: Challenge = random();
        let aad = context(b'q', scope, &[]);
        let tag = self
            .request
            .encrypt(
                XNonce::from_slice(&challenge),
                Payload {
                    msg: &[],
                    aad: &aad,
                },
            )
            .unwrap_or_else(|_| unreachable!("sealing an empty message cannot fail"));
        let mut proof = [0u8; PROOF_LEN];
        proof[..4].copy_from_slice(REQUEST_MAGIC);
        proof[4..4 + NONCE].copy_from_slice(&challenge);
        proof[4 + NONCE..].copy_from_slice(&tag);
        (challenge, proof)
    }

    /// The challenge of a request whose proof verifies.
    pub(crate) fn check(&self, scope: Scope<'_>, proof: &[u8]) -> Result<Challenge, Refusal> {
        if proof.len() != PROOF_LEN || &proof[..4] != REQUEST_MAGIC {
            return Err(Refusal::Malformed);
        }
        let mut challenge: Challenge = [0; NONCE];
        challenge.copy_from_slice(&proof[4..4 + NONCE]);
        let aad = context(b'q', scope, &[]);
        self.request
            .decrypt(
                XNonce::from_slice(&challenge),
                Payload {
                    msg: &proof[4 + NONCE..],
                    aad: &aad,
                },
            )
            .map_err(|_| Refusal::Forged)?;
        Ok(challenge)
    }

    /// `json` sealed for the request that sent `challenge`.
    pub(crate) fn seal(&self, scope: Scope<'_>, challenge: &Challenge, json: &[u8]) -> Vec<u8> {
        let nonce: [u8; NONCE] = random();
        let aad = context(b'a', scope, challenge);
        let sealed = self
            .answer
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: json,
                    aad: &aad,
                },
            )
            .unwrap_or_else(|_| unreachable!("metadata is far below XChaCha20's limit"));
        let mut out = Vec::with_capacity(SEAL_OVERHEAD + json.len());
        out.extend_from_slice(ANSWER_MAGIC);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        out
    }

    /// The metadata JSON of an answer sealed for `challenge`.
    pub(crate) fn open(
        &self,
        scope: Scope<'_>,
        challenge: &Challenge,
        answer: &[u8],
    ) -> Result<Vec<u8>, Refusal> {
        if answer.len() < SEAL_OVERHEAD || &answer[..4] != ANSWER_MAGIC {
            return Err(Refusal::Malformed);
        }
        let aad = context(b'a', scope, challenge);
        self.answer
            .decrypt(
                XNonce::from_slice(&answer[4..4 + NONCE]),
                Payload {
                    msg: &answer[4 + NONCE..],
                    aad: &aad,
                },
            )
            .map_err(|_| Refusal::Forged)
    }

    /// `json` sealed to be stored under the name in `scope`, for any
    /// holder of the secret to open there.
    pub(crate) fn seal_stored(&self, scope: Scope<'_>, json: &[u8]) -> Vec<u8> {
        let nonce: [u8; NONCE] = random();
        let aad = context(b's', scope, &[]);
        let sealed = self
            .stored
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: json,
                    aad: &aad,
                },
            )
            .unwrap_or_else(|_| unreachable!("metadata is far below XChaCha20's limit"));
        let mut out = Vec::with_capacity(SEAL_OVERHEAD + json.len());
        out.extend_from_slice(STORED_MAGIC);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        out
    }

    /// The metadata JSON of a value sealed to be stored under `scope`.
    pub(crate) fn open_stored(&self, scope: Scope<'_>, value: &[u8]) -> Result<Vec<u8>, Refusal> {
        if value.len() < SEAL_OVERHEAD || &value[..4] != STORED_MAGIC {
            return Err(Refusal::Malformed);
        }
        let aad = context(b's', scope, &[]);
        self.stored
            .decrypt(
                XNonce::from_slice(&value[4..4 + NONCE]),
                Payload {
                    msg: &value[4 + NONCE..],
                    aad: &aad,
                },
            )
            .map_err(|_| Refusal::Forged)
    }
}

/// Whether a stored value looks sealed (to tell a fetcher without the
/// secret why it cannot read it).
pub(crate) fn looks_sealed_stored(value: &[u8]) -> bool {
    value.starts_with(STORED_MAGIC)
}

/// Whether `answer` looks sealed (to tell a fetcher without the secret why
/// it cannot read it).
pub(crate) fn looks_sealed(answer: &[u8]) -> bool {
    answer.starts_with(ANSWER_MAGIC)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HTTP_K: Scope<'static> = Scope {
        channel: "http",
        name: "k",
    };

    #[test]
    fn a_sealed_answer_opens_only_for_its_scope_challenge_and_secret() {
        let keys = Keys::derive(b"0123456789abcdef0123");
        let (challenge, proof) = keys.prove(HTTP_K);
        assert_eq!(keys.check(HTTP_K, &proof), Ok(challenge));
        let answer = keys.seal(HTTP_K, &challenge, b"{\"json\":1}");
        assert!(!answer.windows(6).any(|w| w == b"\"json\""), "in clear");
        assert_eq!(
            keys.open(HTTP_K, &challenge, &answer).unwrap(),
            b"{\"json\":1}"
        );

        // Another key, another channel, another request, another secret.
        let other_key = Scope {
            channel: "http",
            name: "k2",
        };
        let nats = Scope {
            channel: "nats",
            name: "k",
        };
        let (later, _) = keys.prove(HTTP_K);
        let other = Keys::derive(b"0123456789abcdef0124");
        for (scope, ch, k) in [
            (other_key, challenge, &keys),
            (nats, challenge, &keys),
            (HTTP_K, later, &keys),
            (HTTP_K, challenge, &other),
        ] {
            assert_eq!(k.open(scope, &ch, &answer), Err(Refusal::Forged));
        }
        // Altered in any byte.
        for i in 4..answer.len() {
            let mut bad = answer.clone();
            bad[i] ^= 1;
            assert_eq!(
                keys.open(HTTP_K, &challenge, &bad),
                Err(Refusal::Forged),
                "{i}"
            );
        }
        assert_eq!(
            keys.open(HTTP_K, &challenge, b"{\"v\":1}"),
            Err(Refusal::Malformed)
        );
        assert_eq!(
            keys.open(HTTP_K, &challenge, b"FCS1"),
            Err(Refusal::Malformed)
        );
    }

    #[test]
    fn a_stored_value_opens_only_under_its_key_and_secret() {
        let keys = Keys::derive(b"0123456789abcdef0123");
        let at = Scope {
            channel: "etcd",
            name: "/ferry/metadata/k",
        };
        let value = keys.seal_stored(at, b"{\"json\":1}");
        assert!(looks_sealed_stored(&value));
        assert!(!value.windows(6).any(|w| w == b"\"json\""), "in clear");
        assert_eq!(keys.open_stored(at, &value).unwrap(), b"{\"json\":1}");
        let elsewhere = Scope {
            channel: "etcd",
            name: "/ferry/metadata/k2",
        };
        let other = Keys::derive(b"0123456789abcdef0124");
        assert_eq!(keys.open_stored(elsewhere, &value), Err(Refusal::Forged));
        assert_eq!(other.open_stored(at, &value), Err(Refusal::Forged));
        for i in 4..value.len() {
            let mut bad = value.clone();
            bad[i] ^= 1;
            assert_eq!(keys.open_stored(at, &bad), Err(Refusal::Forged), "{i}");
        }
        // Neither an answer sealed for a request nor clear JSON opens here.
        let (challenge, _) = keys.prove(at);
        let answer = keys.seal(at, &challenge, b"{}");
        assert_eq!(keys.open_stored(at, &answer), Err(Refusal::Malformed));
        assert_eq!(keys.open_stored(at, b"{\"v\":1}"), Err(Refusal::Malformed));
    }

    #[test]
    fn proofs_verify_only_with_the_secret_and_for_their_scope() {
        let keys = Keys::derive(b"0123456789abcdef0123");
        let (_, proof) = keys.prove(HTTP_K);
        let other = Keys::derive(b"another secret, long enough");
        assert_eq!(other.check(HTTP_K, &proof), Err(Refusal::Forged));
        let k2 = Scope {
            channel: "http",
            name: "k2",
        };
        assert_eq!(keys.check(k2, &proof), Err(Refusal::Forged));
        assert_eq!(keys.check(HTTP_K, &proof[..10]), Err(Refusal::Malformed));
        assert_eq!(keys.check(HTTP_K, &[0; PROOF_LEN]), Err(Refusal::Malformed));
        let (c1, _) = keys.prove(HTTP_K);
        let (c2, _) = keys.prove(HTTP_K);
        assert_ne!(c1, c2, "challenges are drawn afresh");
        assert!(!format!("{keys:?}").contains('0'));
    }
}
