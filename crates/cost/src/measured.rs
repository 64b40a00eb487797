//! Measured per-op latencies: a table the executor writes after timing each op
//! of a graph on a real device, and a cost model that prices the ops it lists by
//! their measurements and every other op by a fallback model.
//!
//! # Format `outcore-latency-table/1`
//!
//! ```json
//! {
//!   "format": "outcore-latency-table/1",
//!   "device": "NVIDIA H100 80GB HBM3",
//!   "graph_model": "resnet50",
//!   "entries": [
//!     {"op": 12, "name": "layer1.0.conv1", "kind": "conv2d", "time_s": 0.00012, "samples": 9}
//!   ],
//!   "copies": {"h2d_bytes_per_s": 5.3e10, "d2h_bytes_per_s": 5.1e10},
//!   "copy_entries": [
//!     {"tensor": 40, "name": "layer1.0.relu", "direction": "d2h",
//!      "size_bytes": 3211264, "time_s": 6.3e-5, "samples": 9}
//!   ]
//! }
//! ```
//!
//! - `format`: exactly `outcore-latency-table/1`.
//! - `device`: free text naming the device the times were taken on.
//! - `graph_model`: the graph's `meta.model`, for the reader's information.
//! - `entries`: one per measured op. `op` is the op id (its index in the graph),
//!   `name` the op's name, which must equal the graph's name for that id or the
//!   entry is ignored (the table was taken on another graph or build of it);
//!   `time_s` the op's time on the compute stream in seconds (the executor
//!   reports a robust statistic such as the median); `samples` how many runs it
//!   summarises (at least 1; default 1); `kind` (optional) the op's kind, for
//!   the reader. An op id may appear once.
//! - `copies` (optional): measured pinned-copy rates in bytes/s, which replace
//!   the fallback device's one-way rates; `duplex_bytes_per_s` (optional) the
//!   measured both-directions total, else the fallback device's is kept.
//! - `copy_entries` (optional): the per-tensor copy times the rates were fitted
//!   from (see [`MeasuredCopies::fit`]), kept for the reader; pricing uses `copies`.
//!
//! [`MeasuredTable::coverage`] says how many of a graph's ops the table prices.

use crate::device::DeviceProfile;
use crate::error::{CostError, CostErrorKind};
use crate::model::{CopyRates, CostModel};
use outcore_graph::{Graph, OpId};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt;
use std::path::Path;

/// The `format` string of the current latency-table format.
pub const LATENCY_TABLE_FORMAT: &str = "outcore-latency-table/1";

/// Per-op measured latencies of one graph on one device (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasuredTable {
    pub format: String,
    pub device: String,
    pub graph_model: String,
    pub entries: Vec<MeasuredEntry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copies: Option<MeasuredCopies>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copy_entries: Vec<MeasuredCopyEntry>,
}

/// One op's measured time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasuredEntry {
    /// The op id, i.e. its index in the graph.
    pub op: u32,
    /// The op's name, checked against the graph.
    pub name: String,
    /// Seconds on the compute stream.
    pub time_s: f64,
    /// Runs the time summarises.
    #[serde(default = "one_sample")]
    pub samples: u64,
    /// The op's kind (e.g. `conv2d`), for the reader only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// The direction of a host-device copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CopyDirection {
    /// Host to device (a swap-in).
    H2d,
    /// Device to host (a swap-out).
    D2h,
}

/// One tensor's measured copy time in one direction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasuredCopyEntry {
    /// The tensor id, i.e. its index in the graph.
    pub tensor: u32,
    /// The tensor's name.
    pub name: String,
    pub direction: CopyDirection,
    pub size_bytes: u64,
    /// Seconds from the copy's start to its end on its stream.
    pub time_s: f64,
    /// Copies the time summarises.
    #[serde(default = "one_sample")]
    pub samples: u64,
}

fn one_sample() -> u64 {
    1
}

/// Measured host-link rates, bytes/s.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MeasuredCopies {
    pub h2d_bytes_per_s: f64,
    pub d2h_bytes_per_s: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplex_bytes_per_s: Option<f64>,
}

