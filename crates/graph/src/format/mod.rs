//! Graph file formats: outcore's own versioned JSON and the `dnn-train-graph/1` import.

pub mod dnn_train_graph;
pub mod native;

use crate::{Graph, GraphError, GraphErrorKind};
use std::path::Path;

/// Reads a graph file in either supported format, deciding by its `format` field,
/// and validates it.
pub fn load_graph_file(path: &Path) -> Result<Graph, GraphError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| GraphErrorKind::Io {
        path: shown.clone(),
        source,
    })?;
    let head: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| GraphErrorKind::Parse {
            path: shown.clone(),
            format: "a graph file",
            detail: e.to_string(),
        })?;
    let format = head
        .get("format")
        .and_then(|f| f.as_str())
        .unwrap_or("<missing>")
        .to_string();
    drop(head);
    let graph = match format.as_str() {
        dnn_train_graph::FORMAT => dnn_train_graph::import_str(&text, &shown)?,
        native::FORMAT => native::from_str(&text, &shown)?,
        _ => {
            return Err(GraphErrorKind::UnsupportedFormat {
                path: shown,
                found: format,
                expected: "`outcore-graph/1` or `dnn-train-graph/1`",
            }
            .into());
        }
    };
    crate::validate(&graph)?;
    Ok(graph)
}
