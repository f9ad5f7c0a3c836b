//! A job's view of the traces: training paths and per-(batch size, power limit) epoch costs,
//! parsed once and indexed so that the recurrence loop never searches a table.

use super::trace::{PowerRow, SimError, SimResult, TrainRow};

/// A recurring job, as the reference's `Job` names it for the simulator.
#[derive(Debug, Clone, PartialEq)]
pub struct JobSpec {
    /// Dataset name.
    pub dataset: String,
    /// Network name.
    pub network: String,
    /// Optimizer name.
    pub optimizer: String,
    /// Target validation metric.
    pub target_metric: f64,
    /// Maximum number of epochs of one run.
    pub max_epochs: u32,
    /// The user's default batch size (b0).
    pub default_bs: u32,
}

/// The six NSDI'23 workloads: (dataset, network, optimizer, target metric, max epochs, b0), as in
/// the reference's `run_alibaba.py`.
pub const BUILTIN_WORKLOADS: [(&str, &str, &str, f64, u32, u32); 6] = [
    ("cifar100", "shufflenetv2", "adadelta", 0.6, 100, 1024),
    ("imagenet", "resnet50", "adadelta", 0.65, 100, 256),
    ("librispeech", "deepspeech2", "adamw", 40.0, 16, 256),
    ("movielens-1m", "ncf", "adam", 0.41, 100, 1024),
    ("sentiment140", "bert_base_uncased", "adamw", 0.84, 10, 128),
    ("squad", "bert_base_uncased", "adamw", 84.0, 6, 32),
];

/// The built-in job for `dataset` (default batch size not yet clamped to a GPU).
pub fn builtin_job(dataset: &str) -> SimResult<JobSpec> {
    BUILTIN_WORKLOADS
        .iter()
        .find(|w| w.0 == dataset)
        .map(|w| JobSpec {
            dataset: w.0.into(),
            network: w.1.into(),
            optimizer: w.2.into(),
            target_metric: w.3,
            max_epochs: w.4,
            default_bs: w.5,
        })
        .ok_or_else(|| {
            let names: Vec<&str> = BUILTIN_WORKLOADS.iter().map(|w| w.0).collect();
            SimError::UnknownWorkload(dataset.to_string(), names.join(", "))
        })
}

/// One epoch at one (batch size, power limit).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EpochCost {
    /// Power limit, W.
    pub power_limit: u32,
    /// Seconds per epoch.
    pub time: f64,
    /// Joules per epoch.
    pub energy: f64,
    /// Average power, W.
    pub power: f64,
}

/// Everything the simulator knows about one batch size.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchSizeData {
    /// The batch size.
    pub batch_size: u32,
    /// Epoch costs, power limit ascending.
    pub epochs: Vec<EpochCost>,
    /// Training paths (target epoch, `None` = never reached), in train-trace order.
    pub paths: Vec<Option<f64>>,
    /// Mean epoch energy and time over all power limits: the first epoch of a run that
    /// profiles power limits in slices of that epoch.
    pub profile_energy: f64,
    /// See `profile_energy`.
    pub profile_time: f64,
}

impl BatchSizeData {
    /// Highest power limit in the trace for this batch size, W.
    pub fn max_pl(&self) -> u32 {
        self.epochs.last().map(|e| e.power_limit).unwrap_or(0)
    }

    /// Epoch data at `pl`, if the trace has it.
    pub fn at(&self, pl: u32) -> Option<&EpochCost> {
        self.epochs.iter().find(|e| e.power_limit == pl)
    }
}

/// One job on one GPU, ready to simulate.
#[derive(Debug, Clone, PartialEq)]
pub struct JobTable {
    /// The job (default batch size clamped into the trace's range).
    pub job: JobSpec,
    /// Feasible batch sizes, ascending, each with its data.
    pub batch_sizes: Vec<BatchSizeData>,
    /// Highest power limit anywhere in the merged trace, W (the reference's `MAXPOWER`).
    pub max_power: f64,
}

