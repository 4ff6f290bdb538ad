# shellcheck shell=bash
# lib.sh — what the command's shell tests (test_cli.sh, test_explain.sh, test_bench.sh) share,
# sourced at their top: the sdpa binary from their first argument, a scratch directory
# $tmp removed on exit, the counters with ok and fail, and finish, which prints the summary
# line and fails unless something passed and nothing failed.
set -u
if [ $# -lt 1 ]; then
  echo "usage: $0 PATH/TO/sdpa" >&2
  exit 2
fi
# shellcheck disable=SC2034 # used by the tests that source this file
sdpa=$1
passed=0
failed=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ok NAME / fail NAME [WHY]: one result.
ok() {
  echo "  ok   $1"
  passed=$((passed + 1))
}
fail() {
  echo "  FAIL $1${2:+: $2}"
  failed=$((failed + 1))
}

finish() {
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
}
