//! `ferry kv-target`: the other process of `ferry bench --workload kv`,
//! which creates the passive side of each request (blocks of its pools, or
//! one plain buffer for the contiguous rows) and answers on stdout.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Context;
use ferry::{Connector, Pool};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, Mutex};

use super::{contiguous_buffer, fill_block, ids, verify, verify_contiguous, Answer, Req, LOCAL};

/// `ferry kv-target`: serves requests on stdin until it closes.
pub async fn target(connector: Connector) -> anyhow::Result<()> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Answer>();
    tokio::spawn(async move {
        let mut out = tokio::io::stdout();
        while let Some(a) = rx.recv().await {
            let mut line = serde_json::to_vec(&a).unwrap_or_default();
            line.push(b'\n');
            if out.write_all(&line).await.is_err() || out.flush().await.is_err() {
                break;
            }
        }
    });
    let connector = Arc::new(connector);
    let pools: Arc<Mutex<HashMap<(usize, u32), Pool>>> = Arc::default();
    // The contiguous buffers, by (block, blocks, write), while no
    // operation holds them.
    let contig: Contig = Arc::default();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        let r: Req = serde_json::from_str(&line).context("a kv request")?;
        if r.raw {
            raw_target(&contig, &tx, r).await?;
            continue;
        }
        if r.contiguous {
            contiguous_target(&connector, &contig, &tx, r).await?;
            continue;
        }
        let pool = {
            let mut p = pools.lock().await;
            if !p.contains_key(&(r.block, r.blocks)) {
                p.clear();
                let pool = Pool::allocate(r.block * r.blocks as usize, r.block)?;
                // Written once, so that its pages are real.
                for id in 0..r.blocks {
                    pool.with_block_mut(id, |b| fill_block(b, id))?;
                }
                p.insert((r.block, r.blocks), pool);
            }
            p[&(r.block, r.blocks)].clone()
        };
        let all = ids(r.blocks, r.run, r.seed);
        let mine = &all[r.from as usize..r.to as usize];
        let (tx, c) = (tx.clone(), connector.clone());
        let made = if r.write {
            match pool.blocks(mine) {
                Ok(d) => c.create_writable(vec![d]).await.map(|op| {
                    let m = op.metadata().to_json();
                    (m, Box::new(op) as Box<dyn ferry::Operation<'static>>)
                }),
                Err(e) => Err(ferry::Error::Config(e.to_string())),
            }
        } else {
            match pool.shared_blocks(mine) {
                Ok(d) => c.create_readable(vec![d]).await.map(|op| {
                    let m = op.metadata().to_json();
                    (m, Box::new(op) as Box<dyn ferry::Operation<'static>>)
                }),
                Err(e) => Err(ferry::Error::Config(e.to_string())),
            }
        };
        match made {
            Ok((m, op)) => {
                send_metadata(&tx, r.id, m);
                let check = r.verify.then(|| {
                    let theirs = ids(r.blocks, r.run, r.seed ^ LOCAL);
                    let mine = mine.to_vec();
                    (
                        pool.clone(),
                        mine,
                        theirs[r.from as usize..r.to as usize].to_vec(),
                    )
                });
                tokio::spawn(async move {
                    let mut error = op.wait_for_completion().await.err().map(|e| e.to_string());
                    drop(op);
                    if let (None, Some((pool, mine, theirs))) = (&error, check) {
                        error = verify(&pool, &mine, &theirs).err().map(|e| e.to_string());
                    }
                    send_done(&tx, r.id, error);
                });
            }
            Err(e) => {
                send_done(&tx, r.id, Some(e.to_string()));
            }
        }
    }
    Ok(())
}

type Contig = Arc<Mutex<HashMap<(usize, u32, bool), ferry::Descriptor<'static>>>>;

/// Serves one `contiguous` request: the one plain buffer of the shape
/// (made at the first request, then handed back by each operation),
/// readable (a READ) or writable (a WRITE, checked once written if asked).
async fn contiguous_target(
    c: &Arc<Connector>,
    contig: &Contig,
    tx: &mpsc::UnboundedSender<Answer>,
    r: Req,
) -> anyhow::Result<()> {
    let key = (r.block, r.blocks, r.write);
    let d = match contig.lock().await.remove(&key) {
        Some(d) => d,
        None => contiguous_buffer(r.block, r.blocks, !r.write)?,
    };
    let made = if r.write {
        c.create_writable(vec![d]).await.map(|op| {
            let m = op.metadata().to_json();
            (m, Box::new(op) as Box<dyn ferry::Operation<'static>>)
        })
    } else {
        c.create_readable(vec![d]).await.map(|op| {
            let m = op.metadata().to_json();
            (m, Box::new(op) as Box<dyn ferry::Operation<'static>>)
        })
    };
    let (m, op) = match made {
        Ok(x) => x,
        Err(e) => {
            send_done(tx, r.id, Some(e.to_string()));
            return Ok(());
        }
    };
    send_metadata(tx, r.id, m);
    let (tx, contig) = (tx.clone(), contig.clone());
    tokio::spawn(async move {
        let mut error = op.wait_for_completion().await.err().map(|e| e.to_string());
        let mut back = op.into_descriptors();
        if let (None, true, Some(d)) = (&error, r.verify, back.first()) {
            error = verify_contiguous(d, r.block).err().map(|e| e.to_string());
        }
        if let Some(d) = back.pop() {
            contig.lock().await.insert(key, d);
        }
        send_done(&tx, r.id, error);
    });
    Ok(())
}

/// Answers a `raw` request: the pid and address of the shape's contiguous
/// READ buffer (made if need be), which stays in place until a contiguous
/// READ of the shape takes it (the baseline runs before one does).
async fn raw_target(
    contig: &Contig,
    tx: &mpsc::UnboundedSender<Answer>,
    r: Req,
) -> anyhow::Result<()> {
    let key = (r.block, r.blocks, false);
    let mut c = contig.lock().await;
    let d = match c.entry(key) {
        std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
        std::collections::hash_map::Entry::Vacant(v) => {
            v.insert(contiguous_buffer(r.block, r.blocks, true)?)
        }
    };
    let at = d.as_slice().map_or(0, |b| b.as_ptr() as usize);
    for done in [false, true] {
        let _ = tx.send(Answer {
            id: r.id,
            metadata: (!done).then(|| format!("{} {at}", std::process::id())),
            error: None,
            done,
        });
    }
    Ok(())
}

/// Answers request `id` with the metadata of its operation.
fn send_metadata(tx: &mpsc::UnboundedSender<Answer>, id: u64, metadata: String) {
    let _ = tx.send(Answer {
        id,
        metadata: Some(metadata),
        error: None,
        done: false,
    });
}

/// Answers that request `id` has ended, with why it failed, if it did.
fn send_done(tx: &mpsc::UnboundedSender<Answer>, id: u64, error: Option<String>) {
    let _ = tx.send(Answer {
        id,
        metadata: None,
        error,
        done: true,
    });
}
