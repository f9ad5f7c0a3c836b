//! Pipeline DAGs: instructions as nodes, data and ordering dependencies as edges.

use super::PerseusError;

/// Kind of a pipeline instruction. The names match the strings the client hooks receive
/// (`on_instruction_begin("forward")`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InstructionKind {
    Forward,
    Backward,
}

impl InstructionKind {
    pub fn name(self) -> &'static str {
        match self {
            InstructionKind::Forward => "forward",
            InstructionKind::Backward => "backward",
        }
    }
}

/// One instruction of a pipeline iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Instruction {
    pub stage: usize,
    pub microbatch: usize,
    pub kind: InstructionKind,
}

/// A DAG of activities on nodes. `edges[k] = (a, b)` means `b` starts after `a` finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dag {
    pub num_nodes: usize,
    pub edges: Vec<(usize, usize)>,
}

impl Dag {
    /// Check the edges and return a topological order of the nodes.
    pub fn topological_order(&self) -> Result<Vec<usize>, PerseusError> {
        let n = self.num_nodes;
        let mut indeg = vec![0usize; n];
        let mut succ: Vec<Vec<usize>> = vec![Vec::new(); n];
        for &(a, b) in &self.edges {
            if a >= n || b >= n {
                return Err(PerseusError::EdgeOutOfRange {
                    edge: (a, b),
                    num_nodes: n,
                });
            }
            succ[a].push(b);
            indeg[b] += 1;
        }
        let mut order: Vec<usize> = (0..n).filter(|&v| indeg[v] == 0).collect();
        let mut head = 0;
        while head < order.len() {
            let v = order[head];
            head += 1;
            for &w in &succ[v] {
                indeg[w] -= 1;
                if indeg[w] == 0 {
                    order.push(w);
                }
            }
        }
        if order.len() != n {
            return Err(PerseusError::Cycle);
        }
        Ok(order)
    }

    /// Length of the longest path when node `v` takes `durations[v]`: the iteration time.
    pub fn makespan<T>(&self, durations: &[T]) -> Result<T, PerseusError>
    where
        T: Copy + PartialOrd + std::ops::Add<Output = T> + Default,
    {
        if durations.len() != self.num_nodes {
            return Err(PerseusError::LengthMismatch {
                what: "durations",
                got: durations.len(),
                expected: self.num_nodes,
            });
        }
        let order = self.topological_order()?;
        let mut pred: Vec<Vec<usize>> = vec![Vec::new(); self.num_nodes];
        for &(a, b) in &self.edges {
            pred[b].push(a);
        }
        let mut finish = vec![T::default(); self.num_nodes];
        let mut best = T::default();
        for &v in &order {
            let mut start = T::default();
            for &p in &pred[v] {
                if finish[p] > start {
                    start = finish[p];
                }
            }
            finish[v] = start + durations[v];
            if finish[v] > best {
                best = finish[v];
            }
        }
        Ok(best)
    }
}

/// Order in which stage `stage` of a synchronous 1F1B pipeline (PipeDream-Flush) runs its
/// instructions: `min(stages - stage - 1, microbatches)` warm-up forwards, then alternating
/// forward/backward, then the remaining backwards.
pub fn stage_order_1f1b(
    num_stages: usize,
    num_microbatches: usize,
    stage: usize,
) -> Vec<(InstructionKind, usize)> {
    let warmup = (num_stages - stage - 1).min(num_microbatches);
    let mut out = Vec::with_capacity(2 * num_microbatches);
    for m in 0..warmup {
        out.push((InstructionKind::Forward, m));
    }
    for i in 0..num_microbatches - warmup {
        out.push((InstructionKind::Forward, warmup + i));
        out.push((InstructionKind::Backward, i));
    }
    for m in num_microbatches - warmup..num_microbatches {
        out.push((InstructionKind::Backward, m));
    }
    out
}

/// The DAG of one synchronous 1F1B iteration. Nodes are numbered stage by stage in each stage's
/// execution order, so node `stage * 2 * num_microbatches + k` is stage `stage`'s `k`-th
/// instruction. Edges: each stage runs its instructions in order; a forward waits for the same
/// microbatch's forward on the previous stage; a backward waits for the next stage's backward
/// (the last stage's backward waits for its own forward, which the stage order already implies).
// Indexing by (stage, kind, microbatch) reads better than zipped iterators here.
#[allow(clippy::needless_range_loop)]
pub fn pipeline_1f1b(
    num_stages: usize,
    num_microbatches: usize,
) -> Result<(Vec<Instruction>, Dag), PerseusError> {
    if num_stages == 0 || num_microbatches == 0 {
        return Err(PerseusError::EmptyPipeline {
            num_stages,
            num_microbatches,
        });
    }
    let per_stage = 2 * num_microbatches;
    let mut instructions = Vec::with_capacity(num_stages * per_stage);
    // index[stage][kind][microbatch] -> node
    let mut index = vec![
        [
            vec![0usize; num_microbatches],
            vec![0usize; num_microbatches]
        ];
        num_stages
    ];
    let mut edges = Vec::new();
    for s in 0..num_stages {
        for (k, (kind, m)) in stage_order_1f1b(num_stages, num_microbatches, s)
            .into_iter()
            .enumerate()
        {
            let node = s * per_stage + k;
            instructions.push(Instruction {
                stage: s,
                microbatch: m,
                kind,
            });
            index[s][(kind == InstructionKind::Backward) as usize][m] = node;
            if k > 0 {
                edges.push((node - 1, node));
            }
        }
    }
    for s in 0..num_stages {
        for m in 0..num_microbatches {
            if s > 0 {
                edges.push((index[s - 1][0][m], index[s][0][m]));
            }
            if s + 1 < num_stages {
                edges.push((index[s + 1][1][m], index[s][1][m]));
            }
        }
    }
    Ok((
        instructions,
        Dag {
            num_nodes: num_stages * per_stage,
            edges,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_f_one_b_order_and_makespan() {
        assert_eq!(
            stage_order_1f1b(4, 3, 0)
                .iter()
                .map(|(k, m)| format!("{}{m}", &k.name()[..1]))
                .collect::<Vec<_>>(),
            ["f0", "f1", "f2", "b0", "b1", "b2"]
        );
        assert_eq!(
            stage_order_1f1b(4, 4, 2)
                .iter()
                .map(|(k, m)| format!("{}{m}", &k.name()[..1]))
                .collect::<Vec<_>>(),
            ["f0", "f1", "b0", "f2", "b1", "f3", "b2", "b3"]
        );
        // Uniform forward 1, backward 2: the classic 1F1B iteration time is
        // (M + S - 1) * (f + b) = (8 + 4 - 1) * 3.
        let (instr, dag) = pipeline_1f1b(4, 8).unwrap();
        let d: Vec<u64> = instr
            .iter()
            .map(|i| match i.kind {
                InstructionKind::Forward => 1,
                InstructionKind::Backward => 2,
            })
            .collect();
        assert_eq!(dag.makespan(&d).unwrap(), 33);
        assert!(pipeline_1f1b(0, 3).is_err());
    }

    #[test]
    fn cycles_and_bad_edges_are_errors() {
        let dag = Dag {
            num_nodes: 2,
            edges: vec![(0, 1), (1, 0)],
        };
        assert_eq!(dag.topological_order(), Err(PerseusError::Cycle));
        let dag = Dag {
            num_nodes: 2,
            edges: vec![(0, 5)],
        };
        assert!(matches!(
            dag.topological_order(),
            Err(PerseusError::EdgeOutOfRange { .. })
        ));
    }
}
