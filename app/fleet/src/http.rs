//! Just enough HTTP/1.1 (RFC 9112) for etcd's JSON gateway: one POST per connection (`Connection: close`), the
//! answer read to its end, chunked bodies decoded; and a streamed POST (`/v3/watch`) whose chunks are read as
//! they come. Plain TCP or TLS (rustls). Every wait has a deadline.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};

/// Where a request goes: an endpoint `HOST:PORT`, TLS to it or not, and etcd's auth token if there is one
/// (sent as the `Authorization` header, which etcd's gateway passes on as the token).
#[derive(Clone, Copy)]
pub struct Target<'a> {
    pub addr: &'a str,
    pub tls: Option<&'a Arc<ClientConfig>>,
    pub token: Option<&'a str>,
}

/// One connection to an endpoint.
pub enum Conn {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Conn {
    fn tcp(&self) -> &TcpStream {
        match self {
            Conn::Plain(s) => s,
            Conn::Tls(t) => &t.sock,
        }
    }
}

/// A TLS error said plainly: which side refused, and for a refused client certificate what to give.
fn tls_error(e: io::Error) -> io::Error {
    let Some(inner) = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) else { return e };
    let hint = match inner {
        rustls::Error::AlertReceived(
            rustls::AlertDescription::BadCertificate | rustls::AlertDescription::CertificateRequired,
        ) => " (the server wants a client certificate and key that its CA signed)",
        rustls::Error::InvalidCertificate(_) => " (the server's certificate does not verify under the CA given)",
        _ => "",
    };
    io::Error::new(e.kind(), format!("TLS: {inner}{hint}"))
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Tls(t) => t.read(buf).map_err(tls_error),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Tls(t) => t.write(buf).map_err(tls_error),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Tls(t) => t.flush().map_err(tls_error),
        }
    }
}

/// The host part of `HOST:PORT` (`[v6]:PORT` too), as TLS names the server.
fn host(addr: &str) -> &str {
    let h = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    h.trim_start_matches('[').trim_end_matches(']')
}

/// Connects to `addr`, with TLS when `tls` is given (the handshake runs within the deadline too).
fn connect(addr: &str, tls: Option<&Arc<ClientConfig>>, timeout: Duration) -> io::Result<Conn> {
    let s = tcp(addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let Some(config) = tls else { return Ok(Conn::Plain(s)) };
    let name = ServerName::try_from(host(addr).to_string())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{addr}: not a TLS server name: {e}")))?;
    let c = ClientConnection::new(config.clone(), name).map_err(|e| io::Error::other(format!("TLS: {e}")))?;
    let mut t = StreamOwned::new(c, s);
    while t.conn.is_handshaking() {
        t.conn.complete_io(&mut t.sock).map_err(tls_error)?;
    }
    Ok(Conn::Tls(Box::new(t)))
}

fn tcp(addr: &str, timeout: Duration) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{addr}: no address"));
    for a in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn send(to: Target<'_>, path: &str, body: &str, timeout: Duration) -> io::Result<BufReader<Conn>> {
    let mut s = connect(to.addr, to.tls, timeout)?;
    let auth = to.token.map_or(String::new(), |t| format!("Authorization: {t}\r\n"));
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{auth}\
         Connection: close\r\n\r\n{body}",
        to.addr,
        body.len()
    );
    s.write_all(req.as_bytes())?;
    s.flush()?;
    Ok(BufReader::new(s))
}

fn bad(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// The status line and headers: (status, chunked, content length).
fn head(r: &mut impl BufRead) -> io::Result<(u16, bool, Option<usize>)> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed before an answer"));
    }
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(format!("not an HTTP status line: {:?}", line.trim_end())))?;
    let (mut chunked, mut length) = (false, None);
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed in the headers"));
        }
        let l = line.trim_end();
        if l.is_empty() {
            return Ok((status, chunked, length));
        }
        if let Some((k, v)) = l.split_once(':') {
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
            if k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked") {
                chunked = true;
            } else if k == "content-length" {
                length = v.parse().ok();
            }
        }
    }
}

/// One chunk of a chunked body; `None` after the last (zero-length) chunk.
fn chunk(r: &mut impl BufRead) -> io::Result<Option<Vec<u8>>> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed in a chunked body"));
    }
    let size_text = line.trim_end().split(';').next().unwrap_or("");
    let size = usize::from_str_radix(size_text.trim(), 16).map_err(|_| bad(format!("chunk size {size_text:?}")))?;
    let mut data = vec![0u8; size];
    r.read_exact(&mut data)?;
    let mut crlf = [0u8; 2];
    r.read_exact(&mut crlf)?;
    if size == 0 {
        return Ok(None);
    }
    Ok(Some(data))
}

/// POSTs `body` (JSON) to `path`; the status and the whole answer body.
pub fn post(to: Target<'_>, path: &str, body: &str, timeout: Duration) -> io::Result<(u16, String)> {
    let mut r = send(to, path, body, timeout)?;
    let (status, chunked, length) = head(&mut r)?;
    let mut out = Vec::new();
    if chunked {
        while let Some(c) = chunk(&mut r)? {
            out.extend_from_slice(&c);
        }
    } else if let Some(n) = length {
        out.resize(n, 0);
        r.read_exact(&mut out)?;
    } else {
        r.read_to_end(&mut out)?;
    }
    Ok((status, String::from_utf8_lossy(&out).into_owned()))
}

/// A streamed answer: the body's bytes as they arrive.
pub struct Stream {
    r: BufReader<Conn>,
    chunked: bool,
    done: bool,
}

impl Stream {
    /// POSTs `body` and reads the head; each later read waits at most `read_timeout`.
    pub fn open(
        to: Target<'_>,
        path: &str,
        body: &str,
        timeout: Duration,
        read_timeout: Duration,
    ) -> io::Result<Stream> {
        let mut r = send(to, path, body, timeout)?;
        let (status, chunked, _) = head(&mut r)?;
        if status != 200 {
            return Err(bad(format!("{path} answered HTTP {status}")));
        }
        r.get_ref().tcp().set_read_timeout(Some(read_timeout))?;
        Ok(Stream { r, chunked, done: false })
    }

    /// The next piece of the body (`Ok(None)` at its end); a read timeout is `ErrorKind::WouldBlock` or
    /// `TimedOut`, after which the stream may be read again only if the timeout hit between chunks.
    pub fn next_piece(&mut self) -> io::Result<Option<Vec<u8>>> {
        if self.done {
            return Ok(None);
        }
        if self.chunked {
            let c = chunk(&mut self.r)?;
            self.done = c.is_none();
            Ok(c)
        } else {
            let mut buf = vec![0u8; 8192];
            let n = self.r.read(&mut buf)?;
            self.done = n == 0;
            buf.truncate(n);
            Ok((n > 0).then_some(buf))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies_are_put_together() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nWiki\r\n5;x=y\r\npedia\r\n0\r\n\r\n";
        let mut r = &raw[..];
        assert_eq!(head(&mut r).unwrap(), (200, true, None));
        assert_eq!(chunk(&mut r).unwrap().unwrap(), b"Wiki");
        assert_eq!(chunk(&mut r).unwrap().unwrap(), b"pedia");
        assert_eq!(chunk(&mut r).unwrap(), None);
        let mut r = &b"HTTP/1.1 404 Not Found\r\ncontent-length: 3\r\n\r\nabc"[..];
        assert_eq!(head(&mut r).unwrap(), (404, false, Some(3)));
        assert!(head(&mut &b"garbage\r\n\r\n"[..]).is_err());
    }
}
