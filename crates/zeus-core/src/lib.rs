//! The Rust core of zeus: GPU devices (NVML and the simulated GPU), measurement, the cost metric
//! and optimizers. Python bindings (`zeus._core`) are behind the `python` feature, so `cargo test`
//! builds and links without Python.

pub mod device;
pub mod monitor;
pub mod optimizer;
pub mod util;

#[cfg(feature = "python")]
mod python;
