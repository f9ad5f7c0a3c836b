use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use super::*;
use crate::device::sim::{preset, Load, SimCluster, SimConfig};

/// An A40 (default limit 300 W) and a V100 (no memory clock locking), with a virtual clock.
fn sim_cluster_gpus() -> (SimCluster, Gpus) {
    let cluster = SimCluster::new(SimConfig {
        presets: vec![preset::find("A40").unwrap(), preset::find("V100").unwrap()],
        virtual_clock: true,
        privileged: true,
        workload: None,
        fidelity: crate::device::sim::Fidelity::Ideal,
        load: Load::Idle,
        ..SimConfig::default()
    });
    let gpus = cluster.gpus();
    (cluster, gpus)
}

fn sim_gpus() -> Gpus {
    sim_cluster_gpus().1
}

/// Make every write to simulated GPU `index` fail from now on (reads still work).
fn refuse_writes(cluster: &SimCluster, index: usize) {
    use crate::device::sim::board::{calls, error_code, Fault};
    use crate::device::Clock;
    cluster.devices()[index].inject_fault(Fault {
        calls: calls::WRITE_ONLY,
        from: cluster.clock().now(),
        until: f64::INFINITY,
        code: error_code("UNKNOWN").unwrap(),
        gpu: None,
    });
}

fn limit(gpus: &Gpus, index: usize) -> u32 {
    gpus.device(index)
        .unwrap()
        .power_management_limit()
        .unwrap()
}

fn uuid(gpus: &Gpus, index: usize) -> String {
    gpus.device(index).unwrap().uuid().unwrap()
}

fn entry(j: &Journal, kind: Kind, uuid: &str) -> Option<Entry> {
    match j.read(kind, uuid).unwrap() {
        Read::Absent => None,
        Read::Entry(e) => Some(e),
        Read::Corrupt(c) => panic!("unexpected {c}"),
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut n: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != ".lock")
        .collect();
    n.sort();
    n
}

/// A process of a dead owner: the pid cannot exist.
fn dead_owner() -> Owner {
    Owner::pid_only(i32::MAX as u32)
}

/// A running process that is not this one, killed on drop.
struct OtherProcess(Child);

impl OtherProcess {
    fn start() -> OtherProcess {
        OtherProcess(Command::new("sleep").arg("60").spawn().unwrap())
    }

    fn owner(&self) -> Owner {
        Owner::of_pid(self.0.id()).unwrap()
    }

    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for OtherProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn write_entry(j: &Journal, e: &Entry) {
    let _l = j.lock().unwrap();
    j.write(e).unwrap();
}

#[test]
fn a_guard_journals_the_original_before_its_first_change_and_puts_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::at(dir.path().join("nested"));
    let gpus = sim_gpus();
    let g = SettingsGuard::new(gpus.clone(), j.clone());
    assert!(!g.is_active());
    assert!(g.set_power_limit(0, 200_000).unwrap().is_empty());
    g.set_power_limit(0, 150_000).unwrap();
    assert_eq!(limit(&gpus, 0), 150_000);
    let e = entry(&j, Kind::PowerLimit, &uuid(&gpus, 0)).unwrap();
    assert_eq!(e.original, Original::PowerLimit(300_000));
    assert_eq!(e.holders, vec![Owner::current()]);
    assert_eq!(g.original_power_limit(0), Some(300_000));
    // The documented format, readable by older builds (`pid`).
    let raw: serde_json::Value =
        serde_json::from_slice(&fs::read(j.path_of(Kind::PowerLimit, &uuid(&gpus, 0))).unwrap())
            .unwrap();
    assert_eq!(raw["power_limit_mw"], 300_000);
    assert_eq!(raw["pid"], std::process::id());
    assert_eq!(raw["holders"][0]["pid"], std::process::id());

