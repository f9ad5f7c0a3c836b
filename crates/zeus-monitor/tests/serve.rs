//! End-to-end runs of `zeus-monitor serve` on simulated GPUs: start it on an ephemeral port,
//! scrape over plain TCP, parse the exposition.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

fn bin(sim_gpus: &str, state: &std::path::Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_zeus-monitor"));
    c.env("ZEUS_GPU_BACKEND", "sim")
        .env("ZEUS_SIM_GPUS", sim_gpus)
        .env("ZEUS_SIM_LOAD", "busy")
        .env("ZEUS_STATE_DIR", state)
        .env_remove("ZEUS_SIM_CLOCK")
        .env_remove("ZEUS_SIM_CPUS")
        .env_remove("ZEUS_RAPL_ROOT")
        .env_remove("ZEUS_SIM_FIDELITY")
        .env_remove("CUDA_VISIBLE_DEVICES");
    c
}

/// Held shared by every exporter of these tests, and exclusively by a test that measures
/// accuracy: a dozen exporters side by side, each a sampler thread and simulated GPUs burning
/// their read costs, starve a two-core machine's samplers far beyond the two busy loops the
/// accuracy figures are checked against (issue 22 tracks what a starved sampler gets wrong).
static MACHINE: RwLock<()> = RwLock::new(());

/// A running exporter; SIGKILLed on drop if the test did not stop it.
struct Server {
    child: Child,
    addr: String,
    stderr: mpsc::Receiver<String>,
    _state: tempfile::TempDir,
    _shared: Option<RwLockReadGuard<'static, ()>>,
}

impl Server {
    fn start(sim_gpus: &str, extra: &[&str]) -> Server {
        Server::start_with(sim_gpus, extra, &[])
    }

    fn start_with(sim_gpus: &str, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let shared = MACHINE.read().unwrap_or_else(|e| e.into_inner());
        Server::spawn(sim_gpus, extra, env, Some(shared))
    }

    /// An exporter for a test that holds the machine alone (`MACHINE.write()`).
    fn start_alone(sim_gpus: &str) -> Server {
        Server::spawn(sim_gpus, &[], &[], None)
    }

    fn spawn(
        sim_gpus: &str,
        extra: &[&str],
        env: &[(&str, &str)],
        shared: Option<RwLockReadGuard<'static, ()>>,
    ) -> Server {
        let state = tempfile::tempdir().unwrap();
        let mut child = bin(sim_gpus, state.path())
            .envs(env.iter().copied())
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        // Built first, so that a panic below kills the child on drop.
        let mut server = Server {
            child,
            addr: String::new(),
            stderr: rx,
            _state: state,
            _shared: shared,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = server
                .stderr
                .recv_timeout(left)
                .expect("the exporter printed no address");
            if let Some(rest) = line.split("http://").nth(1) {
                server.addr = rest.split("/metrics").next().unwrap().to_string();
                return server;
            }
        }
    }

    fn get(&self, path: &str) -> (u16, String, String) {
        get(&self.addr, path)
    }

