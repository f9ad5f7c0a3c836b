//! The `work` method's cost model, fitted online: a stretch of serving of length `T` that
//! processed `P` prefill tokens and `D` decode tokens while holding `K` tokens in KV caches
//! on average costs
//!
//! ```text
//! E = idle_w·T + prefill_j·P + decode_j·D + kv_w·K·T
//! ```
//!
//! The model is fitted by non-negative least squares over *spans* of consecutive steps (half a
//! second by default), not over single steps: a step lasts 20-40 ms while a GPU's counter and
//! power readings change every 100 ms, so the measured energy of one step is smeared into its
//! neighbours, and a regression on smeared steps pulls every weight toward the mean. A span's
//! energy is the sum of its steps' cuts, which adds up exactly (`EnergyMonitor::cut_window`),
//! and only its two outer edges carry the smear.

/// Number of model terms: idle power, prefill, decode, KV-cache residency.
pub const TERMS: usize = 4;

/// What a stretch of serving did: the model's regressors.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Features {
    /// Duration, s.
    pub seconds: f64,
    pub prefill_tokens: f64,
    pub decode_tokens: f64,
    /// KV-cache tokens held, integrated over time (token·s).
    pub kv_token_seconds: f64,
}

impl Features {
    pub fn as_array(&self) -> [f64; TERMS] {
        [
            self.seconds,
            self.prefill_tokens,
            self.decode_tokens,
            self.kv_token_seconds,
        ]
    }

    pub fn add(&mut self, o: &Features) {
        self.seconds += o.seconds;
        self.prefill_tokens += o.prefill_tokens;
        self.decode_tokens += o.decode_tokens;
        self.kv_token_seconds += o.kv_token_seconds;
    }
}

/// Fitted weights of the cost model, with what the fit knows about them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Weights {
    /// W drawn whatever the requests do (static and idle power).
    pub idle_w: f64,
    /// J per prefill token.
    pub prefill_j: f64,
    /// J per decode token.
    pub decode_j: f64,
    /// W per token held in KV caches (attention reads the cache every step).
    pub kv_w: f64,
    /// Standard errors of the four weights, in the same order (∞ where the data cannot tell).
    pub std_err: [f64; TERMS],
    /// Their covariance (∞ on the diagonal where the data cannot tell).
    pub cov: [[f64; TERMS]; TERMS],
    /// Root-mean-square misfit of a span's energy, J, and relative to the mean span energy.
    pub rms_j: f64,
    pub rms_rel: f64,
    /// Mean energy of a fitted span, J.
    pub mean_j: f64,
    /// Number of spans fitted.
    pub spans: usize,
}

impl Weights {
    pub fn as_array(&self) -> [f64; TERMS] {
        [self.idle_w, self.prefill_j, self.decode_j, self.kv_w]
    }

    /// The model of a sum of GPUs from each GPU's own: the weights add, and so do the
    /// variances (each GPU's spans are fitted on its own counter).
    pub fn sum(parts: &[Weights]) -> Option<Weights> {
        let first = parts.first()?;
        let mut w = *first;
        for p in &parts[1..] {
            w.idle_w += p.idle_w;
            w.prefill_j += p.prefill_j;
            w.decode_j += p.decode_j;
            w.kv_w += p.kv_w;
            for k in 0..TERMS {
                w.std_err[k] = w.std_err[k].hypot(p.std_err[k]);
                for j in 0..TERMS {
                    w.cov[k][j] += p.cov[k][j];
                }
            }
            w.rms_j = w.rms_j.hypot(p.rms_j);
            w.mean_j += p.mean_j;
            w.spans = w.spans.min(p.spans);
        }
        w.rms_rel = if w.mean_j > 0.0 {
            w.rms_j / w.mean_j
        } else {
            0.0
        };
        Some(w)
    }

    /// The standard deviation of `g · weights` (J when `g` is in the terms' units), from the
    /// weights' covariance: how far a linear function of the weights may move.
    pub fn spread(&self, g: &[f64; TERMS]) -> f64 {
        let mut var = 0.0;
        for i in 0..TERMS {
            if g[i] == 0.0 {
                continue;
            }
            if !self.cov[i][i].is_finite() {
                return f64::INFINITY;
            }
            for j in 0..TERMS {
                if g[j] != 0.0 {
                    var += g[i] * g[j] * self.cov[i][j];
                }
            }
        }
        var.max(0.0).sqrt()
    }

