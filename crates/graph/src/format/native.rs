//! outcore's own graph format, `outcore-graph/1`: the IR serialised losslessly as JSON.

use crate::{Graph, GraphError, GraphErrorKind, GraphMeta, Op, Tensor};
use serde::{Deserialize, Serialize};

/// The version tag written into every file.
pub const FORMAT: &str = "outcore-graph/1";

// Spelled out rather than `#[serde(flatten)]`, which buffers the whole document.
#[derive(Serialize)]
struct FileRef<'a> {
    format: &'static str,
    meta: &'a GraphMeta,
    tensors: &'a [Tensor],
    ops: &'a [Op],
}

#[derive(Deserialize)]
struct FileOwned {
    format: String,
    meta: GraphMeta,
    tensors: Vec<Tensor>,
    ops: Vec<Op>,
}

/// Serialises a graph as `outcore-graph/1` JSON.
pub fn to_string(graph: &Graph) -> String {
    // Serialising plain data into a String cannot fail.
    serde_json::to_string(&FileRef {
        format: FORMAT,
        meta: &graph.meta,
        tensors: &graph.tensors,
        ops: &graph.ops,
    })
    .unwrap_or_default()
}

/// Parses `outcore-graph/1` JSON; `path` only names the source in errors.
pub fn from_str(text: &str, path: &str) -> Result<Graph, GraphError> {
    let file: FileOwned = serde_json::from_str(text).map_err(|e| GraphErrorKind::Parse {
        path: path.to_string(),
        format: FORMAT,
        detail: e.to_string(),
    })?;
    if file.format != FORMAT {
        return Err(GraphErrorKind::UnsupportedFormat {
            path: path.to_string(),
            found: file.format,
            expected: "`outcore-graph/1`",
        }
        .into());
    }
    Ok(Graph {
        meta: file.meta,
        tensors: file.tensors,
        ops: file.ops,
    })
}
