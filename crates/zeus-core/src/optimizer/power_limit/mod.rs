//! Power-limit optimization: the optimum selectors that pick one power limit from the profile.
//!
//! The profiling state machine that produces the measurements lives in Python
//! (`zeus.optimizer.power_limit`), because every step of it calls Python objects (the monitor,
//! a user's selector, the training loop's hooks); the arithmetic that decides lives here.

pub mod selector;

pub use selector::{Measurement, Selector, SelectorError};
