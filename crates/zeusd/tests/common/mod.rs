//! The daemon as a child binary on simulated GPUs (and CPUs), spoken to with raw HTTP/1.1 over
//! its Unix socket or TCP. Its stderr goes to a file the tests read (the write log).

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const KEY: &str = "a signing key of more than 16 bytes\n";

pub enum Addr {
    Uds(PathBuf),
    Tcp(String),
}

pub struct Daemon {
    pub child: Child,
    pub addr: Addr,
    pub dir: tempfile::TempDir,
    stderr: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A connected stream either way.
pub enum Conn {
    Uds(UnixStream),
    Tcp(TcpStream),
}

impl Read for Conn {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Uds(s) => s.read(b),
            Conn::Tcp(s) => s.read(b),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Uds(s) => s.write(b),
            Conn::Tcp(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub struct Builder {
    args: Vec<String>,
    env: Vec<(String, String)>,
    tcp: bool,
    key: bool,
    nofile: Option<u64>,
}

pub fn daemon() -> Builder {
    Builder {
        args: Vec::new(),
        env: vec![
            ("ZEUS_GPU_BACKEND".into(), "sim".into()),
            ("ZEUS_SIM_CLOCK".into(), "virtual".into()),
            ("ZEUS_SIM_GPUS".into(), "A40,V100".into()),
            ("ZEUS_SIM_CPUS".into(), "1".into()),
        ],
        tcp: false,
        key: false,
        nofile: None,
    }
}

impl Builder {
    pub fn arg(mut self, a: &str) -> Builder {
        self.args.push(a.into());
        self
    }
    pub fn env(mut self, k: &str, v: &str) -> Builder {
        self.env.retain(|(key, _)| key != k);
        self.env.push((k.into(), v.into()));
        self
    }
    pub fn no_env(mut self, k: &str) -> Builder {
        self.env.retain(|(key, _)| key != k);
        self
    }
    pub fn tcp(mut self) -> Builder {
        self.tcp = true;
        self
    }
    /// Run with at most `n` open descriptors (systemd's default is 1,024).
    pub fn nofile(mut self, n: u64) -> Builder {
        self.nofile = Some(n);
        self
    }
    /// Auth on, with [`KEY`] in `<dir>/key`.
    pub fn auth(mut self) -> Builder {
        self.key = true;
        self
    }

    pub fn command(&self, dir: &Path) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_zeusd"));
        c.arg("serve").arg("--state-dir").arg(dir.join("state"));
        if self.key {
            std::fs::write(dir.join("key"), KEY).unwrap();
            c.arg("--signing-key-path").arg(dir.join("key"));
        }
        c.args(&self.args);
        if let Some(n) = self.nofile {
            use std::os::unix::process::CommandExt;
            // SAFETY: only setrlimit (async-signal-safe) runs between fork and exec.
            unsafe {
                c.pre_exec(move || {
                    let lim = libc::rlimit {
                        rlim_cur: n,
                        rlim_max: n,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        c.env_remove("ZEUS_SIM_CPUS");
        c.env_remove("ZEUS_SIM_PRIVILEGED");
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }

    pub fn start(self) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let mut c = self.command(dir.path());
        let addr = if self.tcp {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let a = format!("127.0.0.1:{port}");
            c.args(["--mode", "tcp", "--tcp-bind-address", &a]);
            Addr::Tcp(a)
        } else {
            let sock = dir.path().join("zeusd.sock");
            c.args(["--mode", "uds", "--socket-path"]).arg(&sock);
            Addr::Uds(sock)
        };
        let stderr = dir.path().join("stderr");
        c.stderr(std::fs::File::create(&stderr).unwrap());
        let child = c.spawn().unwrap();
        let mut d = Daemon {
            child,
            addr,
            dir,
            stderr,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while d.connect().is_err() {
            if let Ok(Some(st)) = d.child.try_wait() {
                panic!("daemon exited with {st}: {}", d.stderr());
            }
            assert!(Instant::now() < deadline, "daemon did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }
}

impl Daemon {
    /// A connection whose reads give up after 30 s: a daemon that stops answering fails the
    /// test instead of hanging it.
    pub fn connect(&self) -> std::io::Result<Conn> {
        let patience = Some(Duration::from_secs(30));
        match &self.addr {
            Addr::Uds(p) => UnixStream::connect(p).and_then(|s| {
                s.set_read_timeout(patience)?;
                Ok(Conn::Uds(s))
            }),
            Addr::Tcp(a) => TcpStream::connect(a).and_then(|s| {
                s.set_read_timeout(patience)?;
                Ok(Conn::Tcp(s))
            }),
        }
    }

    pub fn sock(&self) -> &Path {
        match &self.addr {
            Addr::Uds(p) => p,
            Addr::Tcp(_) => panic!("not a socket daemon"),
        }
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    pub fn key_path(&self) -> PathBuf {
        self.dir.path().join("key")
    }

    /// One request (optionally with a bearer token); (status, body).
    pub fn req(&self, method: &str, target: &str, token: Option<&str>) -> (u16, String) {
        let mut s = self.connect().unwrap();
        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        write!(
            s,
            "{method} {target} HTTP/1.1\r\nHost: zeusd\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let raw = String::from_utf8_lossy(&raw).into_owned();
        let status = raw[9..12].parse().unwrap();
        let body = raw.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
        (status, body.to_string())
    }

    pub fn get(&self, target: &str) -> (u16, serde_json::Value) {
        let (st, body) = self.req("GET", target, None);
        (
            st,
            serde_json::from_str(&body).unwrap_or(serde_json::Value::Null),
        )
    }

    pub fn post(&self, target: &str) -> (u16, serde_json::Value) {
        let (st, body) = self.req("POST", target, None);
        (
            st,
            serde_json::from_str(&body).unwrap_or(serde_json::Value::Null),
        )
    }

    pub fn power_limit(&self, gpu: usize, token: Option<&str>) -> u64 {
        let (st, body) = self.req("GET", &format!("/gpu/get_power_limit?gpu_ids={gpu}"), token);
        assert_eq!(st, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v[gpu.to_string()]["power_limit_mw"].as_u64().unwrap()
    }

    /// `zeusd token issue` with this daemon's key.
    pub fn token(&self, user: &str, scope: &str, expires: &str) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_zeusd"))
            .args(["token", "issue", "--signing-key-path"])
            .arg(self.key_path())
            .args(["--user", user, "--scope", scope, "--expires", expires])
            .stderr(Stdio::inherit())
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }
}
