//! The rest of the zeusd API over the socket and TCP: new endpoints' shapes, block=false,
//! per-GPU errors, API groups, auth, the write log.

mod common;

use std::time::{Duration, Instant};

use common::daemon;
use serde_json::Value;

#[test]
fn discover_lists_groups_gpus_and_cpus() {
    let d = daemon().start();
    let (st, v) = d.get("/discover");
    assert_eq!(st, 200);
    assert_eq!(
        v["enabled_api_groups"],
        serde_json::json!(["gpu-control", "gpu-read", "cpu-read"])
    );
    assert_eq!(v["auth_required"], false);
    let g = &v["gpus"][1];
    assert_eq!(g["id"], 1);
    assert!(g["name"].as_str().unwrap().contains("V100"), "{g}");
    assert_eq!(g["pci_address"], "00000000:02:00.0", "{g}");
    assert_eq!(g["cumulative_energy_available"], true);
    assert_eq!(v["cpus"][0]["id"], 0);
    assert!(v["cpus"][0]["dram_available"].is_boolean());
}

#[test]
fn resets_and_persistence_over_tcp() {
    let d = daemon().tcp().start();
    for path in [
        "/gpu/set_gpu_locked_clocks?gpu_ids=0,1&min_clock_mhz=900&max_clock_mhz=1200",
        "/gpu/reset_gpu_locked_clocks?gpu_ids=0,1",
        "/gpu/set_mem_locked_clocks?gpu_ids=0&min_clock_mhz=1&max_clock_mhz=100000",
        "/gpu/reset_mem_locked_clocks?gpu_ids=0",
        "/gpu/set_mem_locked_clocks?gpu_ids=0&min_clock_mhz=1&max_clock_mhz=100000",
        "/gpu/reset_locked_clocks?gpu_ids=0,1&block=true",
    ] {
        let (st, v) = d.post(path);
        assert_eq!(st, 200, "{path}: {v}");
    }
    // The V100 cannot lock memory clocks: NotSupported is a 400 for that GPU alone.
    let (st, v) = d.post("/gpu/reset_mem_locked_clocks?gpu_ids=0,1");
    assert_eq!(st, 400, "{v}");
    assert!(
        v["errors"].get("0").is_none() && v["errors"]["1"].is_string(),
        "{v}"
    );
    let (st, v) = d.get("/gpu/get_persistence_mode");
    assert_eq!(st, 200);
    assert_eq!(v["0"]["enabled"], false);
    assert_eq!(v["1"]["enabled"], false);
    let (st, _) = d.post("/gpu/set_persistence_mode?gpu_ids=1&enabled=true");
    assert_eq!(st, 200);
    let (_, v) = d.get("/gpu/get_persistence_mode?gpu_ids=1");
    assert_eq!(v["1"]["enabled"], true);
    assert!(v.get("0").is_none());
    let (st, v) = d.post("/gpu/set_persistence_mode?gpu_ids=1");
    assert_eq!(st, 400);
    assert!(v["error"].as_str().unwrap().contains("enabled"), "{v}");
}

