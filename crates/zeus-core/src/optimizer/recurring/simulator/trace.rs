//! Parsing the Zeus trace files (`summary_train.csv`, `summary_power_<gpu>.csv`).
//!
//! Every error names the file, and where it applies the line, the column and the bad value, so a
//! user with a hand-edited trace can find the problem without reading our code.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// What can go wrong when loading traces or preparing a simulation.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The file could not be opened or read.
    #[error("cannot read trace file {path}: {source}")]
    Io {
        /// Offending file.
        path: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },
    /// A required column is missing from the header.
    #[error("trace file {path} has no column '{column}' (header: {header})")]
    MissingColumn {
        /// Offending file.
        path: PathBuf,
        /// Missing column name.
        column: String,
        /// The header that was found.
        header: String,
    },
    /// A cell could not be parsed or is out of range.
    #[error("trace file {path}, line {line}, column '{column}': bad value '{value}' ({why})")]
    BadValue {
        /// Offending file.
        path: PathBuf,
        /// 1-based line number (the header is line 1).
        line: u64,
        /// Column name.
        column: String,
        /// Cell text.
        value: String,
        /// Why it was rejected.
        why: &'static str,
    },
    /// The CSV itself is malformed (ragged rows, bad quoting, bad UTF-8).
    #[error("trace file {path} is malformed: {message}")]
    Malformed {
        /// Offending file.
        path: PathBuf,
        /// Parser message.
        message: String,
    },
    /// The workload name is not one of the built-in ones.
    #[error("unknown workload '{0}'; known workloads: {1}")]
    UnknownWorkload(String, String),
    /// The traces have no rows for a job.
    #[error("{0}")]
    NoData(String),
    /// A bad simulation argument.
    #[error("{0}")]
    InvalidArgument(String),
    /// The job could not reach its target metric (default batch size or 20 tries).
    #[error("{0}")]
    NotConverged(String),
}

/// Result alias for the simulator.
pub type SimResult<T> = Result<T, SimError>;

/// One row of `summary_train.csv`: one training run observed reaching (or not) a target metric.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainRow {
    /// Dataset name.
    pub dataset: String,
    /// Network name.
    pub network: String,
    /// Batch size.
    pub batch_size: u32,
    /// Optimizer name.
    pub optimizer: String,
    /// Repetition index of the configuration.
    pub run: i64,
    /// Target validation metric.
    pub target_metric: f64,
    /// Epoch at which the target was reached; `None` if never.
    pub target_epoch: Option<f64>,
}

/// One row of `summary_power_<gpu>.csv`: an epoch at one (batch size, power limit).
#[derive(Debug, Clone, PartialEq)]
pub struct PowerRow {
    /// Dataset name.
    pub dataset: String,
    /// Network name.
    pub network: String,
    /// Batch size.
    pub batch_size: u32,
    /// Optimizer name.
    pub optimizer: String,
    /// Power limit, W.
    pub power_limit: u32,
    /// Seconds per epoch.
    pub time_per_epoch: f64,
    /// Average power during the epoch, W.
    pub average_power: f64,
}

/// Columns of the train trace.
pub const TRAIN_COLUMNS: [&str; 8] = [
    "dataset",
    "network",
    "batch_size",
    "optimizer",
    "learning_rate",
    "run",
    "target_metric",
    "target_epoch",
];

/// Columns of the power trace.
pub const POWER_COLUMNS: [&str; 7] = [
    "dataset",
    "network",
    "batch_size",
    "optimizer",
    "power_limit",
    "time_per_epoch",
    "average_power",
];

/// A CSV reader that remembers the file name and maps column names to positions.
struct Table {
    path: PathBuf,
    cols: HashMap<String, usize>,
    rows: Vec<(u64, csv::StringRecord)>,
}

