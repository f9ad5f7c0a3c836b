//! The daemon as a child binary on the simulated GPU, spoken to over a real Unix socket.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

struct Daemon {
    child: Child,
    sock: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start() -> Daemon {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("zeusd.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_zeusd"))
        .args(["serve", "--mode", "uds", "--socket-path"])
        .arg(&sock)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .env("ZEUS_GPU_BACKEND", "sim")
        .env("ZEUS_SIM_CLOCK", "virtual")
        .env("ZEUS_SIM_GPUS", "A40,V100")
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while UnixStream::connect(&sock).is_err() {
        assert!(Instant::now() < deadline, "daemon did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Daemon {
        child,
        sock,
        _dir: dir,
    }
}

/// One request; returns (status, body).
fn request(sock: &Path, method: &str, target: &str) -> (u16, String) {
    let mut s = UnixStream::connect(sock).unwrap();
    write!(
        s,
        "{method} {target} HTTP/1.1\r\nHost: zeusd\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let status = raw[9..12].parse().unwrap();
    let body = raw.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
    (status, body.to_string())
}

#[test]
fn discover_and_time_shapes() {
    let d = start();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&d.sock).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o660, "default --socket-permissions");
    let (st, body) = request(&d.sock, "GET", "/discover");
    assert_eq!(st, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["gpus"].as_array().unwrap().len(), 2);
    assert!(v["gpus"][0]["name"].as_str().unwrap().contains("Simulated"));
    assert_eq!(v["auth_required"], false);
    let (st, body) = request(&d.sock, "GET", "/time");
    assert_eq!(st, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(v["timestamp_ms"].as_u64().unwrap() > 1_600_000_000_000);
}

#[test]
fn set_then_get_power_limit_and_400_names_parameter() {
    let d = start();
    let (st, _) = request(
        &d.sock,
        "POST",
        "/gpu/set_power_limit?gpu_ids=0&power_limit_mw=200000&block=true",
    );
    assert_eq!(st, 200);
    let (st, body) = request(&d.sock, "GET", "/gpu/get_power_limit?gpu_ids=0");
    assert_eq!(st, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["0"]["power_limit_mw"], 200000);
    let (st, body) = request(
        &d.sock,
        "POST",
        "/gpu/set_power_limit?gpu_ids=0&power_limit_mw=abc",
    );
    assert_eq!(st, 400);
    assert!(body.contains("power_limit_mw"));
    let (st, body) = request(&d.sock, "POST", "/gpu/set_power_limit?power_limit_mw=1");
    assert_eq!(st, 400);
    assert!(body.contains("gpu_ids"));
}

#[test]
fn read_endpoints_shapes() {
    let d = start();
    let (st, body) = request(&d.sock, "GET", "/gpu/get_power_limit_constraints?gpu_ids=1");
    assert_eq!(st, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        v["1"]["min_power_limit_mw"].as_u64().unwrap()
            < v["1"]["max_power_limit_mw"].as_u64().unwrap()
    );
    let (st, body) = request(&d.sock, "GET", "/gpu/get_power");
    assert_eq!(st, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(v["timestamp_ms"].is_u64());
    assert!(v["power_mw"]["0"].is_u64() && v["power_mw"]["1"].is_u64());
    let (st, body) = request(&d.sock, "GET", "/gpu/get_cumulative_energy?gpu_ids=0");
    assert_eq!(st, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(v["0"]["energy_mj"].is_u64());
}

#[test]
fn lock_clocks_and_400_names_clock_parameter() {
    let d = start();
    let (st, body) = request(
        &d.sock,
        "POST",
        "/gpu/set_gpu_locked_clocks?gpu_ids=0&min_clock_mhz=900&max_clock_mhz=1200&block=true",
    );
    assert_eq!(st, 200, "{body}");
    let (st, body) = request(
        &d.sock,
        "POST",
        "/gpu/set_gpu_locked_clocks?gpu_ids=0&min_clock_mhz=x&max_clock_mhz=1200",
    );
    assert_eq!(st, 400);
    assert!(body.contains("min_clock_mhz"));
    let (st, body) = request(
        &d.sock,
        "POST",
        "/gpu/set_mem_locked_clocks?gpu_ids=0&min_clock_mhz=1",
    );
    assert_eq!(st, 400);
    assert!(body.contains("max_clock_mhz"));
}

#[test]
fn tcp_mode_serves_the_same_api() {
    use std::net::{TcpListener, TcpStream};
    let dir = tempfile::tempdir().unwrap();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_zeusd"))
        .args([
            "serve",
            "--mode",
            "tcp",
            "--tcp-bind-address",
            &addr,
            "--state-dir",
        ])
        .arg(dir.path().join("state"))
        .env("ZEUS_GPU_BACKEND", "sim")
        .env("ZEUS_SIM_CLOCK", "virtual")
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut s = loop {
        if let Ok(s) = TcpStream::connect(&addr) {
            break s;
        }
        assert!(Instant::now() < deadline, "daemon did not start");
        std::thread::sleep(Duration::from_millis(20));
    };
    write!(
        s,
        "GET /time HTTP/1.1\r\nHost: zeusd\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    assert!(raw.contains("timestamp_ms"));
}
