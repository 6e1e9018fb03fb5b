#!/usr/bin/env bash
# Runs the quick suite and the store's durability tests on another Node version, e.g. 24.22.3 or 22.23.3.
# The Node binary comes from the npm registry's node-linux-<arch> package (nothing else is downloaded),
# kept under .cache/; the checkout's node_modules and dist/ are used as they are. On Node 22.13+ and 24
# the store runs on Node's own SQLite (node:sqlite), so better-sqlite3's addon (built for the Node that
# installed it) is never loaded. The package carries node only: npm is the one already on PATH, run
# by this Node (package-install.test.ts installs the packed tarball with it, no compiler on PATH).
set -euo pipefail
version="${1:?usage: scripts/test-on-node.sh VERSION (for example 24.22.3)}"
cd "$(dirname "$0")/.."
arch=$(node -p process.arch)
dir="$PWD/.cache/node-$version"
if [ ! -x "$dir/bin/node" ]; then
  echo "test-on-node: fetching node-linux-$arch@$version from the npm registry"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "node-linux-$arch@$version" >/dev/null)
  mkdir -p "$dir"
  tar -xzf "$tmp"/node-linux-*.tgz -C "$dir" --strip-components=1
  rm -rf "$tmp"
fi
export PATH="$dir/bin:$PATH"
echo "test-on-node: $(node --version)"
node node_modules/vitest/vitest.mjs run --config vitest.other-node.config.ts
