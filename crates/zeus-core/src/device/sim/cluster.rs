//! [`SimCluster`]: the simulated GPUs of a process and their clock, configured from the
//! environment ([`SimConfig`]), and the process's one cluster.

use super::*;

/// How to build a simulated cluster.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub presets: Vec<&'static Preset>,
    pub virtual_clock: bool,
    pub privileged: bool,
    /// `None`: each preset's default workload.
    pub workload: Option<Workload>,
    pub load: Load,
    pub fidelity: Fidelity,
    /// Real fidelity: the CPU cost of an energy read, s, for every GPU (`None`: each preset's).
    pub energy_read_cost_s: Option<f64>,
    /// `ZEUS_SIM_SHARED`: the file whose devices this process shares with every process naming
    /// it (see [`shared`]); `None`: private devices.
    pub shared: Option<std::path::PathBuf>,
    /// Overrides of every board's timing and quirks, and scheduled faults (see [`board`]).
    pub board: BoardKnobs,
    /// A virtual clock's start (seconds since the epoch); `None`: now, to the second.
    pub virtual_origin: Option<f64>,
}

impl Default for SimConfig {
    /// One A40 on the real clock, privileged, idle, real fidelity (what an empty environment
    /// gives).
    fn default() -> SimConfig {
        SimConfig {
            presets: vec![preset::find("A40").expect("A40 is a preset")],
            virtual_clock: false,
            privileged: true,
            workload: None,
            load: Load::Idle,
            fidelity: Fidelity::Real,
            energy_read_cost_s: None,
            shared: None,
            board: BoardKnobs::default(),
            virtual_origin: None,
        }
    }
}

fn env_flag(name: &str, default: bool, yes: &[&str], no: &[&str]) -> GpuResult<bool> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(v) => {
            let l = v.trim().to_ascii_lowercase();
            if l.is_empty() {
                Ok(default)
            } else if yes.contains(&l.as_str()) {
                Ok(true)
            } else if no.contains(&l.as_str()) {
                Ok(false)
            } else {
                Err(GpuError::Init(format!(
                    "{name}={v:?} is not valid: use one of {yes:?} or {no:?}"
                )))
            }
        }
    }
}

impl SimConfig {
    /// Read the `ZEUS_SIM_*` variables; bad values give an error naming them.
    pub fn from_env() -> GpuResult<SimConfig> {
        let spec = std::env::var("ZEUS_SIM_GPUS").unwrap_or_default();
        let spec = if spec.trim().is_empty() {
            "A40".to_string()
        } else {
            spec
        };
        let presets = spec
            .split(',')
            .map(|k| {
                preset::find(k).ok_or_else(|| {
                    GpuError::Init(format!(
                        "ZEUS_SIM_GPUS={spec:?}: unknown GPU model {:?}; known models: {}",
                        k.trim(),
                        preset::keys().join(", ")
                    ))
                })
            })
            .collect::<GpuResult<Vec<_>>>()?
            .into_iter()
            // A two-die board (MI250X) enumerates as two GPUs.
            .flat_map(|p| std::iter::repeat_n(p, p.dies.max(1)))
            .collect::<Vec<_>>();
        let virtual_clock = env_flag("ZEUS_SIM_CLOCK", false, &["virtual"], &["real"])?;
        let privileged = env_flag(
            "ZEUS_SIM_PRIVILEGED",
            true,
            &["1", "true", "yes"],
            &["0", "false", "no"],
        )?;
        let busy = env_flag("ZEUS_SIM_LOAD", false, &["busy"], &["idle"])?;
        let workload = match std::env::var("ZEUS_SIM_WORKLOAD") {
            Ok(p) if !p.trim().is_empty() => Some(Workload::parse(&p)?),
            _ => None,
        };
        let ideal = env_flag("ZEUS_SIM_FIDELITY", false, &["ideal"], &["real"])?;
        let energy_read_cost_s = match std::env::var("ZEUS_SIM_ENERGY_READ_MS") {
            Ok(v) if !v.trim().is_empty() => match v.trim().parse::<f64>() {
                Ok(ms) if ms.is_finite() && (0.0..=1000.0).contains(&ms) => Some(ms / 1000.0),
                _ => {
                    return Err(GpuError::Init(format!(
                        "ZEUS_SIM_ENERGY_READ_MS={v:?} is not valid: milliseconds from 0 to 1000"
                    )))
                }
            },
            _ => None,
        };
        let shared = shared::path_from_env();
        let board = BoardKnobs::from_env()?;
        let config = SimConfig {
            presets,
            virtual_clock,
            privileged,
            workload,
            load: if busy { Load::Busy } else { Load::Idle },
            fidelity: if ideal {
                Fidelity::Ideal
            } else {
                Fidelity::Real
            },
            energy_read_cost_s,
            shared,
            board,
            virtual_origin: None,
        };
        config.check()?;
        Ok(config)
    }

    /// Refuse combinations that cannot work: a shared device on a virtual clock (a virtual clock
    /// belongs to one process, so processes could not agree on the time).
    /// [`SimConfig::from_env`] for one vendor's simulated driver library: the boards of other
    /// vendors are not its GPUs (the simulated `libnvidia-ml.so.1` lists the NVIDIA models of
    /// `ZEUS_SIM_GPUS`, the simulated `libamd_smi.so` the AMD ones), and with `ZEUS_SIM_GPUS`
    /// unset an AMD library has an MI300X (the simulator's default A40 is NVIDIA's).
    pub fn from_env_for(vendor: Vendor) -> GpuResult<SimConfig> {
        let mut config = SimConfig::from_env()?;
        let unset = std::env::var("ZEUS_SIM_GPUS").map_or(true, |v| v.trim().is_empty());
        if unset && vendor == Vendor::Amd {
            config.presets = vec![preset::find("MI300X").expect("MI300X is a preset")];
        }
        config.presets.retain(|p| p.vendor == vendor);
        Ok(config)
    }

