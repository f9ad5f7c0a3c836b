//! Bounded serving for zeus's HTTP servers (`zeusd`, the `zeus-monitor` exporter).
//!
//! `axum::serve` accepts every connection and keeps it for as long as the client likes: a local
//! user opening a thousand silent connections exhausts a root daemon's descriptors, and then
//! neither new clients nor restores of a killed client's settings get one. [`Bounded`] wraps a
//! listener so that:
//! - each client (a Unix-socket peer's uid, a TCP peer's IP address) holds at most
//!   [`Limits::per_client`] connections, and the server at most [`Limits::total`]. A
//!   connection past either makes room by closing that client's (or, at the total, anyone's)
//!   longest-idle connection, if one has been idle a second; else it is closed itself. So one
//!   user cannot crowd out the others, and on a shared TCP address (loopback) a scraper's new
//!   connection displaces an attacker's silent ones rather than being refused;
//! - a connection on which nothing is read or written for [`Limits::idle`] is closed (a
//!   request in flight or a server-sent-event stream with keep-alives is never idle).

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::serve::Listener;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::time::{Instant, Sleep};

/// The bounds of a [`Bounded`] listener.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Open connections per client.
    pub per_client: usize,
    /// Open connections in all.
    pub total: usize,
    /// Close a connection after this long without a byte either way.
    pub idle: Duration,
    /// A connection idle this long may be closed to make room for a newcomer.
    pub evict_after: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            per_client: 64,
            total: 768,
            idle: Duration::from_secs(60),
            evict_after: Duration::from_secs(1),
        }
    }
}

/// Who a connection counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Client {
    Uid(u32),
    Ip(IpAddr),
    /// A peer whose credentials could not be read: they all share one allowance.
    Unknown,
}

impl std::fmt::Display for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Client::Uid(u) => write!(f, "uid {u}"),
            Client::Ip(a) => write!(f, "{a}"),
            Client::Unknown => f.write_str("an unidentified peer"),
        }
    }
}

/// Streams whose peer can be named.
pub trait Identify {
    fn client(&self) -> Client;
}

impl Identify for UnixStream {
    fn client(&self) -> Client {
        self.peer_cred()
            .map_or(Client::Unknown, |c| Client::Uid(c.uid()))
    }
}

impl Identify for TcpStream {
    fn client(&self) -> Client {
        self.peer_addr()
            .map_or(Client::Unknown, |a| Client::Ip(a.ip()))
    }
}

/// One open connection, as the listener and the connection both see it.
struct Conn {
    client: Client,
    /// Milliseconds since the listener's epoch at the last byte either way.
    last: AtomicU64,
    /// Set to close the connection (it is the longest idle of a client at its cap).
    evicted: AtomicBool,
    /// The connection's reader, to wake when evicted.
    waker: Mutex<Option<Waker>>,
}

#[derive(Default)]
struct Counts {
    open: HashMap<u64, Arc<Conn>>,
    by_client: HashMap<Client, usize>,
    next_id: u64,
    /// Clients told about (logged) while at their cap, so a flood logs one line.
    warned: std::collections::HashSet<Client>,
}

/// A connection's place in the counts, given back when the connection closes.
struct Slot {
    counts: Arc<Mutex<Counts>>,
    id: u64,
    conn: Arc<Conn>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = lock(&self.counts);
        c.open.remove(&self.id);
        let client = self.conn.client;
        if let Some(n) = c.by_client.get_mut(&client) {
            *n -= 1;
            if *n == 0 {
                c.by_client.remove(&client);
                c.warned.remove(&client);
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A listener with [`Limits`]; serve it with `axum::serve` like the listener it wraps.
pub struct Bounded<L> {
    inner: L,
    limits: Limits,
    counts: Arc<Mutex<Counts>>,
    name: &'static str,
    epoch: std::time::Instant,
}

impl<L> Bounded<L> {
    /// Wrap `inner`; `name` prefixes the one line logged when a client reaches its cap.
    pub fn new(inner: L, limits: Limits, name: &'static str) -> Bounded<L> {
        Bounded {
            inner,
            limits,
            counts: Arc::default(),
            name,
            epoch: std::time::Instant::now(),
        }
    }

    /// Connections open now (all clients).
    pub fn open_connections(&self) -> usize {
        lock(&self.counts).open.len()
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn admit(&self, client: Client) -> Option<Slot> {
        let now = self.now_ms();
        let mut c = lock(&self.counts);
        let mine = c.by_client.get(&client).copied().unwrap_or(0);
        let full = mine >= self.limits.per_client;
        let evictable = self.limits.evict_after.as_millis() as u64;
        if full || c.open.len() >= self.limits.total {
            // Make room: the longest idle of this client's connections (or anyone's, at the
            // total), if it has been idle long enough not to be in the middle of something.
            // Ties (connections idle since the same millisecond) go to the oldest.
            let victim = c
                .open
                .iter()
                .filter(|(_, x)| !x.evicted.load(Ordering::Relaxed))
                .filter(|(_, x)| !full || x.client == client)
                .filter(|(_, x)| now.saturating_sub(x.last.load(Ordering::Relaxed)) >= evictable)
                .min_by_key(|(id, x)| (x.last.load(Ordering::Relaxed), **id))
                .map(|(_, x)| x.clone());
            if c.warned.insert(client) {
                eprintln!(
                    "{}: {client} has {mine} connections open ({} in all); its longest idle \
                     ones are closed to make room, or new ones refused",
                    self.name,
                    c.open.len()
                );
            }
            let victim = victim?;
            victim.evicted.store(true, Ordering::Relaxed);
            let waker = lock(&victim.waker).take();
            if let Some(w) = waker {
                w.wake();
            }
        }
        let conn = Arc::new(Conn {
            client,
            last: AtomicU64::new(now),
            evicted: AtomicBool::new(false),
            waker: Mutex::new(None),
        });
        let id = c.next_id;
        c.next_id += 1;
        c.open.insert(id, conn.clone());
        *c.by_client.entry(client).or_insert(0) += 1;
        Some(Slot {
            counts: self.counts.clone(),
            id,
            conn,
        })
    }
}

impl<L> Listener for Bounded<L>
where
    L: Listener,
    L::Io: Identify,
{
    type Io = Guarded<L::Io>;
    type Addr = L::Addr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (io, addr) = self.inner.accept().await;
            let Some(slot) = self.admit(io.client()) else {
                drop(io);
                continue;
            };
            let idle = self.limits.idle;
            return (
                Guarded {
                    io,
                    idle,
                    timer: Box::pin(tokio::time::sleep(idle)),
                    epoch: self.epoch,
                    slot,
                },
                addr,
            );
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// Bounded over a Unix socket.
pub type BoundedUnix = Bounded<UnixListener>;
/// Bounded over TCP.
pub type BoundedTcp = Bounded<TcpListener>;

/// An accepted connection: closed after [`Limits::idle`] without traffic; its slot is given
/// back when it is dropped.
pub struct Guarded<Io> {
    io: Io,
    idle: Duration,
    timer: Pin<Box<Sleep>>,
    epoch: std::time::Instant,
    slot: Slot,
}

impl<Io> Guarded<Io> {
    /// The stream inside (for its peer's credentials).
    pub fn inner(&self) -> &Io {
        &self.io
    }

    fn touched(&mut self) {
        self.timer.as_mut().reset(Instant::now() + self.idle);
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.slot.conn.last.store(ms, Ordering::Relaxed);
    }

    /// Idle too long, or closed to make room: registers `cx` to be woken for either.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        {
            let mut w = lock(&self.slot.conn.waker);
            if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *w = Some(cx.waker().clone());
            }
        }
        self.slot.conn.evicted.load(Ordering::Relaxed) || self.timer.as_mut().poll(cx).is_ready()
    }
}

fn idle_error() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "connection idle for too long")
}

