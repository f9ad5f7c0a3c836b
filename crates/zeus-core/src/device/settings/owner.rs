//! Who holds a GPU setting: a process, named by its pid, its start time and the boot it ran in.
//!
//! A pid alone is not an identity: after the owner dies the kernel hands its pid to the next
//! process, and a journal that trusted the pid would wait forever for an unrelated process to
//! exit while the GPU keeps the dead owner's setting. The start time (field 22 of
//! `/proc/<pid>/stat`, in clock ticks since boot) tells the two apart, and the boot id
//! (`/proc/sys/kernel/random/boot_id`) tells apart processes of different boots, whose start
//! times are counted from different origins.
//!
//! A process that has exited but whose parent has not yet waited for it (a zombie) still has
//! its pid and start time; it holds nothing any more and never runs again, so it counts as
//! gone (field 3, the state, is `Z` or `X`): a job killed under a launcher that reaps its
//! children late gets its settings back now, not when the launcher gets round to it.

use std::fs;
use std::io;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

/// A process that holds (or held) a GPU setting.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Owner {
    pub pid: u32,
    /// Start time in clock ticks since boot; `None` where it cannot be read (not Linux, or an
    /// entry written by an older build that recorded only the pid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<u64>,
    /// The boot the process ran in; `None` where unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
}

impl Owner {
    /// This process. Read anew on every call: a forked child is a different owner.
    pub fn current() -> Owner {
        let pid = std::process::id();
        Owner {
            pid,
            start_time: start_time(pid),
            boot_id: boot_id(),
        }
    }

    /// The running process `pid`, or `None` if there is none.
    pub fn of_pid(pid: u32) -> Option<Owner> {
        if !pid_exists(pid) {
            return None;
        }
        let stat = proc_stat(pid);
        if stat.as_ref().is_some_and(ProcStat::exited) {
            return None;
        }
        Some(Owner {
            pid,
            start_time: stat.and_then(|s| s.start_time),
            boot_id: boot_id(),
        })
    }

    /// An owner known only by its pid (entries of older builds).
    pub fn pid_only(pid: u32) -> Owner {
        Owner {
            pid,
            start_time: None,
            boot_id: None,
        }
    }

    /// Whether this very process still runs: same boot, the pid exists, and (where both are
    /// known) the process now under that pid started when the owner did.
    pub fn is_alive(&self) -> bool {
        // A pid-only record (an older build's) naming pid 1: init never exits, and a container
        // whose job ran as pid 1 has another pid 1 after a restart; either way the record's
        // owner cannot be told from what runs now, and waiting for it would never end.
        if self.pid == 1 && self.start_time.is_none() {
            return false;
        }
        if let (Some(mine), Some(now)) = (&self.boot_id, boot_id()) {
            if *mine != now {
                return false;
            }
        }
        if !pid_exists(self.pid) {
            return false;
        }
        let stat = proc_stat(self.pid);
        if stat.as_ref().is_some_and(ProcStat::exited) {
            return false;
        }
        match (self.start_time, stat.and_then(|s| s.start_time)) {
            (Some(recorded), Some(now)) => recorded == now,
            // The pid exists and nothing contradicts it being the owner.
            _ => true,
        }
    }

    /// Whether `other` is the same process (a pid-only record matches on the pid).
    pub fn same_process(&self, other: &Owner) -> bool {
        let known_and_differ =
            |a: &Option<u64>, b: &Option<u64>| matches!((a, b), (Some(x), Some(y)) if x != y);
        self.pid == other.pid
            && !known_and_differ(&self.start_time, &other.start_time)
            && !matches!((&self.boot_id, &other.boot_id), (Some(a), Some(b)) if a != b)
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "process {}", self.pid)
    }
}

/// The owners' pids for a message: `"1234, 5678"`.
pub fn pid_list(owners: &[Owner]) -> String {
    let pids: Vec<String> = owners.iter().map(|o| o.pid.to_string()).collect();
    pids.join(", ")
}

/// Whether a process with this pid exists. Permission errors mean it exists but belongs to
/// someone else.
pub fn pid_exists(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return false;
    }
    // SAFETY: kill with signal 0 only checks for the process; it sends nothing.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Start time of process `pid` in clock ticks since boot, from `/proc/<pid>/stat`.
pub fn start_time(pid: u32) -> Option<u64> {
    proc_stat(pid)?.start_time
}

/// The fields of `/proc/<pid>/stat` that tell who a process is and whether it still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProcStat {
    /// Field 3: `R`, `S`, `D`, ... or `Z` (zombie) and `X` (dead).
    state: char,
    /// Field 22, clock ticks since boot.
    start_time: Option<u64>,
}

impl ProcStat {
    /// The process has exited; only its entry in the process table is left.
    fn exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

fn proc_stat(pid: u32) -> Option<ProcStat> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Fields 3 and 22 of a `/proc/<pid>/stat` line. The command name (field 2) is in parentheses
/// and may itself contain spaces and parentheses, so fields are counted after the last `)`.
fn parse_stat(stat: &str) -> Option<ProcStat> {
    let after = &stat[stat.rfind(')')? + 1..];
    let mut fields = after.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // Field 22 is the 19th after the state.
    let start_time = fields.nth(18).and_then(|f| f.parse().ok());
    Some(ProcStat { state, start_time })
}

/// This boot's id; the same for every process of one boot.
fn boot_id() -> Option<String> {
    static BOOT_ID: OnceLock<Option<String>> = OnceLock::new();
    BOOT_ID
        .get_or_init(|| {
            fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_field_22_even_with_parentheses_in_the_name() {
        let stat = "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 \
                    1000 200 18446744073709551615";
        assert_eq!(
            parse_stat(stat),
            Some(ProcStat {
                state: 'S',
                start_time: Some(987654)
            })
        );
        assert_eq!(parse_stat("garbage"), None);
        assert!(parse_stat("7 (x) Z 1 7").unwrap().exited());
    }

    #[test]
    fn an_exited_child_not_yet_waited_for_is_gone() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let owner = Owner::of_pid(child.id()).expect("running");
        assert!(owner.is_alive());
        child.kill().unwrap();
        // Not waited for: a zombie keeps its pid and start time until then.
        let t0 = std::time::Instant::now();
        while owner.is_alive() && t0.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(pid_exists(child.id()), "still in the process table");
        assert!(!owner.is_alive(), "a zombie holds nothing");
        assert!(Owner::of_pid(child.id()).is_none());
        child.wait().unwrap();
    }

    #[test]
    fn this_process_is_alive_and_a_different_start_time_is_not() {
        let me = Owner::current();
        assert!(me.is_alive());
        if let Some(t) = me.start_time {
            let impostor = Owner {
                start_time: Some(t + 1),
                ..me.clone()
            };
            assert!(
                !impostor.is_alive(),
                "a reused pid must not count as the owner"
            );
            assert!(!impostor.same_process(&me));
        }
        let other_boot = Owner {
            boot_id: Some("not-this-boot".into()),
            ..me.clone()
        };
        if me.boot_id.is_some() {
            assert!(!other_boot.is_alive());
        }
        assert!(Owner::pid_only(me.pid).same_process(&me));
    }

    #[test]
    fn nonsense_pids_are_not_alive() {
        assert!(!Owner::pid_only(0).is_alive());
        assert!(!Owner::pid_only(u32::MAX).is_alive());
        assert!(Owner::of_pid(i32::MAX as u32).is_none());
    }
}
