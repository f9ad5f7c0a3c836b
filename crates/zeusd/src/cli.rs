//! Command line: `zeusd serve ...` and `zeusd token issue ...`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use crate::api::Group;

#[derive(Parser)]
#[command(
    name = "zeusd",
    version,
    about = "GPU settings and CPU energy daemon (Zeus 0.16 zeusd API)"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Serve the API.
    Serve(ServeArgs),
    /// Print a systemd unit that runs this zeusd binary (as installed by `pip install`, in
    /// its real place), for /etc/systemd/system/zeusd.service.
    Unit(UnitArgs),
    /// Bearer tokens for a daemon started with --signing-key-path.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
}

#[derive(Subcommand)]
pub enum TokenCommand {
    /// Print a signed token (HS256 JWT) on stdout.
    Issue(IssueArgs),
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    Uds,
    Tcp,
}

#[derive(clap::Args)]
pub struct ServeArgs {
    #[arg(long, value_enum, default_value = "uds")]
    pub mode: Mode,
    #[arg(long, default_value = "/run/zeusd/zeusd.sock")]
    pub socket_path: PathBuf,
    /// Mode of the socket file, octal. 660 by default: give the clients' group access with
    /// --socket-gid (upstream zeusd's 666 lets every local user write GPU settings).
    #[arg(long, default_value = "660", value_parser = parse_octal)]
    pub socket_permissions: u32,
    /// Owner of the socket file (numeric uid); unchanged when absent.
    #[arg(long)]
    pub socket_uid: Option<u32>,
    /// Group of the socket file (numeric gid); unchanged when absent.
    #[arg(long)]
    pub socket_gid: Option<u32>,
    #[arg(long, default_value = "127.0.0.1:4938")]
    pub tcp_bind_address: String,
    /// Where the settings journal lives (default: zeus-core's default location).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// API groups to serve, comma-separated: gpu-control, gpu-read, cpu-read (default: all;
    /// cpu-read only where RAPL is present).
    #[arg(long, value_parser = parse_groups)]
    pub enable: Option<Groups>,
    /// Turn on bearer-token auth: a file whose bytes (a trailing newline stripped) are the
    /// HS256 key. `/discover` and `/time` never need a token.
    #[arg(long)]
    pub signing_key_path: Option<PathBuf>,
    /// Seconds a client without a pid (TCP) keeps its settings after its last request; then
    /// they are restored. Renewed by any request, or by POST /client/renew_lease.
    #[arg(long, default_value = "60", value_parser = parse_lease)]
    pub tcp_lease_seconds: f64,
    /// GPU samples per second on /gpu/stream_power.
    #[arg(long, default_value = "20", value_parser = parse_hz)]
    pub gpu_stream_hz: f64,
    /// CPU samples per second on /cpu/stream_power.
    #[arg(long, default_value = "10", value_parser = parse_hz)]
    pub cpu_stream_hz: f64,
}

#[derive(clap::Args)]
pub struct IssueArgs {
    /// The key file the daemon was started with.
    #[arg(long)]
    pub signing_key_path: PathBuf,
    /// The token's subject (`sub`), shown in the daemon's write log.
    #[arg(long)]
    pub user: String,
    /// API groups the token may use, comma-separated.
    #[arg(long, value_parser = parse_groups)]
    pub scope: Groups,
    /// Lifetime: a number with s, m, h or d (1h, 7d, 30d), or `never`.
    #[arg(long, default_value = "30d", value_parser = parse_expires)]
    pub expires: Expires,
}

/// A non-empty, duplicate-free list of API groups.
#[derive(Clone, Debug)]
pub struct Groups(pub Vec<Group>);

fn parse_groups(s: &str) -> Result<Groups, String> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let g = Group::from_name(part.trim()).ok_or_else(|| {
            format!("unknown API group {part:?}: use gpu-control, gpu-read or cpu-read")
        })?;
        if !out.contains(&g) {
            out.push(g);
        }
    }
    Ok(Groups(out))
}

fn parse_octal(s: &str) -> Result<u32, String> {
    match u32::from_str_radix(s, 8) {
        Ok(m) if m <= 0o7777 => Ok(m),
        Ok(_) => Err("not a file mode (at most 7777)".into()),
        Err(e) => Err(format!("not an octal mode: {e}")),
    }
}

fn parse_hz(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(hz) if (0.1..=1000.0).contains(&hz) => Ok(hz),
        _ => Err("expected samples per second between 0.1 and 1000".into()),
    }
}

/// Token lifetime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expires {
    Never,
    After(Duration),
}

pub fn parse_expires(s: &str) -> Result<Expires, String> {
    if s == "never" {
        return Ok(Expires::Never);
    }
    let bad = || format!("expected e.g. 1h, 7d, 30d or never, got {s:?}");
    let split = s.len().checked_sub(1).ok_or_else(bad)?;
    if !s.is_char_boundary(split) {
        return Err(bad());
    }
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| bad())?;
    let secs = match unit {
        "s" => n,
        "m" => n.checked_mul(60).ok_or_else(bad)?,
        "h" => n.checked_mul(3600).ok_or_else(bad)?,
        "d" => n.checked_mul(86_400).ok_or_else(bad)?,
        _ => return Err(bad()),
    };
    if secs == 0 {
        return Err(bad());
    }
    Ok(Expires::After(Duration::from_secs(secs)))
}

fn parse_lease(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 1e9 => Ok(v),
        _ => Err(format!("expected a positive number of seconds, got {s:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expires_forms() {
        assert_eq!(parse_expires("never"), Ok(Expires::Never));
        assert_eq!(
            parse_expires("7d"),
            Ok(Expires::After(Duration::from_secs(7 * 86_400)))
        );
        assert_eq!(
            parse_expires("1h"),
            Ok(Expires::After(Duration::from_secs(3600)))
        );
        for bad in ["", "d", "0h", "1y", "-1h", "1é"] {
            assert!(parse_expires(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn groups_parse_and_reject_unknown() {
        assert_eq!(parse_groups("gpu-read,cpu-read").unwrap().0.len(), 2);
        assert!(parse_groups("gpu-read,gpu-write").is_err());
    }
}

#[derive(clap::Args)]
pub struct UnitArgs {
    /// The group whose members may use the socket (its gid goes into the unit). Without it
    /// only root can.
    #[arg(long)]
    pub socket_group: Option<String>,
    /// Extra arguments for `zeusd serve` (for example --signing-key-path /etc/zeusd/key).
    #[arg(last = true)]
    pub serve_args: Vec<String>,
}
