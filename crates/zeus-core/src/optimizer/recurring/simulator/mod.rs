//! Trace-driven simulation of recurring jobs (the Zeus NSDI'23 evaluation).
//!
//! `trace` parses the train and power traces with errors naming file, line, column and value;
//! `table` joins them once per job into per-batch-size tables; `policy` holds the traits a
//! policy plugs in through (the Zeus policy of `super` implements them, and so do Python
//! policies through the bindings); `engine` runs the recurrence loop, drawing training paths
//! as the reference does, so the built-in Zeus policy runs entirely in Rust.

pub mod engine;
pub mod policy;
pub mod table;
pub mod trace;

pub use engine::{totals, HistoryEntry, Knobs, PathSampler, MAX_TRIES};
pub use policy::{BatchSizePolicy, PowerLimitPolicy};
pub use table::{builtin_job, JobSpec, JobTable, BUILTIN_WORKLOADS};
pub use trace::{SimError, SimResult};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

/// Parsed trace files, keyed by path, size and modification time, so that simulating many
/// workloads and seeds over one trace directory parses each file once per process.
type Cache<T> = Mutex<HashMap<(PathBuf, u64, Option<SystemTime>), Arc<Vec<T>>>>;

static TRAIN_CACHE: OnceLock<Cache<trace::TrainRow>> = OnceLock::new();
static POWER_CACHE: OnceLock<Cache<trace::PowerRow>> = OnceLock::new();

fn cached<T>(
    cache: &'static OnceLock<Cache<T>>,
    path: &Path,
    read: fn(&Path) -> SimResult<Vec<T>>,
) -> SimResult<Arc<Vec<T>>> {
    let meta = std::fs::metadata(path).map_err(|source| SimError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let key = (path.to_path_buf(), meta.len(), meta.modified().ok());
    let cache = cache.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(rows) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(rows.clone());
    }
    let rows = Arc::new(read(path)?);
    let mut map = cache.lock().unwrap_or_else(|e| e.into_inner());
    // A changed file leaves its stale entry behind; drop entries of the same path.
    map.retain(|k, _| k.0 != key.0);
    map.insert(key, rows.clone());
    Ok(rows)
}

/// Read (or reuse) a parsed `summary_train.csv`.
pub fn read_train_cached(path: &Path) -> SimResult<Arc<Vec<trace::TrainRow>>> {
    cached(&TRAIN_CACHE, path, trace::read_train)
}

/// Read (or reuse) a parsed power trace.
pub fn read_power_cached(path: &Path) -> SimResult<Arc<Vec<trace::PowerRow>>> {
    cached(&POWER_CACHE, path, trace::read_power)
}

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
    let train = read_train_cached(&dir.join("summary_train.csv"))?;
    let power = read_power_cached(&power_path)?;
    JobTable::build(&job, &train, &power)
}

/// Default number of recurrences: 2·|batch sizes|·|power limits|, as in the paper.
pub fn default_recurrences(table: &JobTable) -> u32 {
    (2 * table.batch_sizes.len() * table.num_power_limits()) as u32
}

#[cfg(test)]
mod tests;
