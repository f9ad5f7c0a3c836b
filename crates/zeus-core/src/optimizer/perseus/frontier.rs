//! The iteration time–cost frontier of a DAG whose activities each choose among discrete
//! `(time, cost)` options, by the Phillips–Dessouky minimum-cut method (the method the `lowtime`
//! package implements).
//!
//! # What is computed, precisely
//!
//! Times are quantised to integer units of `unit_time`, rounding **up** (a plan never runs
//! longer than planned). For each activity, options slower than its cheapest option are dropped
//! (they are dominated), and its cost becomes `h_i`, the lower convex envelope of its remaining
//! options, evaluated at every integer duration between its fastest and its cheapest option.
//! The frontier is then, for every integer iteration time `T` from the all-cheapest makespan
//! down to the shortest achievable one,
//!
//! ```text
//! C(T) = min { sum_i h_i(d_i) : d_i integer in [dmin_i, dmax_i], longest path(d) <= T }
//! ```
//!
//! together with a minimising `d`. This is the linear-programming relaxation of the discrete
//! problem; its constraint matrix is totally unimodular, so with integer breakpoints the LP
//! optimum at integer `T` is attained at integer durations, and the `C(T)` above is exactly what
//! Phillips–Dessouky's continuous method traces at integer `T`. When every integer duration in
//! an activity's range is itself an option whose cost lies on the envelope (e.g. convex costs at
//! consecutive durations), `C(T)` equals the exact discrete Pareto frontier; in general `C(T)` is
//! a lower bound on it. Tests check both statements by brute force.
//!
//! A frontier point is turned into a real plan by [`Frontier::choices`]: each activity takes its
//! cheapest option no slower than its planned duration, so the plan's iteration time is at most
//! `T` and its cost is at least `C(T)` (equal when the durations fall on envelope vertices).
//!
//! # Method
//!
//! Start with every activity at its cheapest option. Repeatedly, on the subnetwork of critical
//! activities (zero total float), find a minimum cut where a forward activity costs
//! `h(d - 1) - h(d)` to shorten by one unit (infinite if it cannot) and a backward activity
//! returns `h(d) - h(d + 1)` when lengthened by one unit. The cut value
//! `sum forward u - sum backward l` is turned into an ordinary minimum cut with non-negative
//! capacities `u - l` and per-node terms (the standard lower-bound reduction), solved with
//! Dinic's maximum flow. Shorten the forward activities and lengthen the backward ones by one
//! unit; the iteration gets one unit shorter at the least extra cost. Stop when every cut is
//! infinite (some critical path is fully crashed). When a step leaves the critical arcs and the
//! envelope pieces their costs come from unchanged, the minimum-cut problem is the same and the
//! previous cut is reused without a max-flow (Phillips–Dessouky's step-size argument, applied
//! one unit at a time).

use super::dag::Dag;
use super::PerseusError;

/// Stands for "cannot be shortened": far above any sum of real costs, yet finite so that flow
/// arithmetic stays well defined.
const INF: f64 = 1e30;

/// One activity's cost envelope over its integer duration range.
#[derive(Debug, Clone)]
struct Envelope {
    dmin: u64,
    dmax: u64,
    /// `h[d - dmin]` for `d` in `dmin..=dmax`.
    h: Vec<f64>,
    /// `seg[d - dmin]`: the envelope segment holding `[d, d + 1]`, for `d` in `dmin..dmax`.
    /// Within one segment the slope is constant, which lets a step reuse the previous cut.
    seg: Vec<u32>,
    /// Quantised options sorted by duration, cost: `(duration, cost, original index)`.
    options: Vec<(u64, f64, usize)>,
}

