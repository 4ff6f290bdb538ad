#!/usr/bin/env bash
# test_outputs.sh — the command's output files, as docs/sdpa.1 (OUTPUT FILES) promises them:
# all or nothing, never over an input or each other, devices, FIFOs and /dev/stdout written in
# place, symlinks written through, modes kept, nothing left behind by an error or a signal.
# Usage: test_outputs.sh PATH/TO/sdpa
# shellcheck source=tests/lib.sh
. "$(dirname "$0")/lib.sh"
cd "$tmp" || exit 2

# A float32 .npy of the given shape holding 0.25 * ((i * 7) % 11) - 1, written with Python's
# standard library only (numpy is not needed to run the tests).
npy() { # npy FILE D0 D1 ...
  python3 - "$@" <<'EOF'
import struct, sys
path, dims = sys.argv[1], [int(d) for d in sys.argv[2:]]
n = 1
for d in dims:
    n *= d
shape = "(" + "".join(f"{d}, " for d in dims).rstrip(" ") + ")"
head = "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }" % shape
head += " " * (63 - (10 + len(head)) % 64) + "\n"
with open(path, "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head.encode())
    f.write(struct.pack(f"<{n}f", *[0.25 * ((i * 7) % 11) - 1 for i in range(n)]))
EOF
}
npy q.npy 2 4 8
npy k.npy 2 6 8
npy v.npy 2 6 8
in="--q q.npy --k k.npy --v v.npy"

# run NAME WANT ARGS...: sdpa run with ARGS; its exit code must be WANT. stderr in $tmp/err.
run() {
  local name=$1 want=$2
  shift 2
  "$sdpa" run "$@" > out.txt 2> err
  local got=$?
  if [ "$got" -eq "$want" ]; then ok "$name"; else fail "$name" "exit $got, want $want: $(head -c 300 err)"; fi
}
# said NAME TEXT: stderr of the last run holds TEXT.
said() {
  if grep -qF -- "$2" err; then ok "$1"; else fail "$1" "stderr lacks '$2': $(head -c 300 err)"; fi
}
# clean NAME: no temporary or backup file left in $tmp.
clean() {
  if ls -A | grep -q '\.sdpa\.\(tmp\|bak\)\.'; then fail "$1" "left $(ls -A | grep '\.sdpa\.')"; else ok "$1"; fi
}
same() { # same NAME FILE1 FILE2
  if cmp -s "$2" "$3"; then ok "$1"; else fail "$1" "$2 and $3 differ"; fi
}

run reference 0 $in --out ref.npy --lse ref_lse.npy --weights ref_w.npy

# Outputs that are one file, or an input: usage errors, before any work, nothing written.
cp q.npy q_before.npy
run same_name 2 $in --out o.npy --lse o.npy
said same_name_said "--out o.npy and --lse o.npy name the same file"
run same_file_new 2 $in --out ./o.npy --weights o.npy
run same_file_existing 2 $in --out ref.npy --heatmap ./ref.npy
run over_input 2 $in --out q.npy
said over_input_said "--out q.npy is the input --q q.npy"
ln q.npy hard_q.npy
run over_input_hard_link 2 $in --lse hard_q.npy
ln -s q.npy link_q.npy
run over_input_symlink 2 $in --weights link_q.npy
same input_untouched q.npy q_before.npy
if [ ! -e o.npy ]; then ok nothing_written; else fail nothing_written; fi
"$sdpa" heatmap --weights ref_w.npy --out ref_w.npy 2> err
if [ $? -eq 2 ] && grep -qF "is the input --weights" err; then ok heatmap_over_weights; else fail heatmap_over_weights "$(cat err)"; fi

# Character devices and /dev/stdout are written in place; a device may be named twice. As
# root, twins of /dev/null and /dev/full made here stand in for them: a command that replaced
# devices (as one once did) then breaks only the twins, not the machine's. /dev/stdout is
# tried only after /dev/fd/1 was written in place, for the same reason.
null=/dev/null full=/dev/full
if mknod null_twin c 1 3 2> /dev/null && mknod full_twin c 1 7 2> /dev/null; then
  null=$tmp/null_twin full=$tmp/full_twin
fi
run dev_null 0 $in --out "$null" --lse "$null"
if [ -c "$null" ]; then ok dev_null_still_a_device; else fail dev_null_still_a_device; fi
"$sdpa" run $in --out /dev/fd/1 > fd1.npy
same fd_1 fd1.npy ref.npy
if cmp -s fd1.npy ref.npy; then
  "$sdpa" run $in --out /dev/stdout | cat > piped.npy
  same stdout_pipe piped.npy ref.npy
  "$sdpa" run $in --out /dev/stdout > redirected.npy
  same stdout_redirected redirected.npy ref.npy
  { printf 'head'; "$sdpa" run $in --out /dev/stdout; } > appended.npy
  if [ "$(head -c 4 appended.npy)" = head ] && cmp -s <(tail -c +5 appended.npy) ref.npy; then
    ok stdout_at_its_position
  else
    fail stdout_at_its_position
  fi
else
  fail stdout "not tried: /dev/fd/1 was not written in place"
fi
run fd_not_open 1 $in --out /dev/fd/9
said fd_not_open_said "descriptor 9 is not open for writing"

# A FIFO is written, not replaced: its reader gets the file.
mkfifo fifo
timeout 20 cat fifo > from_fifo.npy &
reader=$!
run fifo 0 $in --out fifo
wait "$reader"
same fifo_read from_fifo.npy ref.npy
if [ -p fifo ]; then ok fifo_still_a_fifo; else fail fifo_still_a_fifo; fi

# A symbolic link is written through; a dangling one creates its target.
printf old > target.npy
ln -s target.npy link.npy
run symlink 0 $in --out link.npy
if [ -L link.npy ]; then ok symlink_kept; else fail symlink_kept; fi
same symlink_target_written target.npy ref.npy
ln -s made.npy dangling.npy
run dangling_symlink 0 $in --out dangling.npy
same dangling_target_made made.npy ref.npy

# A replaced file keeps its mode.
printf old > private.npy
chmod 600 private.npy
run mode 0 $in --out private.npy
if [ "$(stat -c %a private.npy)" = 600 ]; then ok mode_kept; else fail mode_kept "$(stat -c %a private.npy)"; fi
same mode_written private.npy ref.npy

# All or nothing: a failure on the second output leaves the first as it was.
printf old > keep.npy
run full_device 1 $in --out keep.npy --lse "$full"
said full_device_said "--lse $full: write failed: No space left on device"
if [ "$(cat keep.npy)" = old ]; then ok full_device_kept_first; else fail full_device_kept_first; fi
clean full_device_clean
# ... and a full disk, met as the file-size limit (SIGXFSZ ignored: the write fails EFBIG):
# under 8 KiB, the output (2 x 64 x 8 floats, 4 KiB) fits and the weights (2 x 64 x 64, 32 KiB)
# do not.
npy bq.npy 2 64 8
npy bk.npy 2 64 8
npy bv.npy 2 64 8
(trap '' XFSZ; ulimit -f 8; exec "$sdpa" run --q bq.npy --k bk.npy --v bv.npy --out keep.npy \
  --weights big_w.npy > out.txt 2> err)
if [ $? -eq 1 ]; then ok file_size_limit; else fail file_size_limit "$(cat err)"; fi
if [ "$(cat keep.npy)" = old ] && [ ! -e big_w.npy ]; then ok file_size_limit_nothing; else fail file_size_limit_nothing; fi
clean file_size_limit_clean

# A signal while the outputs are being written (here: waiting for a FIFO's reader, the
# regular output already complete in its temporary) removes the temporary and replaces
# nothing.
for sig in TERM HUP; do
  printf old > keep.npy
  "$sdpa" run $in --out keep.npy --lse fifo 2> err &
  pid=$!
  for _ in $(seq 100); do
    ls -A | grep -q '\.sdpa\.tmp\.' && break
    sleep 0.1
  done
  if ls -A | grep -q '\.sdpa\.tmp\.'; then ok "signal_${sig}_waiting"; else fail "signal_${sig}_waiting"; fi
  kill -"$sig" "$pid"
  wait "$pid"
  code=$?
  if [ "$code" -eq $((128 + $(kill -l "$sig"))) ]; then ok "signal_${sig}_dies_of_it"; else fail "signal_${sig}_dies_of_it" "exit $code"; fi
  if [ "$(cat keep.npy)" = old ]; then ok "signal_${sig}_kept"; else fail "signal_${sig}_kept"; fi
  clean "signal_${sig}_clean"
done

# Names: as long as the file system allows (the temporary's name does not depend on it),
# one byte more is refused before the work; directories are refused.
max=$(getconf NAME_MAX .)
long=$(printf "%0$((max - 4))d.npy" 0)
run name_max 0 $in --out "$long"
same name_max_written "$long" ref.npy
run name_too_long 1 $in --out "x$long"
said name_too_long_said "too long"
run directory 1 $in --out .
said directory_said "is a directory"

# bench --json: no fixed temporary name (a symlink there is not followed), written through
# a symlink at the name itself.
printf victim > victim
ln -s victim r.json.tmp
ln -s real.json r.json
"$sdpa" bench --shape 1,1,8,8,4 --reps 1 --warmup 0 --min-time 0 --threads 1 --json r.json \
  > out.txt 2> err
if [ $? -eq 0 ] && [ "$(cat victim)" = victim ] && [ -L r.json ] && grep -q '"tool"' real.json; then
  ok bench_json
else
  fail bench_json "$(cat err)"
fi
clean clean_at_end
finish
