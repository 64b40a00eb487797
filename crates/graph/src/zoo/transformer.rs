//! Zoo models of the `transformer` family (being written; registers nothing yet).

use super::ModelInfo;

pub(super) fn models() -> Vec<ModelInfo> {
    Vec::new()
}
