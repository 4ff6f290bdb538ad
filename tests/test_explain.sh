#!/usr/bin/env bash
# test_explain.sh — `sdpa explain` as a learner meets it: the default run shows the seeds'
# numbers (torch.manual_seed(42), 4 tokens, d = 8) at every step and passes its own check
# against the library; every line fits 80 columns, even at 16 x 16; no colour escapes reach a
# pipe; --causal masks the future; the user's own .npy files (written here byte by byte, so
# numpy is not needed) give the right result; every error exits with the right code and says
# why on stderr. Usage: test_explain.sh PATH/TO/sdpa
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

# run ARGS...: runs sdpa explain ARGS with stdout in $tmp/out, stderr in $tmp/err; sets rc.
run() {
  "$sdpa" explain "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
}

# expect NAME WANT_EXIT STREAM PATTERN -- ARGS...: runs `sdpa explain ARGS`, checks the exit
# code and that STREAM (out or err) matches the extended regex PATTERN.
expect() {
  local name=$1 want=$2 stream=$3 pattern=$4
  shift 5
  run "$@"
  if [ "$rc" -ne "$want" ]; then
    fail "$name" "exit $rc, want $want"
    sed 's/^/    /' "$tmp/err" | head -5
    return
  fi
  if ! grep -Eq -- "$pattern" "$tmp/$stream"; then
    fail "$name" "std$stream does not match /$pattern/"
    head -5 "$tmp/$stream" | sed 's/^/    /'
    return
  fi
  ok "$name"
}

# expect_error NAME WANT_EXIT PATTERN -- ARGS...: an error: the exit code, the message on
# stderr, and nothing at all on stdout.
expect_error() {
  local name=$1 want=$2 pattern=$3
  shift 4
  run "$@"
  if [ "$rc" -ne "$want" ]; then
    fail "$name" "exit $rc, want $want"
  elif [ -s "$tmp/out" ]; then
    fail "$name" "an error printed to stdout"
  elif ! grep -Eq -- "$pattern" "$tmp/err"; then
    fail "$name" "stderr does not match /$pattern/"
    sed 's/^/    /' "$tmp/err" | head -5
  else
    ok "$name"
  fi
}

# fits NAME ARGS...: every line of the output is at most 80 columns and holds no ESC.
fits() {
  local name=$1
  shift
  run "$@"
  if [ "$rc" -ne 0 ]; then
    fail "$name" "exit $rc"
    return
  fi
  local long
  long=$(LC_ALL=C awk 'length($0) > 80 { print NR ": " length($0) " columns" }' "$tmp/out")
  if [ -n "$long" ]; then
    fail "$name" "lines over 80 columns: $(echo "$long" | head -3 | tr '\n' ' ')"
  elif LC_ALL=C grep -q $'\033' "$tmp/out"; then
    fail "$name" "ANSI escape codes in a pipe"
  else
    ok "$name"
  fi
}