impl MeasuredCopies {
    /// One-way rates fitted to per-tensor copy times: for each direction, all
    /// bytes copied over all time spent copying (sample-weighted). The per-copy
    /// latency is folded into the rate, so small copies are priced slightly
    /// pessimistically. `None` unless both directions have a positive total time
    /// (a rate for one direction only cannot fill both fields).
    pub fn fit(entries: &[MeasuredCopyEntry]) -> Option<MeasuredCopies> {
        let rate = |direction: CopyDirection| {
            let (bytes, time_s) = entries
                .iter()
                .filter(|e| e.direction == direction && e.time_s.is_finite())
                .fold((0.0, 0.0), |(b, t), e| {
                    (
                        b + e.size_bytes as f64 * e.samples as f64,
                        t + e.time_s * e.samples as f64,
                    )
                });
            (time_s > 0.0 && bytes > 0.0).then(|| bytes / time_s)
        };
        Some(MeasuredCopies {
            h2d_bytes_per_s: rate(CopyDirection::H2d)?,
            d2h_bytes_per_s: rate(CopyDirection::D2h)?,
            duplex_bytes_per_s: None,
        })
    }
}

impl MeasuredTable {
    /// An empty table for `graph_model` measured on `device`.
    pub fn new(device: &str, graph_model: &str) -> Self {
        MeasuredTable {
            format: LATENCY_TABLE_FORMAT.to_string(),
            device: device.to_string(),
            graph_model: graph_model.to_string(),
            entries: Vec::new(),
            copies: None,
            copy_entries: Vec::new(),
        }
    }

    /// Appends an entry for `op`, named as in the graph.
    pub fn push(&mut self, op: OpId, name: &str, time_s: f64, samples: u64) {
        self.entries.push(MeasuredEntry {
            op: op.0,
            name: name.to_string(),
            time_s,
            samples,
            kind: None,
        });
    }

    /// Appends a tensor's measured copy time in one direction.
    pub fn push_copy(&mut self, entry: MeasuredCopyEntry) {
        self.copy_entries.push(entry);
    }

    /// Parses and validates a table; `origin` names the source in errors.
    pub fn from_json_str(text: &str, origin: &str) -> Result<MeasuredTable, CostError> {
        let table: MeasuredTable = serde_json::from_str(text).map_err(|e| {
            CostError::new(CostErrorKind::Parse {
                origin: origin.to_string(),
                what: "latency table (outcore-latency-table/1 JSON)",
                detail: e.to_string(),
            })
        })?;
        table.validate_as(origin)?;
        Ok(table)
    }

