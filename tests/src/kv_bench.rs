//! `cargo xtask bench kv`: the key-value store (`leasebox_client::Store`, docs/kv.md) against the hosted
//! appliance with the device model, and the same workload through the raw lease API (`Client::submit` of
//! zero-copy `Op`s to fixed offsets, waited per ticket) to show the store's own cost. Values of 4 KiB, 64 KiB
//! and 1 MiB; 1 and 8 threads; batches of 1 and 64; put then get. Prints; asserts nothing.
//!
//! Each thread has its own keys (as many as its batch) and its own registered buffer; a put cell writes them
//! again and again, a get cell reads them back. Cells whose working set (threads × batch × value) would not fit
//! the store's leases without eviction are skipped and say so.

use std::sync::Arc;
use std::time::{Duration, Instant};

use leasebox_client::rdma::SoftConfig;
use leasebox_client::store::{GetItem, PutItem};
use leasebox_client::{
    AllocOptions, Appliance, Client, ClientConfig, Credentials, Op, RequesterConfig, Store, StoreConfig, Timeouts, Wait,
};

use crate::control::start_hosted;

const SIZES: [usize; 3] = [4 << 10, 64 << 10, 1 << 20];
const THREADS: [usize; 2] = [1, 8];
const BATCHES: [usize; 2] = [1, 64];
const LEASE: u64 = 128 << 20;
/// The working set a cell may have (two leases of [`LEASE`], with room to spare for the slab's classes).
const BUDGET: usize = 192 << 20;

/// One cell's figures: operations per second and per-call latency percentiles (µs).
#[derive(Default)]
struct Cell {
    ops_per_s: f64,
    p50: u64,
    p99: u64,
    errors: u64,
}

fn pct(v: &mut [u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1]
}

fn appliance(addr: &str, key: &[u8], udp: std::net::SocketAddr) -> Appliance {
    Appliance {
        addr: addr.to_string(),
        credentials: Credentials { name: "demo".into(), key: key.to_vec() },
        requester: RequesterConfig::Soft(SoftConfig { peer: udp, ..SoftConfig::default() }),
    }
}

/// Runs `threads` threads of `f(thread)` for `per`, each call returning the items it did and its errors.
fn drive(threads: usize, per: Duration, f: impl Fn(usize) -> (usize, usize) + Sync) -> Cell {
    let end = Instant::now() + per;
    let started = Instant::now();
    let results: Vec<(usize, u64, Vec<u64>)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let f = &f;
                s.spawn(move || {
                    let (mut ops, mut errors, mut lat) = (0usize, 0u64, Vec::new());
                    while Instant::now() < end {
                        let t0 = Instant::now();
                        let (n, e) = f(t);
                        lat.push(t0.elapsed().as_micros() as u64);
                        ops += n;
                        errors += e as u64;
                    }
                    (ops, errors, lat)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or_default()).collect()
    });
    let secs = started.elapsed().as_secs_f64();
    let ops: usize = results.iter().map(|r| r.0).sum();
    let errors = results.iter().map(|r| r.1).sum();
    let mut lat: Vec<u64> = results.into_iter().flat_map(|r| r.2).collect();
    Cell { ops_per_s: ops as f64 / secs, p50: pct(&mut lat, 0.5), p99: pct(&mut lat, 0.99), errors }
}