    let released = g.restore().unwrap();
    assert_eq!(
        released,
        vec![Released::Restored {
            index: 0,
            original: Original::PowerLimit(300_000)
        }]
    );
    assert_eq!(limit(&gpus, 0), 300_000);
    assert!(
        names(j.dir()).is_empty(),
        "no entry or temporary file is left"
    );
    assert!(g.restore().unwrap().is_empty(), "restore is idempotent");
}

#[test]
fn uuids_cannot_escape_the_directory() {
    let j = Journal::at("/state");
    assert_eq!(
        j.path_of(Kind::PowerLimit, "../../etc/passwd"),
        PathBuf::from("/state/power-limit-______etc_passwd.json")
    );
}

#[test]
fn entries_of_older_builds_read_as_a_pid_only_holder() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::at(dir.path());
    fs::write(
        j.path_of(Kind::PowerLimit, "GPU-old"),
        br#"{"uuid": "GPU-old", "power_limit_mw": 300000, "pid": 12, "created": 1}"#,
    )
    .unwrap();
    fs::write(
        j.path_of(Kind::Clocks, "GPU-old"),
        br#"{"uuid": "GPU-old", "gpu_clocks": true, "memory_clocks": false, "pid": 12, "created": 1}"#,
    )
    .unwrap();
    let scan = j.scan().unwrap();
    assert!(scan.corrupt.is_empty());
    assert_eq!(
        scan.entries,
        vec![
            Entry {
                uuid: "GPU-old".into(),
                original: Original::PowerLimit(300_000),
                holders: vec![Owner::pid_only(12)],
                created: 1
            },
            Entry {
                uuid: "GPU-old".into(),
                original: Original::Unlock(ClockLocks::GPU),
                holders: vec![Owner::pid_only(12)],
                created: 1
            }
        ]
    );
}

#[test]
fn an_original_outside_the_gpus_range_gives_the_driver_default() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::at(dir.path());
    let gpus = sim_gpus();
    let u = uuid(&gpus, 0);
    // 5 mW, out of the A40's range: never settable, so retrying it would never end.
    write_entry(
        &j,
        &Entry {
            uuid: u.clone(),
            original: Original::PowerLimit(5_000),
            holders: vec![dead_owner()],
            created: 0,
        },
    );
    gpus.set_power_management_limit(0, 250_000).unwrap();
    let report = restore_stale(&j, &gpus, false);
    assert!(report.failed.is_empty(), "{report:?}");
    let [r] = report.restored.as_slice() else {
        panic!("{report:?}")
    };
    assert_eq!(r.applied, Original::PowerLimit(300_000));
    assert!(!r.original_known);
    assert_eq!(r.journaled, Some(Original::PowerLimit(5_000)));
    assert_eq!(
        r.to_string(),
        format!(
            "GPU 0 ({u}): set the default power limit 300000 mW (the journaled 5000 mW is \
             outside the GPU's range) (journaled by process {})",
            i32::MAX
        )
    );
    assert_eq!(limit(&gpus, 0), 300_000);
    assert!(entry(&j, Kind::PowerLimit, &u).is_none());
}

#[test]
fn an_older_builds_entry_naming_pid_1_is_restored() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::at(dir.path());
    let gpus = sim_gpus();
    let u = uuid(&gpus, 0);
    fs::write(
        j.path_of(Kind::PowerLimit, &u),
        format!(r#"{{"uuid": "{u}", "power_limit_mw": 150000, "pid": 1, "created": 1}}"#),
    )
    .unwrap();
    gpus.set_power_management_limit(0, 250_000).unwrap();
    let report = restore_stale(&j, &gpus, false);
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(report.restored.len(), 1, "{report:?}");
    assert_eq!(limit(&gpus, 0), 150_000);
    assert!(entry(&j, Kind::PowerLimit, &u).is_none());
}

