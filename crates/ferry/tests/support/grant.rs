//! What the grant tests share (`grant.rs`, `grant_tcp.rs`, `grant_ucx.rs`):
//! block contents, the holder's cues and report lines. Each test crate
//! declares `mod spawned` (`support/spawned.rs`) beside this module.

use std::io::BufRead;
use std::io::Write as _;

use ferry::{Error, Grant, Pool};

use super::spawned::{self, Server};

/// The size of a test's blocks.
pub const BLOCK: usize = 4096;

/// The bytes of block `i` of a test: distinct per block and per seed.
pub fn block_bytes(seed: u8, i: u32) -> Vec<u8> {
    spawned::pattern(u64::from(seed), i as usize, BLOCK)
}

pub fn fill(pool: &Pool, id: u32, bytes: &[u8]) {
    pool.with_block_mut(id, |b| b.copy_from_slice(bytes))
        .unwrap();
}

pub fn holds(pool: &Pool, id: u32, bytes: &[u8]) -> bool {
    pool.with_block(id, |b| b == bytes).unwrap()
}

pub fn all_are(pool: &Pool, id: u32, byte: u8) -> bool {
    pool.with_block(id, |b| b.iter().all(|&x| x == byte))
        .unwrap()
}

/// `<role> <metadata json>`, as the holder gets it.
pub fn spec(role: &str, g: &Grant) -> String {
    format!("{role} {}", g.metadata().to_json().unwrap())
}

/// Waits for the parent's next cue (a line on stdin).
pub fn cue() -> String {
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    line.trim().to_string()
}

/// Sends the holder its next cue.
pub fn tell(server: &mut Server, line: &str) {
    let stdin = server.child.stdin.as_mut().unwrap();
    writeln!(stdin, "{line}").unwrap();
    stdin.flush().unwrap();
}

/// The name of a grant error, for the holder's report lines.
pub fn name<T>(r: &ferry::Result<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(Error::Grant(e)) => format!("{e:?}")
            .split([' ', '(', '{'])
            .next()
            .unwrap_or("?")
            .to_string(),
        Err(e) => format!("other:{e}"),
    }
}
