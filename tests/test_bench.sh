#!/usr/bin/env bash
# test_bench.sh — `sdpa bench` as a script meets it: a tiny shape runs, exits 0 and writes a
# JSON file that parses and holds the figures; usage errors exit 2; --help exits 0. It never
# checks a time or a rate (the machines are shared). Usage: test_bench.sh PATH/TO/sdpa
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"

# check NAME WANT_EXIT -- ARGS...: runs sdpa bench ARGS and checks the exit code.
check() {
  local name=$1 want=$2
  shift 3
  "$sdpa" bench "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -eq "$want" ]; then
    ok "$name"
  else
    fail "$name" "exit $rc, want $want"
    sed 's/^/    /' "$tmp/err" | head -5
  fi
}

# One run, three shapes (each run measures the peak twice, about a second each).
check run 0 -- --shape 1,1,16,16,8 --reps 2 --min-time 0.5 --threads 1 --json "$tmp/x.json" \
  --shape 1,2/1,8,8,4,causal --shape 1,2/1,8,8,4,causal-add
if [ -f "$tmp/x.json" ] && [ ! -e "$tmp/x.json.tmp" ]; then ok json_written; else fail json_written; fi
if python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$tmp/x.json" 2>"$tmp/err"; then
  ok json_parses
else
  fail json_parses; sed 's/^/    /' "$tmp/err" | head -5
fi
# The figures a consumer relies on are there, and consistent with the shape asked for.
if python3 - "$tmp/x.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
s = j["shapes"]
assert len(s) == 3 and s[0]["spec"] == "1,1,16,16,8", s
assert s[0]["flops"] == 4 * 1 * 1 * 8 * 16 * 16, s[0]["flops"]
assert 1 <= s[0]["reps"] <= 2 and s[0]["ms_median"] > 0
assert j["threads"] == 1 and j["peak"]["start"]["fma_gflops"] > 0
for k in ("sdpa_version", "date", "cpu_model", "cpu_family", "cpu_model_number", "cache_kib",
          "cpu_isa", "isa", "kernel", "flop_convention"):
    assert k in j, k
levels = ["generic", "avx2", "avx512", "amx"]
assert levels.index(j["isa"]) <= levels.index(j["cpu_isa"]), (j["isa"], j["cpu_isa"])
assert set(j["cache_kib"]) == {"l1d", "l2", "l3"}
# no shape is a bf16 forward: the AMX unit is not timed, whatever the kernels
assert all(j["peak"][w]["tile_gflops"] is None for w in ("start", "end")), j["peak"]
assert all(x["pct_tile_peak"] is None for x in s), [x["pct_tile_peak"] for x in s]
# each shape names the table that ran it: f32 never runs on the AMX table (bf16 alone), so
# it is the run's kernel unless that is flash-amx, whose f32 problems go one level down
want = "flash-avx512" if j["kernel"].startswith("flash-amx") else j["kernel"]
assert all(x["kernel"] == want for x in s), ([x["kernel"] for x in s], j["kernel"])
PY
then ok json_fields; else fail json_fields; fi
if ! grep -q 'AMX tile peak' "$tmp/out" && ! grep -q '%tile' "$tmp/out"; then
  ok no_tile_peak_line
else
  fail no_tile_peak_line
fi

if grep -Eq '^ +1 +1 +16 +16 +8 +none' "$tmp/out"; then ok table_row; else fail table_row; fi

# A causal shape counts only the visible pairs: L(L+1)/2 with top-left alignment.
if python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["shapes"][1]; assert s["visible_pairs"]==36 and s["Hkv"]==1 and s["flops"]==4*2*4*36, s' \
  "$tmp/x.json" 2>/dev/null; then ok causal_pairs; else fail causal_pairs; fi
# causal-add: the same pairs through an f32 mask tensor (the mask's own path in the library).
if python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["shapes"][2]; assert s["mask"]=="causal-add" and s["visible_pairs"]==36 and s["align"]=="top-left", s' \
  "$tmp/x.json" 2>/dev/null && grep -Eq '^ +1 +2/1 +8 +8 +4 +causal-add +f32 ' "$tmp/out"; then
  ok causal_add
else
  fail causal_add
fi

# --backward times sdpa_backward: FLOP 2.5 x the forward's, and the bwd/fwd ratio (with a
# softcap, which the header and the JSON name).
check backward 0 -- --backward --shape 1,2,8,8,4 --reps 1 --min-time 0.1 --threads 1 --json "$tmp/b.json" \
  --softcap 30
if grep -q 'bwd/fwd' "$tmp/out" && grep -q 'softcap 30 at every shape' "$tmp/out" &&
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); s=j["shapes"][0]; assert j["op"]=="backward" and j["softcap"]==30 and s["flops"]==2.5*4*2*4*64 and s["bwd_over_fwd"]>0, s; assert ("backward: " + s["kernel"] + "\n") in j["describe"], (s["kernel"], j["describe"])' \
    "$tmp/b.json" 2>/dev/null; then
  ok backward_figures
else
  fail backward_figures
fi

