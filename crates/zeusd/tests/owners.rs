//! Settings held on behalf of clients: restored when the client dies, 409 when another live
//! client holds them, adopted or restored across a SIGKILLed daemon, leases over TCP.
//!
//! A client is a `python3` child that sends one request over the socket, prints the status and
//! body on one line, and then sleeps until it is killed.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{daemon, Addr, Daemon};

const ORIGINAL_MW: u64 = 300_000;

const CLIENT: &str = r#"
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(("POST %s HTTP/1.1\r\nHost: zeusd\r\nContent-Length: 0\r\nConnection: close\r\n\r\n" % sys.argv[2]).encode())
raw = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    raw += chunk
head, _, body = raw.decode().partition("\r\n\r\n")
print(head.split()[1], body.replace("\n", " "), flush=True)
time.sleep(600)
"#;

/// A client process that made one request and stays alive; killed on drop.
struct Client {
    child: Child,
    status: u16,
    body: serde_json::Value,
}

impl Client {
    fn post(sock: &Path, target: &str) -> Client {
        let mut child = Command::new("python3")
            .args(["-c", CLIENT])
            .arg(sock)
            .arg(target)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 is needed for these tests");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let (status, body) = line.trim().split_once(' ').unwrap_or((line.trim(), ""));
        Client {
            status: status.parse().unwrap_or_else(|_| panic!("{line:?}")),
            body: serde_json::from_str(body).unwrap_or(serde_json::Value::Null),
            child,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Poll until `cond` holds, at most `limit`; how long it took.
fn within(limit: Duration, mut cond: impl FnMut() -> bool) -> Option<Duration> {
    let t0 = Instant::now();
    loop {
        if cond() {
            return Some(t0.elapsed());
        }
        if t0.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn set_limit(mw: u64) -> String {
    format!("/gpu/set_power_limit?gpu_ids=0&power_limit_mw={mw}")
}

fn journaled(d: &Daemon) -> Vec<String> {
    match std::fs::read_dir(d.dir.path().join("state")) {
        Ok(rd) => rd
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with("power-limit-"))
            .collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn a_killed_clients_power_limit_is_restored_within_a_second() {
    let d = daemon().start();
    let mut c = Client::post(d.sock(), &set_limit(200_000));
    assert_eq!(c.status, 200, "{}", c.body);
    assert_eq!(d.power_limit(0, None), 200_000);
    let journal = std::fs::read_to_string(
        d.dir
            .path()
            .join("state")
            .join(journaled(&d).first().expect("journaled")),
    )
    .unwrap();
    let entry: serde_json::Value = serde_json::from_str(&journal).unwrap();
    assert_eq!(
        entry["holders"][0]["pid"].as_u64(),
        Some(u64::from(c.pid())),
        "the client is the holder: {journal}"
    );
    c.kill();
    let took = within(Duration::from_secs(1), || {
        d.power_limit(0, None) == ORIGINAL_MW
    });
    assert!(took.is_some(), "not restored within 1 s: {}", d.stderr());
    // `--nocapture` shows it: milliseconds when the pidfd wakes the watcher.
    eprintln!("restored within {:?} of the kill", took.unwrap());
    assert!(journaled(&d).is_empty());
    assert!(
        within(Duration::from_secs(1), || d.stderr().contains("exited")).is_some(),
        "{}",
        d.stderr()
    );
}

#[test]
fn a_client_that_exited_but_was_not_waited_for_is_restored() {
    // Launchers do not always reap a killed job at once; the zombie holds nothing.
    let d = daemon().start();
    let mut c = Client::post(d.sock(), &set_limit(200_000));
    assert_eq!(c.status, 200, "{}", c.body);
    c.child.kill().unwrap();
    let took = within(Duration::from_secs(1), || {
        d.power_limit(0, None) == ORIGINAL_MW
    });
    assert!(
        Path::new(&format!("/proc/{}", c.pid())).exists(),
        "not waited for yet"
    );
    assert!(took.is_some(), "not restored within 1 s: {}", d.stderr());
    c.kill();
}

#[test]
fn a_conflicting_write_gets_409_and_the_last_holder_out_restores() {
    let d = daemon().start();
    let mut a = Client::post(d.sock(), &set_limit(200_000));
    assert_eq!(a.status, 200, "{}", a.body);
    let b = Client::post(d.sock(), &set_limit(150_000));
    assert_eq!(b.status, 409, "{}", b.body);
    assert_eq!(
        b.body["conflicts"][0]["holders"][0]["pid"].as_u64(),
        Some(u64::from(a.pid())),
        "{}",
        b.body
    );
    assert!(b.body["errors"]["0"]
        .as_str()
        .unwrap()
        .contains(&format!("pid {}", a.pid())));
    assert_eq!(d.power_limit(0, None), 200_000, "A's setting stands");
    // The same value joins A as a holder.
    let mut b = Client::post(d.sock(), &set_limit(200_000));
    assert_eq!(b.status, 200, "{}", b.body);
    // A may not be outvoted now either way: B holds 200 W too.
    let (st, _) = d.post(&set_limit(100_000));
    assert_eq!(st, 409);
    a.kill();
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(d.power_limit(0, None), 200_000, "B still holds it");
    assert_eq!(journaled(&d).len(), 1);
    b.kill();
    assert!(
        within(Duration::from_secs(1), || d.power_limit(0, None)
            == ORIGINAL_MW)
        .is_some(),
        "{}",
        d.stderr()
    );
    assert!(journaled(&d).is_empty());
}

#[test]
fn a_reset_releases_only_the_callers_hold() {
    let d = daemon().start();
    let lock = "/gpu/set_gpu_locked_clocks?gpu_ids=0&min_clock_mhz=900&max_clock_mhz=1200";
    let mut a = Client::post(d.sock(), lock);
    assert_eq!(a.status, 200, "{}", a.body);
    // Another client may not reset (or change) what A locked...
    let b = Client::post(d.sock(), "/gpu/reset_gpu_locked_clocks?gpu_ids=0");
    assert_eq!(b.status, 409, "{}", b.body);
    let (st, body) =
        d.post("/gpu/set_gpu_locked_clocks?gpu_ids=0&min_clock_mhz=300&max_clock_mhz=600");
    assert_eq!(st, 409, "{body}");
    // ...but may join it (this test process is the second client).
    let (st, body) = d.post(lock);
    assert_eq!(st, 200, "{body}");
    let state = d.dir.path().join("state");
    let has_clocks = || {
        std::fs::read_dir(&state).unwrap().any(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("clocks-")
        })
    };
    a.kill();
    std::thread::sleep(Duration::from_millis(600));
    assert!(has_clocks(), "this process still holds the lock");
    // The last holder's reset releases and unlocks.
    let (st, body) = d.post("/gpu/reset_gpu_locked_clocks?gpu_ids=0");
    assert_eq!(st, 200, "{body}");
    assert!(!has_clocks());
}

/// Start a second daemon on `d`'s directory and socket (the first must be gone).
fn restart(d: &mut Daemon) -> std::path::PathBuf {
    let _ = d.child.kill();
    let _ = d.child.wait();
    let sock = d.sock().to_path_buf();
    let stderr = d.dir.path().join("stderr2");
    let mut cmd = daemon().command(d.dir.path());
    cmd.args(["--mode", "uds", "--socket-path"])
        .arg(&sock)
        .stderr(std::fs::File::create(&stderr).unwrap());
    d.child = cmd.spawn().unwrap();
    let up = within(Duration::from_secs(10), || {
        std::os::unix::net::UnixStream::connect(&sock).is_ok()
    });
    assert!(up.is_some(), "daemon did not restart");
    stderr
}

#[test]
fn after_a_daemon_sigkill_dead_clients_are_restored_and_live_ones_adopted() {
    let mut d = daemon().start();
    let mut dead = Client::post(d.sock(), &set_limit(200_000));
    assert_eq!(dead.status, 200, "{}", dead.body);
    let mut alive = Client::post(
        d.sock(),
        "/gpu/set_power_limit?gpu_ids=1&power_limit_mw=200000",
    );
    assert_eq!(alive.status, 200, "{}", alive.body);
    // SIGKILL: nothing is restored, the journal keeps both entries.
    let _ = d.child.kill();
    let _ = d.child.wait();
    dead.kill();
    assert_eq!(journaled(&d).len(), 2);
    let stderr = restart(&mut d);
    let log = std::fs::read_to_string(&stderr).unwrap();
    assert!(log.contains("startup restore: GPU 0"), "{log}");
    assert!(
        log.contains(&format!(
            "adopted GPU 1's power limit held by live process {}",
            alive.pid()
        )),
        "{log}"
    );
    assert_eq!(journaled(&d).len(), 1, "the live client's entry stays");
    // The adopted client is watched like any other.
    alive.kill();
    assert!(
        within(Duration::from_secs(1), || journaled(&d).is_empty()).is_some(),
        "{}",
        std::fs::read_to_string(&stderr).unwrap()
    );
}

/// One request over TCP with extra headers; (status, body).
fn tcp_req(d: &Daemon, method: &str, target: &str, headers: &str) -> (u16, serde_json::Value) {
    let Addr::Tcp(a) = &d.addr else { panic!() };
    let mut s = std::net::TcpStream::connect(a).unwrap();
    write!(
        s,
        "{method} {target} HTTP/1.1\r\nHost: zeusd\r\n{headers}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let body = raw.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
    (
        raw[9..12].parse().unwrap(),
        serde_json::from_str(body).unwrap_or(serde_json::Value::Null),
    )
}

#[test]
fn a_tcp_clients_settings_last_as_long_as_its_lease() {
    let d = daemon().tcp().arg("--tcp-lease-seconds").arg("0.6").start();
    let job = "X-Zeusd-Client: job-1\r\n";
    let (st, body) = tcp_req(&d, "POST", &set_limit(200_000), job);
    assert_eq!(st, 200, "{body}");
    // Another TCP client (another key) conflicts.
    let (st, body) = tcp_req(&d, "POST", &set_limit(150_000), "X-Zeusd-Client: job-2\r\n");
    assert_eq!(st, 409, "{body}");
    assert_eq!(body["conflicts"][0]["holders"][0]["client"], "client=job-1");
    // Renewals keep it past several lease lengths.
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(300));
        let (st, body) = tcp_req(&d, "POST", "/client/renew_lease", job);
        assert_eq!(st, 200, "{body}");
        assert_eq!(body["client"], "client=job-1");
        assert_eq!(body["holds"], 1);
    }
    assert_eq!(d.power_limit(0, None), 200_000);
    // Silence: the lease lapses and the original comes back.
    assert!(
        within(Duration::from_secs(2), || d.power_limit(0, None)
            == ORIGINAL_MW)
        .is_some(),
        "{}",
        d.stderr()
    );
    // The log line follows the restore.
    assert!(
        within(Duration::from_secs(1), || d
            .stderr()
            .contains("lease lapsed"))
        .is_some(),
        "{}",
        d.stderr()
    );
}

/// Open `GET /client/hold` over TCP as `headers`' client; the stream and its first event.
fn open_hold(d: &Daemon, headers: &str) -> (BufReader<std::net::TcpStream>, serde_json::Value) {
    let Addr::Tcp(a) = &d.addr else { panic!() };
    let mut s = std::net::TcpStream::connect(a).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /client/hold HTTP/1.1\r\nHost: zeusd\r\n{headers}\r\n"
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
    let event = next_event(&mut r);
    (r, event)
}

/// The next `data:` event of an event stream (chunked framing lines are skipped).
fn next_event(r: &mut BufReader<std::net::TcpStream>) -> serde_json::Value {
    loop {
        let mut line = String::new();
        assert!(r.read_line(&mut line).unwrap() > 0, "the stream ended");
        if let Some(data) = line.strip_prefix("data: ") {
            return serde_json::from_str(data.trim()).unwrap();
        }
    }
}

#[test]
fn a_tcp_clients_hold_connection_keeps_its_lease_and_its_close_ends_it_within_a_second_or_so() {
    // The lease is long (the default minute): only the connection can end the hold quickly.
    let d = daemon().tcp().start();
    let job = "X-Zeusd-Client: job-1\r\n";
    let (st, body) = tcp_req(&d, "POST", &set_limit(200_000), job);
    assert_eq!(st, 200, "{body}");
    let (mut hold, first) = open_hold(&d, job);
    assert_eq!(first["client"], "client=job-1", "{first}");
    assert_eq!(first["holds"], 1, "{first}");
    assert_eq!(first["lease_seconds"], 60.0, "{first}");
    // Heartbeats keep coming.
    for _ in 0..3 {
        assert_eq!(next_event(&mut hold)["holds"], 1);
    }
    // A dropped connection the client replaces at once keeps the hold.
    drop(hold);
    let (mut hold, _) = open_hold(&d, job);
    let kept_until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < kept_until {
        assert_eq!(next_event(&mut hold)["holds"], 1);
    }
    assert_eq!(d.power_limit(0, None), 200_000, "{}", d.stderr());
    // The client goes away (its kernel closes the socket): the original is back in about a
    // second, though the lease had most of a minute left.
    let closed = Instant::now();
    drop(hold);
    let took = within(Duration::from_secs(3), || {
        d.power_limit(0, None) == ORIGINAL_MW
    });
    assert!(took.is_some(), "{}", d.stderr());
    assert!(
        closed.elapsed() >= Duration::from_millis(900),
        "before the grace ended"
    );
    assert!(
        within(Duration::from_secs(1), || d
            .stderr()
            .contains("hold connection closed"))
        .is_some(),
        "{}",
        d.stderr()
    );
}

#[test]
fn a_unix_socket_client_is_held_by_its_process_not_a_hold_connection() {
    let d = daemon().start();
    let (st, body) = d.get("/client/hold");
    assert_eq!(st, 400, "{body}");
    assert!(body.to_string().contains("Unix-socket"), "{body}");
}

#[test]
fn sigterm_restores_what_live_clients_hold() {
    let mut d = daemon().start();
    let c = Client::post(d.sock(), &set_limit(200_000));
    assert_eq!(c.status, 200, "{}", c.body);
    let st = Command::new("kill")
        .args(["-TERM", &d.child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let exited = within(Duration::from_secs(5), || {
        matches!(d.child.try_wait(), Ok(Some(_)))
    });
    assert!(exited.is_some(), "daemon did not stop");
    assert!(journaled(&d).is_empty(), "{}", d.stderr());
    assert!(d.stderr().contains("daemon stopping"), "{}", d.stderr());
}

/// The Python that uid 65534 can run through `setpriv` (not one installed under root's home,
/// as pyenv's is); `None` unless this test runs as root with `setpriv` at hand.
fn other_users_python() -> Option<&'static str> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root || Command::new("setpriv").arg("--help").output().is_err() {
        return None;
    }
    Some(if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    })
}

const FLOOD: &str = r#"
import resource, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held = []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(sys.argv[1])
        held.append(s)
    except OSError:
        s.close()
print(len(held), flush=True)
time.sleep(600)
"#;

/// Another local user (uid 65534, through `setpriv`) opens 1,100 silent connections to the
/// socket: a new client still gets answers, and a client killed meanwhile is restored within a
/// second (each uid holds at most 64 connections; the rest are closed at once).
#[test]
fn silent_connections_from_another_user_stall_no_one() {
    let Some(python) = other_users_python() else {
        eprintln!("skipped: needs root and setpriv to act as another user");
        return;
    };
    // The socket open to every local user (upstream's default): the attacker can connect.
    let d = daemon()
        .nofile(1024)
        .arg("--socket-permissions")
        .arg("666")
        .start();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(d.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut c = Client::post(d.sock(), &set_limit(200_000));
    assert_eq!(c.status, 200, "{}", c.body);
    let mut flood = Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            python,
            "-c",
            FLOOD,
        ])
        .arg(d.sock())
        .arg("1100")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(flood.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    eprintln!("the other user connected {} times", line.trim());
    // A new client is answered while the flood holds its connections.
    assert_eq!(d.power_limit(0, None), 200_000);
    c.kill();
    let took = within(Duration::from_secs(1), || {
        d.power_limit(0, None) == ORIGINAL_MW
    });
    let _ = flood.kill();
    let _ = flood.wait();
    assert!(took.is_some(), "not restored within 1 s: {}", d.stderr());
    assert!(
        d.stderr().contains("uid 65534 has 64 connections open"),
        "{}",
        d.stderr()
    );
}

/// Another user writing the value a job holds does not become a co-holder (any local user
/// could then freeze the job's schedule, which could no longer change its own setting): it
/// is refused. Root may share a hold.
#[test]
fn another_user_cannot_join_a_hold() {
    let Some(python) = other_users_python() else {
        eprintln!("skipped: needs root and setpriv to act as another user");
        return;
    };
    let d = daemon().arg("--socket-permissions").arg("666").start();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(d.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let job = Client::post(d.sock(), &set_limit(200_000));
    assert_eq!(job.status, 200, "{}", job.body);
    let out = Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            python,
            "-c",
        ])
        .arg(CLIENT.replace("time.sleep(600)", ""))
        .arg(d.sock())
        .arg(set_limit(200_000))
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(
        line.starts_with("409"),
        "{line} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(d.power_limit(0, None), 200_000);
    let again = Client::post(d.sock(), &set_limit(200_000));
    assert_eq!(again.status, 200, "root may share a hold: {}", again.body);
}
