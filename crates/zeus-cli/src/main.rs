//! `zeus-monitor`: standalone GPU power logger. (Full CLI lands with the measurement work.)

fn main() {
    eprintln!("usage: zeus-monitor LOGFILE DURATION SLEEP_MS [GPU_IDX]");
}