# Half precision: --dtype sets Q, K, V and O, a --shape's own DTYPE field wins for its shape,
# GB/s counts the K/V bytes in their dtype, and every shape has its working-set read probe.
check dtype 0 -- --dtype f16 --shape 1,1,16,16,8 --shape 1,2/1,8,8,4,causal,f32/bf16 --reps 2 \
  --min-time 0.2 --threads 1 --json "$tmp/d.json"
if python3 - "$tmp/d.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
a, b = j["shapes"]
assert (a["dtype"], a["kv_dtype"], a["spec"]) == ("f16", "f16", "1,1,16,16,8,f16"), a
assert a["kv_bytes"] == 2 * 16 * 8 * 2, a["kv_bytes"]
assert (b["dtype"], b["kv_dtype"], b["spec"]) == ("f32", "bf16", "1,2/1,8,8,4,causal,f32/bf16"), b
assert b["kv_bytes"] == 2 * 8 * 4 * 2 and b["flops"] == 4 * 2 * 4 * 36, b
assert j["dtype"] == "mixed" and j["kv_dtype"] == "mixed", (j["dtype"], j["kv_dtype"])
for s in (a, b):
    rb = s["read_bw"]
    assert rb["bytes"] >= s["kv_bytes"] and rb["threads"] == 1, rb
    assert rb["before_gbs"] > 0 and rb["after_gbs"] > 0, rb
    assert rb["gbs"] == max(rb["before_gbs"], rb["after_gbs"]), rb
    for k in ("gbs", "pct_bandwidth", "pct_bandwidth_dram"):
        assert s[k] is not None and s[k] > 0, (k, s)
assert "bandwidth_convention" in j
PY
then ok dtype_json; else fail dtype_json; fi
if grep -Eq '^ +1 +2/1 +8 +8 +4 +causal +f32/bf16 ' "$tmp/out" && grep -q 'rd GB/s' "$tmp/out"; then
  ok dtype_table
else
  fail dtype_table
fi
# --kv-dtype alone keeps Q and O in f32; the backward takes half-precision K and V too.
check kv_dtype_backward 0 -- --kv-dtype bf16 --backward --shape 1,2,8,8,4 --reps 1 --min-time 0.1 \
  --threads 1 --json "$tmp/kb.json"
if python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); s=j["shapes"][0]; assert (j["dtype"], j["kv_dtype"], s["spec"], s["kv_bytes"]) == ("f32", "bf16", "1,2,8,8,4,f32/bf16", 2*2*8*4*2) and s["bwd_over_fwd"] > 0, s' \
  "$tmp/kb.json" 2>/dev/null; then
  ok kv_dtype_figures
else
  fail kv_dtype_figures
fi
check bad_dtype 2 -- --dtype f8 --shape 1,1,4,4,4
if grep -q -- "--dtype wants f32, f16 or bf16, got 'f8'" "$tmp/err"; then ok bad_dtype_message; else fail bad_dtype_message; fi
check bad_kv_dtype 2 -- --kv-dtype --shape 1,1,4,4,4
check bad_shape_dtype 2 -- --shape 1,1,4,4,4,f64
if grep -q 'DTYPE T or T/KVT' "$tmp/err"; then ok bad_shape_dtype_message; else fail bad_shape_dtype_message; fi
check bad_shape_two_dtypes 2 -- --shape 1,1,4,4,4,f16,bf16
check bad_shape_two_masks 2 -- --shape 1,1,4,4,4,causal,none
# The decode preset is known (the bad --json path stops it before any timing: exit 1, not 2).
check preset_decode 1 -- --preset decode --json "$tmp/no/such/dir/x.json"

check help 0 -- --help
if grep -q 'visible' "$tmp/out"; then ok help_flops; else fail help_flops; fi
if grep -q -- '--kv-dtype' "$tmp/out" && grep -q 'rd GB/s' "$tmp/out"; then ok help_dtype; else fail help_dtype; fi
check bad_option 2 -- --frob
check bad_softcap 2 -- --softcap -2 --shape 1,1,4,4,4
check bad_threads 2 -- --threads -3
check bad_shape 2 -- --shape 1,3/2,8,8,4
check bad_preset 2 -- --preset huge
check bad_json_dir 1 -- --shape 1,1,4,4,4 --json "$tmp/no/such/dir/x.json"
check bad_peak_isa 2 -- --peak-isa sse
# A bf16 forward: the AMX unit's rate is measured where the kernels run on a real unit (not
# an emulated one), and only there; the header names it then.
check tiles 0 -- --shape 1,1,32,32,32,bf16 --shape 1,1,32,32,32,bf16/f32 --reps 1 \
  --min-time 0.1 --threads 1 --json "$tmp/t.json"
if python3 - "$tmp/t.json" "$tmp/out" <<'PY'
import json, re, sys
j = json.load(open(sys.argv[1]))
real_amx = j["isa"] == "amx" and not j["kernel"].endswith("emulated")
for when in ("start", "end"):
    tile = j["peak"][when]["tile_gflops"]
    assert (tile > 0) if real_amx else (tile is None), (j["kernel"], when, tile)
out = open(sys.argv[2]).read()
line = re.search(r"^AMX tile peak \(TDPBF16PS, 1 thread\): [0-9]+ GFLOP/s at the start, "
                 r"[0-9]+ at the end$", out, re.M)