# write_npy FILE DESCR SHAPE HEX...: a version-1.0 .npy file; each HEX is one element's bits
# (8 hex digits for '<f4', 4 for '<f2'), written little-endian.
write_npy() {
  local file=$1 descr=$2 shape=$3
  shift 3
  local dict="{'descr': '$descr', 'fortran_order': False, 'shape': ($shape), }"
  local pad=$(((64 - (10 + ${#dict} + 1) % 64) % 64))
  local hlen=$((${#dict} + pad + 1))
  {
    printf '\x93NUMPY\x01\x00'
    printf "\\x$(printf %02x $((hlen & 255)))\\x$(printf %02x $((hlen >> 8)))"
    printf '%s%*s\n' "$dict" "$pad" ''
    local h
    for h in "$@"; do
      if [ ${#h} -eq 8 ]; then
        printf "\\x${h:6:2}\\x${h:4:2}\\x${h:2:2}\\x${h:0:2}"
      else
        printf "\\x${h:2:2}\\x${h:0:2}"
      fi
    done
  } >"$file"
}

echo "the seeds' example (defaults: --n 4 --d 8 --seed 42)"
expect x_row0 0 out 'x0 \[ +1\.93 +1\.49 +0\.90 +-2\.11 +0\.68 +-1\.23 +-0\.04 +-1\.60 \]' --
expect scores_row0 0 out 'q0 \[ +48\.36 +-1\.43 +7\.06 +16\.17 \]' --
expect scores_worked 0 out '^  scores\[0, 1\] = q0 \. k1 = \(-2\.85\)\*1\.14 \+' --
expect scores_worked_result 0 out '\(-4\.78\)\*\(-1\.18\) = -1\.43$' --
expect scale_variance 0 out 'the 16 raw scores have sample variance [0-9.]+' --
expect scaled_row0 0 out 'q0 \[ +17\.10 +-0\.51 +2\.50 +5\.72 \]' --
expect softmax_worked 0 out 'sum of exp = 1\.60e-06 \+ 6\.33e-04 \+ 1\.0000 \+ 0\.0213 = 1\.0219' --
expect weights_row0 0 out 'q0 \[ 1\.000 0\.000 0\.000 0\.000 \] +1\.000000' --
expect weights_row1 0 out 'q1 \[ 0\.011 0\.989 0\.000 0\.000 \] +1\.000000' --
expect weights_row2 0 out 'q2 \[ 0\.000 0\.001 0\.979 0\.021 \] +1\.000000' --
expect weights_row3 0 out 'q3 \[ 0\.000 0\.000 0\.993 0\.007 \] +1\.000000' --
expect output_worked 0 out '^  out\[2\] = 0\.000 x v0 \+ 0\.001 x v1 \+ 0\.979 x v2 \+ 0\.021 x v3$' --
expect output_row3 0 out 'o3 \[ +-5\.21 +3\.40 +-5\.28 +0\.90 +3\.34 +-0\.39 +3\.69 +-1\.06 \]' --
expect steps 0 out '^Step 6\. The check' --
expect why_small 0 out 'softmax\(\[2, 1, 0\.5\]\) += \[0\.6285, 0\.2312, 0\.1402\]' --
expect why_huge 0 out 'softmax\(\[200, 100, 50\]\) += \[1\.0000, (3\.78e-44|0\.0000), 0\.0000\]' --
expect why_scaled 0 out 'softmax\(\[200, 100, 50\] / 100\) = \[0\.6285, 0\.2312, 0\.1402\]' --

# The final check: both differences printed, both below 1e-5.
run
diffs=$(sed -n 's/.*max |sdpa_[a-z]* - step by step| = \([0-9.e+-]*\)$/\1/p' "$tmp/out")
if [ "$(echo "$diffs" | wc -l)" -eq 2 ] &&
  echo "$diffs" | awk '{ if ($1 + 0 >= 1e-5) bad = 1 } END { exit bad }'; then
  ok "check_below_1e-5 ($(echo $diffs))"
else
  fail check_below_1e-5 "differences: '$(echo $diffs)'"
fi
if grep -q '^Step 4\. The causal mask' "$tmp/out"; then
  fail no_mask_step "the mask step appears without --causal"
else
  ok no_mask_step
fi

echo "80 columns, no colour in a pipe"
fits width_default
fits width_16x16 --n 16 --d 16
fits width_causal --causal
fits width_16x16_causal --n 16 --d 16 --causal --seed 3
fits width_1x1 --n 1 --d 1
fits width_no_color --no-color --n 9 --d 13
# On a terminal (util-linux script(1) gives one) colour appears, unless asked not to.
if script --version 2>/dev/null | grep -q util-linux; then
  script -qec "'$sdpa' explain" /dev/null >"$tmp/tty" 2>&1
  if LC_ALL=C grep -q $'\033\\[' "$tmp/tty"; then ok color_on_tty; else fail color_on_tty "no ANSI codes"; fi
  script -qec "'$sdpa' explain --no-color" /dev/null >"$tmp/tty" 2>&1
  if LC_ALL=C grep -q $'\033' "$tmp/tty"; then fail no_color_option "ANSI codes"; else ok no_color_option; fi
  script -qec "NO_COLOR=1 '$sdpa' explain" /dev/null >"$tmp/tty" 2>&1
  if LC_ALL=C grep -q $'\033' "$tmp/tty"; then fail no_color_env "ANSI codes"; else ok no_color_env; fi
else
  echo "  skip colour on a terminal (no util-linux script)"
fi

echo "--causal"
expect causal_step 0 out '^Step 4\. The causal mask: no peeking at the future' -- --causal
expect causal_inf 0 out 'q0 \[ +17\.10 +-inf +-inf +-inf \]' -- --causal
expect causal_inf_row2 0 out 'q2 \[ +-7\.39 +-1\.41 +5\.96 +-inf \]' -- --causal
expect causal_count 0 out 'Here 6 of the 16 entries are masked' -- --causal
expect causal_weights0 0 out 'q0 \[ 1\.000 +0 +0 +0 \] +1\.000000' -- --causal
expect causal_weights2 0 out 'q2 \[ 0\.000 0\.001 0\.999 +0 \] +1\.000000' -- --causal
expect causal_output0 0 out 'o0 \[ +-3\.69 +0\.80 +9\.47 +-2\.52 +-6\.27 +-0\.84 +-3\.96 +-3\.32 \]' -- --causal
expect causal_check 0 out '^Step 7\. The check' -- --causal
expect causal_agree 0 out 'They agree to float32 rounding' -- --causal --n 16 --d 16 --seed 5

echo "--backward"
# the seeds' example carried through the gradients for L = out.sum(): dV is the weights'
# column sums (row v2 of the seed-42 weights sums to 1.97), dS, dQ worked out, the finite
# difference and sdpa_backward agreeing
expect bwd_dv 0 out 'v2 \[ 1\.97 1\.97 1\.97 1\.97 1\.97 1\.97 1\.97 1\.97 \]' -- --backward
expect bwd_delta 0 out 'Delta_2 = 0\.000\*\(-10\.33\)' -- --backward
expect bwd_fd 0 out 'dQ\[2, 0\] from the chain rule = 0\.02191795' -- --backward
expect bwd_fd_value 0 out '\(L\(q \+ h\) - L\(q - h\)\) / 2h = 0\.02191795' -- --backward
expect bwd_agree 0 out 'All three agree' -- --backward
expect bwd_causal_agree 0 out 'All three agree' -- --backward --causal --n 16 --d 16 --seed 5
fits width_backward --backward --causal --n 16 --d 16 --seed 3
expect other_seed 0 out 'They agree to float32 rounding' -- --n 6 --d 16 --seed 7
expect wrapped 0 out 'columns 0-7 of 16 \(wrapped to fit 80 columns\)' -- --n 16 --d 16

echo "your own .npy files"
# Q = K = I (the 2 x 2 identity), V = [[1, 2], [3, 4]]: scores = I, scaled = I / sqrt(2),
# weights row 0 = softmax([0.7071, 0]) = [0.6698, 0.3302], out[0] = [1.6605, 2.6605].
one=3f800000 zero=00000000
write_npy "$tmp/eye.npy" '<f4' '2, 2' $one $zero $zero $one
write_npy "$tmp/v.npy" '<f4' '2, 2' $one 40000000 40400000 40800000
write_npy "$tmp/v16.npy" '<f2' '2, 2' 3c00 4000 4200 4400
write_npy "$tmp/q3.npy" '<f4' '3, 2' $one $zero $zero $one 3f000000 bf800000
write_npy "$tmp/k23.npy" '<f4' '2, 3' $one $zero $zero $zero $one $zero
write_npy "$tmp/v32.npy" '<f4' '3, 2' $one $one $one $one $one $one
write_npy "$tmp/rank3.npy" '<f4' '1, 2, 2' $one $zero $zero $one
big=()
for i in $(seq 17); do big+=($one); done
write_npy "$tmp/big.npy" '<f4' '17, 1' "${big[@]}"
write_npy "$tmp/nan.npy" '<f4' '2, 2' $one 7fc00000 $zero $one
printf 'not a numpy file at all\n' >"$tmp/junk.npy"
own=(--q "$tmp/eye.npy" --k "$tmp/eye.npy" --v "$tmp/v.npy")
expect own_inputs 0 out 'v1 \[ 3\.00 4\.00 \]' -- "${own[@]}"
expect own_scaled 0 out 'q0 \[ 0\.71 0\.00 \]' -- "${own[@]}"
expect own_weights 0 out 'q0 \[ 0\.670 0\.330 \] +1\.000000' -- "${own[@]}"
expect own_out0 0 out 'o0 \[ 1\.66 2\.66 \]' -- "${own[@]}"
expect own_out1 0 out 'o1 \[ 2\.34 3\.34 \]' -- "${own[@]}"
expect own_agree 0 out 'They agree to float32 rounding' -- "${own[@]}"
expect own_f16 0 out 'o0 \[ 1\.66 2\.66 \]' -- --q "$tmp/eye.npy" --k "$tmp/eye.npy" --v "$tmp/v16.npy"
expect own_causal 0 out 'o0 \[ 1\.00 2\.00 \]' -- "${own[@]}" --causal
expect own_lq_ne_lk 0 out 'o2 \[ 1\.51 2\.51 \]' -- --q "$tmp/q3.npy" --k "$tmp/eye.npy" --v "$tmp/v.npy" --causal
fits own_width "${own[@]}" --causal
# q0 = k0 = [1e20, 1e20]: q0.k0 = 2e40 is beyond f32, +inf in the library (a NaN row) but
# finite in the steps' double; explain names the rule instead of calling it a bug.
e20=60ad78ec
write_npy "$tmp/qbig.npy" '<f4' '2, 2' $e20 $e20 $one $one
write_npy "$tmp/kbig.npy" '<f4' '2, 2' $e20 $e20 $zero $zero
expect beyond_f32 0 out 'They differ, and by rule: a score here reaches 2e\+40' -- \
  --q "$tmp/qbig.npy" --k "$tmp/kbig.npy" --v "$tmp/v.npy"

echo "errors"
expect_error n_text 2 "--n wants a number of tokens from 1 to 16, not 'abc'" -- --n abc
expect_error n_zero 2 "--n wants .* not '0'" -- --n 0
expect_error n_17 2 "--n wants .* not '17'" -- --n 17
expect_error n_negative 2 "--n wants .* not '-3'" -- --n -3
expect_error n_trailing 2 "--n wants .* not '4x'" -- --n 4x
expect_error d_17 2 "--d wants a dimension from 1 to 16, not '17'" -- --d 17
expect_error seed_bad 2 "--seed wants a whole number" -- --seed -1
expect_error missing_value 2 "--n needs a value" -- --n
expect_error unknown_option 2 "unknown option '--frob'" -- --frob
expect_error q_without_v 2 "--q, --k and --v go together: --v is missing" -- --q "$tmp/eye.npy" --k "$tmp/eye.npy"
expect_error files_and_n 2 "do not mix with" -- "${own[@]}" --n 3
expect_error missing_file 1 "$tmp/nope\.npy" -- --q "$tmp/nope.npy" --k "$tmp/eye.npy" --v "$tmp/v.npy"
expect_error not_npy 1 "junk\.npy" -- --q "$tmp/junk.npy" --k "$tmp/eye.npy" --v "$tmp/v.npy"
expect_error shape_qk 1 "eye\.npy has shape \(2, 2\) but .*k23\.npy has shape \(2, 3\)" -- --q "$tmp/eye.npy" --k "$tmp/k23.npy" --v "$tmp/v.npy"
expect_error shape_kv 1 "eye\.npy has shape \(2, 2\) but .*v32\.npy has shape \(3, 2\)" -- --q "$tmp/eye.npy" --k "$tmp/eye.npy" --v "$tmp/v32.npy"
expect_error rank3 1 "rank3\.npy: shape \(1, 2, 2\)" -- --q "$tmp/rank3.npy" --k "$tmp/eye.npy" --v "$tmp/v.npy"
expect_error too_big 1 "big\.npy: shape \(17, 1\)" -- --q "$tmp/big.npy" --k "$tmp/big.npy" --v "$tmp/big.npy"
expect_error nan 1 "nan\.npy: element 1 is NaN" -- --q "$tmp/nan.npy" --k "$tmp/eye.npy" --v "$tmp/v.npy"

echo "help"
expect help 0 out '^usage: sdpa explain' -- --help
for opt in --n --d --seed --q --k --v --causal --no-color --help; do
  expect "help_mentions_$opt" 0 out "^  (-h, )?$opt" -- --help
done
expect help_examples 0 out '^examples:' -- -h
if "$sdpa" --help | grep -q '^  explain '; then ok main_usage_lists_explain; else fail main_usage_lists_explain "not in 'sdpa --help'"; fi

finish
