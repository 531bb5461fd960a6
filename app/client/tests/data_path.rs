//! The data path a program runs, against hosted appliances with the device model: registered memory and zero
//! copy (`write_from`/`read_into`, scatter/gather, no byte through a bounce buffer), asynchronous batches with
//! per-item results across leases and appliances (a lease revoked mid-batch fails only its own operations),
//! the completion fd, a region dropped while a transfer uses it, and a stuck lease that lets go of the memory.

use std::os::unix::io::RawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod support;
use support::appliance::{MIB, config, pattern, serial, start_hosted};

use leasebox_client::rdma::{RcConfig, SoftConfig, WcStatus};
use leasebox_client::{AllocOptions, Client, ClientConfig, Error, Event, Op, Outcome, RequesterConfig, Ticket, Wait};
use leasebox_proto::{Request, Response};

/// Whether `fd` polls readable within `ms` milliseconds (poll(2)).
fn readable(fd: RawFd, ms: i32) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd, for the duration of the call.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    n == 1 && p.revents & libc::POLLIN != 0
}

#[test]
fn registered_memory_goes_both_ways_without_a_copy() {
    let _one = serial();
    let a = start_hosted(&[]);
    let client = Client::connect(config(vec![a.appliance()])).unwrap();
    let mut lease = client.alloc(4 * MIB, AllocOptions::default()).unwrap();

    // 1 MiB + 100 bytes from the middle of one buffer, back into another at another offset: many packets one
    // way, many 64 KiB READs the other.
    let len = MIB as usize + 100;
    let mut src = pattern(21, len + 300);
    let mut dst = vec![0u8; len + 50];
    {
        let from = client.register(&mut src).unwrap();
        let into = client.register(&mut dst).unwrap();
        assert_eq!((from.len(), into.len()), (len + 300, len + 50));
        lease.write_from(&from, 300, 4096, len).unwrap();
        lease.read_into(&into, 50, 4096, len).unwrap();
        assert!(!from.in_use() && !into.in_use());
        // A range outside the region is refused, nothing sent.
        let e = lease.write_from(&from, len, 0, 301).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e}");
        let e = lease.read_into(&into, 0, lease.size() - 10, 20).unwrap_err();
        assert!(matches!(e, Error::OutOfRange { .. }), "{e}");
    }
    assert!(dst[50..] == src[300..], "the zero-copy round trip changed the bytes");
    assert_eq!(&dst[..50], &[0; 50], "bytes before the offset untouched");
    assert_eq!(client.bytes_copied(), 0, "zero copy went through a bounce buffer");

    // The copying calls stay, and are counted: 64 bytes in, 64 bytes out.
    lease.write(0, &[5; 64]).unwrap();
    let mut back = [0u8; 64];
    lease.read(0, &mut back).unwrap();
    assert_eq!(back, [5; 64]);
    assert_eq!(client.bytes_copied(), 128);

    // An owned region: its bytes are reachable through it; a write from it is read back by the copying call.
    let mut owned = client.register_owned(pattern(22, 8192)).unwrap();
    lease.write_from(&owned, 0, 2 * MIB, 8192).unwrap();
    let mut check = vec![0u8; 8192];
    lease.read(2 * MIB, &mut check).unwrap();
    assert_eq!(check, owned.bytes());
    owned.bytes_mut()[..4].copy_from_slice(b"abcd");
    lease.write_from(&owned, 0, 2 * MIB, 4).unwrap();
    lease.read(2 * MIB, &mut check[..4]).unwrap();
    assert_eq!(&check[..4], b"abcd");
    assert_eq!(client.bytes_copied(), 128 + 8192 + 4);

    assert!(matches!(client.register(&mut []), Err(Error::Config(_))));
    assert_eq!(lease.free().unwrap(), Outcome::TornDown);
}