    /// How many standard errors a weight's bound spans: about two with many spans, more with
    /// few (a t-quantile grows as the degrees of freedom shrink, and the first fits' errors
    /// are as much the spans' systematic edge errors as noise).
    pub fn reach(&self) -> f64 {
        let dof = self.spans.saturating_sub(TERMS).max(1) as f64;
        2.0 + 8.0 / dof
    }

    /// The model's energy for `f`, J.
    pub fn predict(&self, f: &Features) -> f64 {
        dot(&self.as_array(), &f.as_array())
    }
}

fn dot(a: &[f64; TERMS], b: &[f64; TERMS]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The normal equations of the spans seen so far.
#[derive(Debug, Clone, Default)]
pub struct WorkFit {
    xtx: [[f64; TERMS]; TERMS],
    xty: [f64; TERMS],
    yty: f64,
    y_sum: f64,
    n: usize,
}

impl WorkFit {
    /// Add a span: what it did and the energy it measured (J).
    pub fn add(&mut self, f: &Features, energy_j: f64) {
        let x = f.as_array();
        for i in 0..TERMS {
            for j in 0..TERMS {
                self.xtx[i][j] += x[i] * x[j];
            }
            self.xty[i] += x[i] * energy_j;
        }
        self.yty += energy_j * energy_j;
        self.y_sum += energy_j;
        self.n += 1;
    }

    pub fn spans(&self) -> usize {
        self.n
    }

    /// The misfit (sum of squared residuals, J²) of the unconstrained least-squares fit over
    /// the terms seen: one small Cholesky solve, to compare fits cheaply (the anchored fits'
    /// time offsets) before solving the chosen one with its constraints. `None` where the
    /// terms cannot be told apart.
    pub fn misfit(&self) -> Option<f64> {
        let seen: Vec<usize> = (0..TERMS).filter(|&i| self.xtx[i][i] > 0.0).collect();
        if seen.is_empty() {
            return None;
        }
        let scale: Vec<f64> = seen.iter().map(|&i| 1.0 / self.xtx[i][i].sqrt()).collect();
        let m: Vec<Vec<f64>> = (0..seen.len())
            .map(|k| {
                (0..seen.len())
                    .map(|l| self.xtx[seen[k]][seen[l]] * scale[k] * scale[l])
                    .collect()
            })
            .collect();
        let rhs: Vec<f64> = (0..seen.len())
            .map(|k| self.xty[seen[k]] * scale[k])
            .collect();
        let sol = solve_spd(&m, &rhs)?;
        // At the least-squares solution, SSR = y'y - w'X'y.
        let fitted: f64 = sol.iter().zip(&rhs).map(|(w, b)| w * b).sum();
        Some((self.yty - fitted).max(0.0))
    }

    /// The non-negative least-squares weights, or `None` before `min_spans` spans or while no
    /// term has been seen. Terms never seen (an all-zero column: no prefill yet, say) get
    /// weight 0 and an infinite standard error.
    pub fn solve(&self, min_spans: usize) -> Option<Weights> {
        if self.n < min_spans.max(1) {
            return None;
        }
        // Scale the columns to unit norm: seconds (~0.5) and token counts (~1e4) differ by
        // orders of magnitude, and the subset solves below are plain Cholesky.
        let scale: [f64; TERMS] = std::array::from_fn(|i| {
            let d = self.xtx[i][i];
            if d > 0.0 {
                1.0 / d.sqrt()
            } else {
                0.0
            }
        });
        let seen: Vec<usize> = (0..TERMS).filter(|&i| scale[i] > 0.0).collect();
        if seen.is_empty() {
            return None;
        }
        let a = |i: usize, j: usize| self.xtx[i][j] * scale[i] * scale[j];
        let b = |i: usize| self.xty[i] * scale[i];
        // Non-negative least squares over at most four terms: the best of the subsets whose
        // unconstrained solution is non-negative (2^4 Cholesky solves at worst, nanoseconds).
        let mut best: Option<(f64, Vec<usize>, Vec<f64>)> = None;
        for mask in 1u32..(1 << TERMS) {
            let set: Vec<usize> = seen
                .iter()
                .copied()
                .filter(|&i| mask & (1 << i) != 0)
                .collect();
            if set.is_empty() || set.len() != mask.count_ones() as usize {
                continue;
            }
            let m: Vec<Vec<f64>> = set
                .iter()
                .map(|&i| set.iter().map(|&j| a(i, j)).collect())
                .collect();
            let rhs: Vec<f64> = set.iter().map(|&i| b(i)).collect();
            let Some(sol) = solve_spd(&m, &rhs) else {
                continue;
            };
            if sol.iter().any(|&v| v < 0.0) {
                continue;
            }
            // Residual sum of squares: y'y - 2 w'X'y + w'X'Xw.
            let mut ssr = self.yty;
            for (k, &i) in set.iter().enumerate() {
                ssr -= 2.0 * sol[k] * b(i);
                for (l, &j) in set.iter().enumerate() {
                    ssr += sol[k] * sol[l] * a(i, j);
                }
            }
            let ssr = ssr.max(0.0);
            if best
                .as_ref()
                .is_none_or(|(s, _, _)| ssr < *s - 1e-12 * self.yty)
            {
                best = Some((ssr, set, sol));
            }
        }
        let (ssr, set, sol) = best?;
        let mut w = [0.0; TERMS];
        for (k, &i) in set.iter().enumerate() {
            w[i] = sol[k] * scale[i];
        }
        let dof = self.n.saturating_sub(set.len()).max(1) as f64;
        let sigma2 = ssr / dof;
        // Standard errors from the inverse of X'X over every term seen, not just the active
        // ones: a term the constraint holds at zero may be there only because another term
        // moves with it (decode tokens grow with time when a full batch decodes all along),
        // and then both are uncertain, however well the pair fits. Where X'X is singular
        // (the data cannot tell the terms apart at all) they stay infinite.
        let mut cov = [[0.0; TERMS]; TERMS];
        for (i, row) in cov.iter_mut().enumerate() {
            if !seen.contains(&i) {
                row[i] = f64::INFINITY;
            }
        }
        let m: Vec<Vec<f64>> = seen
            .iter()
            .map(|&i| seen.iter().map(|&j| a(i, j)).collect())
            .collect();
        match invert_spd(&m) {
            Some(inv) => {
                for (k, &i) in seen.iter().enumerate() {
                    for (l, &j) in seen.iter().enumerate() {
                        cov[i][j] = sigma2 * inv[k][l] * scale[i] * scale[j];
                    }
                }
            }
            None => {
                for &i in &seen {
                    cov[i][i] = f64::INFINITY;
                }
            }
        }
        let std_err: [f64; TERMS] = std::array::from_fn(|i| cov[i][i].max(0.0).sqrt());
        let mean_y = self.y_sum / self.n as f64;
        let rms = sigma2.sqrt();
        Some(Weights {
            idle_w: w[0],
            prefill_j: w[1],
            decode_j: w[2],
            kv_w: w[3],
            std_err,
            cov,
            rms_j: rms,
            rms_rel: if mean_y > 0.0 { rms / mean_y } else { 0.0 },
            mean_j: mean_y,
            spans: self.n,
        })
    }
}

/// Cholesky factor of a symmetric positive-definite matrix, or `None` if it is not (to
/// working precision).
fn cholesky(m: &[Vec<f64>]) -> Option<Vec<Vec<f64>>> {
    let n = m.len();
    let mut l = vec![vec![0.0; n]; n];
    for i in 0..n {
        for j in 0..=i {
            let s: f64 = (0..j).map(|k| l[i][k] * l[j][k]).sum();
            if i == j {
                let d = m[i][i] - s;
                if d <= 1e-12 * m[i][i].abs().max(1e-300) {
                    return None;
                }
                l[i][j] = d.sqrt();
            } else {
                l[i][j] = (m[i][j] - s) / l[j][j];
            }
        }
    }
    Some(l)
}

fn solve_spd(m: &[Vec<f64>], rhs: &[f64]) -> Option<Vec<f64>> {
    let l = cholesky(m)?;
    let n = rhs.len();
    let mut y = vec![0.0; n];
    for i in 0..n {
        y[i] = (rhs[i] - (0..i).map(|k| l[i][k] * y[k]).sum::<f64>()) / l[i][i];
    }
    let mut x = vec![0.0; n];
    for i in (0..n).rev() {
        x[i] = (y[i] - (i + 1..n).map(|k| l[k][i] * x[k]).sum::<f64>()) / l[i][i];
    }
    Some(x)
}

fn invert_spd(m: &[Vec<f64>]) -> Option<Vec<Vec<f64>>> {
    let n = m.len();
    // Column c of the inverse solves m x = e_c; m is symmetric, so is its inverse, and the
    // columns serve as rows.
    (0..n)
        .map(|c| {
            let e: Vec<f64> = (0..n).map(|r| if r == c { 1.0 } else { 0.0 }).collect();
            solve_spd(m, &e)
        })
        .collect()
}
