#!/usr/bin/env bash
# test_cli.sh — the sdpa command as a user meets it: `sdpa demo` prints the seeds' numbers,
# every subcommand answers --help, `sdpa info` reports the dispatch, and usage errors exit 2
# with a message on stderr. Usage: test_cli.sh PATH/TO/sdpa
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

# expect NAME WANT_EXIT PATTERN -- ARGS...: runs sdpa ARGS, checks exit code and that the
# combined output matches the extended regex PATTERN.
expect() {
  local name=$1 want=$2 pattern=$3
  shift 4
  "$sdpa" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -ne "$want" ]; then
    fail "$name" "exit $rc, want $want"; sed 's/^/    /' "$tmp/err" | head -5
    return
  fi
  if ! cat "$tmp/out" "$tmp/err" | grep -Eq -- "$pattern"; then
    fail "$name" "output does not match /$pattern/"; head -5 "$tmp/out" "$tmp/err"
    return
  fi
  ok "$name"
}

# The demo reproduces the seeds' walk-through (shared/seeds, torch.manual_seed(42)).
expect demo_x 0 '\[ +1\.93 +1\.49 +0\.90 +-2\.11 +0\.68 +-1\.23 +-0\.04 +-1\.60 \]' -- demo
expect demo_scores 0 '\[ +48\.36 +-1\.43 +7\.06 +16\.17 \]' -- demo
expect demo_scaled 0 '\[ +17\.10 +-0\.51 +2\.50 +5\.72 \]' -- demo
expect demo_weights 0 '\[ +0\.000 +0\.001 +0\.979 +0\.021 \] +1\.000000' -- demo
expect demo_output 0 '\[ +-5\.21 +3\.40 +-5\.28 +0\.90 +3\.34 +-0\.39 +3\.69 +-1\.06 \]' -- demo
expect demo_check 0 'max \|difference\| = [0-9.]+e-0[6-9]|max \|difference\| = 0\.00e\+00' -- demo
expect demo_speed 0 '^Speed: B=1 H=8 L=256 D=64 f32 in [0-9.]+ ms' -- demo
expect demo_help 0 '^usage: sdpa demo' -- demo --help
expect demo_bad_option 2 "unknown option '--frob'" -- demo --frob

expect info 0 '^isa: +(generic|avx2|avx512|amx)' -- info
expect info_help 0 '^usage: sdpa info' -- info --help
SDPA_MAX_ISA=generic expect info_env_cap 0 '^isa: +generic' -- info
SDPA_MAX_ISA=bogus expect info_env_unknown 0 'SDPA_MAX_ISA="bogus" is not generic\|avx2\|avx512\|amx: ignored' -- info

expect help 0 '^usage: sdpa <command>' -- --help
expect version 0 '^sdpa [0-9]+\.[0-9]+\.[0-9]+$' -- version
expect no_command 2 '^usage: sdpa <command>' --
expect unknown_command 2 "unknown command 'frobnicate'" -- frobnicate

finish