assert (line is not None) == real_amx, (real_amx, line)
# %tile: the bf16 forward's GFLOP/s over the higher tile peak; none for the shape with an f32
# K and V, which the AMX table does not take
bf16, mixed = j["shapes"]
peak = max(j["peak"][w]["tile_gflops"] or 0 for w in ("start", "end"))
if real_amx:
    assert abs(bf16["pct_tile_peak"] - 100 * bf16["gflops"] / peak) < 1e-6 * bf16["pct_tile_peak"]
    assert re.search(r"%peak +%tile +GB/s", out) and re.search(r" 32 none +bf16 .*% +[0-9.]+% ", out)
    assert re.search(r" 32 none +bf16/f32 .*% +- ", out), out
else:
    assert bf16["pct_tile_peak"] is None and "%tile" not in out
assert mixed["pct_tile_peak"] is None
# the bf16 forward ran on the AMX table wherever the kernels are at that level (emulated too);
# its f32 K and V took the vector table, and the table's last column says so
assert bf16["kernel"] == j["kernel"], (bf16["kernel"], j["kernel"])
want = "flash-avx512" if j["kernel"].startswith("flash-amx") else j["kernel"]
assert mixed["kernel"] == want, (mixed["kernel"], j["kernel"])
assert re.search(r" 32 none +bf16/f32 .*  " + re.escape(want) + "$", out, re.M), out
PY
then ok tile_peak; else fail tile_peak; fi
# The peak probe follows the library's level: the generic loop on request, and a level above
# the kernels' (here capped by SDPA_MAX_ISA) refused as a runtime error before any timing.
check peak_generic 0 -- --shape 1,1,8,8,4 --reps 1 --min-time 0.1 --threads 1 --peak-isa generic
if grep -q 'generic loop' "$tmp/out"; then ok peak_generic_named; else fail peak_generic_named; fi
# ... and a table whose peak loop is below its kernels says so, unless both are generic
if [ "$("$sdpa" info | sed -n 's/^isa: *//p')" = generic ] || grep -q 'below the kernels' "$tmp/out"; then
  ok peak_below_noted
else
  fail peak_below_noted
fi
# Capped kernels are named as such beside the CPU's own level.
SDPA_MAX_ISA=generic check capped 0 -- --shape 1,1,8,8,4 --reps 1 --min-time 0.1 --threads 1
if [ "$("$sdpa" info | sed -n 's/^cpu isa: *\([a-z0-9]*\).*/\1/p')" = generic ] ||
  grep -q 'the kernels are capped' "$tmp/out"; then
  ok capped_named
else
  fail capped_named
fi
# A shape too large for memory says how much it asked for (13 TB here), and exits 1 (under
# AddressSanitizer too, whose allocator must then return NULL rather than stop the program).
ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}allocator_may_return_null=1 \
  check oom 1 -- --shape 1,64,1,400000000,64 --threads 1 --reps 1 --min-time 0.1
if grep -q 'out of memory for the inputs (Q, K, V and the output: 13107200.0 MB)' "$tmp/err"; then
  ok oom_size
else
  fail oom_size
fi
# Kernels capped below the AMX level do not time the unit, nor does a bf16 backward (the AMX
# table takes forwards alone).
SDPA_MAX_ISA=avx512 check capped_no_tiles 0 -- --shape 1,1,32,32,32,bf16 --reps 1 \
  --min-time 0.1 --threads 1 --json "$tmp/c.json"
if python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["peak"]; assert p["start"]["tile_gflops"] is None and p["end"]["tile_gflops"] is None' \
  "$tmp/c.json" 2>/dev/null && ! grep -q 'AMX tile peak' "$tmp/out"; then
  ok capped_no_tile_peak
else
  fail capped_no_tile_peak
fi
# nor a bf16 shape whose D the AMX table does not take (a multiple of 32, up to 256)
check d16_no_tiles 0 -- --shape 1,1,32,32,16,bf16 --reps 1 --min-time 0.1 --threads 1 \
  --json "$tmp/d16.json"
if python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); p=j["peak"]; assert p["start"]["tile_gflops"] is None and j["shapes"][0]["pct_tile_peak"] is None' \
  "$tmp/d16.json" 2>/dev/null && ! grep -q '%tile' "$tmp/out"; then
  ok d16_no_tile_peak
else
  fail d16_no_tile_peak
fi
check backward_no_tiles 0 -- --backward --shape 1,1,32,32,32,bf16 --reps 1 --min-time 0.1 \
  --threads 1 --json "$tmp/bt.json"
if python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["peak"]; assert p["start"]["tile_gflops"] is None and p["end"]["tile_gflops"] is None' \
  "$tmp/bt.json" 2>/dev/null; then
  ok backward_no_tile_peak
else
  fail backward_no_tile_peak
fi
SDPA_MAX_ISA=generic check peak_above_kernels 1 -- --shape 1,1,8,8,4 --peak-isa avx2
if grep -q 'does not go above' "$tmp/err"; then ok peak_above_message; else fail peak_above_message; fi

finish