impl JobTable {
    /// Join the traces for `job` the way the reference does (inner join on dataset, network,
    /// batch size and optimizer).
    ///
    /// The default batch size is clamped to the largest batch size available, as the reference's
    /// Alibaba driver does per GPU. Batch sizes for which the train trace has no run at the job's
    /// target metric are dropped: the reference would crash sampling a path from them.
    pub fn build(job: &JobSpec, train: &[TrainRow], power: &[PowerRow]) -> SimResult<JobTable> {
        // MAXPOWER is taken over the whole merged trace, not only this job.
        let mut max_power = 0u32;
        {
            let mut keys: std::collections::HashSet<(&str, &str, &str, u32)> =
                std::collections::HashSet::new();
            for t in train {
                keys.insert((&t.dataset, &t.network, &t.optimizer, t.batch_size));
            }
            for p in power {
                if keys.contains(&(
                    p.dataset.as_str(),
                    p.network.as_str(),
                    p.optimizer.as_str(),
                    p.batch_size,
                )) {
                    max_power = max_power.max(p.power_limit);
                }
            }
        }
        let mine_t: Vec<&TrainRow> = train
            .iter()
            .filter(|t| {
                t.dataset == job.dataset && t.network == job.network && t.optimizer == job.optimizer
            })
            .collect();
        let mine_p: Vec<&PowerRow> = power
            .iter()
            .filter(|p| {
                p.dataset == job.dataset && p.network == job.network && p.optimizer == job.optimizer
            })
            .collect();
        let power_bss: std::collections::HashSet<u32> =
            mine_p.iter().map(|p| p.batch_size).collect();
        let mut bss: Vec<u32> = mine_t
            .iter()
            .map(|t| t.batch_size)
            .filter(|bs| power_bss.contains(bs))
            .collect();
        bss.sort_unstable();
        bss.dedup();
        if bss.is_empty() {
            return Err(SimError::NoData(format!(
                "the traces have no common batch size for {}/{}/{} (train trace rows: {}, power \
                 trace rows: {})",
                job.dataset,
                job.network,
                job.optimizer,
                mine_t.len(),
                mine_p.len()
            )));
        }
        let mut out = Vec::with_capacity(bss.len());
        for &bs in &bss {
            let paths: Vec<Option<f64>> = mine_t
                .iter()
                .filter(|t| t.batch_size == bs && t.target_metric == job.target_metric)
                .map(|t| t.target_epoch)
                .collect();
            if paths.is_empty() {
                continue;
            }
            let mut epochs: Vec<EpochCost> = Vec::new();
            for p in mine_p.iter().filter(|p| p.batch_size == bs) {
                if epochs.iter().any(|e| e.power_limit == p.power_limit) {
                    return Err(SimError::NoData(format!(
                        "the power trace has two rows for {}/{}/{} batch size {} power limit {} W",
                        job.dataset, job.network, job.optimizer, bs, p.power_limit
                    )));
                }
                epochs.push(EpochCost {
                    power_limit: p.power_limit,
                    time: p.time_per_epoch,
                    energy: p.time_per_epoch * p.average_power,
                    power: p.average_power,
                });
            }
            epochs.sort_by_key(|e| e.power_limit);
            let n = epochs.len() as f64;
            let profile_energy = epochs.iter().map(|e| e.energy).sum::<f64>() / n;
            let profile_time = epochs.iter().map(|e| e.time).sum::<f64>() / n;
            out.push(BatchSizeData {
                batch_size: bs,
                epochs,
                paths,
                profile_energy,
                profile_time,
            });
        }
        if out.is_empty() {
            return Err(SimError::NoData(format!(
                "the train trace has no run of {}/{}/{} with target metric {}",
                job.dataset, job.network, job.optimizer, job.target_metric
            )));
        }
        let mut job = job.clone();
        let largest = out.last().map(|b| b.batch_size).unwrap_or(job.default_bs);
        job.default_bs = job.default_bs.min(largest);
        if !out.iter().any(|b| b.batch_size == job.default_bs) {
            let have: Vec<String> = out.iter().map(|b| b.batch_size.to_string()).collect();
            return Err(SimError::InvalidArgument(format!(
                "default batch size {} of {} is not among the trace's batch sizes [{}]",
                job.default_bs,
                job.dataset,
                have.join(", ")
            )));
        }
        Ok(JobTable {
            job,
            batch_sizes: out,
            max_power: max_power as f64,
        })
    }

    /// The ascending list of batch sizes.
    pub fn batch_size_list(&self) -> Vec<u32> {
        self.batch_sizes.iter().map(|b| b.batch_size).collect()
    }

    /// Index of `bs` in `batch_sizes`.
    pub fn index_of(&self, bs: u32) -> SimResult<usize> {
        self.batch_sizes
            .binary_search_by_key(&bs, |b| b.batch_size)
            .map_err(|_| {
                SimError::InvalidArgument(format!(
                    "batch size {} is not in the trace of {} (have {:?})",
                    bs,
                    self.job.dataset,
                    self.batch_size_list()
                ))
            })
    }

    /// Number of distinct power limits over all batch sizes.
    pub fn num_power_limits(&self) -> usize {
        let mut pls: Vec<u32> = self
            .batch_sizes
            .iter()
            .flat_map(|b| b.epochs.iter().map(|e| e.power_limit))
            .collect();
        pls.sort_unstable();
        pls.dedup();
        pls.len()
    }
}