#[test]
fn scatter_gather_lists_gather_and_scatter_in_order() {
    let _one = serial();
    let a = start_hosted(&[]);
    let client = Client::connect(config(vec![a.appliance()])).unwrap();
    let mut lease = client.alloc(2 * MIB, AllocOptions::default()).unwrap();
    assert!(lease.max_sge() >= 2, "{}", lease.max_sge());

    let mut one = pattern(31, 10_000);
    let mut two = pattern(32, 100_000);
    let mut got_a = vec![0u8; 70_000];
    let mut got_b = vec![0u8; 40_000];
    // What the gathered write below sends: 90,000 + 1,000 + 9,995 bytes.
    let want: Vec<u8> = [&two[5..90_005], &one[..1000], &two[90_005..]].concat();
    {
        let (r1, r2) = (client.register(&mut one).unwrap(), client.register(&mut two).unwrap());
        // Three pieces from two regions, one write.
        lease.write_from_sg(&[(&r2, 5, 90_000), (&r1, 0, 1000), (&r2, 90_005, 9_995)], 1000).unwrap();
        // Read back scattered differently: two pieces of another pair of regions.
        let (ga, gb) = (client.register(&mut got_a).unwrap(), client.register(&mut got_b).unwrap());
        lease.read_into_sg(&[(&ga, 0, 70_000), (&gb, 5, 30_995)], 1000).unwrap();

        // Too many pieces: refused before anything is sent.
        let many: Vec<_> = (0..lease.max_sge() + 1).map(|i| (&ga, i * 10, 10)).collect();
        let e = lease.read_into_sg(&many, 0).unwrap_err();
        assert!(matches!(&e, Error::Config(m) if m.contains("max_sge")), "{e}");
        // Two pieces of one read landing on the same bytes: refused (a READ's bytes have one writer).
        let e = lease.read_into_sg(&[(&ga, 0, 100), (&ga, 50, 100)], 0).unwrap_err();
        assert!(matches!(&e, Error::Config(m) if m.contains("overlap")), "{e}");
        // Reading twice from the same bytes is fine.
        lease.write_from_sg(&[(&r1, 0, 100), (&r1, 0, 100)], 200_000).unwrap();
    }
    assert_eq!(want.len(), 100_995);
    let got: Vec<u8> = [&got_a[..], &got_b[5..31_000]].concat();
    assert!(got_b[..5].iter().chain(&got_b[31_000..]).all(|b| *b == 0), "bytes outside the pieces were written");
    assert!(got == want, "the scattered read differs from the gathered write");
    assert_eq!(client.bytes_copied(), 0);
}

/// Two appliances, a lease on each: 64 writes in one batch, then 64 reads, per-item results; the completion
/// fd is readable exactly while results wait.
#[test]
fn a_64_deep_batch_across_two_appliances() {
    let _one = serial();
    let (x, y) = (start_hosted(&[]), start_hosted(&[]));
    let client = Client::connect(config(vec![x.appliance(), y.appliance()])).unwrap();
    let l0 = client.alloc(2 * MIB, AllocOptions { prefer: Some(0), ..AllocOptions::default() }).unwrap();
    let l1 = client.alloc(2 * MIB, AllocOptions { prefer: Some(1), ..AllocOptions::default() }).unwrap();
    assert_eq!((l0.appliance_index(), l1.appliance_index()), (0, 1));
    assert_eq!(l0.queue_depth(), 64);

    const BLOCK: usize = 16 << 10;
    let src = client.register_owned(pattern(41, 64 * BLOCK)).unwrap();
    let mut dst = client.register_owned(vec![0; 64 * BLOCK]).unwrap();
    let fd = client.completion_fd();
    assert!(!readable(fd, 0), "readable before anything was submitted");

    // Block i goes to lease i % 2, at block i / 2.
    let place = |i: usize| (if i.is_multiple_of(2) { &l0 } else { &l1 }, (i / 2 * BLOCK) as u64);
    let writes = (0..64).map(|i| {
        let (l, at) = place(i);
        Op::write_from(l, &src, i * BLOCK, at, BLOCK)
    });
    let tickets = client.submit(writes);
    assert_eq!(tickets.len(), 64);
    assert!(readable(fd, 10_000), "no completion became readable");
    let done = client.wait(Wait::All, Duration::from_secs(20)).unwrap();
    assert!(!readable(fd, 0), "readable with nothing left to take");
    let mut seen: Vec<Ticket> = done.iter().map(|(t, _)| *t).collect();
    seen.sort();
    assert_eq!(seen, tickets);
    for (t, r) in &done {
        assert_eq!(r.as_ref().ok(), Some(&BLOCK), "ticket {t:?}: {r:?}");
    }

    let reads = (0..64).map(|i| {
        let (l, at) = place(i);
        Op::read_into(l, &dst, i * BLOCK, at, BLOCK)
    });
    let tickets = client.submit(reads);
    // One ticket waited for alone, the rest by polling.
    let first = client.wait(tickets[0], Duration::from_secs(20)).unwrap();
    assert_eq!(first.len(), 1);
    assert!(matches!(first[0], (t, Ok(n)) if t == tickets[0] && n == BLOCK));
    let mut results = Vec::new();
    let end = Instant::now() + Duration::from_secs(20);
    while results.len() < 63 && Instant::now() < end {
        if readable(fd, 100) {
            results.extend(client.poll(16));
        }
    }
    assert_eq!(results.len(), 63);
    assert!(results.iter().all(|(_, r)| matches!(r, Ok(n) if *n == BLOCK)));
    assert!(!readable(fd, 0));
    assert!(matches!(client.wait(tickets[0], Duration::ZERO), Err(Error::Config(_))), "a taken ticket again");
    let mut src = src;
    assert!(dst.bytes() == src.bytes(), "64 blocks through two appliances came back different");
    assert_eq!(client.bytes_copied(), 0);
}

