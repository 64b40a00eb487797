#!/usr/bin/env bash
# The single test command of outcore: the Rust workspace's tests, then the
# Python package (crates/py + python/outcore) built as its abi3 wheel into a
# virtual environment with a pinned torch from PyPI, and its pytest suite.
#
#   tools/test-all.sh              everything
#   OUTCORE_SKIP_RUST=1 tools/test-all.sh    the Python part only
#
# The virtual environment lives outside the repository (OUTCORE_VENV, default
# ~/.cache/outcore/venv-torch2.11) so that repeated runs skip the ~2.5 GB torch
# download; delete it to start afresh.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=2.11.0          # the version on the GPU machines
TORCHVISION_VERSION=0.26.0    # the torchvision release built for it

if [ -z "${OUTCORE_SKIP_RUST:-}" ]; then
    cargo test --workspace --locked
fi

VENV="${OUTCORE_VENV:-$HOME/.cache/outcore/venv-torch2.11}"
if [ ! -x "$VENV/bin/python" ]; then
    mkdir -p "$(dirname "$VENV")"
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION" numpy "pytest>=7" "maturin>=1.5,<2"

# The binding shares the main target directory (it is its own workspace).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
start=$(date +%s)
# The binding's own lints (it is its own cargo workspace, outside `cargo clippy --workspace`).
cargo fmt --manifest-path crates/py/Cargo.toml -- --check
cargo clippy --manifest-path crates/py/Cargo.toml --locked --all-targets -- -D warnings
rm -rf target/wheels
"$VENV/bin/maturin" build --release --locked --compatibility linux --auditwheel skip -o target/wheels \
    --interpreter "$VENV/bin/python"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall target/wheels/outcore-*.whl
# From outside the source tree, so that the installed wheel is what is tested.
(cd python/tests && "$VENV/bin/python" -m pytest -q -p no:cacheprovider .)
echo "python part (build, lint, pytest): $(( $(date +%s) - start )) s"