    fn check(&self) -> GpuResult<()> {
        if let (Some(path), true) = (&self.shared, self.virtual_clock) {
            return Err(GpuError::Init(format!(
                "ZEUS_SIM_SHARED={} cannot be used with ZEUS_SIM_CLOCK=virtual: a virtual clock \
                 belongs to one process, so processes sharing the GPUs could not agree on the \
                 time; use the real clock (unset ZEUS_SIM_CLOCK) or drop ZEUS_SIM_SHARED",
                path.display()
            )));
        }
        Ok(())
    }
}

/// A set of simulated GPUs sharing one clock.
#[derive(Debug)]
pub struct SimCluster {
    clock: Arc<SimClock>,
    devices: Vec<Arc<SimGpu>>,
}

impl SimCluster {
    /// Build private devices. Panics if `config.shared` is set and the file cannot be opened:
    /// use [`SimCluster::open`] for a configuration from the environment.
    pub fn new(config: SimConfig) -> SimCluster {
        SimCluster::open(config).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Build the devices `config` describes; with `config.shared`, open (or create) the shared
    /// file, which can fail (a mismatch, an unreadable file, a virtual clock).
    pub fn open(config: SimConfig) -> GpuResult<SimCluster> {
        config.check()?;
        // Dies of a two-die board come in pairs: the first of a run of its preset is even.
        let dies: Vec<Die> = {
            let mut v = Vec::with_capacity(config.presets.len());
            for (i, p) in config.presets.iter().enumerate() {
                let die = if p.dies < 2 {
                    Die::Whole
                } else if i > 0 && v[i - 1] == Die::Even && config.presets[i - 1].key == p.key {
                    Die::Odd
                } else {
                    Die::Even
                };
                v.push(die);
            }
            v
        };
        let build = |clock: Arc<SimClock>| -> Vec<SimGpu> {
            config
                .presets
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let mut g = SimGpu::new(
                        i,
                        p,
                        clock.clone(),
                        config.privileged,
                        config.workload.as_ref(),
                        config.load,
                        config.fidelity,
                    );
                    if let Some(cost) = config.energy_read_cost_s {
                        g.energy_read_cost_s = cost;
                    }
                    g.die = dies[i];
                    g.with_knobs(&config.board)
                })
                .collect()
        };
        let (clock, devices) = match &config.shared {
            Some(path) => shared::open(path, &config.presets, build)?,
            None => {
                let clock = Arc::new(if config.virtual_clock {
                    config
                        .virtual_origin
                        .map_or_else(SimClock::virtual_clock, SimClock::virtual_from)
                } else {
                    SimClock::real()
                });
                (clock.clone(), build(clock))
            }
        };
        let devices: Vec<Arc<SimGpu>> = devices.into_iter().map(Arc::new).collect();
        for pair in devices.windows(2) {
            if pair[0].die == Die::Even && pair[1].die == Die::Odd {
                let _ = pair[0].partner.set(Arc::downgrade(&pair[1]));
            }
        }
        if config.board.counter_frozen {
            for d in &devices {
                d.freeze_counter();
            }
        }
        Ok(SimCluster { clock, devices })
    }

    pub fn clock(&self) -> Arc<SimClock> {
        self.clock.clone()
    }

    pub fn devices(&self) -> &[Arc<SimGpu>] {
        &self.devices
    }

    /// Every simulated device as a backend device, in order.
    pub fn gpu_devices(&self) -> Vec<Arc<dyn Gpu>> {
        self.devices
            .iter()
            .map(|d| d.clone() as Arc<dyn Gpu>)
            .collect()
    }

    /// Every simulated device visible, in order, `CUDA_VISIBLE_DEVICES` not applied (tests and
    /// benchmarks; `Gpus::from_env` applies it).
    pub fn gpus(&self) -> Gpus {
        let n = self.devices.len();
        Gpus::with_indices(
            BackendKind::Sim,
            self.gpu_devices(),
            (0..n).collect(),
            self.clock(),
        )
    }

    pub fn device(&self, index: usize) -> GpuResult<&Arc<SimGpu>> {
        self.devices.get(index).ok_or_else(|| {
            GpuError::InvalidArg(format!(
                "simulated GPU index {index} is out of range: {} simulated GPU(s) exist",
                self.devices.len()
            ))
        })
    }

    /// Run `work` units on the given GPUs at once (a synchronous training step): each is busy for
    /// as long as its settings need, then idle. On the virtual clock the clock is advanced past
    /// the slowest GPU; on the real clock the caller waits the returned duration.
    pub fn run(&self, indices: &[usize], work: f64) -> GpuResult<f64> {
        let mut longest: f64 = 0.0;
        for &i in indices {
            longest = longest.max(self.device(i)?.start_work(work));
        }
        self.clock.advance(longest);
        Ok(longest)
    }
}

static GLOBAL: Mutex<Option<Arc<SimCluster>>> = Mutex::new(None);

/// The process's simulated cluster, built from the environment on first use.
pub fn global_cluster() -> GpuResult<Arc<SimCluster>> {
    let mut g = GLOBAL.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(c) = g.as_ref() {
        return Ok(c.clone());
    }
    let c = Arc::new(SimCluster::open(SimConfig::from_env()?)?);
    *g = Some(c.clone());
    Ok(c)
}

/// Drop the process's cluster so the next use rebuilds it from the environment (for tests).
pub fn reset_global_cluster() {
    *GLOBAL.lock().unwrap_or_else(|p| p.into_inner()) = None;
}
