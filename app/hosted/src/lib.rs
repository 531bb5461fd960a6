//! The hosted appliance as a library, so tests and benchmarks can start one in-process.

use leasebox_session::{ConnId, Entropy, EntropyError, Keyring, Limits, NoLeases, Server};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How often a connection thread looks for output queued by timers (TIMEOUT frames).
const POLL: Duration = Duration::from_millis(20);

/// Nonces from the OS.
struct OsEntropy;
impl Entropy for OsEntropy {
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), EntropyError> {
        std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(buf)).map_err(|_| EntropyError)
    }
}

/// Listen address, limits and keys.
pub struct HostedConfig {
    pub listen: SocketAddr,
    pub limits: Limits,
    pub keys: Keyring,
}

impl HostedConfig {
    /// `--listen ADDR` and the kernel's option words.
    pub fn from_args(args: &[String]) -> Result<HostedConfig, String> {
        let mut listen: SocketAddr = "127.0.0.1:7470".parse().expect("literal address");
        let mut words = Vec::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if a == "--listen" {
                let v = it.next().ok_or("--listen needs ADDR:PORT")?;
                listen = v.parse().map_err(|_| format!("--listen: '{v}' is not ADDR:PORT"))?;
            } else if a.starts_with('-') {
                return Err(format!("unknown flag '{a}'"));
            } else {
                words.push(a.as_str());
            }
        }
        let line = words.join(" ");
        let line: &'static str = Box::leak(line.into_boxed_str());
        let mut cfg = leasebox_kernel::config::Config::default();
        cfg.apply(line).map_err(|e| e.to_string())?;
        cfg.check().map_err(|e| e.to_string())?;
        if let Some(w) = cfg.unknown().0.first() {
            return Err(format!("unknown option '{w}'"));
        }
        let control = cfg.control();
        let mut keys = Keyring::new();
        for (name, hex) in control.tenants() {
            keys.add_tenant(name, hex).map_err(|e| format!("tenant={name}: {e}"))?;
        }
        if let Some(hex) = control.admin_key_hex() {
            keys.set_admin(hex).map_err(|e| format!("admin=: {e}"))?;
        }
        let limits = Limits {
            sessions: control.sessions as usize,
            credits: control.credits as u16,
            heartbeat_ms: control.heartbeat_ms,
        };
        Ok(HostedConfig { listen, limits, keys })
    }
}

type Shared = Arc<Mutex<Server<NoLeases, OsEntropy>>>;

/// A running hosted appliance.
pub struct Hosted {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

fn now_ms(start: Instant) -> u64 {
    start.elapsed().as_millis() as u64
}

impl Hosted {
    /// Binds and starts serving (accept thread + timer thread + one thread per connection).
    pub fn start(cfg: HostedConfig) -> Result<Hosted, String> {
        let start = Instant::now();
        let server = Server::new(cfg.limits, cfg.keys, NoLeases::default(), OsEntropy, 0).map_err(|e| e.to_string())?;
        let server: Shared = Arc::new(Mutex::new(server));
        let listener = TcpListener::bind(cfg.listen).map_err(|e| format!("binding {}: {e}", cfg.listen))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let stop = Arc::new(AtomicBool::new(false));
        let next_conn = Arc::new(AtomicU64::new(1));

        let timer = {
            let (server, stop) = (server.clone(), stop.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    server.lock().expect("server lock").tick(now_ms(start));
                    thread::sleep(Duration::from_millis(50));
                }
            })
        };
        let acceptor = {
            let (server, stop) = (server.clone(), stop.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let id = ConnId(next_conn.fetch_add(1, Ordering::Relaxed));
                            let (server, stop) = (server.clone(), stop.clone());
                            thread::spawn(move || serve(server, stream, id, start, stop));
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(5)),
                        Err(_) => thread::sleep(Duration::from_millis(50)),
                    }
                }
            })
        };
        Ok(Hosted { addr, stop, threads: vec![timer, acceptor] })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Blocks until the service stops.
    pub fn join(mut self) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }

    /// Stops accepting and ends every connection thread (they notice within `POLL`).
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        self.join();
    }
}

/// One connection: bytes from the socket into the core, the core's output back out.
fn serve(server: Shared, mut stream: TcpStream, id: ConnId, start: Instant, stop: Arc<AtomicBool>) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(POLL));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
    let mut inbuf = vec![0u8; 64 * 1024];
    let mut outbuf = vec![0u8; 64 * 1024];
    server.lock().expect("server lock").open(id, now_ms(start));
    loop {
        // Flush whatever the core has for this connection, then see whether it wants the connection closed.
        let done = loop {
            let (n, close) = {
                let mut s = server.lock().expect("server lock");
                let n = s.output(id, &mut outbuf);
                (n, n == 0 && s.wants_close(id))
            };
            if close {
                break true;
            }
            if n == 0 {
                break false;
            }
            if stream.write_all(&outbuf[..n]).is_err() {
                break true;
            }
        };
        if done || stop.load(Ordering::Relaxed) {
            break;
        }
        match stream.read(&mut inbuf) {
            Ok(0) => break,
            Ok(n) => server.lock().expect("server lock").input(id, &inbuf[..n], now_ms(start)),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
    server.lock().expect("server lock").closed(id, now_ms(start));
}
