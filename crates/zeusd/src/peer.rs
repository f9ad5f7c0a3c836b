//! Who is on the other end of a connection, and the write log.
//!
//! On the Unix socket the kernel tells us the peer's uid, gid and pid (`SO_PEERCRED`, read once
//! when the connection is accepted); over TCP we know only its address. axum stores the
//! [`Peer`] as `ConnectInfo<Peer>` in every request's extensions; handlers take it through the
//! [`Caller`] extractor (`caller.peer.pid()`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::connect_info::Connected;
use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::serve::IncomingStream;
use tokio::net::{TcpListener, UnixListener};
use zeus_http::Bounded;

use crate::token::Identity;

/// The client of one connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Peer {
    /// A Unix-socket client, from `SO_PEERCRED`. `pid` is `None` where the kernel gives none.
    Unix {
        uid: u32,
        gid: u32,
        pid: Option<u32>,
    },
    Tcp(SocketAddr),
    /// The credentials could not be read.
    Unknown,
}

impl Peer {
    /// The client's process id (Unix socket only).
    pub fn pid(&self) -> Option<u32> {
        match self {
            Peer::Unix { pid, .. } => *pid,
            _ => None,
        }
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Unix { uid, gid, .. } => {
                write!(f, "uid={uid} gid={gid} pid=")?;
                match self.pid() {
                    Some(p) => write!(f, "{p}"),
                    None => f.write_str("?"),
                }
            }
            Peer::Tcp(a) => write!(f, "tcp={a}"),
            Peer::Unknown => f.write_str("peer=?"),
        }
    }
}

impl Connected<IncomingStream<'_, Bounded<UnixListener>>> for Peer {
    fn connect_info(stream: IncomingStream<'_, Bounded<UnixListener>>) -> Peer {
        match stream.io().inner().peer_cred() {
            Ok(c) => Peer::Unix {
                uid: c.uid(),
                gid: c.gid(),
                pid: c.pid().and_then(|p| u32::try_from(p).ok()),
            },
            Err(_) => Peer::Unknown,
        }
    }
}

impl Connected<IncomingStream<'_, Bounded<TcpListener>>> for Peer {
    fn connect_info(stream: IncomingStream<'_, Bounded<TcpListener>>) -> Peer {
        Peer::Tcp(*stream.remote_addr())
    }
}

/// What a handler knows about the request's origin: the connection's peer, the token's
/// subject (if auth is on) and the request target (path and query), for the write log.
#[derive(Clone, Debug)]
pub struct Caller {
    pub peer: Peer,
    pub subject: Option<String>,
    pub target: String,
    /// The `X-Zeusd-Client` header: names a client without a pid (TCP) for its lease.
    pub client: Option<String>,
}

/// The `X-Zeusd-Client` header, if present and text.
pub fn client_header(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get("x-zeusd-client")
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Caller, Infallible> {
        let peer = parts
            .extensions
            .get::<ConnectInfo<Peer>>()
            .map(|c| c.0.clone())
            .unwrap_or(Peer::Unknown);
        let subject = parts
            .extensions
            .get::<Identity>()
            .and_then(|i| i.0.as_ref().map(|c| c.sub.clone()));
        Ok(Caller {
            peer,
            subject,
            target: parts.uri.to_string(),
            client: client_header(&parts.headers),
        })
    }
}

impl Caller {
    pub fn log(&self, result: &str) {
        log_write(&self.peer, self.subject.as_deref(), &self.target, result);
    }
}

/// One line on stderr per write: UTC time, peer, token subject, target, result. What a client
/// chose (its token's subject, the target) has its control characters escaped, so a subject
/// with a newline cannot forge a line of the log.
pub fn log_write(peer: &Peer, subject: Option<&str>, target: &str, result: &str) {
    let sub = one_line(subject.unwrap_or("-"));
    eprintln!(
        "{} zeusd write {peer} sub={sub} {} -> {}",
        utc_now(),
        one_line(target),
        one_line(result)
    );
}

/// `s` with control characters (newlines, escapes) written as `\u{..}` escapes.
pub fn one_line(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod log_tests {
    #[test]
    fn control_characters_cannot_break_a_log_line() {
        let forged = "alice\n2026-01-01T00:00:00.000Z zeusd write uid=0 sub=root";
        let line = super::one_line(forged);
        assert!(!line.contains('\n'));
        assert!(line.starts_with("alice\\u{a}2026"), "{line}");
        assert_eq!(super::one_line("plain subject"), "plain subject");
    }
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ`.
fn utc_now() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    format_utc(d.as_secs(), d.subsec_millis())
}

fn format_utc(secs: u64, millis: u32) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(format_utc(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_utc(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(format_utc(1_798_761_599, 999), "2026-12-31T23:59:59.999Z");
    }
}