impl<Io: AsyncRead + Unpin> AsyncRead for Guarded<Io> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.touched();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(idle_error())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<Io: AsyncWrite + Unpin> AsyncWrite for Guarded<Io> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.io).poll_write(cx, data) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.touched();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(idle_error())),
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn app() -> axum::Router {
        axum::Router::new().route("/", axum::routing::get(|| async { "ok" }))
    }

    async fn get(path: &std::path::Path) -> io::Result<String> {
        let mut s = UnixStream::connect(path).await?;
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        Ok(out)
    }

    /// The test app served on a fresh socket with `limits`: its directory, socket path, and
    /// the listener's counts.
    fn serve(
        name: &str,
        limits: Limits,
    ) -> (std::path::PathBuf, std::path::PathBuf, Arc<Mutex<Counts>>) {
        let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let _ = std::fs::remove_file(&path);
        let l = Bounded::new(UnixListener::bind(&path).unwrap(), limits, "test");
        let counts = l.counts.clone();
        tokio::spawn(async move { axum::serve(l, app()).await.unwrap() });
        (dir, path, counts)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_at_its_cap_does_not_crowd_out_the_server_and_idle_ones_go() {
        let (dir, path, counts) = serve(
            "zeus-http-test",
            Limits {
                per_client: 8,
                total: 100,
                idle: Duration::from_millis(500),
                evict_after: Duration::from_secs(3600),
            },
        );
        // Eight silent connections: this uid's allowance.
        let mut silent = Vec::new();
        for _ in 0..8 {
            silent.push(UnixStream::connect(&path).await.unwrap());
        }
        while lock(&counts).open.len() < 8 {
            tokio::task::yield_now().await;
        }
        // A ninth is closed at once (the same uid: the test's).
        let mut ninth = UnixStream::connect(&path).await.unwrap();
        let _ = ninth.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await;
        let mut buf = Vec::new();
        let n = ninth.read_to_end(&mut buf).await.unwrap_or(0);
        assert_eq!(n, 0, "{:?}", String::from_utf8_lossy(&buf));
        // The silent ones are closed once idle, and the uid gets its allowance back.
        for s in &mut silent {
            let mut b = [0u8; 1];
            let read = tokio::time::timeout(Duration::from_secs(30), s.read(&mut b)).await;
            assert_eq!(
                read.expect("an idle connection stayed open").unwrap_or(0),
                0
            );
        }
        while !lock(&counts).open.is_empty() {
            tokio::task::yield_now().await;
        }
        assert!(get(&path).await.unwrap().contains("ok"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_newcomer_displaces_the_longest_idle_connection_of_its_client() {
        let (dir, path, counts) = serve(
            "zeus-http-evict",
            Limits {
                per_client: 4,
                total: 100,
                idle: Duration::from_secs(3600),
                evict_after: Duration::ZERO,
            },
        );
        let mut silent = Vec::new();
        for k in 0..4 {
            silent.push(UnixStream::connect(&path).await.unwrap());
            while lock(&counts).open.len() < k + 1 {
                tokio::task::yield_now().await;
            }
        }
        // At the cap, a request still gets its answer: the oldest silent connection goes.
        assert!(get(&path).await.unwrap().contains("ok"));
        let mut b = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(30), silent[0].read(&mut b)).await;
        assert_eq!(read.expect("the oldest was not closed").unwrap_or(0), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