impl Envelope {
    fn new(activity: usize, options: &[(f64, f64)], unit: f64) -> Result<Envelope, PerseusError> {
        if options.is_empty() {
            return Err(PerseusError::NoOptions { activity });
        }
        let mut q = Vec::with_capacity(options.len());
        for (k, &(t, c)) in options.iter().enumerate() {
            if !(t.is_finite() && t >= 0.0 && c.is_finite()) {
                return Err(PerseusError::BadOption {
                    activity,
                    time: t,
                    cost: c,
                });
            }
            // Round up (with slack for float noise), so planned durations are never optimistic.
            let d = ((t / unit) - 1e-6).ceil().max(0.0);
            if d > 1e9 {
                return Err(PerseusError::TooManyUnits {
                    activity,
                    time: t,
                    unit_time: unit,
                });
            }
            q.push((d as u64, c, k));
        }
        q.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
        // Pareto points: strictly cheaper than every faster option.
        let mut pareto: Vec<(u64, f64)> = Vec::new();
        for &(d, c, _) in &q {
            if pareto.last().is_none_or(|&(_, pc)| c < pc) {
                if pareto.last().is_some_and(|&(pd, _)| pd == d) {
                    pareto.pop();
                }
                pareto.push((d, c));
            }
        }
        // Lower convex envelope (monotone chain, slopes strictly increasing).
        let mut hull: Vec<(u64, f64)> = Vec::with_capacity(pareto.len());
        for &p in &pareto {
            while hull.len() >= 2 {
                let a = hull[hull.len() - 2];
                let b = hull[hull.len() - 1];
                let cross = (b.0 - a.0) as f64 * (p.1 - a.1) - (b.1 - a.1) * (p.0 - a.0) as f64;
                if cross <= 0.0 {
                    hull.pop();
                } else {
                    break;
                }
            }
            hull.push(p);
        }
        let dmin = hull[0].0;
        let dmax = hull[hull.len() - 1].0;
        let mut h = Vec::with_capacity((dmax - dmin + 1) as usize);
        let mut seg = Vec::with_capacity((dmax - dmin) as usize);
        for (j, w) in hull.windows(2).enumerate() {
            let (d0, c0) = w[0];
            let (d1, c1) = w[1];
            let span = (d1 - d0) as f64;
            for d in d0..d1 {
                h.push(c0 + (c1 - c0) * (d - d0) as f64 / span);
                seg.push(j as u32);
            }
        }
        h.push(hull[hull.len() - 1].1);
        Ok(Envelope {
            dmin,
            dmax,
            h,
            seg,
            options: q,
        })
    }

    fn cost(&self, d: u64) -> f64 {
        self.h[(d - self.dmin) as usize]
    }

    /// Envelope segments that set the shortening and lengthening costs at `d`
    /// (`u32::MAX` where the activity cannot move that way).
    fn slopes_at(&self, d: u64) -> (u32, u32) {
        let shorten = if d > self.dmin {
            self.seg[(d - 1 - self.dmin) as usize]
        } else {
            u32::MAX
        };
        let lengthen = if d < self.dmax {
            self.seg[(d - self.dmin) as usize]
        } else {
            u32::MAX
        };
        (shorten, lengthen)
    }

    /// Index of the cheapest original option no slower than `d` (ties: the faster one).
    fn choose(&self, d: u64) -> usize {
        let mut best: Option<(f64, u64, usize)> = None;
        for &(od, c, k) in &self.options {
            if od > d {
                break;
            }
            if best.is_none_or(|(bc, bd, _)| c < bc || (c == bc && od < bd)) {
                best = Some((c, od, k));
            }
        }
        best.map(|b| b.2).unwrap_or(self.options[0].2)
    }
}

/// The result: one point per integer iteration time, slowest (cheapest) first.
#[derive(Debug, Clone)]
pub struct Frontier {
    unit_time: f64,
    num_activities: usize,
    times: Vec<u64>,
    costs: Vec<f64>,
    /// Row-major `times.len() x num_activities`.
    durations: Vec<u64>,
    envelopes: Vec<Envelope>,
}

impl Frontier {
    pub fn len(&self) -> usize {
        self.times.len()
    }

    pub fn is_empty(&self) -> bool {
        self.times.is_empty()
    }

    pub fn unit_time(&self) -> f64 {
        self.unit_time
    }

    /// Iteration times in units, decreasing.
    pub fn times(&self) -> &[u64] {
        &self.times
    }

    /// `C(T)` at each point, non-decreasing along the frontier.
    pub fn costs(&self) -> &[f64] {
        &self.costs
    }

    /// Planned integer duration of each activity at point `k`.
    pub fn durations(&self, k: usize) -> &[u64] {
        &self.durations[k * self.num_activities..(k + 1) * self.num_activities]
    }

    /// For point `k`, each activity's chosen option (index into its option list): the cheapest
    /// option whose quantised time is at most the planned duration.
    pub fn choices(&self, k: usize) -> Vec<usize> {
        self.durations(k)
            .iter()
            .zip(&self.envelopes)
            .map(|(&d, e)| e.choose(d))
            .collect()
    }

    /// The cheapest point whose iteration time is at most `limit` units (the costs are
    /// non-increasing in time, so the slowest such point), or `None` if even the fastest point
    /// is slower.
    pub fn best_within(&self, limit: u64) -> Option<usize> {
        self.times.iter().position(|&t| t <= limit)
    }
}

/// Dinic's maximum flow on a graph rebuilt each Phillips–Dessouky step; buffers are reused.
#[derive(Default)]
struct FlowNet {
    first: Vec<usize>,
    next: Vec<usize>,
    to: Vec<usize>,
    cap: Vec<f64>,
    level: Vec<i64>,
    iter: Vec<usize>,
    queue: Vec<usize>,
}

const NIL: usize = usize::MAX;

