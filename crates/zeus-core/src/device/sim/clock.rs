//! The simulator's clock: the system clock, or a virtual one that moves only when advanced, so
//! that a long workload runs in milliseconds and the same way every time.

use std::sync::atomic::{AtomicU64, Ordering};

use super::super::{Clock, SystemClock};

#[derive(Debug)]
pub struct SimClock {
    is_virtual: bool,
    /// Wall time when the virtual clock was made, so virtual timestamps look like `time.time()`.
    origin: f64,
    /// Virtual nanoseconds since `origin`.
    elapsed_ns: AtomicU64,
}

impl SimClock {
    pub fn real() -> SimClock {
        SimClock {
            is_virtual: false,
            origin: 0.0,
            elapsed_ns: AtomicU64::new(0),
        }
    }

    pub fn virtual_clock() -> SimClock {
        SimClock {
            is_virtual: true,
            origin: SystemClock.now().floor(),
            elapsed_ns: AtomicU64::new(0),
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
