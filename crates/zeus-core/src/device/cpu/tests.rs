use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;

fn zone(dir: &Path, name: &str, energy: u64, range: u64) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("name"), format!("{name}\n")).unwrap();
    std::fs::write(dir.join("energy_uj"), format!("{energy}\n")).unwrap();
    std::fs::write(dir.join("max_energy_range_uj"), format!("{range}\n")).unwrap();
}

#[test]
fn discovers_intel_packages_with_and_without_dram() {
    let t = tempfile::tempdir().unwrap();
    let r = t.path();
    zone(&r.join("intel-rapl:1"), "package-1", 5, 100);
    zone(&r.join("intel-rapl:0"), "package-0", 7, 1000);
    zone(&r.join("intel-rapl:0/intel-rapl:0:0"), "core", 1, 1000);
    zone(&r.join("intel-rapl:0/intel-rapl:0:1"), "dram", 3, 1000);
    // Not packages: the control type directory, an MMIO zone, a psys zone.
    std::fs::create_dir_all(r.join("intel-rapl")).unwrap();
    zone(&r.join("intel-rapl-mmio:0"), "package-0", 1, 10);
    zone(&r.join("intel-rapl:2"), "psys", 1, 10);
    let cpus = Cpus::open(r).unwrap();
    assert_eq!(cpus.len(), 2);
    let p0 = cpus.package(0).unwrap();
    assert_eq!(p0.package.dir(), r.join("intel-rapl:0"));
    assert_eq!(p0.package.max_energy_range_uj(), 1000);
    let d = p0.dram.as_ref().unwrap();
    assert_eq!(d.dir(), r.join("intel-rapl:0/intel-rapl:0:1"));
    assert_eq!(d.energy_j().unwrap(), 3e-6);
    let p1 = cpus.package(1).unwrap();
    assert!(p1.dram.is_none());
    assert_eq!(p1.package.energy_j().unwrap(), 5e-6);
    assert_eq!(cpus.zones(&[1, 0]).unwrap().len(), 3);
    let e = cpus.package(2).unwrap_err();
    assert_eq!(e.class_name(), "ZeusCPUNotFoundError");
    assert!(cpus.check_indices(&[0, 0]).is_err());
}

#[test]
fn discovers_amd_naming_and_dram_beside_the_package() {
    let t = tempfile::tempdir().unwrap();
    let r = t.path();
    zone(&r.join("amd-rapl:0"), "package-0", 11, 1 << 32);
    zone(&r.join("amd-rapl:0:0"), "dram", 12, 1 << 32);
    let cpus = Cpus::open(r).unwrap();
    assert_eq!(cpus.len(), 1);
    assert_eq!(
        cpus.packages()[0].dram.as_ref().unwrap().dir(),
        r.join("amd-rapl:0:0")
    );
}

#[test]
fn no_rapl_names_the_searched_directory() {
    let t = tempfile::tempdir().unwrap();
    for root in [t.path().to_path_buf(), t.path().join("missing")] {
        let e = Cpus::open(&root).unwrap_err();
        assert_eq!(e.class_name(), "ZeusRAPLNotSupportedError");
        let msg = e.to_string();
        assert!(msg.contains(&root.display().to_string()), "{msg}");
        assert!(msg.contains("containers"), "{msg}");
    }
}

#[test]
fn bad_content_names_the_file_and_the_content() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("intel-rapl:0");
    zone(&d, "package-0", 1, 10);
    std::fs::write(d.join("energy_uj"), "12ab\n").unwrap();
    let e = Cpus::open(t.path()).unwrap_err();
    assert_eq!(e.class_name(), "ZeusRAPLFileInitError");
    let msg = e.to_string();
    assert!(msg.contains("energy_uj") && msg.contains("12ab"), "{msg}");
}

