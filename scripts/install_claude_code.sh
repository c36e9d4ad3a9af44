#!/usr/bin/env bash
# Claude Code (npm `@anthropic-ai/claude-code`, a native binary of about 250 MB) outside the
# repository, for the opt-in test of Anthropic's API with the real client
# (SWITCHYARD_TEST_CLAUDE_CODE=1). Needs Node.js and npm. Made once per machine; prints the
# binary's path on the last line.
set -euo pipefail

VERSION=2.1.197
CACHE_ROOT="${SWITCHYARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/switchyard}"
DIR="$CACHE_ROOT/claude-code-$VERSION"

if [ -x "$DIR/node_modules/.bin/claude" ] && [ -f "$DIR/.complete" ]; then
    echo "$DIR/node_modules/.bin/claude"
    exit 0
fi
mkdir -p "$CACHE_ROOT"
exec 9>"$DIR.lock"
flock 9
if [ ! -f "$DIR/.complete" ]; then
    rm -rf "$DIR"
    mkdir -p "$DIR"
    npm install --prefix "$DIR" --no-audit --no-fund --silent "@anthropic-ai/claude-code@$VERSION" >&2
    "$DIR/node_modules/.bin/claude" --version >&2
    touch "$DIR/.complete"
fi
echo "$DIR/node_modules/.bin/claude"