    /// Reads and validates a table file.
    pub fn from_json_file(path: &Path) -> Result<MeasuredTable, CostError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| {
            CostError::new(CostErrorKind::Read {
                path: origin.clone(),
                source,
            })
        })?;
        // A UTF-8 byte order mark (some editors write one) is not JSON.
        MeasuredTable::from_json_str(text.strip_prefix('\u{feff}').unwrap_or(&text), &origin)
    }

    /// The JSON text of the table.
    pub fn to_json_string(&self) -> String {
        // Plain strings and numbers always serialise (non-finite floats become
        // null, which validation on read reports).
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Validates the table and writes it to `path`.
    pub fn write_json_file(&self, path: &Path) -> Result<(), CostError> {
        let origin = path.display().to_string();
        self.validate_as(&origin)?;
        std::fs::write(path, self.to_json_string() + "\n").map_err(|source| {
            CostError::new(CostErrorKind::Write {
                path: origin,
                source,
            })
        })
    }

    /// Checks the format string, that times are finite and non-negative, samples
    /// at least 1, op ids unique and copy rates positive.
    pub fn validate(&self) -> Result<(), CostError> {
        self.validate_as("latency table")
    }

    fn validate_as(&self, origin: &str) -> Result<(), CostError> {
        if self.format != LATENCY_TABLE_FORMAT {
            return Err(CostError::new(CostErrorKind::UnsupportedFormat {
                origin: origin.to_string(),
                found: self.format.clone(),
                expected: LATENCY_TABLE_FORMAT,
            }));
        }
        let invalid = |detail: String| {
            Err(CostError::new(CostErrorKind::InvalidTable {
                origin: origin.to_string(),
                detail,
            }))
        };
        let mut seen: HashMap<u32, &str> = HashMap::new();
        for e in &self.entries {
            if !(e.time_s.is_finite() && e.time_s >= 0.0) {
                return invalid(format!(
                    "op {} (`{}`): `time_s` must be a non-negative, finite number of seconds, got {}",
                    e.op, e.name, e.time_s
                ));
            }
            if e.samples == 0 {
                return invalid(format!(
                    "op {} (`{}`): `samples` must be at least 1",
                    e.op, e.name
                ));
            }
            if let Some(first) = seen.insert(e.op, &e.name) {
                return invalid(format!(
                    "op {} is listed twice (`{first}` and `{}`); keep one entry per op",
                    e.op, e.name
                ));
            }
        }
        for c in &self.copy_entries {
            if !(c.time_s.is_finite() && c.time_s >= 0.0) {
                return invalid(format!(
                    "copy of tensor {} (`{}`): `time_s` must be a non-negative, finite number of seconds, got {}",
                    c.tensor, c.name, c.time_s
                ));
            }
            if c.samples == 0 {
                return invalid(format!(
                    "copy of tensor {} (`{}`): `samples` must be at least 1",
                    c.tensor, c.name
                ));
            }
        }
        if let Some(c) = &self.copies {
            let rates = [
                ("copies.h2d_bytes_per_s", Some(c.h2d_bytes_per_s)),
                ("copies.d2h_bytes_per_s", Some(c.d2h_bytes_per_s)),
                ("copies.duplex_bytes_per_s", c.duplex_bytes_per_s),
            ];
            for (field, value) in rates {
                match value {
                    Some(v) if !(v.is_finite() && v > 0.0) => {
                        return invalid(format!(
                            "`{field}` must be a positive, finite rate in bytes/s, got {v}"
                        ));
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// How many of `graph`'s ops the table prices, and which entries it ignores.
    pub fn coverage(&self, graph: &Graph) -> Coverage {
        let mut cov = Coverage {
            graph_ops: graph.n_ops(),
            matched: 0,
            name_mismatches: Vec::new(),
            out_of_range: Vec::new(),
        };
        let mut counted = vec![false; graph.n_ops()];
        for e in &self.entries {
            let Some(op) = graph.ops.get(e.op as usize) else {
                cov.out_of_range.push(e.op);
                continue;
            };
            if op.name != e.name {
                cov.name_mismatches.push(NameMismatch {
                    op: OpId(e.op),
                    table_name: e.name.clone(),
                    graph_name: op.name.clone(),
                });
            } else if !counted[e.op as usize] {
                counted[e.op as usize] = true;
                cov.matched += 1;
            }
        }
        cov
    }
}

/// How well a latency table fits a graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coverage {
    /// Ops in the graph.
    pub graph_ops: usize,
    /// Ops whose entry matched by id and name: these use the measured time.
    pub matched: usize,
    /// Entries ignored because the graph's op of that id has another name.
    pub name_mismatches: Vec<NameMismatch>,
    /// Entries ignored because the graph has no op of that id.
    pub out_of_range: Vec<u32>,
}

/// An entry whose name disagrees with the graph's op of the same id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameMismatch {
    pub op: OpId,
    pub table_name: String,
    pub graph_name: String,
}

impl Coverage {
    /// Ops priced by the fallback model.
    pub fn unmeasured(&self) -> usize {
        self.graph_ops - self.matched
    }

    /// Whether every op is measured and no entry was ignored.
    pub fn is_complete(&self) -> bool {
        self.matched == self.graph_ops
            && self.name_mismatches.is_empty()
            && self.out_of_range.is_empty()
    }
}

impl fmt::Display for Coverage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {} ops measured, {} priced by the fallback model",
            self.matched,
            self.graph_ops,
            self.unmeasured()
        )?;
        if let Some(first) = self.name_mismatches.first() {
            write!(
                f,
                "; {} entries ignored for a name mismatch (first: {} is `{}` in the table but `{}` in the graph; was the table taken on another graph?)",
                self.name_mismatches.len(),
                first.op,
                first.table_name,
                first.graph_name
            )?;
        }
        if !self.out_of_range.is_empty() {
            write!(
                f,
                "; {} entries name ops beyond the graph's {} ops",
                self.out_of_range.len(),
                self.graph_ops
            )?;
        }
        Ok(())
    }
}

/// Prices the ops a [`MeasuredTable`] lists (matched by id and name) by their
/// measured times and all others by `fallback`; copies use the table's measured
/// rates when it has them, else the fallback's pricing.
#[derive(Debug, Clone)]
pub struct MeasuredModel<M: CostModel = Box<dyn CostModel>> {
    table: MeasuredTable,
    fallback: M,
    /// The fallback's device with the measured copy rates, if any, put in.
    device: DeviceProfile,
    /// Entry index by op id; the first entry wins if an unvalidated table repeats one.
    by_op: HashMap<u32, usize>,
}

