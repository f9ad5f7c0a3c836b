//! Simulated RAPL counters that wrap every second or so, read through the real reader, the
//! shared sampler and measurement windows.
//!
//! These run in their own test binary (a process of their own) on purpose: the library's unit
//! tests include simulated GPUs whose calibrated energy reads spin the CPU for milliseconds,
//! and on a 2-core machine those starve the simulated RAPL writer and the sampler thread.
//!
//! The simulated counters are files a writer thread rewrites about every millisecond; a loaded
//! machine holds that thread up for tens of milliseconds now and then, so the value a read saw
//! is bracketed ([`bracket`]) rather than compared with the truth at one instant: the checks
//! then hold however late the writer runs, and still catch a wrap lost or counted twice.

use std::sync::Arc;
use std::time::{Duration, Instant};

use zeus_core::device::cpu::sim::{self, SimRapl};
use zeus_core::device::cpu::Cpus;
use zeus_core::device::{BackendKind, Gpus, SystemClock};
use zeus_core::monitor::energy::{EnergyMonitor, ReadMode};
use zeus_core::monitor::sampler::Sampler;

/// What a counter read saw, per package (package, DRAM), J: at least what the writer had
/// published before the read, at most the truth after it.
#[derive(Debug, Clone, Copy)]
struct Bracket {
    lo: (f64, f64),
    hi: (f64, f64),
}