#[test]
fn block_false_returns_at_once_and_applies() {
    let d = daemon().start();
    let (st, _) = d.post("/gpu/set_power_limit?gpu_ids=0&power_limit_mw=150000&block=false");
    assert_eq!(st, 200);
    let deadline = Instant::now() + Duration::from_secs(5);
    while d.power_limit(0, None) != 150_000 {
        assert!(Instant::now() < deadline, "block=false write never applied");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (st, v) = d.post("/gpu/set_power_limit?gpu_ids=0&power_limit_mw=1&block=maybe");
    assert_eq!(st, 400);
    assert!(v["error"].as_str().unwrap().starts_with("block"), "{v}");
    assert_eq!(d.power_limit(0, None), 150_000);
}

#[test]
fn per_gpu_errors_take_the_worst_status() {
    // Unprivileged: an in-range limit is NoPermission (403), an out-of-range one 400.
    let d = daemon().env("ZEUS_SIM_PRIVILEGED", "0").start();
    let before = (d.power_limit(0, None), d.power_limit(1, None));
    // 280 W is inside the A40's range and above the V100's 250 W.
    let (st, v) = d.post("/gpu/set_power_limit?gpu_ids=0,1&power_limit_mw=280000");
    assert_eq!(st, 403, "{v}");
    let errors = v["errors"].as_object().unwrap();
    assert!(errors["0"]
        .as_str()
        .unwrap()
        .contains("Insufficient Permissions"));
    assert!(errors["1"].as_str().unwrap().contains("250000"), "{v}");
    assert_eq!((d.power_limit(0, None), d.power_limit(1, None)), before);
}

#[test]
fn partial_failure_changes_only_the_good_gpu() {
    let d = daemon().start();
    let (st, v) = d.post("/gpu/set_power_limit?gpu_ids=0,1&power_limit_mw=280000");
    assert_eq!(st, 400, "{v}");
    assert!(v["errors"].get("0").is_none());
    assert!(v["errors"]["1"].is_string());
    assert_eq!(d.power_limit(0, None), 280_000);
}

#[test]
fn reads_default_to_all_gpus_and_check_gpu_ids() {
    let d = daemon().start();
    let (st, v) = d.get("/gpu/get_power_limit");
    assert_eq!(st, 200);
    assert!(v["0"]["power_limit_mw"].is_u64() && v["1"]["power_limit_mw"].is_u64());
    for bad in ["2", "0,0", "x", "", "0,,1"] {
        let (st, v) = d.get(&format!("/gpu/get_power?gpu_ids={bad}"));
        assert_eq!(st, 400, "gpu_ids={bad}: {v}");
        assert!(v["error"].as_str().unwrap().starts_with("gpu_ids"), "{v}");
    }
}

#[test]
fn cpu_group_shapes() {
    let d = daemon().start();
    let (st, v) = d.get("/cpu/get_cumulative_energy?cpu=true&dram=true");
    assert_eq!(st, 200, "{v}");
    let e1 = v["0"]["cpu_energy_uj"].as_u64().unwrap();
    assert!(v["0"].get("dram_energy_uj").is_some());
    let (st, v) = d.get("/cpu/get_cumulative_energy?cpu=false&dram=false");
    assert_eq!(st, 200);
    assert_eq!(v["0"]["cpu_energy_uj"], Value::Null);
    assert_eq!(v["0"]["dram_energy_uj"], Value::Null);
    for (q, name) in [
        ("cpu=true", "dram"),
        ("dram=true", "cpu"),
        ("cpu=yes&dram=true", "cpu"),
        ("cpu=true&dram=true&cpu_ids=3", "cpu_ids"),
    ] {
        let (st, v) = d.get(&format!("/cpu/get_cumulative_energy?{q}"));
        assert_eq!(st, 400, "{q}: {v}");
        assert!(v["error"].as_str().unwrap().starts_with(name), "{q}: {v}");
    }
    std::thread::sleep(Duration::from_millis(100));
    let (_, v) = d.get("/cpu/get_cumulative_energy?cpu=true&dram=false");
    assert!(
        v["0"]["cpu_energy_uj"].as_u64().unwrap() > e1,
        "energy grows"
    );
    let (st, v) = d.get("/cpu/get_power");
    assert_eq!(st, 200, "{v}");
    assert!(v["timestamp_ms"].is_u64());
    assert!(v["power_mw"]["0"]["cpu_mw"].as_u64().unwrap() > 0, "{v}");
    assert!(v["power_mw"]["0"].get("dram_mw").is_some());
}

#[test]
fn without_rapl_cpu_read_by_default_serves_no_cpus() {
    let empty = tempfile::tempdir().unwrap();
    let d = daemon()
        .no_env("ZEUS_SIM_CPUS")
        .env("ZEUS_RAPL_ROOT", empty.path().to_str().unwrap())
        .start();
    let (_, v) = d.get("/discover");
    assert_eq!(v["cpus"], serde_json::json!([]));
    let (st, v) = d.get("/cpu/get_power");
    assert_eq!(st, 400);
    assert!(v["error"].as_str().unwrap().contains("RAPL"), "{v}");
    // Asked for explicitly, a missing RAPL stops the daemon from starting.
    let dir = tempfile::tempdir().unwrap();
    let out = daemon()
        .no_env("ZEUS_SIM_CPUS")
        .env("ZEUS_RAPL_ROOT", empty.path().to_str().unwrap())
        .arg("--enable")
        .arg("gpu-read,cpu-read")
        .arg("--socket-path")
        .arg(dir.path().join("s").to_str().unwrap())
        .command(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--enable cpu-read") && err.contains("RAPL"),
        "{err}"
    );
}

#[test]
fn disabled_groups_answer_404_and_leave_gpus_alone() {
    let d = daemon().arg("--enable").arg("gpu-read").start();
    let before = d.power_limit(0, None);
    let (st, v) = d.post("/gpu/set_power_limit?gpu_ids=0&power_limit_mw=150000");
    assert_eq!(st, 404);
    assert!(v["error"].as_str().unwrap().contains("gpu-control"), "{v}");
    let (st, _) = d.get("/cpu/get_power");
    assert_eq!(st, 404);
    assert_eq!(d.power_limit(0, None), before);
    let (_, v) = d.get("/discover");
    assert_eq!(v["enabled_api_groups"], serde_json::json!(["gpu-read"]));
    assert_eq!(v["cpus"], serde_json::json!([]));
    let (st, _) = d.get("/auth/whoami");
    assert_eq!(st, 404, "whoami with auth off");
}

#[test]
fn socket_owner_and_mode_flags() {
    let uid = unsafe_ids().0;
    let gid = unsafe_ids().1;
    let d = daemon()
        .arg("--socket-permissions")
        .arg("660")
        .arg("--socket-uid")
        .arg(&uid.to_string())
        .arg("--socket-gid")
        .arg(&gid.to_string())
        .start();
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let m = std::fs::metadata(d.sock()).unwrap();
    assert_eq!(m.permissions().mode() & 0o777, 0o660);
    assert_eq!((m.uid(), m.gid()), (uid, gid));
}

/// This process's uid and gid, from /proc (the tests run unprivileged, so chown to ourselves).
fn unsafe_ids() -> (u32, u32) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| -> u32 {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    (field("Uid:"), field("Gid:"))
}

#[test]
fn write_log_names_the_peer_pid_and_subject() {
    let d = daemon().auth().start();
    let t = d.token("alice", "gpu-control,gpu-read", "1h");
    let (st, body) = d.req(
        "POST",
        "/gpu/set_power_limit?gpu_ids=0&power_limit_mw=160000",
        Some(&t),
    );
    assert_eq!(st, 200, "{body}");
    let (st, _) = d.req(
        "POST",
        "/gpu/set_power_limit?gpu_ids=0&power_limit_mw=oops",
        Some(&t),
    );
    assert_eq!(st, 400);
    let pid = format!("pid={}", std::process::id());
    let log = d.stderr();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("zeusd write")).collect();
    assert_eq!(lines.len(), 2, "{log}");
    assert!(lines[0].contains(&pid), "{log}");
    assert!(lines[0].contains("sub=alice"), "{log}");
    assert!(lines[0].contains("power_limit_mw=160000"), "{log}");
    assert!(lines[0].ends_with("-> 200 ok"), "{log}");
    assert!(lines[1].contains("-> 400 power_limit_mw"), "{log}");
}

