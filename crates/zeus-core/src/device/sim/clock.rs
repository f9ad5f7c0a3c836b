//! The simulator's clock: the system clock, or a virtual one that moves only when advanced, so
//! that a long workload runs in milliseconds and the same way every time. Devices shared between
//! processes (`ZEUS_SIM_SHARED`) run on a third kind: `CLOCK_MONOTONIC` plus an offset stored in
//! the shared file, the same in every process and immune to the wall clock being stepped.

use std::sync::atomic::{AtomicU64, Ordering};

use super::super::{Clock, SystemClock};

#[derive(Debug)]
pub struct SimClock {
    is_virtual: bool,
    /// Wall time when the virtual clock was made, so virtual timestamps look like `time.time()`.
    origin: f64,
    /// Virtual nanoseconds since `origin`.
    elapsed_ns: AtomicU64,
    /// Shared clock: `now()` is `CLOCK_MONOTONIC` plus this (wall time minus monotonic time when
    /// the shared file was made, so timestamps still look like `time.time()`).
    monotonic_offset: Option<f64>,
}

/// `CLOCK_MONOTONIC`, seconds: one origin for every process on the machine (unlike `Instant`,
/// whose origin is private to the process).
pub fn monotonic_now() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

impl SimClock {
    pub fn real() -> SimClock {
        SimClock {
            is_virtual: false,
            origin: 0.0,
            elapsed_ns: AtomicU64::new(0),
            monotonic_offset: None,
        }
    }

    /// The clock of devices shared between processes: `CLOCK_MONOTONIC + offset`.
    pub fn shared(monotonic_offset: f64) -> SimClock {
        SimClock {
            is_virtual: false,
            origin: 0.0,
            elapsed_ns: AtomicU64::new(0),
            monotonic_offset: Some(monotonic_offset),
        }
    }

    pub fn virtual_clock() -> SimClock {
        SimClock::virtual_from(SystemClock.now().floor())
    }

    /// A virtual clock that starts at `origin` (seconds since the epoch): the same run every
    /// time, for tests that must be reproducible to the microsecond.
    pub fn virtual_from(origin: f64) -> SimClock {
        SimClock {
            is_virtual: true,
            origin,
            elapsed_ns: AtomicU64::new(0),
            monotonic_offset: None,
        }
    }

    /// Move a virtual clock forward. Returns `false` (and does nothing) on the real clock.
    pub fn advance(&self, seconds: f64) -> bool {
        if !self.is_virtual {
            return false;
        }
        if seconds > 0.0 && seconds.is_finite() {
            self.elapsed_ns
                .fetch_add((seconds * 1e9).round() as u64, Ordering::SeqCst);
        }
        true
    }
}

impl Clock for SimClock {
    fn now(&self) -> f64 {
        if self.is_virtual {
            self.origin + self.elapsed_ns.load(Ordering::SeqCst) as f64 * 1e-9
        } else if let Some(offset) = self.monotonic_offset {
            monotonic_now() + offset
        } else {
            SystemClock.now()
        }
    }

    fn is_virtual(&self) -> bool {
        self.is_virtual
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_clock_moves_only_when_advanced() {
        let c = SimClock::virtual_clock();
        let t0 = c.now();
        assert_eq!(c.now(), t0);
        assert!(c.advance(1.5));
        assert!((c.now() - t0 - 1.5).abs() < 1e-6);
        assert!(c.advance(-3.0));
        assert!((c.now() - t0 - 1.5).abs() < 1e-6);
        assert!(!SimClock::real().advance(1.0));
    }
}
