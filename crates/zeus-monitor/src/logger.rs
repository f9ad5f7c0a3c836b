//! The power logger: `zeus-monitor LOGFILE DURATION SLEEP_MS [GPU_IDX]` and `--restore`.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::{log_prefix, open_gpus};
use zeus_core::monitor::power_log::{split_seconds, PowerLog, PowerLogFormat};

use clap::{Parser, ValueEnum};
use zeus_core::device::settings::{restore_stale, Journal};
use zeus_core::device::{power_mw, GpuResult, Gpus, PowerPreference};

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    Csv,
    Jsonl,
}

/// Log GPU power (mW) over time to a CSV file.
#[derive(Parser, Debug)]
#[command(
    name = "zeus-monitor",
    version,
    // `zeus-monitor out.csv -3 100` is a bad DURATION, not an unknown flag `-3`.
    allow_negative_numbers = true,
    about = "Log GPU power (mW) over time to a CSV file",
    after_help = "Examples:\n  zeus-monitor power.csv 60 100        # GPU 0 for 60 s, 100 ms sleep after each poll\n  zeus-monitor - 0 0 --interval 50 --gpus 0,1 --energy --format jsonl\n  zeus-monitor --restore               # undo GPU changes of killed zeus processes\n\nPrometheus exporter (a subcommand; see `zeus-monitor serve --help`):\n  zeus-monitor serve [--listen 127.0.0.1:9400] [--gpus 0,1]"
)]
struct Args {
    /// Output file; `-` for stdout.
    #[arg(required_unless_present = "restore")]
    logfile: Option<String>,
    /// How long to log, seconds; 0 runs until interrupted.
    #[arg(required_unless_present = "restore")]
    duration: Option<f64>,
    /// Milliseconds to sleep after each poll (0 = poll back to back). Optional with --interval.
    sleep_ms: Option<u64>,
    /// GPU index to log (default 0).
    gpu_idx: Option<usize>,
    /// Several GPUs, comma-separated (instead of GPU_IDX), e.g. `0,1,3`.
    #[arg(long, value_delimiter = ',', conflicts_with = "gpu_idx")]
    gpus: Option<Vec<usize>>,
    /// Sample on a fixed grid of this many milliseconds instead of sleeping after each poll.
    #[arg(long, value_name = "MS")]
    interval: Option<f64>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Csv)]
    format: Format,
    /// Also log each GPU's total-energy counter (mJ; Volta and newer).
    #[arg(long)]
    energy: bool,
    /// Instead of logging: restore the GPU settings (power limits, locked clocks) that zeus
    /// processes which are no longer running left in the journal ($ZEUS_STATE_DIR, else
    /// $XDG_STATE_HOME/zeus, else ~/.local/state/zeus, else /var/lib/zeus for root and /var/tmp/zeus-<uid> for others), print one line per
    /// GPU restored, and exit.
    #[arg(long, conflicts_with_all = ["logfile", "duration", "sleep_ms", "gpu_idx", "gpus", "interval", "energy"])]
    restore: bool,
}

static STOP: AtomicBool = AtomicBool::new(false);
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only async-signal-safe work here: two atomic stores.
    SIGNAL.store(sig, Ordering::SeqCst);
    STOP.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only touches atomics, which is async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            sa.sa_flags = 0;
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Sleep until `deadline`, waking early (within a few ms) when a stop signal arrives.
fn sleep_until(deadline: Instant) {
    const SLICE: Duration = Duration::from_millis(5);
    loop {
        if STOP.load(Ordering::SeqCst) {
            return;
        }
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        std::thread::sleep((deadline - now).min(SLICE));
    }
}

/// Timestamp of a sample, UNIX seconds and nanoseconds: the backend clock (virtual under the
/// simulator's virtual clock), with nanoseconds from the system clock when the backend clock is
/// the wall clock.
fn stamp(gpus: &Gpus) -> (i64, u32) {
    if gpus.clock().is_virtual() {
        split_seconds(gpus.now())
    } else {
        let d = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        (d.as_secs() as i64, d.subsec_nanos())
    }
}

/// The log file, its rows in the one power-log schema (`zeus_core::monitor::power_log`).
struct Writer {
    out: Box<dyn Write>,
    log: PowerLog,
    line: String,
}

impl Writer {
    fn header(&mut self) -> io::Result<()> {
        if let Some(h) = self.log.header() {
            self.out.write_all(h.as_bytes())?;
            self.out.write_all(b"\n")?;
        }
        self.out.flush()
    }

