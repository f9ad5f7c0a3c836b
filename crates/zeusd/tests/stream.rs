//! Server-sent power streams: shape and rate.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::{daemon, Daemon};
use serde_json::Value;

/// The `data:` payloads a stream sends within `secs` (HTTP/1.0, so the body is not chunked).
fn read_events(d: &Daemon, target: &str, secs: f64) -> (String, Vec<Value>) {
    let mut s = d.connect().unwrap();
    write!(s, "GET {target} HTTP/1.0\r\nHost: zeusd\r\n\r\n").unwrap();
    if let common::Conn::Uds(u) = &s {
        u.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(e) => panic!("{e}"),
        }
    }
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let events = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (head.to_string(), events)
}

/// Samples per second per device, from the events' own timestamps.
fn rates(events: &[Value], id: &str) -> BTreeMap<u64, f64> {
    let mut per: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for e in events {
        per.entry(e[id].as_u64().unwrap())
            .or_default()
            .push(e["timestamp_ms"].as_u64().unwrap());
    }
    per.into_iter()
        .map(|(k, ts)| {
            let span = (ts[ts.len() - 1] - ts[0]) as f64 / 1000.0;
            (k, (ts.len() - 1) as f64 / span)
        })
        .collect()
}

#[test]
fn gpu_stream_power_shape_and_rate() {
    let d = daemon().start();
    let (head, events) = read_events(&d, "/gpu/stream_power", 1.6);
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    assert!(
        head.to_ascii_lowercase().contains("text/event-stream"),
        "{head}"
    );
    assert!(events.len() >= 40, "{} events", events.len());
    for e in &events {
        let o = e.as_object().unwrap();
        assert_eq!(o.len(), 3, "{e}");
        assert!(e["timestamp_ms"].is_u64() && e["power_mw"].is_u64());
        assert!(e["gpu_id"] == 0 || e["gpu_id"] == 1, "{e}");
    }
    for (gpu, hz) in rates(&events, "gpu_id") {
        assert!((15.0..=25.0).contains(&hz), "GPU {gpu}: {hz} Hz");
    }
    let (_, events) = read_events(&d, "/gpu/stream_power?gpu_ids=1", 0.5);
    assert!(!events.is_empty() && events.iter().all(|e| e["gpu_id"] == 1));
}

#[test]
fn cpu_stream_power_shape_and_rate() {
    let d = daemon().start();
    let (_, events) = read_events(&d, "/cpu/stream_power", 2.1);
    assert!(events.len() >= 15, "{} events", events.len());
    for e in &events {
        assert_eq!(e["cpu_id"], 0, "{e}");
        assert!(
            e["timestamp_ms"].is_u64() && e["cpu_mw"].as_u64().unwrap() > 0,
            "{e}"
        );
        assert!(e.get("dram_mw").is_some(), "{e}");
    }
    // Each mean covers the span since the previous event's read, which it names.
    for pair in events.windows(2) {
        assert_eq!(pair[1]["since_ms"], pair[0]["timestamp_ms"], "{pair:?}");
        assert!(pair[1]["since_ms"].as_u64() <= pair[1]["timestamp_ms"].as_u64());
    }
    for (cpu, hz) in rates(&events, "cpu_id") {
        assert!((7.5..=12.5).contains(&hz), "CPU {cpu}: {hz} Hz");
    }
}

#[test]
fn stream_rejects_bad_ids_and_stops_at_shutdown() {
    let mut d = daemon().start();
    let (st, body) = d.req("GET", "/gpu/stream_power?gpu_ids=7", None);
    assert_eq!(st, 400);
    assert!(body.contains("gpu_ids"));
    // An open stream does not keep SIGTERM from stopping the daemon promptly.
    let mut s = d.connect().unwrap();
    write!(s, "GET /gpu/stream_power HTTP/1.0\r\n\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    unsafe_kill_term(d.child.id());
    let st = d.child.wait().unwrap();
    assert!(st.success(), "{st}");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
}

fn unsafe_kill_term(pid: u32) {
    let ok = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}