#[test]
fn write_log_names_the_tcp_address() {
    let d = daemon().tcp().start();
    let (st, _) = d.post("/gpu/reset_locked_clocks?gpu_ids=0");
    assert_eq!(st, 200);
    let log = d.stderr();
    assert!(log.contains("zeusd write tcp=127.0.0.1:"), "{log}");
    assert!(
        log.contains("sub=- /gpu/reset_locked_clocks?gpu_ids=0 -> 200 ok"),
        "{log}"
    );
}

/// Simulated GPUs no other process can see: the daemon says so (a job would read its own
/// copy and never see the daemon's writes); shared through ZEUS_SIM_SHARED, it does not.
#[test]
fn private_simulated_gpus_are_warned_about() {
    let d = daemon().start();
    assert!(
        d.stderr().contains("only this daemon sees"),
        "{}",
        d.stderr()
    );
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("sim-gpus");
    let d = daemon()
        .env("ZEUS_SIM_CLOCK", "real")
        .env("ZEUS_SIM_SHARED", shared.to_str().unwrap())
        .start();
    assert!(
        !d.stderr().contains("only this daemon sees"),
        "{}",
        d.stderr()
    );
}

#[test]
fn a_socket_path_naming_a_regular_file_is_refused_and_the_file_kept() {
    let dir = tempfile::tempdir().unwrap();
    let precious = dir.path().join("precious");
    std::fs::write(&precious, b"keep").unwrap();
    let out = daemon()
        .command(dir.path())
        .args(["--mode", "uds", "--socket-path"])
        .arg(&precious)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("exists and is not a socket"), "{err}");
    assert_eq!(std::fs::read(&precious).unwrap(), b"keep");
}

#[test]
fn port_zero_logs_the_port_bound_and_a_readable_key_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = daemon()
        .auth()
        .command(dir.path())
        .args(["--mode", "tcp", "--tcp-bind-address", "127.0.0.1:0"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let err = child.stderr.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(err));
    let mut seen = Vec::new();
    let listening = loop {
        let line = lines.next().expect("zeusd exited").unwrap();
        seen.push(line.clone());
        if line.contains("listening on") {
            break line;
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(!listening.contains("127.0.0.1:0 "), "{listening}");
    let port: u16 = listening
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    assert_ne!(port, 0, "{listening}");
    // The test's key file is 0644.
    assert!(
        seen.iter().any(|l| l.contains("readable by other users")),
        "{seen:?}"
    );
}
