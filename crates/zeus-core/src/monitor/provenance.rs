//! Where a measured energy came from, so that a figure can say how it was made and how far to
//! trust it: the method, and the calibration it rested on.

/// How an energy figure was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// The sampler's cache: counter values at calibrated moments, the power readings between.
    CachedCounter,
    /// The energy counter read at the window's edges.
    DirectCounter,
    /// Power readings integrated over the window (no counter, or one that cannot be trusted).
    PowerIntegration,
    /// Part of the window had no readings (a driver fault) or the counter was reset within it:
    /// the figure rests on what the board can draw there, and its bound says how much that is.
    Degraded,
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Method::CachedCounter => "cached_counter",
            Method::DirectCounter => "direct_counter",
            Method::PowerIntegration => "power_integration",
            Method::Degraded => "degraded",
        }
    }
}

/// How one device's energy in one window was made.
#[derive(Debug, Clone, PartialEq)]
pub struct Provenance {
    pub method: Method,
    /// The update period of the readings used (s), where known.
    pub update_period: Option<f64>,
    /// How long after the moment it describes the counter shows a value (s), where measured.
    pub counter_lag: Option<f64>,
    /// Why the figure was not made the usual way (a fault, a board the model does not fit).
    pub note: Option<String>,
}

impl Provenance {
    pub fn new(method: Method) -> Provenance {
        Provenance {
            method,
            update_period: None,
            counter_lag: None,
            note: None,
        }
    }
}

impl Default for Provenance {
    fn default() -> Provenance {
        Provenance::new(Method::DirectCounter)
    }
}
