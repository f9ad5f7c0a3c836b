//! [`StopSignal`]: how the monitor threads sleep until their next reading and still stop at
//! once when asked.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// A stop flag that sleeping threads wake up for.
#[derive(Debug, Default)]
pub struct StopSignal {
    stopped: Mutex<bool>,
    wake: Condvar,
}

impl StopSignal {
    pub fn new() -> StopSignal {
        StopSignal::default()
    }

    fn flag(&self) -> MutexGuard<'_, bool> {
        self.stopped.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ask the threads to stop, waking the sleeping ones.
    pub fn stop(&self) {
        *self.flag() = true;
        self.wake.notify_all();
    }

    /// Wake sleeping threads without stopping them, so they look at their work again.
    pub fn nudge(&self) {
        self.wake.notify_all();
    }

    pub fn is_stopped(&self) -> bool {
        *self.flag()
    }

    /// Sleep until `deadline`, a stop or a nudge (or a spurious wake-up); `true` if stopped.
    pub fn sleep_until(&self, deadline: Instant) -> bool {
        let stopped = self.flag();
        let now = Instant::now();
        if *stopped || now >= deadline {
            return *stopped;
        }
        *self
            .wake
            .wait_timeout(stopped, deadline - now)
            .unwrap_or_else(|p| p.into_inner())
            .0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_stop_wakes_a_long_sleep_at_once() {
        let s = Arc::new(StopSignal::new());
        let s2 = s.clone();
        let t = std::thread::spawn(move || {
            let begin = Instant::now();
            let stopped = s2.sleep_until(begin + Duration::from_secs(60));
            (stopped, begin.elapsed())
        });
        std::thread::sleep(Duration::from_millis(20));
        s.stop();
        let (stopped, took) = t.join().unwrap();
        assert!(stopped && took < Duration::from_secs(10));
        assert!(s.sleep_until(Instant::now() + Duration::from_secs(60)));
        let fresh = StopSignal::new();
        assert!(!fresh.sleep_until(Instant::now() + Duration::from_millis(5)));
    }
}
