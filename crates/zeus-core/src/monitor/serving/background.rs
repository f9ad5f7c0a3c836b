//! [`Background`]: a thread that measures a [`WindowLedger`]'s marks off the engine's thread.
//!
//! With deferred cuts (`window.rs`) an engine's calls only mark moments, and the marks are
//! measured together every few steps: cuts of the window at each mark, the split among the
//! requests, the `work` fit. Done on the engine's thread that is a burst of 100-300 µs every
//! [`MARK_BATCH`](super::MARK_BATCH) steps, with its caches cold after the GPU wait, which
//! was most of the ledger's cost per step and a latency spike in the step that paid it. The
//! marks need nothing of the engine's (no interpreter, no GPU call: the window is cut from
//! the sampler's cache), so this thread measures them instead; the engine's thread measures
//! only when the marks pile up past [`WindowLedger::overdue`] (this thread starved or
//! stopped), or when something reads the ledger.

use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::monitor::stop::StopSignal;

/// How often the thread looks for marks that are due: well inside
/// [`MARK_MAX_AGE_S`](super::MARK_MAX_AGE_S), so that a record waits about as long as it did
/// when the engine measured, and rarely enough that the lock it takes costs nothing.
pub const BACKGROUND_PERIOD: Duration = Duration::from_millis(50);

/// What the thread measures: the ledger's state, behind the engine's own lock.
pub trait MeasuredInBackground: Send + 'static {
    /// Measure the marks if they are due. `false`: stop (the ledger is closed, or measuring
    /// failed and the engine's next call is to meet the error).
    fn measure_due(&mut self) -> bool;
}

/// The measuring thread of one ledger. Dropping it stops the thread (it also stops once the
/// state is gone: it holds it weakly, so the state is dropped where its owner drops it).
#[derive(Debug)]
pub struct Background {
    stop: Arc<StopSignal>,
    thread: Option<JoinHandle<()>>,
}

impl Background {
    /// Start measuring `state` every `period`.
    ///
    /// # Errors
    /// The thread could not be spawned.
    pub fn spawn<S: MeasuredInBackground>(
        state: Weak<Mutex<S>>,
        period: Duration,
    ) -> std::io::Result<Background> {
        let stop = Arc::new(StopSignal::new());
        let signal = stop.clone();
        let thread = std::thread::Builder::new()
            .name("zeus-ledger".into())
            .spawn(move || loop {
                if signal.sleep_until(Instant::now() + period) {
                    return;
                }
                let Some(state) = state.upgrade() else {
                    return;
                };
                let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
                if !s.measure_due() {
                    return;
                }
            })?;
        Ok(Background {
            stop,
            thread: Some(thread),
        })
    }

    /// Whether the thread still runs (it stops on [`MeasuredInBackground::measure_due`]'s
    /// `false`, a stop, or once the state is gone).
    pub fn running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stop the thread and wait for it (at most one measurement). Do not hold the state's
    /// lock: the thread may be waiting for it.
    pub fn stop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        // Not joined: a drop may come with the state's lock held; the thread ends at its next
        // wake-up, which the stop brings at once.
        self.stop.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Counting {
        due_after: usize,
        seen: Arc<AtomicUsize>,
    }

    impl MeasuredInBackground for Counting {
        fn measure_due(&mut self) -> bool {
            let n = self.seen.fetch_add(1, Ordering::SeqCst) + 1;
            n < self.due_after
        }
    }

    fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn measures_until_told_to_stop_and_stops_when_the_state_is_gone() {
        let seen = Arc::new(AtomicUsize::new(0));
        let state = Arc::new(Mutex::new(Counting {
            due_after: 3,
            seen: seen.clone(),
        }));
        let bg = Background::spawn(Arc::downgrade(&state), Duration::from_millis(1)).unwrap();
        wait_for("the thread stops on false", || !bg.running());
        assert_eq!(seen.load(Ordering::SeqCst), 3);

        let state = Arc::new(Mutex::new(Counting {
            due_after: usize::MAX,
            seen: Arc::new(AtomicUsize::new(0)),
        }));
        let bg = Background::spawn(Arc::downgrade(&state), Duration::from_millis(1)).unwrap();
        assert!(bg.running());
        drop(state);
        wait_for("the thread stops without its state", || !bg.running());

        let seen = Arc::new(AtomicUsize::new(0));
        let state = Arc::new(Mutex::new(Counting {
            due_after: usize::MAX,
            seen: seen.clone(),
        }));
        let mut bg = Background::spawn(Arc::downgrade(&state), Duration::from_secs(3600)).unwrap();
        let begin = Instant::now();
        bg.stop(); // wakes the hour-long sleep
        assert!(!bg.running() && begin.elapsed() < Duration::from_secs(10));
        assert_eq!(seen.load(Ordering::SeqCst), 0);
    }
}
