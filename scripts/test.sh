#!/usr/bin/env bash
# Runs the whole kvfence test suite. Installs what the tests need (spin, the
# Promela model checker, from Debian's packages) when it is missing and we are
# root; everything else the tests need is generated at test time or committed
# under testdata/.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v spin >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing spin (Promela model checker) from Debian's packages"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq spin gcc >/dev/null
  else
    echo "test.sh: spin is missing; install Debian's 'spin' package (the spec tests need it)" >&2
    exit 1
  fi
fi

echo "== go vet"
go vet ./...

# The simulator's CI seed sweep (10,000 seeds x 200 requests, and varied
# configurations) is built only without -race: the race detector would slow
# it far below its seed count. It runs first so that the race run below,
# which covers every package, gives the closing lines.
echo "== go test ./internal/sim -run Sweep (no race: the long seed sweep)"
go test -count=1 -timeout 15m -run 'Sweep' -v ./internal/sim | grep -v -E '^=== (RUN|PAUSE|CONT|NAME)'

# The race detector also switches on internal/invariants (poisoned pages,
# accounting checks after every transition).
echo "== go test -race ./..."
go test -race -count=1 -timeout 20m ./...