impl FlowNet {
    fn reset(&mut self, n: usize) {
        self.first.clear();
        self.first.resize(n, NIL);
        self.next.clear();
        self.to.clear();
        self.cap.clear();
    }

    fn add(&mut self, a: usize, b: usize, c: f64) {
        for (from, dest, cap) in [(a, b, c), (b, a, 0.0)] {
            self.to.push(dest);
            self.cap.push(cap);
            self.next.push(self.first[from]);
            self.first[from] = self.to.len() - 1;
        }
    }

    fn bfs(&mut self, s: usize, eps: f64) {
        let n = self.first.len();
        self.level.clear();
        self.level.resize(n, -1);
        self.queue.clear();
        self.level[s] = 0;
        self.queue.push(s);
        let mut head = 0;
        while head < self.queue.len() {
            let v = self.queue[head];
            head += 1;
            let mut e = self.first[v];
            while e != NIL {
                let w = self.to[e];
                if self.cap[e] > eps && self.level[w] < 0 {
                    self.level[w] = self.level[v] + 1;
                    self.queue.push(w);
                }
                e = self.next[e];
            }
        }
    }

    fn dfs(&mut self, v: usize, t: usize, f: f64, eps: f64) -> f64 {
        if v == t {
            return f;
        }
        while self.iter[v] != NIL {
            let e = self.iter[v];
            let w = self.to[e];
            if self.cap[e] > eps && self.level[w] == self.level[v] + 1 {
                let pushed = self.dfs(w, t, f.min(self.cap[e]), eps);
                if pushed > eps {
                    self.cap[e] -= pushed;
                    self.cap[e ^ 1] += pushed;
                    return pushed;
                }
            }
            self.iter[v] = self.next[e];
        }
        0.0
    }

    /// Maximum flow from `s` to `t`; stops early once it exceeds `INF / 2` (no finite cut).
    fn max_flow(&mut self, s: usize, t: usize, eps: f64) -> f64 {
        let mut flow = 0.0;
        loop {
            self.bfs(s, eps);
            if self.level[t] < 0 {
                return flow;
            }
            self.iter.clear();
            self.iter.extend_from_slice(&self.first);
            loop {
                let f = self.dfs(s, t, INF, eps);
                if f <= eps {
                    break;
                }
                flow += f;
                if flow >= INF / 2.0 {
                    return flow;
                }
            }
        }
    }
}

