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

# The race detector also switches on internal/invariants (poisoned pages,
# accounting checks). Long seed sweeps of the simulator run without it below.
echo "== go test -race"
go test -race -count=1 -timeout 20m ./...

# Tests built only without -race (the simulator's CI seed sweep, which is too
# slow under the race detector to reach its seed count).
echo "== go test (no race: long sweeps)"
go test -count=1 -timeout 15m -run 'Sweep' ./...