impl Table {
    fn read(path: &Path, required: &[&str]) -> SimResult<Table> {
        let file = std::fs::File::open(path).map_err(|source| SimError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_reader(path, file, required)
    }

    fn from_reader(path: &Path, rdr: impl std::io::Read, required: &[&str]) -> SimResult<Table> {
        let malformed = |e: csv::Error| SimError::Malformed {
            path: path.to_path_buf(),
            message: e.to_string(),
        };
        let mut r = csv::ReaderBuilder::new().has_headers(true).from_reader(rdr);
        let header = r.headers().map_err(malformed)?.clone();
        let cols: HashMap<String, usize> = header
            .iter()
            .enumerate()
            .map(|(i, h)| (h.trim().to_string(), i))
            .collect();
        for c in required {
            if !cols.contains_key(*c) {
                return Err(SimError::MissingColumn {
                    path: path.to_path_buf(),
                    column: (*c).to_string(),
                    header: header.iter().collect::<Vec<_>>().join(","),
                });
            }
        }
        let mut rows = Vec::new();
        for rec in r.records() {
            let rec = rec.map_err(malformed)?;
            let line = rec.position().map(|p| p.line()).unwrap_or(0);
            rows.push((line, rec));
        }
        Ok(Table {
            path: path.to_path_buf(),
            cols,
            rows,
        })
    }

    fn bad(&self, line: u64, column: &str, value: &str, why: &'static str) -> SimError {
        SimError::BadValue {
            path: self.path.clone(),
            line,
            column: column.to_string(),
            value: value.to_string(),
            why,
        }
    }

    fn cell<'a>(&self, rec: &'a csv::StringRecord, column: &str) -> &'a str {
        rec.get(self.cols[column]).unwrap_or("").trim()
    }

    fn text(&self, line: u64, rec: &csv::StringRecord, column: &str) -> SimResult<String> {
        let v = self.cell(rec, column);
        if v.is_empty() {
            return Err(self.bad(line, column, v, "empty"));
        }
        Ok(v.to_string())
    }

    fn positive_int(&self, line: u64, rec: &csv::StringRecord, column: &str) -> SimResult<u32> {
        let v = self.cell(rec, column);
        match v.parse::<u32>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(self.bad(line, column, v, "expected a positive integer")),
        }
    }

    fn int(&self, line: u64, rec: &csv::StringRecord, column: &str) -> SimResult<i64> {
        let v = self.cell(rec, column);
        v.parse::<i64>()
            .map_err(|_| self.bad(line, column, v, "expected an integer"))
    }

    fn finite(&self, line: u64, rec: &csv::StringRecord, column: &str) -> SimResult<f64> {
        let v = self.cell(rec, column);
        match v.parse::<f64>() {
            Ok(x) if x.is_finite() => Ok(x),
            _ => Err(self.bad(line, column, v, "expected a finite number")),
        }
    }

    fn positive(&self, line: u64, rec: &csv::StringRecord, column: &str) -> SimResult<f64> {
        let v = self.cell(rec, column);
        match v.parse::<f64>() {
            Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
            _ => Err(self.bad(line, column, v, "expected a positive number")),
        }
    }
}

fn train_rows(t: &Table) -> SimResult<Vec<TrainRow>> {
    let mut out = Vec::with_capacity(t.rows.len());
    for (line, rec) in &t.rows {
        let line = *line;
        let te = t.cell(rec, "target_epoch");
        // An empty cell (or pandas' NaN spelling) means the run never reached the target.
        let target_epoch = if te.is_empty() || te.eq_ignore_ascii_case("nan") {
            None
        } else {
            match te.parse::<f64>() {
                Ok(x) if x.is_finite() && x >= 1.0 => Some(x),
                _ => {
                    return Err(t.bad(
                        line,
                        "target_epoch",
                        te,
                        "expected an epoch number >= 1 or an empty cell",
                    ))
                }
            }
        };
        out.push(TrainRow {
            dataset: t.text(line, rec, "dataset")?,
            network: t.text(line, rec, "network")?,
            batch_size: t.positive_int(line, rec, "batch_size")?,
            optimizer: t.text(line, rec, "optimizer")?,
            run: t.int(line, rec, "run")?,
            target_metric: t.finite(line, rec, "target_metric")?,
            target_epoch,
        });
    }
    Ok(out)
}

