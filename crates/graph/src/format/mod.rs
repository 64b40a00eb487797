//! Graph file formats: outcore's own versioned JSON and the `dnn-train-graph/1` import.

pub mod aten_rewrite;
pub mod dnn_train_graph;
pub mod native;

use crate::{Graph, GraphError, GraphErrorKind};
use std::path::Path;

/// The largest graph file read: 256 MiB.
pub const MAX_GRAPH_FILE_BYTES: u64 = 256 << 20;

/// Reads a graph file in either supported format, deciding by its `format` field,
/// and validates it.
pub fn load_graph_file(path: &Path) -> Result<Graph, GraphError> {
    let shown = path.display().to_string();
    // Checked before reading: the largest exported graphs are a few MB, and
    // parsing takes several times a file's size in memory.
    if let Ok(meta) = std::fs::metadata(path)
        && meta.len() > MAX_GRAPH_FILE_BYTES
    {
        return Err(GraphErrorKind::Malformed {
            path: shown,
            detail: format!(
                "the file has {} bytes; accepted: at most {MAX_GRAPH_FILE_BYTES} bytes (256 MiB) of graph JSON",
                meta.len()
            ),
        }
        .into());
    }
    let text = std::fs::read_to_string(path).map_err(|source| GraphErrorKind::Io {
        path: shown.clone(),
        source,
    })?;
    // Some editors write a UTF-8 byte order mark, which JSON parsers reject.
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    // Only the `format` field, without building the rest: the format is known
    // (or refused) before the whole document is parsed.
    #[derive(serde::Deserialize)]
    struct Head {
        format: Option<serde_json::Value>,
    }
    let head: Head = serde_json::from_str(text).map_err(|e| GraphErrorKind::Parse {
        path: shown.clone(),
        format: "a graph file",
        detail: e.to_string(),
    })?;
    let format = match head.format {
        Some(serde_json::Value::String(f)) => f,
        Some(other) => other.to_string(),
        None => "<missing>".to_string(),
    };
    let graph = match format.as_str() {
        dnn_train_graph::FORMAT => dnn_train_graph::import_str(text, &shown)?,
        native::FORMAT => native::from_str(text, &shown)?,
        _ => {
            return Err(GraphErrorKind::UnsupportedFormat {
                path: shown,
                found: format,
                expected: "`outcore-graph/1` or `dnn-train-graph/1`",
            }
            .into());
        }
    };
    if let Err(mut errors) = crate::validate(&graph) {
        if format == dnn_train_graph::FORMAT {
            // Name the fields as the file spells them, not as the IR does.
            for v in &mut errors.violations {
                if let crate::ViolationKind::DanglingReference { field, .. } = &mut v.kind {
                    *field = match *field {
                        "view_of" => "alias_of",
                        "inplace_update_of" => "inplace_of",
                        other => other,
                    };
                }
            }
        }
        return Err(GraphErrorKind::Invalid(errors).into());
    }
    Ok(graph)
}
