//! The simulated GPU: a model of a board (see [`preset`]) running a workload (see [`workload`]),
//! on the system clock or a virtual one (see [`clock`]).
//!
//! It has two faces. In-process, [`SimGpu`] implements [`Gpu`] and is chosen only when the user
//! sets `ZEUS_GPU_BACKEND=sim`. Out-of-process, the `zeus-sim-nvml` crate wraps the same model in
//! the NVML C ABI as a drop-in `libnvidia-ml.so.1`.
//!
//! Configuration (read once per process, by [`SimConfig::from_env`]):
//! - `ZEUS_SIM_GPUS`: comma-separated preset keys (default `A40`).
//! - `ZEUS_SIM_CLOCK`: `real` (default) or `virtual`.
//! - `ZEUS_SIM_PRIVILEGED`: `1` (default) or `0`; unprivileged setters fail with NoPermission.
//! - `ZEUS_SIM_WORKLOAD`: a built-in measured workload (`matmul_bf16`, `stream_add_fp32`,
//!   `bert_train_step`, see [`workload::builtin_names`]) or a CSV curve
//!   (`power_limit,time_per_epoch,average_power`), for every GPU.
//! - `ZEUS_SIM_LOAD`: `idle` (default) or `busy`, the load every GPU starts with.
//! - `ZEUS_SIM_FIDELITY`: `real` (default) or `ideal`, see [`Fidelity`].
//! - `ZEUS_SIM_ENERGY_READ_MS`: the CPU cost of an energy read at real fidelity, for every GPU
//!   (default: the preset's; the H100 measured 3.5-6 ms).
//! - `ZEUS_SIM_SHARED`: a file path; every process naming the same file shares the devices'
//!   mutable state, as processes share a real GPU (see [`shared`]). Not with a virtual clock.
//! - The board's timing and quirks (update periods, counter lag and resolution, power noise, no
//!   instant power, counter resets, a fault schedule): see [`board`].
//!
//! Energy is the exact integral of the modelled power over time; the state is integrated lazily
//! whenever it is read or changed. What a reading *returns* depends on the fidelity: with `real`,
//! what a driver would have published by then (see [`Fidelity::Real`]).

pub mod board;
pub mod clock;
mod cluster;
mod gpu;
pub mod preset;
pub mod shared;
pub mod workload;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use board::{Board, BoardKnobs, Fault, FieldTimestamps};
pub use clock::SimClock;
pub use preset::{Preset, PRESETS};
pub use workload::{ClockCurve, ClockPoint, CurvePoint, WorkloadCurve};

use super::{
    Architecture, BackendKind, Clock, Gpu, GpuError, GpuResult, Gpus, MemoryInfo, PowerSample,
    Utilization, Vendor,
};

pub use cluster::{global_cluster, reset_global_cluster, SimCluster, SimConfig};
pub use gpu::*;
// The board state `shared` maps into a file.
use gpu::{Segment, State};

#[cfg(test)]
mod tests;