#[test]
fn restore_stale_skips_live_holders_and_restores_dead_ones() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::at(dir.path());
    let gpus = sim_gpus();
    // GPU 0: held by this (live) process.
    let g = SettingsGuard::new(gpus.clone(), j.clone());
    g.set_power_limit(0, 200_000).unwrap();
    // GPU 1: left by a process that is gone.
    write_entry(
        &j,
        &Entry {
            uuid: uuid(&gpus, 1),
            original: Original::PowerLimit(150_000),
            holders: vec![dead_owner()],
            created: 0,
        },
    );
    gpus.set_power_management_limit(1, 250_000).unwrap();

    let report = restore_stale(&j, &gpus, false);
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(
        report.restored,
        vec![Restored {
            index: 1,
            uuid: uuid(&gpus, 1),
            applied: Original::PowerLimit(150_000),
            original_known: true,
            journaled: None,
            holders: vec![dead_owner()],
            corrupt: None,
        }]
    );
    assert_eq!(
        report.restored[0].to_string(),
        format!(
            "GPU 1 ({}): restored power limit 150000 mW (journaled by process {})",
            uuid(&gpus, 1),
            i32::MAX
        )
    );
    assert_eq!(limit(&gpus, 1), 150_000);
    assert_eq!(limit(&gpus, 0), 200_000, "a live holder's setting stays");

    let report = restore_stale(&j, &gpus, true);
    assert_eq!(report.restored.len(), 1);
    assert_eq!(limit(&gpus, 0), 300_000);
    assert!(j.scan().unwrap().entries.is_empty());
}

#[test]
fn unreadable_entries_are_moved_aside_and_the_gpu_gets_the_driver_default() {
    for content in [
        &b""[..],
        b"  \n",
        b"{\"uuid\": \"GPU-",
        b"[1, 2]",
        b"{\"uuid\": \"x\"}",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::at(dir.path());
        let gpus = sim_gpus();
        let u = uuid(&gpus, 0);
        gpus.set_power_management_limit(0, 180_000).unwrap();
        fs::write(j.path_of(Kind::PowerLimit, &u), content).unwrap();
        let scan = j.scan().unwrap();
        assert_eq!(scan.corrupt.len(), 1, "{content:?}");

        let report = restore_stale(&j, &gpus, false);
        assert!(report.failed.is_empty(), "{:?}", report.failed);
        let [r] = report.restored.as_slice() else {
            panic!("{content:?}: {report:?}")
        };
        assert!(!r.original_known);
        assert_eq!(r.applied, Original::PowerLimit(300_000));
        assert!(
            r.to_string().contains("default power limit 300000 mW"),
            "{r}"
        );
        assert!(r.to_string().contains("moved aside"), "{r}");
        assert_eq!(limit(&gpus, 0), 300_000);
        let left = names(j.dir());
        assert_eq!(left.len(), 1, "{left:?}");
        assert!(left[0].starts_with(&format!("power-limit-{u}.json.corrupt-")));
        let scan = j.scan().unwrap();
        assert!(scan.entries.is_empty() && scan.corrupt.is_empty());
    }
}

#[test]
fn a_guard_meeting_an_unreadable_entry_moves_it_aside_and_journals_anew() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::at(dir.path());
    let gpus = sim_gpus();
    let u = uuid(&gpus, 0);
    fs::write(j.path_of(Kind::PowerLimit, &u), b"").unwrap();
    let g = SettingsGuard::new(gpus.clone(), j.clone());
    let notices = g.set_power_limit(0, 200_000).unwrap();
    assert!(
        matches!(notices.as_slice(), [Notice::MovedAside { index: 0, .. }]),
        "{notices:?}"
    );
    assert_eq!(
        entry(&j, Kind::PowerLimit, &u).unwrap().original,
        Original::PowerLimit(300_000)
    );
    g.restore().unwrap();
    assert_eq!(limit(&gpus, 0), 300_000);
}