impl<M: CostModel> MeasuredModel<M> {
    /// Wraps `fallback` with the measurements of `table`. Entries with a negative
    /// or non-finite time and copy rates that are not positive are ignored (a
    /// table read from a file was validated already).
    pub fn new(table: MeasuredTable, fallback: M) -> Self {
        let mut device = fallback.device().clone();
        if let Some(c) = table.copies.filter(usable_copies) {
            device.h2d_bytes_per_s = c.h2d_bytes_per_s;
            device.d2h_bytes_per_s = c.d2h_bytes_per_s;
            if let Some(duplex) = c.duplex_bytes_per_s {
                device.duplex_bytes_per_s = duplex;
            }
            // A table without a duplex measurement keeps the profile's, held
            // between the measured one-way rates and their sum, where
            // `DeviceProfile::validate` asks it to be.
            device.duplex_bytes_per_s = device.duplex_bytes_per_s.clamp(
                device.h2d_bytes_per_s.max(device.d2h_bytes_per_s),
                device.h2d_bytes_per_s + device.d2h_bytes_per_s,
            );
        }
        let mut by_op = HashMap::new();
        for (i, e) in table.entries.iter().enumerate() {
            if e.time_s.is_finite() && e.time_s >= 0.0 {
                by_op.entry(e.op).or_insert(i);
            }
        }
        MeasuredModel {
            table,
            fallback,
            device,
            by_op,
        }
    }

    pub fn table(&self) -> &MeasuredTable {
        &self.table
    }

    pub fn fallback(&self) -> &M {
        &self.fallback
    }

    /// How many of `graph`'s ops the table prices (see [`MeasuredTable::coverage`]).
    pub fn coverage(&self, graph: &Graph) -> Coverage {
        self.table.coverage(graph)
    }

    /// The measured time of `op`, if the table has a matching entry.
    pub fn measured_time_s(&self, graph: &Graph, op: OpId) -> Option<f64> {
        let entry = &self.table.entries[*self.by_op.get(&op.0)?];
        let graph_op = graph.ops.get(op.index())?;
        (graph_op.name == entry.name).then_some(entry.time_s)
    }

    fn measured_copies(&self) -> Option<MeasuredCopies> {
        self.table.copies.filter(usable_copies)
    }
}

fn usable_copies(c: &MeasuredCopies) -> bool {
    let ok = |v: f64| v.is_finite() && v > 0.0;
    ok(c.h2d_bytes_per_s) && ok(c.d2h_bytes_per_s) && c.duplex_bytes_per_s.is_none_or(ok)
}

impl<M: CostModel> CostModel for MeasuredModel<M> {
    fn device(&self) -> &DeviceProfile {
        &self.device
    }

    fn op_time_s(&self, graph: &Graph, op: OpId) -> f64 {
        self.measured_time_s(graph, op)
            .unwrap_or_else(|| self.fallback.op_time_s(graph, op))
    }

    /// Measured copy rates replace the one-way rates; while both directions
    /// copy, each is capped at half the device's duplex rate as for the profile.
    fn copy_rates(&self) -> CopyRates {
        match self.measured_copies() {
            Some(c) => {
                let half_duplex = self.device.duplex_bytes_per_s / 2.0;
                CopyRates {
                    latency_s: self.device.copy_latency_s,
                    one_way_bytes_per_s: [c.h2d_bytes_per_s, c.d2h_bytes_per_s],
                    duplex_bytes_per_s: [
                        c.h2d_bytes_per_s.min(half_duplex),
                        c.d2h_bytes_per_s.min(half_duplex),
                    ],
                }
            }
            None => self.fallback.copy_rates(),
        }
    }

