#!/usr/bin/env bash
# The test command: installs dependencies, configures, builds, runs every test that
# needs no GPU. Usage: scripts/test.sh [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/setup.sh
bash scripts/build.sh
cd "${L2L_BUILD_DIR:-build}"
ctest -LE gpu --output-on-failure --no-tests=error -j "$(nproc)" "$@"
# ThreadSanitizer build of the EPS concurrency tests (separate build-tsan; slow).
if [ "${L2L_TSAN:-0}" = "1" ]; then bash "$OLDPWD/scripts/tsan.sh"; fi
echo "test.sh: done in $(( $(date +%s) - start )) s"
