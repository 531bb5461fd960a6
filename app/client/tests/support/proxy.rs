//! A TCP proxy in front of an appliance's control port, for tests that cut, silence or refuse the client's
//! connections. Shared by this crate's tests and the C ABI's (app/client-c/tests, through `#[path]`).
#![allow(dead_code)]

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// A TCP proxy whose connections can be cut from the test.
pub struct Proxy {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    pub accepted: Arc<AtomicUsize>,
    /// While set, connections are closed as soon as they are accepted (the appliance unreachable).
    pub refuse: Arc<AtomicBool>,
    /// One flag per connection: set, its bytes are dropped both ways (a silent network, no FIN).
    frozen: Arc<Mutex<Vec<Arc<AtomicBool>>>>,
    thread: Option<JoinHandle<()>>,
}

impl Proxy {
    pub fn start(upstream: String) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let accepted = Arc::new(AtomicUsize::new(0));
        let refuse = Arc::new(AtomicBool::new(false));
        let frozen: Arc<Mutex<Vec<Arc<AtomicBool>>>> = Arc::default();
        let (s, c, n, r, z) = (stop.clone(), conns.clone(), accepted.clone(), refuse.clone(), frozen.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Acquire) {
                match l.accept() {
                    Ok((down, _)) if r.load(Ordering::Acquire) => drop(down),
                    Ok((down, _)) => {
                        down.set_nonblocking(false).unwrap();
                        let up = TcpStream::connect(&upstream).unwrap();
                        n.fetch_add(1, Ordering::AcqRel);
                        let mut g = c.lock().unwrap();
                        g.push(down.try_clone().unwrap());
                        g.push(up.try_clone().unwrap());
                        let mute = Arc::new(AtomicBool::new(false));
                        z.lock().unwrap().push(mute.clone());
                        pump(down.try_clone().unwrap(), up.try_clone().unwrap(), mute.clone());
                        pump(up, down, mute);
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(5)),
                    Err(e) => panic!("proxy accept: {e}"),
                }
            }
        });
        Proxy { addr, stop, conns, accepted, refuse, frozen, thread: Some(thread) }
    }

    /// Every connection open now goes silent (later ones work).
    pub fn freeze(&self) {
        for f in self.frozen.lock().unwrap().iter() {
            f.store(true, Ordering::Release);
        }
    }

    /// Cuts every connection (both sides see it closed).
    pub fn kill(&self) {
        for s in self.conns.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, mute: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 16384];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            if !mute.load(Ordering::Acquire) && to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        // A frozen connection stays open on the far side: a silent network carries no FIN either.
        if !mute.load(Ordering::Acquire) {
            let _ = to.shutdown(std::net::Shutdown::Both);
        }
    });
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.kill();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