/// Run `read` (which reads the counters of `packages`) between the two ends of its bracket;
/// again, up to a second, while a bracket is too wide to check against (more than 2 J of
/// package or 0.25 J of DRAM energy: the writer was held up, not the reader wrong), so that a
/// loaded machine delays these tests instead of failing them. Reading again is harmless: the
/// zones count wraps across any number of reads.
fn bracket<R>(s: &SimRapl, packages: &[usize], mut read: impl FnMut() -> R) -> (R, Vec<Bracket>) {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let (r, b) = bracket_once(s, packages, &mut read);
        let narrow = b
            .iter()
            .all(|x| x.hi.0 - x.lo.0 < 2.0 && x.hi.1 - x.lo.1 < 0.25);
        if narrow || Instant::now() > deadline {
            return (r, b);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn bracket_once<R>(
    s: &SimRapl,
    packages: &[usize],
    read: &mut impl FnMut() -> R,
) -> (R, Vec<Bracket>) {
    let lo: Vec<_> = packages
        .iter()
        .map(|&k| s.published_energy_j(k).unwrap())
        .collect();
    let r = read();
    let b = packages
        .iter()
        .zip(lo)
        .map(|(&k, lo)| Bracket {
            lo,
            hi: s.true_energy_j(k).unwrap(),
        })
        .collect();
    (r, b)
}

/// `got`, the energy of zone `kind` (0 package, 1 DRAM) between two bracketed reads, lies in
/// what the brackets allow (plus the counters' 1 µJ flooring), and the brackets are narrow
/// enough to tell a wrap of `range_j` lost or gained.
fn assert_between(got: f64, start: Bracket, end: Bracket, kind: usize, range_j: f64) {
    let pick = |b: (f64, f64)| if kind == 0 { b.0 } else { b.1 };
    let lo = pick(end.lo) - pick(start.hi) - 1e-5;
    let hi = pick(end.hi) - pick(start.lo) + 1e-5;
    assert!(
        (lo..=hi).contains(&got),
        "zone {kind}: {got} J outside [{lo}, {hi}]"
    );
    assert!(
        hi - lo < range_j / 4.0,
        "zone {kind}: the writer lagged so far that [{lo}, {hi}] cannot tell a lost wrap"
    );
}

#[test]
fn simulated_tree_counters_follow_the_truth() {
    let t = tempfile::tempdir().unwrap();
    let range = 30_000_000; // 30 J: the package wraps every few hundred ms, DRAM (3.75 J) too
    let s = sim::SimRapl::start(2, Some(t.path().join("rapl")), range).unwrap();
    let cpus = Cpus::open(s.dir()).unwrap();
    assert_eq!(cpus.len(), 2);
    let (p0, d0) = s.true_energy_j(0).unwrap();
    let zones = cpus.zones(&[0]).unwrap();
    let (start, b0) = bracket(&s, &[0], || {
        zones
            .iter()
            .map(|z| z.energy_j().unwrap())
            .collect::<Vec<f64>>()
    });
    let t_end = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < t_end {
        for z in &zones {
            z.energy_j().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (end, b1) = bracket(&s, &[0], || {
        zones
            .iter()
            .map(|z| z.energy_j().unwrap())
            .collect::<Vec<f64>>()
    });
    let (p1, d1) = s.true_energy_j(0).unwrap();
    assert!(p1 - p0 > 30.0, "the package counter wrapped: {}", p1 - p0);
    assert!(d1 - d0 > 3.75, "the DRAM counter wrapped: {}", d1 - d0);
    for (k, range_j) in [(0, 30.0), (1, 3.75)] {
        assert_between(end[k] - start[k], b0[0], b1[0], k, range_j);
    }
    // The counter file itself is the truth modulo the range.
    let raw = zones[0].read_raw_uj().unwrap();
    assert!(raw < range);
    let dir = s.dir().to_path_buf();
    drop(s);
    assert!(dir.exists(), "a directory given by the caller is kept");
}

#[test]
fn cpu_only_monitor_measures_packages_and_logs_their_columns() {
    let t = tempfile::tempdir().unwrap();
    // 60 J (DRAM 7.5 J): each zone wraps at least once in the window.
    let s = SimRapl::start(2, Some(t.path().join("rapl")), 60_000_000).unwrap();
    let cpus = Cpus::open(s.dir()).unwrap();
    // Package 1 without DRAM: its zone is dropped from a second, sparser tree.
    let gpus = Gpus::with_indices(BackendKind::Sim, vec![], vec![], Arc::new(SystemClock));
    let log = t.path().join("log.csv");
    let mut m = EnergyMonitor::with_cpus(
        gpus.clone(),
        Some(vec![]),
        Some((&cpus, vec![1, 0])),
        Some(&log),
        None,
        ReadMode::Auto,
    )
    .unwrap();
    assert_eq!(m.cpu_indices(), Some(&[1usize, 0][..]));
    // A window's edges happen once: bracketed once, not retried.
    let ((), b0) = bracket_once(&s, &[1, 0], &mut || m.begin_window("w").unwrap());
    std::thread::sleep(Duration::from_millis(1600));
    let (r, b1) = bracket_once(&s, &[1, 0], &mut || {
        m.end_window("w", false, None).unwrap().measurement
    });
    assert!(r.energy.is_empty());
    let (c, d) = (
        r.cpu_energy.clone().unwrap(),
        r.dram_energy.clone().unwrap(),
    );
    for k in 0..2 {
        assert!(
            b1[k].lo.0 - b0[k].hi.0 > 60.0 && b1[k].lo.1 - b0[k].hi.1 > 7.5,
            "both counters wrapped"
        );
        assert_between(c[k].1, b0[k], b1[k], 0, 60.0);
        assert_between(d[k].1, b0[k], b1[k], 1, 7.5);
    }
    assert_eq!((c[0].0, c[1].0), (1, 0));
    assert!((r.total_energy() - c.iter().chain(&d).map(|x| x.1).sum::<f64>()).abs() < 1e-9);
    let text = std::fs::read_to_string(&log).unwrap();
    let rows: Vec<&str> = text.lines().collect();
    // The reference's columns, then each package's bounds (issue 22).
    assert_eq!(
        rows[0],
        "start_time,window_name,elapsed_time,cpu1_energy,dram1_energy,cpu0_energy,dram0_energy,\
         cpu1_energy_uncertainty,dram1_energy_uncertainty,cpu0_energy_uncertainty,\
         dram0_energy_uncertainty"
    );
    let fields: Vec<&str> = rows[1].split(',').collect();
    assert_eq!(fields.len(), 11);
    for bound in &fields[7..] {
        let b: f64 = bound.parse().unwrap();
        assert!(b.is_finite() && b >= 0.0, "{bound}");
    }
    let cancelled = {
        m.begin_window("x").unwrap();
        m.end_window("x", true, None).unwrap().measurement
    };
    assert_eq!(cancelled.cpu_energy, Some(vec![(1, 0.0), (0, 0.0)]));

    // A package without DRAM: no DRAM entry and no DRAM column.
    // The writer may put a file back between listing and removal: retry.
    let gone = t.path().join("rapl/intel-rapl:1/intel-rapl:1:0");
    while std::fs::remove_dir_all(&gone).is_err() && gone.exists() {}
    let cpus = Cpus::open(s.dir()).unwrap();
    let log2 = t.path().join("log2.csv");
    let mut m = EnergyMonitor::with_cpus(
        gpus.clone(),
        Some(vec![]),
        Some((&cpus, vec![0, 1])),
        Some(&log2),
        None,
        ReadMode::Auto,
    )
    .unwrap();
    m.begin_window("w").unwrap();
    let r = m.end_window("w", false, None).unwrap().measurement;
    assert_eq!(r.dram_energy.unwrap().len(), 1);
    let header = std::fs::read_to_string(&log2).unwrap();
    assert!(header.starts_with(
        "start_time,window_name,elapsed_time,cpu0_energy,dram0_energy,cpu1_energy,\
         cpu0_energy_uncertainty,dram0_energy_uncertainty,cpu1_energy_uncertainty\n"
    ));
    // No GPU and no CPU is not a monitor.
    assert!(
        EnergyMonitor::with_cpus(gpus, Some(vec![]), None, None, None, ReadMode::Auto).is_err()
    );
}

#[test]
fn leased_zones_are_read_often_enough_to_count_every_wrap() {
    let t = tempfile::tempdir().unwrap();
    // 80 J: the simulated package (60-120 W) wraps every 0.7-1.3 s, its DRAM (10 J, 8-14 W)
    // about as often: ranges a thread starved for a few hundred ms does not lose.
    let s = SimRapl::start(1, Some(t.path().join("rapl")), 80_000_000).unwrap();
    let cpus = Cpus::open(s.dir()).unwrap();
    let zones = cpus.zones(&[0]).unwrap();
    let read = || {
        zones
            .iter()
            .map(|z| z.energy_j().unwrap())
            .collect::<Vec<f64>>()
    };
    let (e0, b0) = bracket(&s, &[0], read);
    let lease = Sampler::lease_zones(&zones).unwrap();
    // Nobody but the sampler reads the zones meanwhile.
    std::thread::sleep(Duration::from_millis(2500));
    let (e1, b1) = bracket(&s, &[0], read);
    assert!(lease.zones().iter().all(|z| z.error().is_none()));
    let wrapped = [b1[0].lo.0 - b0[0].hi.0, b1[0].lo.1 - b0[0].hi.1];
    for (k, range_j) in [(0, 80.0), (1, 10.0)] {
        assert!(wrapped[k] > range_j, "zone {k} wrapped: {} J", wrapped[k]);
        assert_between(e1[k] - e0[k], b0[0], b1[0], k, range_j);
    }
    let interval = zones[0].poll_interval().as_secs_f64();
    assert!(interval < 80.0 / 60.0 / 4.0 + 1e-3, "{interval}");
    drop(lease);
}