/// A batch over two leases; the first lease is revoked by the operator while its operations are in flight: they
/// fail with `Revoked` (each on its own), the other lease's all complete.
#[test]
fn a_lease_revoked_mid_batch_fails_only_its_own_operations() {
    let _one = serial();
    let a = start_hosted(&[]);
    let revokes = Arc::new(Mutex::new(0));
    let r = revokes.clone();
    let cfg = ClientConfig {
        on_event: Some(Arc::new(move |e: &Event| {
            if matches!(e, Event::Revoked { .. }) {
                *r.lock().unwrap() += 1;
            }
        })),
        ..config(vec![a.appliance()])
    };
    let client = Client::connect(cfg).unwrap();
    let doomed = client.alloc(32 * MIB, AllocOptions::default()).unwrap();
    let kept = client.alloc(2 * MIB, AllocOptions::default()).unwrap();
    // One write at a time on the doomed lease, so most of its batch is still to come when the revoke lands.
    doomed.set_queue_depth(1);
    let src = client.register_owned(pattern(51, MIB as usize)).unwrap();
    let mut ops = Vec::new();
    for i in 0..32u64 {
        ops.push(Op::write_from(&doomed, &src, 0, i * MIB, MIB as usize));
        ops.push(Op::write_from(&kept, &src, (i * 4096) as usize, i * 4096, 4096));
    }
    let tickets = client.submit(ops);
    let first = client.wait(tickets[0], Duration::from_secs(20)).unwrap();
    assert!(matches!(first[0].1, Ok(n) if n == MIB as usize), "{:?}", first[0].1);

    let mut admin = a.admin();
    assert!(matches!(
        admin.call(&Request::Revoke { lease: doomed.id(), qp_first: false }),
        Ok(Response::Revoke { .. })
    ));
    let done = client.wait(Wait::All, Duration::from_secs(20)).unwrap();
    assert_eq!(done.len(), 63);
    let by_ticket = |t: Ticket| &done.iter().find(|(x, _)| *x == t).unwrap().1;
    let mut revoked = 0;
    for (i, t) in tickets.iter().enumerate().skip(1) {
        match (i % 2, by_ticket(*t)) {
            (1, Ok(4096)) => {}
            (0, Ok(n)) if *n == MIB as usize => {}
            (0, Err(Error::Revoked { lease, outcome })) => {
                assert_eq!(*lease, doomed.id());
                assert!(matches!(outcome, Outcome::TornDown | Outcome::NotFound), "{outcome:?}");
                revoked += 1;
            }
            (_, r) => panic!("operation {i}: {r:?}"),
        }
    }
    eprintln!("{revoked} of the doomed lease's 31 later writes failed Revoked, the rest had landed");
    assert!(revoked >= 20, "only {revoked} of the doomed lease's 31 later writes were revoked");
    assert!(doomed.revoked().is_some());
    // After the batch: the doomed lease refuses at once, the kept one works on.
    let t = client.submit([Op::write_from(&doomed, &src, 0, 0, 8), Op::write_from(&kept, &src, 0, 0, 8)]);
    let r = client.wait(Wait::All, Duration::from_secs(10)).unwrap();
    assert!(matches!(r.iter().find(|x| x.0 == t[0]).unwrap().1, Err(Error::Revoked { .. })));
    assert!(matches!(r.iter().find(|x| x.0 == t[1]).unwrap().1, Ok(8)));
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(*revokes.lock().unwrap(), 1, "the event comes once");
    let _ = admin.bye();
}

