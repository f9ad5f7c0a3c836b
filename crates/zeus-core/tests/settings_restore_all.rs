//! `restore_all` reaches every guard of the process, so it runs in a test binary of its own:
//! among the unit tests it would restore other tests' guards mid-test.

use zeus_core::device::settings::{restore_all, Journal, SettingsGuard};
use zeus_core::device::sim::{preset, Fidelity, Load, SimCluster, SimConfig};

#[test]
fn dropping_the_last_clone_restores_and_restore_all_reaches_live_guards() {
    let cluster = SimCluster::new(SimConfig {
        presets: vec![preset::find("A40").unwrap(); 2],
        virtual_clock: true,
        privileged: true,
        workload: None,
        fidelity: Fidelity::Ideal,
        load: Load::Idle,
        ..SimConfig::default()
    });
    let gpus = cluster.gpus();
    let limit = |i: usize| gpus.device(i).unwrap().power_management_limit().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let journal = Journal::at(dir.path());

    {
        let g = SettingsGuard::new(gpus.clone(), journal.clone());
        let clone = g.clone();
        g.set_power_limit(0, 200_000).unwrap();
        drop(g);
        assert_eq!(limit(0), 200_000, "a clone still holds it");
        drop(clone);
    }
    assert_eq!(limit(0), 300_000);

    let first = SettingsGuard::new(gpus.clone(), journal.clone());
    let second = SettingsGuard::new(gpus.clone(), journal.clone());
    first.set_power_limit(0, 200_000).unwrap();
    second.set_power_limit(1, 150_000).unwrap();
    let errors = restore_all();
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!((limit(0), limit(1)), (300_000, 300_000));
    assert!(!first.is_active() && !second.is_active());
    assert!(std::fs::read_dir(dir.path())
        .unwrap()
        .all(|e| e.unwrap().file_name() == ".lock"));
}