#[test]
fn permission_denied_names_the_file_and_the_fixes() {
    let path = Path::new("/sys/class/powercap/intel-rapl:0/energy_uj");
    let io = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
    let e = CpuError::from_io(path, &io);
    assert_eq!(e.class_name(), "ZeusRAPLPermissionError");
    let msg = e.to_string();
    for want in [
        "/sys/class/powercap/intel-rapl:0/energy_uj",
        "root",
        "chmod a+r",
        "udev",
        "ZEUS_RAPL_ROOT",
    ] {
        assert!(msg.contains(want), "{want} missing: {msg}");
    }
    // Through a real file where the permission bits bite (not as root).
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("intel-rapl:0");
    zone(&d, "package-0", 1, 10);
    std::fs::set_permissions(d.join("energy_uj"), std::fs::Permissions::from_mode(0o000)).unwrap();
    if std::fs::read(d.join("energy_uj")).is_err() {
        let e = Cpus::open(t.path()).unwrap_err();
        assert!(matches!(&e, CpuError::Permission { path } if path == &d.join("energy_uj")));
    }
}

#[test]
fn unwraps_one_and_several_wraps() {
    let t0 = Instant::now();
    let mut u = Unwrapper::new(1000);
    assert_eq!(u.observe(900, t0), 900);
    assert_eq!(u.observe(100, t0 + Duration::from_millis(20)), 1100); // one wrap
    assert_eq!(u.observe(100, t0 + Duration::from_millis(40)), 1100); // nothing
    let mut total = 1100u128;
    let mut raw = 100u64;
    for step in [950u64, 999, 1, 500, 700] {
        raw = (raw + step) % 1000;
        total += u128::from(step);
        assert_eq!(u.observe(raw, t0), total);
    }
    assert!(total > 3 * 1000, "several wraps happened");
}

#[test]
fn poll_interval_follows_power_seen_over_short_gaps_only() {
    let t0 = Instant::now();
    let ms = |n: u64| t0 + Duration::from_millis(n);
    let mut u = Unwrapper::new(20_000_000); // 20 J
    assert_eq!(
        u.poll_interval(),
        Duration::from_millis(10),
        "power unknown"
    );
    u.observe(0, t0);
    // A long first gap may hide wraps: it gives no power figure.
    u.observe(1_000, ms(5_000));
    assert_eq!(u.poll_interval(), Duration::from_millis(10));
    // 2 J every 20 ms (100 W): the interval stays short through half a second of warm-up...
    let (mut raw, mut t) = (1_000u64, 5_000u64);
    for _ in 0..24 {
        (raw, t) = (raw + 2_000_000, t + 20);
        u.observe(raw % 20_000_000, ms(t));
        assert_eq!(
            u.poll_interval(),
            Duration::from_millis(10),
            "warming up at {t}"
        );
    }
    (raw, t) = (raw + 2_000_000, t + 20);
    u.observe(raw % 20_000_000, ms(t));
    // ... then follows the power: a quarter of the 0.2 s the range lasts at 100 W.
    let s = u.poll_interval().as_secs_f64();
    assert!((s - 0.05).abs() < 1e-9, "{s}");
    // A stalled counter (0 W for one interval) barely moves the figure ...
    t += 50;
    u.observe(raw % 20_000_000, ms(t));
    let s = u.poll_interval().as_secs_f64();
    assert!(s > 0.05 && s < 0.051, "{s}");
    // ... and only a long quiet stretch lets the interval grow to its limit.
    let quiet_from = t;
    while u.poll_interval() < Duration::from_secs(1) {
        t += u.poll_interval().as_millis() as u64;
        u.observe(raw % 20_000_000, ms(t));
    }
    assert!(t - quiet_from > 25_000, "{t}");
}