#[test]
fn a_reused_pid_does_not_pass_for_the_dead_owner() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::at(dir.path());
    let gpus = sim_gpus();
    let other = OtherProcess::start();
    // The owner had the pid the running process has now, but started at another time.
    let mut ghost = other.owner();
    let Some(t) = ghost.start_time else {
        eprintln!("no /proc start times here; pid reuse cannot be told apart");
        return;
    };
    ghost.start_time = Some(t.saturating_sub(1000));
    write_entry(
        &j,
        &Entry {
            uuid: uuid(&gpus, 0),
            original: Original::PowerLimit(300_000),
            holders: vec![ghost],
            created: 0,
        },
    );
    gpus.set_power_management_limit(0, 120_000).unwrap();
    let report = restore_stale(&j, &gpus, false);
    assert_eq!(report.restored.len(), 1, "{report:?}");
    assert_eq!(limit(&gpus, 0), 300_000);
}

#[test]
fn with_two_holders_the_last_one_out_restores_even_after_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::at(dir.path());
    let gpus = sim_gpus();
    let u = uuid(&gpus, 0);
    let mut b_process = OtherProcess::start();
    let a = SettingsGuard::new(gpus.clone(), j.clone());
    let b = SettingsGuard::on_behalf_of(gpus.clone(), j.clone(), b_process.owner());
    a.set_power_limit(0, 200_000).unwrap();
    let notices = b.set_power_limit(0, 150_000).unwrap();
    assert!(
        matches!(&notices[..], [Notice::SharedWith { holders, .. }] if holders == &[Owner::current()]),
        "{notices:?}"
    );
    let e = entry(&j, Kind::PowerLimit, &u).unwrap();
    assert_eq!(
        e.original,
        Original::PowerLimit(300_000),
        "B keeps A's original"
    );
    assert_eq!(e.holders, vec![Owner::current(), b_process.owner()]);

    // A leaves cleanly: B still runs, so its setting stays and so does the entry.
    let released = a.restore().unwrap();
    assert_eq!(
        released,
        vec![Released::LeftTo {
            index: 0,
            kind: Kind::PowerLimit,
            holders: vec![b_process.owner()]
        }]
    );
    assert_eq!(limit(&gpus, 0), 150_000);
    assert_eq!(
        entry(&j, Kind::PowerLimit, &u).unwrap().holders,
        vec![b_process.owner()]
    );
    // B is SIGKILLed: its guard never runs (forgotten here as a dead process forgets).
    std::mem::forget(b);
    b_process.kill();
    let report = restore_stale(&j, &gpus, false);
    assert_eq!(report.restored.len(), 1, "{report:?}");
    assert_eq!(limit(&gpus, 0), 300_000);
    assert!(j.scan().unwrap().entries.is_empty());
}

#[test]
fn a_guard_joining_a_dead_holders_entry_inherits_its_original() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::at(dir.path());
    let gpus = sim_gpus();
    let u = uuid(&gpus, 0);
    // A killed process left 120 W behind; the true original is 300 W.
    gpus.set_power_management_limit(0, 120_000).unwrap();
    write_entry(
        &j,
        &Entry {
            uuid: u.clone(),
            original: Original::PowerLimit(300_000),
            holders: vec![dead_owner()],
            created: 7,
        },
    );
    let g = SettingsGuard::new(gpus.clone(), j.clone());
    assert!(g.set_power_limit(0, 200_000).unwrap().is_empty());
    let e = entry(&j, Kind::PowerLimit, &u).unwrap();
    assert_eq!(
        e.holders,
        vec![Owner::current()],
        "the dead holder is dropped"
    );
    assert_eq!(e.created, 7);
    g.restore().unwrap();
    assert_eq!(limit(&gpus, 0), 300_000);
}

