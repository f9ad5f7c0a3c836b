//! zeusd: a daemon that serves Zeus 0.16's zeusd HTTP API over a Unix socket or TCP, so that
//! unprivileged jobs can read GPU and CPU energy and change GPU settings.
//!
//! What exists:
//! - `zeusd serve` ([`serve`]): `/discover`, `/time`, the `/gpu/*` reads and writes
//!   ([`gpu`]), `/cpu/*` energy and power from RAPL ([`cpu`]), server-sent power streams
//!   ([`stream`]); API groups (`--enable`), a disabled group answering 404 ([`router`]);
//!   HS256 bearer tokens ([`token`]) with per-group scopes when `--signing-key-path` is given
//!   ([`auth`]); the Unix-socket peer's uid/gid/pid from `SO_PEERCRED`, logged with every
//!   write ([`peer`]). Modules depend only on those below them: [`api`] (the vocabulary),
//!   [`token`], [`exits`], [`peer`], [`owners`], [`state`], [`auth`], the handlers, [`router`].
//! - GPU power limits and clock locks are held on behalf of the client that asked ([`owners`]):
//!   a Unix-socket client is its process (zeus-core `Owner`: pid, start time, boot), journaled
//!   as the holder through a `SettingsGuard` acting for it, and released by a watcher thread
//!   within 200 ms of its exit; a TCP client holds through a lease (`--tcp-lease-seconds`,
//!   renewed by its requests and `POST /client/renew_lease`, ended a second after its last
//!   `GET /client/hold` connection closes). Another live client's write at a
//!   different value gets 409 naming the holders; resets release only the caller's hold. At
//!   start, stale journal entries are restored and live clients' entries adopted; SIGTERM or
//!   SIGINT restores everything held.
//! - `zeusd token issue` prints a token for a user and a set of groups.
//!
//! Not yet: conflicts with processes that change GPUs without the daemon (they appear in the
//! journal, but the daemon checks conflicts only against its own clients).

mod api;
mod auth;
mod cli;
mod cpu;
mod exits;
mod gpu;
mod owners;
mod peer;
mod router;
mod serve;
mod state;
mod stream;
mod token;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command, Expires, IssueArgs, TokenCommand, UnitArgs};
use crate::token::{Claims, Signer};

fn issue(args: &IssueArgs) -> Result<String, String> {
    let signer = Signer::from_file(&args.signing_key_path)?;
    let exp = match args.expires {
        Expires::Never => None,
        Expires::After(d) => Some(api::now_ms() / 1000 + d.as_secs()),
    };
    Ok(signer.issue(&Claims {
        sub: args.user.clone(),
        scopes: args.scope.0.iter().map(|g| g.name().to_string()).collect(),
        exp,
    }))
}

/// The gid of group `name`, with the fix in the error when there is none.
fn group_gid(name: &str) -> Result<u32, String> {
    let c = std::ffi::CString::new(name).map_err(|_| format!("bad group name {name:?}"))?;
    // SAFETY: getgrnam reads a NUL-terminated string; the result is read at once, before any
    // other call that could reuse its static buffer.
    let g = unsafe { libc::getgrnam(c.as_ptr()) };
    if g.is_null() {
        return Err(format!(
            "no group {name:?} on this host: create it (groupadd {name}) and add the users who \
             may change GPU settings (usermod -aG {name} <user>)"
        ));
    }
    // SAFETY: non-null result of getgrnam.
    Ok(unsafe { (*g).gr_gid })
}

/// A systemd unit running this very binary (a `pip install` puts it inside site-packages; the
/// console script on PATH is a Python launcher, which a root unit should not depend on).
fn unit(args: &UnitArgs) -> Result<String, String> {
    let exe = std::env::current_exe()
        .and_then(|p| p.canonicalize())
        .map_err(|e| format!("cannot find this binary's path: {e}"))?;
    let mut serve = vec![
        "serve".to_string(),
        "--mode uds".into(),
        "--socket-path /run/zeusd/zeusd.sock".into(),
        "--socket-permissions 660".into(),
        "--state-dir /var/lib/zeusd".into(),
    ];
    if let Some(g) = &args.socket_group {
        serve.push(format!("--socket-gid {}", group_gid(g)?));
    }
    serve.extend(args.serve_args.iter().cloned());
    let access = match &args.socket_group {
        Some(g) => format!("members of group {g}"),
        None => "root only (zeusd unit --socket-group <group> admits a group)".into(),
    };
    Ok(format!(
        "[Unit]
Description=zeusd: GPU settings and CPU energy daemon (Zeus 0.16 zeusd API)
After=network.target

[Service]
Type=simple
# Written by `zeusd unit`. Socket: {access}.
ExecStart={exe} {serve}
RuntimeDirectory=zeusd
RuntimeDirectoryMode=0755
StateDirectory=zeusd
StateDirectoryMode=0700
# zeusd caps each client at 64 connections and all at 768; descriptors to spare for restores.
LimitNOFILE=4096
# SIGTERM lets zeusd put back every GPU setting it still holds before it exits.
KillSignal=SIGTERM
TimeoutStopSec=10
Restart=on-failure

[Install]
WantedBy=multi-user.target
",
        exe = exe.display(),
        serve = serve.join(" "),
    ))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Token {
            command: TokenCommand::Issue(args),
        } => issue(&args).map(|t| println!("{t}")),
        Command::Unit(args) => unit(&args).map(|u| print!("{u}")),
        Command::Serve(args) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the runtime: {e}"))
            .and_then(|rt| rt.block_on(serve::run(args))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zeusd: error: {e}");
            ExitCode::from(1)
        }
    }
}