/// The store's cells for one (size, threads, batch): put, then get.
fn store_cells(s: &Store, size: usize, threads: usize, batch: usize, per: Duration) -> Result<[Cell; 2], String> {
    let regions: Vec<_> = (0..threads)
        .map(|_| s.register_buffer(vec![7u8; 2 * batch * size]).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let keys: Vec<Vec<Vec<u8>>> =
        (0..threads).map(|t| (0..batch).map(|i| format!("b{size}-{t}-{i}").into_bytes()).collect()).collect();
    let put = drive(threads, per, |t| {
        let items: Vec<PutItem<'_>> = keys[t]
            .iter()
            .enumerate()
            .map(|(i, k)| PutItem { key: k, region: &regions[t], offset: i * size, len: size })
            .collect();
        let r = s.batch_put_from(&items);
        (batch, r.iter().filter(|c| **c < 0).count())
    });
    let get = drive(threads, per, |t| {
        let items: Vec<GetItem<'_>> = keys[t]
            .iter()
            .enumerate()
            .map(|(i, k)| GetItem { key: k, region: &regions[t], offset: (batch + i) * size, capacity: size })
            .collect();
        let r = s.batch_get_into(&items);
        (batch, r.iter().filter(|c| **c < 0).count())
    });
    for k in keys.iter().flatten() {
        s.remove(k);
    }
    Ok([put, get])
}

/// The raw lease API's cells for the same workload: each thread's values at fixed offsets of the leases.
fn raw_cells(
    c: &Client,
    leases: &[leasebox_client::Lease],
    size: usize,
    threads: usize,
    batch: usize,
    per: Duration,
) -> Result<[Cell; 2], String> {
    let regions: Vec<_> = (0..threads)
        .map(|_| c.register_owned(vec![7u8; 2 * batch * size]).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    // Value (t, i) on lease (t * batch + i) % 2, at its own offset there.
    let place = |t: usize, i: usize| {
        let n = t * batch + i;
        (&leases[n % leases.len()], (n / leases.len() * size) as u64)
    };
    let run = |read: bool| {
        drive(threads, per, |t| {
            let ops: Vec<Op<'_>> = (0..batch)
                .map(|i| {
                    let (l, at) = place(t, i);
                    if read {
                        Op::read_into(l, &regions[t], (batch + i) * size, at, size)
                    } else {
                        Op::write_from(l, &regions[t], i * size, at, size)
                    }
                })
                .collect();
            let tickets = c.submit(ops);
            let mut errors = 0;
            for tk in tickets {
                match c.wait(Wait::Ticket(tk), Duration::from_secs(10)) {
                    Ok(r) if r.iter().all(|(_, x)| x.is_ok()) => {}
                    _ => errors += 1,
                }
            }
            (batch, errors)
        })
    };
    Ok([run(false), run(true)])
}

fn fmt_cell(c: &Cell) -> String {
    let err = if c.errors > 0 { format!(" ({} failed)", c.errors) } else { String::new() };
    format!("{:.0}/s p50 {} µs p99 {} µs{err}", c.ops_per_s, c.p50, c.p99)
}

/// The table, `per` per cell.
pub fn table(per: Duration) -> Result<String, String> {
    let hosted = start_hosted(&["--hca", "--udp", "127.0.0.1:0", "lease_grace_ms=100", "lease_pool_mib=640"])?;
    let udp = hosted.udp.ok_or("the hosted appliance has no RDMA address")?;
    let key = leasebox_client::hex::decode(&hosted.tenant_hex)?;
    let a = appliance(&hosted.addr, &key, udp);
    let store = Arc::new(
        Store::connect(vec![a.clone()], StoreConfig::sized(1 << 20, LEASE, 2)).map_err(|e| format!("store: {e}"))?,
    );
    let client =
        Client::connect(ClientConfig { timeouts: Timeouts::all(Duration::from_secs(5)), ..ClientConfig::new(vec![a]) })
            .map_err(|e| format!("client: {e}"))?;
    let leases: Vec<_> = (0..2)
        .map(|_| client.alloc(LEASE, AllocOptions::default()).map_err(|e| format!("raw lease: {e}")))
        .collect::<Result<_, _>>()?;
    let mut rows = Vec::new();
    for &size in &SIZES {
        for &threads in &THREADS {
            for &batch in &BATCHES {
                let label = |op: &str| {
                    let v = if size >= 1 << 20 { format!("{} MiB", size >> 20) } else { format!("{} KiB", size >> 10) };
                    format!("{v} {op}, {threads} thread{}, batch {batch}", if threads > 1 { "s" } else { "" })
                };
                if threads * batch * size > BUDGET {
                    for op in ["put", "get"] {
                        rows.push(vec![
                            label(op),
                            "skipped: working set over the leases".into(),
                            "—".into(),
                            "—".into(),
                        ]);
                    }
                    continue;
                }
                let s = store_cells(&store, size, threads, batch, per)?;
                let r = raw_cells(&client, &leases, size, threads, batch, per)?;
                for (k, op) in ["put", "get"].iter().enumerate() {
                    let ratio = if s[k].ops_per_s > 0.0 {
                        format!("{:.2}×", r[k].ops_per_s / s[k].ops_per_s)
                    } else {
                        "—".into()
                    };
                    rows.push(vec![label(op), fmt_cell(&s[k]), fmt_cell(&r[k]), ratio]);
                }
            }
        }
    }
    drop(leases);
    drop(client);
    drop(store);
    drop(hosted);
    let headers = ["workload (hosted --hca, software requester)", "store", "raw lease API", "raw ÷ store"];
    Ok(mlx5_hosted::table::render(&headers, &rows, 1))
}