#[test]
fn a_failed_restore_leaves_a_stale_entry_for_the_next_try() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::at(dir.path());
    let (cluster, gpus) = sim_cluster_gpus();
    let u = uuid(&gpus, 0);
    write_entry(
        &j,
        &Entry {
            uuid: u.clone(),
            original: Original::PowerLimit(150_000),
            holders: vec![dead_owner()],
            created: 0,
        },
    );
    // Through a guard first (before the driver refuses): it sets a limit of its own.
    let g = SettingsGuard::new(gpus.clone(), Journal::at(dir.path().join("guard")));
    g.set_power_limit(1, 200_000).unwrap();
    // The driver refuses every write: the set fails and the entry must survive for later.
    refuse_writes(&cluster, 0);
    refuse_writes(&cluster, 1);
    let report = restore_stale(&j, &gpus, false);
    assert!(report.restored.is_empty());
    let [f] = report.failed.as_slice() else {
        panic!("{report:?}")
    };
    assert_eq!(f.kind, Some(Kind::PowerLimit));
    assert!(
        matches!(f.error, SettingsError::Gpu(GpuError::Unknown(_))),
        "{f}"
    );
    assert!(f.to_string().starts_with("GPU 0 ("), "{f}");
    assert!(entry(&j, Kind::PowerLimit, &u).is_some());

    // The guard's own release fails, and the entry it leaves reads as stale.
    let j = Journal::at(dir.path().join("guard"));
    let u = uuid(&gpus, 1);
    assert!(g.restore().is_err());
    assert!(entry(&j, Kind::PowerLimit, &u)
        .unwrap()
        .live_holders()
        .is_empty());
}

#[test]
fn clock_locks_are_journaled_widened_and_unlocked() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::at(dir.path());
    let (cluster, gpus) = sim_cluster_gpus();
    let a40 = &cluster.devices()[0];
    let unlocked = a40.busy_steady_state();
    let u = uuid(&gpus, 0);
    let g = SettingsGuard::new(gpus.clone(), j.clone());
    g.lock_gpu_clocks(0, 900, 900).unwrap();
    assert_eq!(
        entry(&j, Kind::Clocks, &u).unwrap().original,
        Original::Unlock(ClockLocks::GPU)
    );
    g.lock_memory_clocks(0, 5001, 5001).unwrap();
    g.lock_gpu_clocks(0, 1200, 1200).unwrap();
    assert_eq!(
        entry(&j, Kind::Clocks, &u).unwrap().original,
        Original::Unlock(ClockLocks::BOTH)
    );
    assert_ne!(a40.busy_steady_state(), unlocked);
    assert_eq!(names(j.dir()), [format!("clocks-{u}.json")]);
    g.restore().unwrap();
    assert_eq!(a40.busy_steady_state(), unlocked);
    assert!(names(j.dir()).is_empty());
}

#[test]
fn unsupported_memory_locks_count_as_unlocked_and_one_failing_gpu_does_not_stop_others() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::at(dir.path());
    let (cluster, gpus) = sim_cluster_gpus();
    // GPU 0: a driver that refuses every write, a power limit and clocks to put back.
    write_entry(
        &j,
        &Entry {
            uuid: uuid(&gpus, 0),
            original: Original::PowerLimit(150_000),
            holders: vec![dead_owner()],
            created: 0,
        },
    );
    write_entry(
        &j,
        &Entry {
            uuid: uuid(&gpus, 0),
            original: Original::Unlock(ClockLocks::BOTH),
            holders: vec![dead_owner()],
            created: 0,
        },
    );
    // GPU 1 (V100): memory clocks cannot be locked on Volta, yet the entry names them.
    write_entry(
        &j,
        &Entry {
            uuid: uuid(&gpus, 1),
            original: Original::Unlock(ClockLocks::BOTH),
            holders: vec![dead_owner()],
            created: 0,
        },
    );
    refuse_writes(&cluster, 0);
    let report = restore_stale(&j, &gpus, false);
    let restored: Vec<_> = report
        .restored
        .iter()
        .map(|r| (r.index, r.applied.kind()))
        .collect();
    assert_eq!(restored, vec![(1, Kind::Clocks)]);
    // Every kind is tried on the failing GPU too.
    let failed: Vec<_> = report.failed.iter().map(|f| (f.index, f.kind)).collect();
    assert_eq!(
        failed,
        vec![(0, Some(Kind::PowerLimit)), (0, Some(Kind::Clocks))]
    );
    let mut left: Vec<_> = j.scan().unwrap().entries.iter().map(|e| e.kind()).collect();
    left.sort_by_key(|k| format!("{k:?}"));
    assert_eq!(left, vec![Kind::Clocks, Kind::PowerLimit]);
}

