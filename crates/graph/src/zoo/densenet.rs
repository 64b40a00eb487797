//! Zoo models of the `densenet` family (being written; registers nothing yet).

use super::ModelInfo;

pub(super) fn models() -> Vec<ModelInfo> {
    Vec::new()
}