/// Compute the frontier of `dag` where node `i` chooses among `options[i]` (`(time s, cost)`).
pub fn compute_frontier(
    dag: &Dag,
    options: &[Vec<(f64, f64)>],
    unit_time: f64,
) -> Result<Frontier, PerseusError> {
    if !(unit_time.is_finite() && unit_time > 0.0) {
        return Err(PerseusError::BadUnitTime(unit_time));
    }
    let n = dag.num_nodes;
    if options.len() != n {
        return Err(PerseusError::LengthMismatch {
            what: "options",
            got: options.len(),
            expected: n,
        });
    }
    let envelopes = options
        .iter()
        .enumerate()
        .map(|(i, o)| Envelope::new(i, o, unit_time))
        .collect::<Result<Vec<_>, _>>()?;
    let aon_order = dag.topological_order()?;

    // Activity-on-arc network: node 0 = source, 1 = sink, activity i = arc (2 + 2i) -> (3 + 2i);
    // dependencies and source/sink links are fixed zero-length arcs.
    let nn = 2 + 2 * n;
    let (src, sink) = (0usize, 1usize);
    let mut arcs: Vec<(usize, usize, Option<usize>)> = Vec::with_capacity(n * 3 + dag.edges.len());
    let mut has_pred = vec![false; n];
    let mut has_succ = vec![false; n];
    for &(a, b) in &dag.edges {
        arcs.push((3 + 2 * a, 2 + 2 * b, None));
        has_succ[a] = true;
        has_pred[b] = true;
    }
    for i in 0..n {
        arcs.push((2 + 2 * i, 3 + 2 * i, Some(i)));
        if !has_pred[i] {
            arcs.push((src, 2 + 2 * i, None));
        }
        if !has_succ[i] {
            arcs.push((3 + 2 * i, sink, None));
        }
    }
    let mut order = Vec::with_capacity(nn);
    order.push(src);
    for &v in &aon_order {
        order.push(2 + 2 * v);
        order.push(3 + 2 * v);
    }
    order.push(sink);
    // Out-arcs of each AoA node (CSR).
    let mut out_start = vec![0usize; nn + 1];
    for &(a, _, _) in &arcs {
        out_start[a + 1] += 1;
    }
    for v in 0..nn {
        out_start[v + 1] += out_start[v];
    }
    let mut out_arcs = vec![0usize; arcs.len()];
    let mut fill = out_start.clone();
    for (k, &(a, _, _)) in arcs.iter().enumerate() {
        out_arcs[fill[a]] = k;
        fill[a] += 1;
    }

    let mut d: Vec<u64> = envelopes.iter().map(|e| e.dmax).collect();
    let arc_len = |k: usize, d: &[u64]| -> i64 { arcs[k].2.map_or(0, |i| d[i] as i64) };
    let total_cost = |d: &[u64]| -> f64 { d.iter().zip(&envelopes).map(|(&x, e)| e.cost(x)).sum() };

    let mut times = Vec::new();
    let mut costs = Vec::new();
    let mut durations = Vec::new();
    let mut earliest = vec![0i64; nn];
    let mut latest = vec![0i64; nn];
    let mut net = vec![0f64; nn];
    let mut flow = FlowNet::default();
    let mut critical: Vec<usize> = Vec::new();
    let mut in_s = vec![false; nn];
    // What determines the min-cut problem: each critical arc and the envelope segments its
    // costs come from. When a step leaves it unchanged (the usual case: durations move inside
    // linear pieces and no new path turns critical), the previous cut is still a minimum cut,
    // as in Phillips–Dessouky's own step-size rule, and the max-flow is skipped.
    let mut key: Vec<(usize, u32, u32)> = Vec::new();
    let mut prev_key: Vec<(usize, u32, u32)> = Vec::new();

    loop {
        earliest.iter_mut().for_each(|x| *x = 0);
        for &v in &order {
            for &k in &out_arcs[out_start[v]..out_start[v + 1]] {
                let w = arcs[k].1;
                let cand = earliest[v] + arc_len(k, &d);
                if cand > earliest[w] {
                    earliest[w] = cand;
                }
            }
        }
        let makespan = earliest[sink];
        if times.last().is_some_and(|&t: &u64| makespan as u64 >= t) {
            // A cut must shorten the iteration by exactly one unit; anything else means the
            // costs are numerically inconsistent (should not happen), so stop rather than loop.
            break;
        }
        times.push(makespan as u64);
        costs.push(total_cost(&d));
        durations.extend_from_slice(&d);

        latest.iter_mut().for_each(|x| *x = makespan);
        for &v in order.iter().rev() {
            for &k in &out_arcs[out_start[v]..out_start[v + 1]] {
                let cand = latest[arcs[k].1] - arc_len(k, &d);
                if cand < latest[v] {
                    latest[v] = cand;
                }
            }
        }
        critical.clear();
        critical.extend(
            (0..arcs.len()).filter(|&k| latest[arcs[k].1] - earliest[arcs[k].0] == arc_len(k, &d)),
        );

        key.clear();
        key.extend(critical.iter().map(|&k| match arcs[k].2 {
            None => (k, u32::MAX, u32::MAX),
            Some(i) => {
                let (su, sl) = envelopes[i].slopes_at(d[i]);
                (k, su, sl)
            }
        }));
        if key != prev_key {
            flow.reset(nn);
            net.iter_mut().for_each(|x| *x = 0.0);
            let mut scale = 1.0f64;
            for &k in &critical {
                let (a, b, act) = arcs[k];
                let (u, l) = match act {
                    None => (INF, 0.0),
                    Some(i) => {
                        let e = &envelopes[i];
                        let u = if d[i] > e.dmin {
                            e.cost(d[i] - 1) - e.cost(d[i])
                        } else {
                            INF
                        };
                        let l = if d[i] < e.dmax {
                            e.cost(d[i]) - e.cost(d[i] + 1)
                        } else {
                            0.0
                        };
                        (u, l)
                    }
                };
                if u < INF {
                    scale = scale.max(u.abs());
                }
                let c = if u >= INF { INF } else { (u - l).max(0.0) };
                flow.add(a, b, c);
                net[a] += l;
                net[b] -= l;
            }
            let eps = 1e-12 * scale;
            for (v, &x) in net.iter().enumerate().skip(2) {
                if x > eps {
                    flow.add(v, sink, x);
                } else if x < -eps {
                    flow.add(src, v, -x);
                }
            }
            if flow.max_flow(src, sink, eps) >= INF / 2.0 {
                break;
            }
            // Source side of the minimum cut: reachable in the residual graph.
            flow.bfs(src, eps);
            for (v, side) in in_s.iter_mut().enumerate() {
                *side = flow.level[v] >= 0;
            }
            std::mem::swap(&mut key, &mut prev_key);
        }
        for &k in &critical {
            let (a, b, act) = arcs[k];
            if let Some(i) = act {
                if in_s[a] && !in_s[b] {
                    d[i] -= 1;
                } else if !in_s[a] && in_s[b] && d[i] < envelopes[i].dmax {
                    d[i] += 1;
                }
            }
        }
    }

    Ok(Frontier {
        unit_time,
        num_activities: n,
        times,
        costs,
        durations,
        envelopes,
    })
}