#[test]
fn an_unwritable_journal_is_a_notice_and_the_guard_still_restores() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    fs::write(&file, b"").unwrap();
    // A directory below a regular file can never be created, even by root.
    let j = Journal::at(file.join("journal"));
    let gpus = sim_gpus();
    let g = SettingsGuard::new(gpus.clone(), j.clone());
    let notices = g.set_power_limit(0, 200_000).unwrap();
    let [n @ Notice::NotJournaled { .. }] = notices.as_slice() else {
        panic!("{notices:?}")
    };
    assert!(n.to_string().contains("SIGKILL"), "{n}");
    assert_eq!(limit(&gpus, 0), 200_000);
    g.restore().unwrap();
    assert_eq!(limit(&gpus, 0), 300_000);
    // Restoring from it finds nothing and fails nothing.
    let report = restore_stale(&j, &gpus, false);
    assert!(report.restored.is_empty() && report.failed.is_empty());
}

#[test]
fn restore_stale_does_not_create_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::at(dir.path().join("absent"));
    let report = restore_stale(&j, &sim_gpus(), true);
    assert!(report.restored.is_empty() && report.failed.is_empty());
    assert!(!j.dir().exists());
}

#[test]
fn two_guards_of_one_process_count_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::at(dir.path());
    let gpus = sim_gpus();
    let first = SettingsGuard::new(gpus.clone(), j.clone());
    first.set_power_limit(0, 200_000).unwrap();
    let second = SettingsGuard::new(gpus.clone(), j.clone());
    second.set_power_limit(0, 150_000).unwrap();
    assert_eq!(
        second.original_power_limit(0),
        Some(300_000),
        "the journal's original"
    );
    // Dropping the first leaves the second's setting in force.
    drop(first);
    assert_eq!(limit(&gpus, 0), 150_000);
    assert!(entry(&j, Kind::PowerLimit, &uuid(&gpus, 0)).is_some());
    second.restore().unwrap();
    assert_eq!(limit(&gpus, 0), 300_000);
    assert!(entry(&j, Kind::PowerLimit, &uuid(&gpus, 0)).is_none());
}

#[test]
fn release_gives_back_one_setting_and_keeps_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::at(dir.path());
    let gpus = sim_gpus();
    let other = OtherProcess::start();
    let g = SettingsGuard::new(gpus.clone(), j.clone());
    g.set_power_limit(0, 200_000).unwrap();
    g.set_power_limit(1, 200_000).unwrap();
    assert_eq!(g.release(1, Kind::Clocks).unwrap(), None, "not held");
    assert_eq!(
        g.release(1, Kind::PowerLimit).unwrap(),
        Some(Released::Restored {
            index: 1,
            original: Original::PowerLimit(limit(&gpus, 1)),
        })
    );
    assert!(entry(&j, Kind::PowerLimit, &uuid(&gpus, 1)).is_none());
    assert_eq!(limit(&gpus, 0), 200_000, "GPU 0 is still held");
    // Shared with another live process: releasing leaves the setting to it.
    let b = SettingsGuard::on_behalf_of(gpus.clone(), j.clone(), other.owner());
    b.set_power_limit(0, 200_000).unwrap();
    assert!(matches!(
        g.release(0, Kind::PowerLimit).unwrap(),
        Some(Released::LeftTo { .. })
    ));
    assert_eq!(limit(&gpus, 0), 200_000);
    assert!(!g.is_active());
    b.restore().unwrap();
    assert_eq!(limit(&gpus, 0), 300_000);
}

