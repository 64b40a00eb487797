//! Zoo models of the `mobilenet` family (being written; registers nothing yet).

use super::ModelInfo;

pub(super) fn models() -> Vec<ModelInfo> {
    Vec::new()
}