#[test]
fn a_counter_stalled_at_first_loses_no_wraps() {
    // A sampler that reads whenever the interval says, on a counter that stood still for its
    // first 60 ms and then counts 100 W in a 20 J range (a wrap every 0.2 s). Trusting the
    // first figure (0 W) would wait a whole second and lose every wrap after it.
    let t0 = Instant::now();
    let energy_uj = |t_ms: u64| t_ms.saturating_sub(60) * 100_000;
    let mut u = Unwrapper::new(20_000_000);
    let mut t = 0;
    let mut total = 0;
    while t < 5_000 {
        total = u.observe(energy_uj(t) % 20_000_000, t0 + Duration::from_millis(t));
        t += u.poll_interval().as_millis() as u64;
    }
    let last = t - u.poll_interval().as_millis() as u64;
    assert_eq!(total, u128::from(energy_uj(last)), "every wrap counted");
    let s = u.poll_interval().as_secs_f64();
    assert!((s - 0.05).abs() < 1e-9, "{s}");
}

#[test]
fn a_late_read_counts_the_wraps_the_power_implies() {
    let t0 = Instant::now();
    let ms = |n: u64| t0 + Duration::from_millis(n);
    let mut u = Unwrapper::new(1_000_000); // 1 J
    u.observe(0, t0);
    u.observe(100_000, ms(10)); // 10 W: interval 25 ms
    u.observe(200_000, ms(20));
    // 330 ms late at 10 W is 3.3 J: three hidden wraps and 0.3 J.
    let total = u.observe(500_000, ms(350));
    assert_eq!(total, 3_500_000);
    // On schedule, nothing is added.
    assert_eq!(u.observe(600_000, ms(360)), 3_600_000);
}

#[test]
fn a_late_read_after_a_bursty_counter_counts_the_right_wraps() {
    // 10 W in a 1 J range, but the counter moves in bursts: 0.4 J every other 20 ms read, so
    // single figures swing between 0 and 20 W. Half a second of that, then a read 330 ms late
    // (3.3 J: three hidden wraps). The last single figure (20 W) would add six.
    let t0 = Instant::now();
    let ms = |n: u64| t0 + Duration::from_millis(n);
    let mut u = Unwrapper::new(1_000_000);
    let mut e = 0u64;
    u.observe(0, t0);
    let mut t = 0;
    for k in 1..=26u64 {
        t = 20 * k;
        if k % 2 == 0 {
            e += 400_000;
        }
        u.observe(e % 1_000_000, ms(t));
    }
    let p = u.power_w().unwrap();
    assert!((8.0..12.0).contains(&p), "smoothed: {p} W");
    let total = u.observe((e + 3_300_000) % 1_000_000, ms(t + 330));
    assert_eq!(total, u128::from(e + 3_300_000));
}

#[test]
fn a_simulated_tree_in_a_temp_dir_is_removed() {
    let s = sim::SimRapl::start(1, None, sim::DEFAULT_MAX_UJ).unwrap();
    let dir = s.dir().to_path_buf();
    assert!(dir.join("intel-rapl:0/intel-rapl:0:0/energy_uj").exists());
    drop(s);
    assert!(!dir.exists());
}

#[test]
fn power_model_integral_matches_numeric() {
    let (m, _) = sim::models(1);
    let n = 100_000;
    let t = 7.3;
    let h = t / n as f64;
    let numeric: f64 = (0..n).map(|i| m.power_w((i as f64 + 0.5) * h) * h).sum();
    assert!((numeric - m.energy_j(t)).abs() < 1e-6);
    assert!((60.0..=120.0).contains(&m.power_w(1.0)));
}

proptest! {
    /// Any sequence of reads at most one range apart gives the true total.
    #[test]
    fn unwrapping_recovers_the_total(
        range in 1u64..1_000_000_000_000,
        start in any::<u64>(),
        steps in proptest::collection::vec(0.0f64..1.0, 1..200),
    ) {
        let t0 = Instant::now();
        let start = start % range;
        let mut u = Unwrapper::new(range);
        let mut truth = u128::from(start);
        prop_assert_eq!(u.observe(start, t0), truth);
        for (k, f) in steps.iter().enumerate() {
            let step = ((range - 1) as f64 * f) as u64; // less than one range
            truth += u128::from(step);
            let raw = (truth % u128::from(range)) as u64;
            let at = t0 + Duration::from_millis(k as u64 + 1);
            prop_assert_eq!(u.observe(raw, at), truth);
        }
    }
}