#[test]
fn a_guard_adopts_a_journaled_hold_of_its_owner_and_restores_it() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::at(dir.path());
    let gpus = sim_gpus();
    let client = OtherProcess::start();
    // A first daemon set the limit for the client, then died without a hook.
    write_entry(
        &j,
        &Entry {
            uuid: uuid(&gpus, 0),
            original: Original::PowerLimit(300_000),
            holders: vec![client.owner()],
            created: 0,
        },
    );
    gpus.set_power_management_limit(0, 150_000).unwrap();
    let second = SettingsGuard::on_behalf_of(gpus.clone(), j.clone(), client.owner());
    assert!(!second.adopt(0, Kind::Clocks).unwrap(), "nothing journaled");
    let stranger = SettingsGuard::on_behalf_of(gpus.clone(), j.clone(), dead_owner());
    assert!(
        !stranger.adopt(0, Kind::PowerLimit).unwrap(),
        "not its hold"
    );
    assert!(second.adopt(0, Kind::PowerLimit).unwrap());
    assert_eq!(second.original_power_limit(0), Some(300_000));
    second.restore().unwrap();
    assert_eq!(limit(&gpus, 0), 300_000);
    assert!(entry(&j, Kind::PowerLimit, &uuid(&gpus, 0)).is_none());
}

/// A journal left by an older build (a 0755 directory, a 0644 lock file) where another local
/// user holds the lock through a read-only descriptor (`flock` needs no write access): the
/// guard's writes and restores do not wait on it.
#[test]
fn a_lock_held_by_another_user_stalls_nothing() {
    if crate::util::private_dir::euid() != 0
        || Command::new("setpriv").arg("--help").output().is_err()
    {
        eprintln!("skipped: needs root and setpriv to act as another user");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let base = tempfile::tempdir().unwrap();
    fs::set_permissions(base.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let dir = base.path().join("journal");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    let lock = dir.join(".lock");
    fs::write(&lock, b"").unwrap();
    fs::set_permissions(&lock, fs::Permissions::from_mode(0o644)).unwrap();
    let mut attacker = Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "flock",
            "-s",
        ])
        .arg(&lock)
        .args(["sleep", "60"])
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let f = fs::File::open(&lock).unwrap();
        use std::os::unix::io::AsRawFd;
        // SAFETY: flock on a descriptor this test owns.
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the attacker never took the lock"
        );
        std::thread::yield_now();
    }
    let j = Journal::at(&dir);
    let gpus = sim_gpus();
    let (tx, rx) = std::sync::mpsc::channel();
    let (g2, j2) = (gpus.clone(), j.clone());
    std::thread::spawn(move || {
        let g = SettingsGuard::new(g2, j2);
        let notices = g.set_power_limit(0, 200_000).unwrap();
        let released = g.restore().unwrap();
        tx.send((notices, released)).unwrap();
    });
    let got = rx.recv_timeout(std::time::Duration::from_secs(20));
    let _ = attacker.kill();
    let _ = attacker.wait();
    let (notices, released) = got.expect("the guard waited on another user's lock");
    assert!(notices.is_empty(), "{notices:?}");
    assert_eq!(released.len(), 1);
    assert_eq!(limit(&gpus, 0), 300_000);
    let mode = fs::metadata(&lock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the lock file others could open was replaced");
}

/// Six processes set the same GPU's limit and leave, racing one another, twelve rounds: each
/// round ends at the original with an empty journal (the original is read under the lock, so
/// no one journals a value another holder is about to take back).
#[test]
fn racing_writers_always_end_at_the_original() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::at(dir.path());
    let gpus = sim_gpus();
    for round in 0..12 {
        let procs: Vec<OtherProcess> = (0..6).map(|_| OtherProcess::start()).collect();
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(procs.len()));
        let threads: Vec<_> = procs
            .iter()
            .enumerate()
            .map(|(k, p)| {
                let g = SettingsGuard::on_behalf_of(gpus.clone(), j.clone(), p.owner());
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    // Each hold reads the current limit anew: join, change, leave, again.
                    for step in 0..20u32 {
                        g.set_power_limit(0, 150_000 + 10_000 * ((k as u32 + step) % 10))
                            .unwrap();
                        std::thread::yield_now();
                        g.restore().unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(limit(&gpus, 0), 300_000, "round {round}");
        assert!(j.scan().unwrap().entries.is_empty(), "round {round}");
    }
}
