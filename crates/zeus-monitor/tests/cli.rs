//! End-to-end runs of the `zeus-monitor` binary against the simulated GPU.

use std::process::{Command, Stdio};
use std::time::Duration;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_zeus-monitor"));
    c.env("ZEUS_GPU_BACKEND", "sim")
        .env("ZEUS_SIM_GPUS", "A40,V100")
        .env_remove("ZEUS_SIM_CLOCK")
        .env_remove("CUDA_VISIBLE_DEVICES");
    c
}

/// `YYYY-MM-DD HH:MM:SS.nnnnnnnnn,<mW>`
fn is_reference_row(line: &str) -> bool {
    let Some((time, power)) = line.split_once(',') else {
        return false;
    };
    let b = time.as_bytes();
    time.len() == 29
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b' '
        && b[13] == b':'
        && b[16] == b':'
        && b[19] == b'.'
        && time
            .chars()
            .enumerate()
            .all(|(i, c)| [4, 7, 10, 13, 16, 19].contains(&i) || c.is_ascii_digit())
        && power.parse::<u32>().is_ok_and(|p| p > 0)
}

#[test]
fn reference_form_writes_rows_for_the_duration() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.csv");
    let out = bin().arg(&path).args(["0.5", "10"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "Time,Power");
    // 0.5 s at 10 ms sleep + poll time: about 50 rows.
    assert!(
        (25..=51).contains(&(lines.len() - 1)),
        "{} rows",
        lines.len() - 1
    );
    assert!(lines[1..].iter().all(|l| is_reference_row(l)), "{text}");
    let summary = String::from_utf8_lossy(&out.stderr);
    assert!(summary.contains("[ZeusMonitor] Wrote"), "{summary}");
}

#[test]
fn sigterm_keeps_every_row_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.csv");
    let child = bin()
        .arg(&path)
        .args(["0", "1"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(400));
    // SAFETY: plain kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.ends_with('\n'), "last row is complete");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() > 20, "{} rows", lines.len());
    assert!(lines[1..].iter().all(|l| is_reference_row(l)));
    let summary = String::from_utf8_lossy(&out.stderr);
    assert!(summary.contains("SIGTERM"), "{summary}");
    assert!(
        summary.contains(&format!("Wrote {} samples", lines.len() - 1)),
        "{summary}"
    );
}

#[test]
fn extras_several_gpus_energy_jsonl_stdout() {
    let out = bin()
        .args(["-", "0.1", "--interval", "10", "--gpus", "1,0", "--energy"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "Time,Power1,Power0,Energy1,Energy0");
    let last: Vec<&str> = lines.last().unwrap().split(',').collect();
    assert_eq!(last.len(), 5);
    assert!(last[3].parse::<u64>().unwrap() > 0);

    let out = bin()
        .args([
            "-",
            "0.05",
            "--interval",
            "10",
            "--format",
            "jsonl",
            "--energy",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let first = String::from_utf8(out.stdout).unwrap();
    let v: serde_json::Value = serde_json::from_str(first.lines().next().unwrap()).unwrap();
    assert!(v["power_mw"]["0"].as_u64().unwrap() > 0);
    assert!(v["energy_mj"]["0"].is_u64());
    assert!(v["unix_time"].as_f64().unwrap() > 1e9);
}

#[test]
fn bad_arguments_are_usage_errors() {
    for args in [
        vec![],
        vec!["out.csv", "abc", "10"],
        vec!["out.csv", "-1", "10"],
        vec!["out.csv", "1"],
        vec!["out.csv", "1", "10", "9"],
        vec!["out.csv", "1", "--interval", "0"],
        vec!["out.csv", "1", "10", "--format", "xml"],
    ] {
        let out = bin().args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("error:"), "{args:?}: {err}");
    }
}

#[test]
fn bad_numbers_leave_an_existing_file_untouched_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keep.csv");
    let p = path.to_str().unwrap();
    for args in [
        vec![p, "1e20", "100"],
        vec![p, "-3", "100"],
        vec![p, "inf", "100"],
        vec![p, "1", "--interval", "1e-9"],
        vec![p, "1", "--interval", "1e-300"],
        vec![p, "1", "--interval", "1e300"],
        vec![p, "1", "--interval", "nan"],
        vec![p, "1", "18446744073709551615"],
        vec![p, "1", "10", "--gpus", "0,0"],
    ] {
        std::fs::write(&path, "Time,Power\nprecious\n").unwrap();
        let out = bin().args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("error:"), "{args:?}: {err}");
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "Time,Power\nprecious\n",
            "{args:?}"
        );
    }
    let out = bin()
        .args([p, "1", "10", "--gpus", "1,1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("GPU index 1 appears twice"), "{err}");
    let out = bin().args([p, "-3", "100"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("DURATION") && err.contains("-3"), "{err}");
}

#[test]
fn energy_on_a_gpu_without_a_counter_names_the_gpu_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p100.csv");
    let out = bin()
        .env("ZEUS_SIM_GPUS", "A40,P100")
        .args([
            path.to_str().unwrap(),
            "1",
            "10",
            "--gpus",
            "0,1",
            "--energy",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("GPU 1") && err.contains("P100"), "{err}");
    assert!(!path.exists(), "nothing written");
}