    /// Scrape until every GPU has an energy sample (the sampler's first anchor).
    fn ready(&self, n_gpus: usize) -> Vec<Sample> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (status, _, body) = self.get("/metrics");
            assert_eq!(status, 200, "{body}");
            let s = parse(&body);
            if by_gpu(&s, "zeus_gpu_energy_joules_total").len() == n_gpus {
                return s;
            }
            assert!(Instant::now() < deadline, "no energy after 10 s:\n{body}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn signal(&mut self, sig: i32) -> (std::process::ExitStatus, String) {
        // SAFETY: plain kill(2) on our own child.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "still running 10 s after signal {sig}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut rest = String::new();
        while let Ok(l) = self.stderr.recv_timeout(Duration::from_secs(2)) {
            rest.push_str(&l);
            rest.push('\n');
        }
        (status, rest)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET path` over a fresh connection: status, headers, body.
fn get(addr: &str, path: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_string(), body.to_string())
}

#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: HashMap<String, String>,
    value: f64,
}

/// The samples of a text exposition (label values without escapes, as ours are).
fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split("\",")
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap();
                    (k.to_string(), v.trim_matches('"').to_string())
                })
                .collect();
            Sample {
                name: name.to_string(),
                labels,
                value: value.parse().unwrap(),
            }
        })
        .collect()
}

/// `gpu` label -> value of the samples named `name` (and matching `extra` labels).
fn by_gpu_with(s: &[Sample], name: &str, extra: &[(&str, &str)]) -> HashMap<String, f64> {
    s.iter()
        .filter(|x| x.name == name)
        .filter(|x| {
            extra
                .iter()
                .all(|(k, v)| x.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|x| (x.labels["gpu"].clone(), x.value))
        .collect()
}

fn by_gpu(s: &[Sample], name: &str) -> HashMap<String, f64> {
    by_gpu_with(s, name, &[])
}

#[test]
fn metrics_have_labels_help_and_type() {
    let srv = Server::start("H100,A40", &[]);
    let samples = srv.ready(2);
    let (_, head, body) = srv.get("/metrics");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    for (name, kind) in [
        ("zeus_gpu_energy_joules_total", "counter"),
        ("zeus_gpu_power_watts", "gauge"),
        ("zeus_gpu_power_limit_watts", "gauge"),
    ] {
        assert!(body.contains(&format!("# TYPE {name} {kind}\n")), "{body}");
        assert!(body.contains(&format!("# HELP {name} ")), "{body}");
    }
    for s in &samples {
        for l in ["gpu", "uuid", "model", "vendor", "hostname"] {
            assert!(
                s.labels.get(l).is_some_and(|v| !v.is_empty()),
                "{l} missing: {s:?}"
            );
        }
        assert!(s.labels["model"].contains("Simulated"), "{s:?}");
        assert!(s.labels["uuid"].starts_with("GPU-"), "{s:?}");
        assert_eq!(s.labels["vendor"], "nvidia", "{s:?}");
    }
    let limit = by_gpu(&samples, "zeus_gpu_power_limit_watts");
    assert_eq!(limit["0"], 700.0, "H100 default limit");
    assert_eq!(limit["1"], 300.0, "A40 default limit");
    for domain in ["device_instant", "device_average"] {
        let p = by_gpu_with(&samples, "zeus_gpu_power_watts", &[("domain", domain)]);
        assert_eq!(p.len(), 2, "{domain}: {samples:?}");
        assert!(p.values().all(|w| *w > 50.0), "{domain}: {p:?}");
    }
    // No clock was locked by a zeus process: no clock series.
    assert!(!body.contains("zeus_gpu_clock_locked{"), "{body}");
    // Both GPUs are busy at their default (maximum) limits: full clocks.
    assert!(body.contains("# TYPE zeus_gpu_clock_mhz gauge\n"), "{body}");
    let clock = |c: &str| by_gpu_with(&samples, "zeus_gpu_clock_mhz", &[("clock", c)]);
    let (graphics, memory) = (clock("graphics"), clock("memory"));
    assert_eq!((graphics["0"], memory["0"]), (1980.0, 2619.0), "H100");
    assert_eq!((graphics["1"], memory["1"]), (1740.0, 7251.0), "A40");
}

#[test]
fn energy_counter_grows_at_the_simulated_power() {
    let _alone = MACHINE.write().unwrap_or_else(|e| e.into_inner());
    let srv = Server::start_alone("H100,H100");
    let first = srv.ready(2);
    let mut last = by_gpu(&first, "zeus_gpu_energy_joules_total");
    // Until the sampler has a second counter read (at the exporter's budget, ~1.4 s after the
    // first for two GPUs), when the first value was published is only known within a period
    // (100 ms on an H100), and so is the served energy: the rate is measured from a scrape
    // 2.5 s in.
    let started = Instant::now();
    let mut base: Option<(Instant, HashMap<String, f64>)> = None;
    let mut power: HashMap<String, Vec<f64>> = HashMap::new();
    let (mut e1, mut t1) = (HashMap::new(), started);
    while started.elapsed() < Duration::from_secs_f64(8.5) {
        std::thread::sleep(Duration::from_millis(200));
        let asked = Instant::now();
        let (_, _, body) = srv.get("/metrics");
        // The scrape's own moment is somewhere in [asked, answered]: its middle.
        t1 = asked + asked.elapsed() / 2;
        let s = parse(&body);
        e1 = by_gpu(&s, "zeus_gpu_energy_joules_total");
        for (g, e) in &e1 {
            assert!(
                *e >= last[g],
                "GPU {g}: the counter went back: {} -> {e}",
                last[g]
            );
        }
        last = e1.clone();
        if base.is_none() {
            if started.elapsed() >= Duration::from_secs_f64(2.5) {
                base = Some((t1, e1.clone()));
            }
            continue;
        }
        for (g, w) in by_gpu_with(&s, "zeus_gpu_power_watts", &[("domain", "device_average")]) {
            power.entry(g).or_default().push(w);
        }
    }
    let (t0, e0) = base.expect("a baseline scrape");
    let dt = (t1 - t0).as_secs_f64();
    for g in ["0", "1"] {
        let rate = (e1[g] - e0[g]) / dt;
        let watts = power[g].iter().sum::<f64>() / power[g].len() as f64;
        let err = (rate - watts).abs() / watts;
        // Per-update noise of 1% averages out over 30 readings. Known (issue 22): at this
        // budget the cache's scale can shift by up to an update of power (66 J) when a read is
        // placed anew; over 6 s that is under 2%.
        assert!(
            err < 0.03,
            "GPU {g}: counter grew at {rate:.1} W over {dt:.2} s, power reads {watts:.1} W"
        );
    }
}

/// `(cpu, domain)` -> value of `zeus_cpu_energy_joules_total`.
fn cpu_energy(s: &[Sample]) -> HashMap<(String, String), f64> {
    s.iter()
        .filter(|x| x.name == "zeus_cpu_energy_joules_total")
        .map(|x| {
            assert!(!x.labels["hostname"].is_empty(), "{x:?}");
            (
                (x.labels["cpu"].clone(), x.labels["domain"].clone()),
                x.value,
            )
        })
        .collect()
}

#[test]
fn cpu_packages_and_dram_are_exported_across_counter_wraps() {
    // An 80 J range: package 0 (60-120 W) and its DRAM (10 J, 8-14 W) wrap about once a second.
    let srv = Server::start_with(
        "H100",
        &[],
        &[("ZEUS_SIM_CPUS", "2"), ("ZEUS_SIM_RAPL_MAX_UJ", "80000000")],
    );
    let first = srv.ready(1);
    let e0 = cpu_energy(&first);
    let keys: Vec<(String, String)> = ["0", "1"]
        .iter()
        .flat_map(|c| ["package", "dram"].map(|d| (c.to_string(), d.to_string())))
        .collect();
    assert_eq!(e0.len(), 4, "{e0:?}");
    let t0 = Instant::now();
    let mut last = e0.clone();
    while t0.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(150));
        let e = cpu_energy(&parse(&srv.get("/metrics").2));
        for k in &keys {
            assert!(e[k] >= last[k], "{k:?} went back: {} -> {}", last[k], e[k]);
        }
        last = e;
    }
    let dt = t0.elapsed().as_secs_f64();
    for k in &keys {
        let watts = (last[k] - e0[k]) / dt;
        // The model's ranges (package 60-120 W, DRAM 8-14 W); a lost wrap would take 80 J
        // (27 W over 3 s) off the package's figure, 10 J (3 W) off the DRAM's.
        let (lo, hi) = if k.1 == "package" {
            (55.0, 125.0)
        } else {
            (7.0, 15.0)
        };
        assert!((lo..hi).contains(&watts), "{k:?}: {watts:.1} W");
    }
    let (status, _, body) = srv.get("/healthz");
    assert_eq!((status, body.as_str()), (200, "ok"));
}

#[test]
fn cpus_without_rapl_are_skipped_by_auto_and_refused_when_asked_for() {
    let empty = tempfile::tempdir().unwrap();
    let root = empty.path().to_str().unwrap();
    let env = [("ZEUS_RAPL_ROOT", root)];
    let srv = Server::start_with("H100", &[], &env);
    let s = srv.ready(1);
    assert!(cpu_energy(&s).is_empty());
    let state = tempfile::tempdir().unwrap();
    for asked in ["all", "0"] {
        let out = bin("H100", state.path())
            .envs(env)
            .args(["serve", "--listen", "127.0.0.1:0", "--cpus", asked])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "--cpus {asked}: {err}");
        assert!(
            err.contains("RAPL is not available") && err.contains(root),
            "{err}"
        );
    }
    let out = bin("H100", state.path())
        .args(["serve", "--cpus", "zero"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"zero\""));
}

#[test]
fn healthz_and_index() {
    let srv = Server::start("H100", &["--gpus", "0"]);
    let (status, _, body) = srv.get("/healthz");
    assert_eq!((status, body.as_str()), (200, "ok"));
    let (status, _, body) = srv.get("/");
    assert_eq!(status, 200);
    assert!(body.contains("/metrics"), "{body}");
    assert_eq!(srv.get("/nope").0, 404);
}

#[test]
fn many_concurrent_scrapers() {
    let srv = Server::start("H100,H100,H100,H100", &[]);
    srv.ready(4);
    let addr = srv.addr.clone();
    let workers: Vec<_> = (0..32)
        .map(|_| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                for _ in 0..10 {
                    let (status, _, body) = get(&addr, "/metrics");
                    assert_eq!(status, 200);
                    assert_eq!(
                        by_gpu(&parse(&body), "zeus_gpu_energy_joules_total").len(),
                        4,
                        "{body}"
                    );
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
}

#[test]
fn sigint_and_sigterm_stop_it_cleanly() {
    for (sig, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM")] {
        let mut srv = Server::start("A40", &[]);
        assert_eq!(srv.get("/healthz").0, 200);
        let (status, rest) = srv.signal(sig);
        assert!(status.success(), "{status:?} {rest}");
        assert!(rest.contains(&format!("Stopped by {name}")), "{rest}");
    }
}

#[test]
fn a_bad_listen_address_is_refused_naming_it() {
    let state = tempfile::tempdir().unwrap();
    for bad in ["localhost:9400", "127.0.0.1", "1.2.3.4:99999", "nonsense"] {
        let out = bin("A40", state.path())
            .args(["serve", "--listen", bad])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(
            err.contains(bad) && err.contains("--listen"),
            "{bad}: {err}"
        );
    }
    // A port someone else holds: exit 1, naming the address.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap().to_string();
    let out = bin("A40", state.path())
        .args(["serve", "--listen", &addr])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&addr), "{err}");
}

#[test]
fn bad_gpu_indices_are_refused() {
    let state = tempfile::tempdir().unwrap();
    for (gpus, why) in [("2", "out of range"), ("0,0", "twice")] {
        let out = bin("A40,A40", state.path())
            .args(["serve", "--listen", "127.0.0.1:0", "--gpus", gpus])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(why), "{err}");
    }
}

#[test]
fn help_mentions_serve_and_the_positional_form_still_works() {
    let state = tempfile::tempdir().unwrap();
    let out = bin("A40", state.path()).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("zeus-monitor serve"), "{text}");
    let out = bin("A40", state.path())
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("--listen"), "{text}");
    let out = bin("A40", state.path())
        .args(["-", "0.2", "20"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("Time,Power\n"));
}

#[test]
fn promtool_accepts_a_scrape() {
    let Ok(version) = Command::new("promtool").arg("--version").output() else {
        eprintln!(
            "SKIPPED promtool_accepts_a_scrape: promtool is not on PATH \
             (Debian: apt-get install prometheus)"
        );
        return;
    };
    assert!(version.status.success());
    let srv = Server::start("H100,A40", &[]);
    srv.ready(2);
    let (_, _, body) = srv.get("/metrics");
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    check
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool: {out:?}\n{body}"
    );
}

#[test]
fn clocks_a_zeus_process_locked_are_exposed_until_restored() {
    use zeus_core::device::settings::{Journal, SettingsGuard};
    use zeus_core::device::sim::{preset, SimCluster, SimConfig};
    use zeus_core::device::Gpu;

    let state = tempfile::tempdir().unwrap();
    // This test process stands for a zeus job: it locks GPU 0's graphics clocks through a
    // guard journaled in the directory the exporter reads, on the simulated GPUs it shares
    // with the exporter (ZEUS_SIM_SHARED), as two processes share a real GPU.
    let shared = state.path().join("sim-gpus");
    let cluster = SimCluster::new(SimConfig {
        presets: vec![preset::find("A40").unwrap(); 2],
        privileged: true,
        load: zeus_core::device::sim::Load::Busy,
        shared: Some(shared.clone()),
        ..SimConfig::default()
    });
    let dev = cluster.devices()[0].clone();
    let mem = dev.supported_memory_clocks().unwrap()[0];
    let graphics = dev.supported_graphics_clocks(mem).unwrap();
    let mid = graphics[graphics.len() / 2];
    let guard = SettingsGuard::new(cluster.gpus(), Journal::at(state.path()));
    guard
        .lock_gpu_clocks(0, *graphics.last().unwrap(), mid)
        .unwrap();

    let mut child = bin("A40,A40", state.path())
        .env("ZEUS_SIM_SHARED", &shared)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    // Notes (no RAPL here, say) may come before the line with the address.
    let mut addr = None;
    let mut line = String::new();
    while addr.is_none() && err.read_line(&mut line).unwrap_or(0) > 0 {
        addr = line
            .split("http://")
            .nth(1)
            .and_then(|r| r.split("/metrics").next())
            .map(str::to_string);
        line.clear();
    }
    let scrape = |addr: &str| parse(&get(addr, "/metrics").2);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let addr = addr.expect("the exporter printed its address");
        let s = scrape(&addr);
        let uuid0 = s
            .iter()
            .find(|x| x.labels.get("gpu").map(String::as_str) == Some("0"))
            .map(|x| x.labels["uuid"].clone());
        assert_eq!(uuid0, Some(dev.uuid().unwrap()), "same simulated GPU");
        let locked = |s: &[Sample]| -> Vec<(String, String, f64)> {
            s.iter()
                .filter(|x| x.name == "zeus_gpu_clock_locked")
                .map(|x| (x.labels["gpu"].clone(), x.labels["clock"].clone(), x.value))
                .collect()
        };
        assert_eq!(locked(&s), vec![("0".into(), "graphics".into(), 1.0)]);
        let clock = |s: &[Sample]| by_gpu_with(s, "zeus_gpu_clock_mhz", &[("clock", "graphics")]);
        let before = clock(&s);
        assert_eq!(
            before["0"],
            f64::from(mid),
            "the locked GPU runs at the lock's top"
        );
        assert_eq!(
            before["1"],
            f64::from(graphics[0]),
            "the other at full clock"
        );
        guard.restore().unwrap();
        // Gone after the next refresh (once a second).
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let s = scrape(&addr);
            if locked(&s).is_empty() && clock(&s)["0"] == f64::from(graphics[0]) {
                break;
            }
            assert!(Instant::now() < deadline, "still shown 5 s after restore");
            std::thread::sleep(Duration::from_millis(100));
        }
    }));
    let _ = child.kill();
    let _ = child.wait();
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}

/// 1,100 idle connections from the scraper's own address (loopback), against systemd's default
/// 1,024 descriptors: scrapes still get answers (the address holds at most 64 connections, and
/// a newcomer displaces the longest idle one).
#[test]
fn idle_connections_do_not_starve_scrapes() {
    let srv = Server::start("H100", &["--gpus", "0"]);
    srv.ready(1);
    let lim = libc::rlimit {
        rlim_cur: 1024,
        rlim_max: 1024,
    };
    // SAFETY: prlimit on our own child with a valid struct.
    let rc = unsafe {
        libc::prlimit(
            srv.child.id() as i32,
            libc::RLIMIT_NOFILE,
            &lim,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, 0);
    let idle: Vec<TcpStream> = (0..1100)
        .filter_map(|_| TcpStream::connect(&srv.addr).ok())
        .collect();
    // Scrapes get through once the silent connections have idled long enough to be displaced
    // (a second); until then new connections past the address's allowance are refused.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut answered = 0;
    while answered < 5 {
        assert!(
            Instant::now() < deadline,
            "scrapes starved: {answered} answered"
        );
        let ok = std::panic::catch_unwind(|| srv.get("/metrics").0 == 200).unwrap_or(false);
        if ok {
            answered += 1;
        } else {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    drop(idle);
}