/// A foreign region dropped while a batch's READ lands in it waits for the READ: when the drop returns the
/// transfer is over (its result is there) and the memory is the program's again.
#[test]
fn dropping_a_region_in_use_waits_for_its_transfers() {
    let _one = serial();
    let a = start_hosted(&[]);
    let client = Client::connect(config(vec![a.appliance()])).unwrap();
    let mut lease = client.alloc(4 * MIB, AllocOptions::default()).unwrap();
    let data = pattern(61, 2 * MIB as usize);
    lease.write(0, &data).unwrap();
    let mut buf = vec![0u8; 2 * MIB as usize];
    // SAFETY: `buf` outlives the region (dropped below, before `buf` is read) and nothing touches it meanwhile.
    let region = unsafe { client.register_raw(buf.as_mut_ptr(), buf.len()) }.unwrap();
    let t = client.submit([Op::read_into(&lease, &region, 0, 0, buf.len())]);
    drop(region);
    let r = client.poll(8);
    assert!(matches!(r.as_slice(), [(x, Ok(n))] if *x == t[0] && *n == buf.len()), "{r:?}");
    assert!(buf == data);
}

/// A lease whose requester never hears back (its RDMA peer is a socket nobody reads, its transport timer
/// infinite) is stuck: after `rdma_timeout` without progress its QP is destroyed, its operations fail with
/// `Timeout`, the memory they named is let go at once, and later calls fail with `Rdma`.
#[test]
fn a_stuck_lease_times_out_and_lets_go_of_the_memory() {
    let _one = serial();
    let a = start_hosted(&[]);
    let mute = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let rc = RcConfig { timeout: 0, ..RcConfig::default() };
    let mut appliance = a.appliance();
    appliance.requester =
        RequesterConfig::Soft(SoftConfig { peer: mute.local_addr().unwrap(), rc, ..SoftConfig::default() });
    let cfg = ClientConfig { rdma_timeout: Duration::from_millis(300), ..config(vec![appliance]) };
    let client = Client::connect(cfg).unwrap();
    let mut lease = client.alloc(2 * MIB, AllocOptions::default()).unwrap();

    let region = client.register_owned(vec![0; 4096]).unwrap();
    let t0 = Instant::now();
    let t = client.submit([Op::read_into(&lease, &region, 0, 0, 4096)]);
    let r = client.wait(t[0], Duration::from_secs(10)).unwrap();
    let took = t0.elapsed();
    assert!(matches!(r[0].1, Err(Error::Timeout { .. })), "{:?}", r[0].1);
    // Not before `rdma_timeout`: a wall-clock lower bound, which stays (load only makes it later, so it cannot
    // fail spuriously). That the timeout and not the wait's budget ended it is the `Timeout` error.
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(region.wait_idle(Duration::from_secs(1)), "the stuck READ still holds the region");
    let e = lease.write(0, &[1]).unwrap_err();
    assert!(matches!(e, Error::Rdma { status: WcStatus::RetryExcErr, .. }), "{e}");
}