    fn row(&mut self, at: (i64, u32), power: &[u32], energy: &[u64]) -> io::Result<()> {
        self.log.write_row(&mut self.line, at, power, energy);
        self.line.push('\n');
        self.out.write_all(self.line.as_bytes())?;
        // Flushed per row: a kill between rows loses nothing already sampled.
        self.out.flush()
    }
}

fn read(
    gpus: &Gpus,
    indices: &[usize],
    energy: bool,
    p: &mut Vec<u32>,
    e: &mut Vec<u64>,
) -> GpuResult<()> {
    p.clear();
    e.clear();
    for &i in indices {
        // The reference logs NVML's GetPowerUsage (the average); boards without one (MI300X)
        // log their instant power.
        p.push(power_mw(
            gpus.device(i)?.as_ref(),
            PowerPreference::Average,
        )?);
    }
    if energy {
        for &i in indices {
            e.push(gpus.device(i)?.total_energy_consumption()?);
        }
    }
    Ok(())
}

/// A bad argument: one line naming it, exit status 2 (as clap's own usage errors), and nothing
/// touched, since every number is checked before the output file is opened.
fn usage_error(msg: &str) -> ExitCode {
    eprintln!("error: {msg} (see zeus-monitor --help)");
    ExitCode::from(2)
}

/// The longest DURATION, SLEEP_MS and --interval accepted: beyond these a run is a mistake (and
/// the time arithmetic would overflow).
const MAX_DURATION_S: f64 = 10.0 * 365.0 * 86_400.0;
const MAX_PERIOD_MS: f64 = 3_600_000.0;
/// The shortest --interval: below it the grid is busy polling, and a zero-length step would
/// never advance.
const MIN_INTERVAL_MS: f64 = 0.01;

/// Check the numbers and GPU list; `Err` holds the one-line message.
fn validate(args: &Args, duration: f64) -> Result<Vec<usize>, String> {
    if !(duration.is_finite() && (0.0..=MAX_DURATION_S).contains(&duration)) {
        return Err(format!(
            "DURATION must be a number of seconds from 0 (until interrupted) to \
             {MAX_DURATION_S:.0} (10 years), got {duration}"
        ));
    }
    if let Some(ms) = args.interval {
        if !(ms.is_finite() && (MIN_INTERVAL_MS..=MAX_PERIOD_MS).contains(&ms)) {
            return Err(format!(
                "--interval must be from {MIN_INTERVAL_MS} to {MAX_PERIOD_MS:.0} ms, got {ms}"
            ));
        }
    } else if args.sleep_ms.is_none() {
        return Err("SLEEP_MS is required unless --interval is given".into());
    }
    if let Some(ms) = args.sleep_ms {
        if ms as f64 > MAX_PERIOD_MS {
            return Err(format!(
                "SLEEP_MS must be from 0 to {MAX_PERIOD_MS:.0} ms, got {ms}"
            ));
        }
    }
    let indices = match (&args.gpus, args.gpu_idx) {
        (Some(v), _) if v.is_empty() => return Err("--gpus needs at least one index".into()),
        (Some(v), _) => v.clone(),
        (None, Some(i)) => vec![i],
        (None, None) => vec![0],
    };
    for (k, i) in indices.iter().enumerate() {
        if indices[..k].contains(i) {
            return Err(format!("GPU index {i} appears twice in --gpus {indices:?}"));
        }
    }
    Ok(indices)
}