    fn name(&self) -> String {
        format!(
            "measured({}, fallback {})",
            self.table.device,
            self.fallback.name()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::UnitCostModel;
    use outcore_graph::DType;
    use outcore_graph::builder::{GraphBuilder, Optimizer};

    fn graph() -> Graph {
        let mut b = GraphBuilder::new("t", 4, DType::Float32);
        let x = b.input("x", &[4, 8]);
        let y = b.label("y", &[4]);
        let h = b.linear("fc", x, 3, true);
        let loss = b.softmax_cross_entropy(h, y);
        b.finish(loss, Optimizer::None).unwrap()
    }

    #[test]
    fn validation_rejects_bad_tables() {
        let g = graph();
        let mut t = MeasuredTable::new("gpu", "t");
        t.push(OpId(0), &g.ops[0].name, 1e-4, 3);
        t.validate().unwrap();

        let mut bad = t.clone();
        bad.format = "outcore-latency-table/9".into();
        let msg = bad.validate().unwrap_err().to_string();
        assert!(
            msg.contains("unsupported format `outcore-latency-table/9`"),
            "{msg}"
        );

        let mut bad = t.clone();
        bad.push(OpId(0), "again", 1e-4, 1);
        let msg = bad.validate().unwrap_err().to_string();
        assert!(msg.contains("op 0 is listed twice"), "{msg}");

        let mut bad = t.clone();
        bad.entries[0].time_s = -1.0;
        let msg = bad.validate().unwrap_err().to_string();
        assert!(msg.contains("`time_s`"), "{msg}");

        let mut bad = t.clone();
        bad.entries[0].samples = 0;
        assert!(bad.validate().unwrap_err().to_string().contains("samples"));

        let mut bad = t.clone();
        bad.copies = Some(MeasuredCopies {
            h2d_bytes_per_s: 1e10,
            d2h_bytes_per_s: 0.0,
            duplex_bytes_per_s: None,
        });
        let msg = bad.validate().unwrap_err().to_string();
        assert!(msg.contains("copies.d2h_bytes_per_s"), "{msg}");
    }

    #[test]
    fn parse_errors_name_the_origin_and_field() {
        let msg = MeasuredTable::from_json_str(r#"{"format":"outcore-latency-table/1"}"#, "t.json")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("t.json"), "{msg}");
        assert!(msg.contains("missing field `device`"), "{msg}");
        // `samples` and `copies` are optional.
        let t = MeasuredTable::from_json_str(
            r#"{"format":"outcore-latency-table/1","device":"d","graph_model":"m",
                "entries":[{"op":0,"name":"a","time_s":0.5}]}"#,
            "t.json",
        )
        .unwrap();
        assert_eq!(t.entries[0].samples, 1);
        assert_eq!(t.copies, None);
    }

    #[test]
    fn coverage_counts_and_reports() {
        let g = graph();
        let mut t = MeasuredTable::new("gpu", "t");
        t.push(OpId(0), &g.ops[0].name, 1e-4, 3);
        t.push(OpId(1), "renamed", 1e-4, 3);
        t.push(OpId(10_000), "gone", 1e-4, 3);
        let cov = t.coverage(&g);
        assert_eq!(cov.graph_ops, g.n_ops());
        assert_eq!(cov.matched, 1);
        assert_eq!(cov.unmeasured(), g.n_ops() - 1);
        assert_eq!(cov.name_mismatches.len(), 1);
        assert_eq!(cov.name_mismatches[0].graph_name, g.ops[1].name);
        assert_eq!(cov.out_of_range, vec![10_000]);
        assert!(!cov.is_complete());
        let text = cov.to_string();
        assert!(
            text.starts_with(&format!("1 of {} ops measured", g.n_ops())),
            "{text}"
        );
        assert!(text.contains("`renamed`"), "{text}");
    }

    #[test]
    fn copy_rates_are_fitted_from_copy_entries() {
        let entry = |direction, size_bytes, time_s, samples| MeasuredCopyEntry {
            tensor: 0,
            name: "t".into(),
            direction,
            size_bytes,
            time_s,
            samples,
        };
        // h2d: (100 * 2 + 300 * 1) bytes over (1 * 2 + 4 * 1) s = 500 / 6.
        let entries = [
            entry(CopyDirection::H2d, 100, 1.0, 2),
            entry(CopyDirection::H2d, 300, 4.0, 1),
            entry(CopyDirection::D2h, 50, 0.5, 1),
        ];
        let c = MeasuredCopies::fit(&entries).unwrap();
        assert!((c.h2d_bytes_per_s - 500.0 / 6.0).abs() < 1e-9);
        assert_eq!(c.d2h_bytes_per_s, 100.0);
        // One direction only: no rates.
        assert_eq!(MeasuredCopies::fit(&entries[..2]), None);

        let mut t = MeasuredTable::new("gpu", "t");
        t.push_copy(entry(CopyDirection::D2h, 8, -1.0, 1));
        let msg = t.validate().unwrap_err().to_string();
        assert!(msg.contains("copy of tensor 0"), "{msg}");
    }

    #[test]
    fn measured_copy_rates_replace_the_fallbacks() {
        let mut t = MeasuredTable::new("gpu", "t");
        t.copies = Some(MeasuredCopies {
            h2d_bytes_per_s: 4.0,
            d2h_bytes_per_s: 2.0,
            duplex_bytes_per_s: Some(5.0),
        });
        let m = MeasuredModel::new(t, UnitCostModel);
        // UnitCostModel has no copy latency: 8 B at 4 B/s and 2 B/s.
        assert_eq!(m.h2d_time_s(8), 2.0);
        assert_eq!(m.d2h_time_s(8), 4.0);
        assert_eq!(m.device().duplex_bytes_per_s, 5.0);
        assert_eq!(m.device().h2d_duplex_bytes_per_s(), 2.5);
        // Without measured copies the fallback prices them.
        let m = MeasuredModel::new(MeasuredTable::new("gpu", "t"), UnitCostModel);
        assert_eq!(m.h2d_time_s(8), 8.0);
    }
}