fn power_rows(t: &Table) -> SimResult<Vec<PowerRow>> {
    let mut out = Vec::with_capacity(t.rows.len());
    for (line, rec) in &t.rows {
        let line = *line;
        out.push(PowerRow {
            dataset: t.text(line, rec, "dataset")?,
            network: t.text(line, rec, "network")?,
            batch_size: t.positive_int(line, rec, "batch_size")?,
            optimizer: t.text(line, rec, "optimizer")?,
            power_limit: t.positive_int(line, rec, "power_limit")?,
            time_per_epoch: t.positive(line, rec, "time_per_epoch")?,
            average_power: t.positive(line, rec, "average_power")?,
        });
    }
    Ok(out)
}

/// Read and validate `summary_train.csv`.
pub fn read_train(path: &Path) -> SimResult<Vec<TrainRow>> {
    train_rows(&Table::read(path, &TRAIN_COLUMNS)?)
}

/// Read and validate a `summary_power_<gpu>.csv`.
pub fn read_power(path: &Path) -> SimResult<Vec<PowerRow>> {
    power_rows(&Table::read(path, &POWER_COLUMNS)?)
}

/// Parse train-trace text (for tests and in-memory use); `name` appears in errors.
pub fn parse_train(name: &str, text: &str) -> SimResult<Vec<TrainRow>> {
    train_rows(&Table::from_reader(
        Path::new(name),
        text.as_bytes(),
        &TRAIN_COLUMNS,
    )?)
}

/// Parse power-trace text (for tests and in-memory use); `name` appears in errors.
pub fn parse_power(name: &str, text: &str) -> SimResult<Vec<PowerRow>> {
    power_rows(&Table::from_reader(
        Path::new(name),
        text.as_bytes(),
        &POWER_COLUMNS,
    )?)
}

/// The power trace file of `gpu` in `dir`: `summary_power_<gpu>.csv`, GPU name lowercased.
pub fn power_file(dir: &Path, gpu: &str) -> PathBuf {
    dir.join(format!("summary_power_{}.csv", gpu.to_lowercase()))
}

/// GPU names for which `dir` has a power trace, sorted.
pub fn available_gpus(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .map(|it| {
            it.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().to_string();
                    name.strip_prefix("summary_power_")
                        .and_then(|s| s.strip_suffix(".csv"))
                        .map(str::to_string)
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRAIN: &str =
        "dataset,network,batch_size,optimizer,learning_rate,run,target_metric,target_epoch\n\
        d,n,8,adam,0.1,1,0.5,3\n\
        d,n,8,adam,0.1,2,0.5,\n";

    #[test]
    fn parses_empty_target_epoch_as_unreached() {
        let rows = parse_train("t.csv", TRAIN).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].target_epoch, Some(3.0));
        assert_eq!(rows[1].target_epoch, None);
    }

    #[test]
    fn missing_column_is_named() {
        let err = parse_power("p.csv", "dataset,network,batch_size\nd,n,8\n").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("p.csv") && msg.contains("optimizer"), "{msg}");
    }

    #[test]
    fn bad_value_names_line_column_and_value() {
        let text =
            "dataset,network,batch_size,optimizer,power_limit,time_per_epoch,average_power\n\
            d,n,8,adam,100,1.0,50\n\
            d,n,8,adam,125,fast,50\n";
        let msg = parse_power("p.csv", text).unwrap_err().to_string();
        assert!(msg.contains("line 3"), "{msg}");
        assert!(
            msg.contains("time_per_epoch") && msg.contains("'fast'"),
            "{msg}"
        );
    }

    #[test]
    fn ragged_row_is_malformed() {
        let text =
            "dataset,network,batch_size,optimizer,power_limit,time_per_epoch,average_power\n\
            d,n,8,adam,100\n";
        let msg = parse_power("p.csv", text).unwrap_err().to_string();
        assert!(msg.contains("p.csv") && msg.contains("malformed"), "{msg}");
    }
}