/// `--restore`: undo the journaled changes of dead processes on the visible GPUs.
fn restore() -> ExitCode {
    let gpus = match open_gpus() {
        Ok(g) => g,
        Err(code) => return code,
    };
    let journal = Journal::default_location();
    let report = restore_stale(&journal, &gpus, false);
    let mut stdout = io::stdout().lock();
    for r in &report.restored {
        let _ = writeln!(stdout, "{r}");
    }
    let _ = stdout.flush();
    for f in &report.failed {
        eprintln!(
            "{}ERROR: {f}; the entry stays in {}",
            log_prefix(),
            journal.dir().display()
        );
    }
    if report.restored.is_empty() && report.failed.is_empty() {
        eprintln!(
            "{}Nothing to restore in {}.",
            log_prefix(),
            journal.dir().display()
        );
    }
    if report.failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// The logger (and `--restore`): the reference positional form.
pub fn main() -> ExitCode {
    let args = Args::parse();
    if args.restore {
        return restore();
    }
    // clap requires both unless --restore is given.
    let (Some(logfile), Some(duration)) = (args.logfile.clone(), args.duration) else {
        return usage_error("LOGFILE and DURATION are required");
    };
    let indices = match validate(&args, duration) {
        Ok(v) => v,
        Err(msg) => return usage_error(&msg),
    };

    let gpus = match open_gpus() {
        Ok(g) => g,
        Err(code) => return code,
    };
    for &i in &indices {
        if i >= gpus.len() {
            return usage_error(&format!(
                "GPU index {i} is out of range: {} GPU(s) are visible",
                gpus.len()
            ));
        }
        if args.energy {
            let dev = gpus.device(i).expect("index checked");
            if !dev.supports_total_energy_consumption().unwrap_or(false) {
                let name = dev.name().unwrap_or_else(|_| "unknown model".into());
                eprintln!(
                    "error: GPU {i} ({name}) has no energy counter, which --energy needs \
                     (Volta and newer have one); drop --energy or leave GPU {i} out"
                );
                return ExitCode::from(1);
            }
        }
    }

    let out: Box<dyn Write> = if logfile == "-" {
        Box::new(BufWriter::new(io::stdout()))
    } else {
        match File::create(&logfile) {
            Ok(f) => Box::new(BufWriter::new(f)),
            Err(e) => {
                eprintln!("{}ERROR: cannot open {}: {e}", log_prefix(), logfile);
                return ExitCode::from(1);
            }
        }
    };
    let format = match args.format {
        Format::Csv => PowerLogFormat::Csv,
        Format::Jsonl => PowerLogFormat::Jsonl,
    };
    let mut w = Writer {
        out,
        log: PowerLog::new(format, indices.clone(), args.energy),
        line: String::new(),
    };
    install_signal_handlers();
    if let Err(e) = w.header() {
        eprintln!("{}ERROR: writing {}: {e}", log_prefix(), logfile);
        return ExitCode::from(1);
    }

    let begin = Instant::now();
    let end = (duration > 0.0).then(|| begin + Duration::from_secs_f64(duration));
    let interval = args.interval.map(|ms| Duration::from_secs_f64(ms / 1000.0));
    let sleep = Duration::from_millis(args.sleep_ms.unwrap_or(0));
    let (mut power, mut energy) = (Vec::new(), Vec::new());
    let mut rows: u64 = 0;
    let mut power_sum = vec![0.0f64; indices.len()];
    let mut first_last: Option<(f64, f64)> = None;
    let mut next = begin;
    let mut status = ExitCode::SUCCESS;
    while !STOP.load(Ordering::SeqCst) && end.is_none_or(|e| Instant::now() < e) {
        if let Err(e) = read(&gpus, &indices, args.energy, &mut power, &mut energy) {
            eprintln!("{}ERROR: reading GPUs {indices:?}: {e}", log_prefix());
            status = ExitCode::from(1);
            break;
        }
        let at = stamp(&gpus);
        let unix = at.0 as f64 + f64::from(at.1) / 1e9;
        if let Err(e) = w.row(at, &power, &energy) {
            if e.kind() != io::ErrorKind::BrokenPipe {
                eprintln!("{}ERROR: writing {}: {e}", log_prefix(), logfile);
                status = ExitCode::from(1);
            }
            break;
        }
        rows += 1;
        for (s, p) in power_sum.iter_mut().zip(&power) {
            *s += *p as f64 / 1000.0;
        }
        first_last = Some((first_last.map_or(unix, |f| f.0), unix));
        let deadline = match interval {
            Some(iv) => {
                next += iv;
                let now = Instant::now();
                if next < now {
                    // Fell behind: skip missed ticks instead of bursting.
                    let behind = ((now - next).as_secs_f64() / iv.as_secs_f64()).floor() + 1.0;
                    next += iv.mul_f64(behind);
                }
                next
            }
            None => Instant::now() + sleep,
        };
        let deadline = end.map_or(deadline, |e| deadline.min(e));
        if deadline > Instant::now() {
            sleep_until(deadline);
        }
    }
    let span = first_last.map_or(0.0, |(a, b)| b - a);
    let avg: Vec<String> = power_sum
        .iter()
        .zip(&indices)
        .map(|(s, i)| {
            format!(
                "GPU{i} {:.1} W",
                if rows > 0 { s / rows as f64 } else { 0.0 }
            )
        })
        .collect();
    let why = match SIGNAL.load(Ordering::SeqCst) {
        libc::SIGINT => " (stopped by SIGINT)",
        libc::SIGTERM => " (stopped by SIGTERM)",
        _ => "",
    };
    eprintln!(
        "{}Wrote {rows} samples over {span:.3} s to {}{why}; average power: {}",
        log_prefix(),
        if logfile == "-" {
            "stdout"
        } else {
            logfile.as_str()
        },
        avg.join(", ")
    );
    status
}
