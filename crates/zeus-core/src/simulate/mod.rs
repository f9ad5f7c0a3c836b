//! Trace-driven simulation of recurring jobs (the Zeus NSDI'23 evaluation).
//!
//! `trace` parses the train and power traces with errors naming file, line, column and value;
//! `table` joins them once per job into per-batch-size tables; `policy` holds the paper's
//! policies; `engine` runs the recurrence loop, generic over the policies so that the Python
//! bindings can plug in user policies while the built-in Zeus policy runs entirely in Rust.

pub mod engine;
pub mod policy;
pub mod table;
pub mod trace;

pub use engine::{totals, HistoryEntry, Knobs, MAX_TRIES};
pub use policy::{BatchSizePolicy, GaussianTs, JitPowerLimit, PowerLimitPolicy, PruningGts};
pub use table::{builtin_job, JobSpec, JobTable, BUILTIN_WORKLOADS};
pub use trace::{SimError, SimResult};

use std::path::Path;

/// Load the traces of `gpu` in `dir` and build the table of built-in workload `workload`.
pub fn load_builtin(dir: &Path, gpu: &str, workload: &str) -> SimResult<JobTable> {
    let job = builtin_job(workload)?;
    let power_path = trace::power_file(dir, gpu);
    if !power_path.exists() {
        let have = trace::available_gpus(dir);
        return Err(SimError::InvalidArgument(format!(
            "unknown GPU '{gpu}': no power trace {} (GPUs with a power trace in {}: [{}])",
            power_path.display(),
            dir.display(),
            have.join(", ")
        )));
    }
    let train = trace::read_train(&dir.join("summary_train.csv"))?;
    let power = trace::read_power(&power_path)?;
    JobTable::build(&job, &train, &power)
}

/// Default number of recurrences: 2·|batch sizes|·|power limits|, as in the paper.
pub fn default_recurrences(table: &JobTable) -> u32 {
    (2 * table.batch_sizes.len() * table.num_power_limits()) as u32
}

#[cfg(test)]
mod tests;
