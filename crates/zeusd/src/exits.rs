//! Waking the client watcher the moment a client process exits.
//!
//! The watcher ([`crate::owners::Clients::reap`]) would otherwise only notice an exit at its
//! next round ([`crate::owners::WATCH_PERIOD`]). A pidfd (Linux 5.3+) of each client becomes
//! readable when that process terminates, so the watcher polls them all with the round as its
//! timeout: a killed job's power limit is back within milliseconds, and where pidfds are not
//! available (older kernels, seccomp filters) the rounds still catch every exit. A new client
//! rings a [`Bell`] so that the watcher starts waiting on its pidfd too.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use zeus_core::device::settings::Owner;

/// A pidfd of `owner`'s process, or `None` where the kernel does not give one or the pid now
/// names another process.
pub fn pidfd(owner: &Owner) -> Option<Arc<OwnedFd>> {
    let pid = libc::pid_t::try_from(owner.pid).ok()?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = i32::try_from(fd).ok().filter(|&fd| fd >= 0)?;
    // SAFETY: `fd` was just returned by the kernel and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // The pid may have been handed to another process between the owner's check and the
    // open: the descriptor is the owner's only if the owner still runs now.
    owner.is_alive().then(|| Arc::new(fd))
}

/// An eventfd that interrupts the watcher's wait: rung when a client is added, so its pidfd
/// joins the wait at once instead of at the next round.
#[derive(Debug)]
pub struct Bell(Option<OwnedFd>);

impl Bell {
    pub fn new() -> Bell {
        // SAFETY: eventfd takes an initial value and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        // SAFETY: a descriptor just returned by the kernel, owned by nothing else.
        Bell((fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    pub fn ring(&self) {
        if let Some(fd) = &self.0 {
            let one: u64 = 1;
            // SAFETY: writes the 8 bytes of `one` to an eventfd; a full counter (EAGAIN) means
            // a ring is pending anyway.
            unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
    }

    /// Take the pending rings.
    fn clear(&self) {
        if let Some(fd) = &self.0 {
            let mut n: u64 = 0;
            // SAFETY: reads at most 8 bytes into `n`; non-blocking.
            unsafe { libc::read(fd.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
        }
    }
}

/// What ended a [`wait_any`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woken {
    /// One of the processes exited.
    Exit,
    /// The bell rang: the set of clients changed.
    Bell,
    /// Neither, within the timeout (or the wait failed).
    Timeout,
}

/// Wait until one of `fds`' processes exits, `bell` rings, or `timeout` passes.
pub fn wait_any(bell: &Bell, fds: &[Arc<OwnedFd>], timeout: Duration) -> Woken {
    let mut polls: Vec<libc::pollfd> = bell
        .0
        .iter()
        .map(|fd| fd.as_raw_fd())
        .chain(fds.iter().map(|fd| fd.as_raw_fd()))
        .map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `polls` is a live array of `polls.len()` entries whose descriptors `bell` and
    // `fds` keep open for the call.
    let n = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, ms) };
    if n <= 0 {
        if n < 0 {
            // EINTR or the like: do not spin; the caller's round goes on.
            std::thread::sleep(timeout);
        }
        return Woken::Timeout;
    }
    let bell_polls = usize::from(bell.0.is_some());
    if polls[bell_polls..].iter().any(|p| p.revents != 0) {
        return Woken::Exit;
    }
    bell.clear();
    Woken::Bell
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_pidfd_wakes_the_waiter_when_its_process_exits() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let owner = Owner::of_pid(child.id()).unwrap();
        let Some(fd) = pidfd(&owner) else {
            // A kernel without pidfd_open: the watcher's rounds are the fallback.
            child.kill().unwrap();
            child.wait().unwrap();
            return;
        };
        let fds = [fd];
        let bell = Bell::new();
        assert_eq!(
            wait_any(&bell, &fds, Duration::from_millis(50)),
            Woken::Timeout,
            "still running"
        );
        let killer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            child.kill().unwrap();
            child
        });
        let t0 = Instant::now();
        assert_eq!(wait_any(&bell, &fds, Duration::from_secs(20)), Woken::Exit);
        // Woken by the exit, not by the timeout.
        assert!(t0.elapsed() < Duration::from_secs(10));
        killer.join().unwrap().wait().unwrap();
    }

    #[test]
    fn the_bell_interrupts_a_wait_and_one_wake_takes_every_pending_ring() {
        let bell = Arc::new(Bell::new());
        let b = bell.clone();
        let ringer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            b.ring();
        });
        let t0 = Instant::now();
        assert_eq!(wait_any(&bell, &[], Duration::from_secs(20)), Woken::Bell);
        assert!(t0.elapsed() < Duration::from_secs(10));
        ringer.join().unwrap();
        // Rings made before a wait are all taken by its wake. (Rung from this thread: a ring
        // from another thread could land after the wake took the first one, which is then a
        // new ring, as it should be.)
        bell.ring();
        bell.ring();
        assert_eq!(wait_any(&bell, &[], Duration::from_millis(20)), Woken::Bell);
        assert_eq!(
            wait_any(&bell, &[], Duration::from_millis(20)),
            Woken::Timeout
        );
    }

    #[test]
    fn no_descriptor_for_a_process_that_is_gone() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let owner = Owner::of_pid(child.id());
        child.wait().unwrap();
        if let Some(owner) = owner {
            assert!(pidfd(&owner).is_none());
        }
        assert_eq!(
            wait_any(&Bell::new(), &[], Duration::from_millis(1)),
            Woken::Timeout
        );
    }
}
