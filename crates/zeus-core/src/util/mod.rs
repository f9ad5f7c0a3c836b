//! Small shared pieces: the cost metric.

pub mod metric;
