"""peers_table.py -- the tables run_peers.py prints: sdpa's figures beside the peers'.

print_table (the forward) and print_backward_table (--backward) take sdpa bench's JSON, the
peers' (peers_worker.py's, with ggml's columns merged in by run_peers.py), the FMA peak the
percentages are of, and with --rounds N > 1 each round's sdpa JSON (and peers JSON) for the
header's per-round peaks; print_round_ratios prints each round's sdpa/torch per shape. They
write to stdout, change none of what they get, and need only the standard library.
"""

import statistics


def fmt(x, spec="%.1f"):
    return "-" if x is None else spec % x


def isa_line(args, sdpa, peers):
    """One line naming the ISA level each system reported, and the warnings of --isa avx2
    for those that report more."""
    ni = peers.get("numpy_isa", {})
    gi = peers.get("ggml_info")
    # the tables that ran the shapes (each shape's kernel; an older sdpa bench names only
    # the context's: flash-amx runs bf16 alone, the others go to flash-avx512)
    ran = sorted({s.get("kernel") or sdpa["kernel"] for s in sdpa.get("shapes", [])})
    parts = ["sdpa %s (%s)" % (sdpa["isa"], ", ".join(ran) or sdpa["kernel"]),
             "torch %s%s" % (peers["torch_isa"], " (MKL asked for AVX2)"
                             if args.isa == "avx2" else ""),
             "numpy %s%s" % (ni.get("numpy_simd", "?"), ", OpenBLAS %s" % ni["openblas_core"]
                             if ni.get("openblas_core") else "")]
    if gi:
        parts.append("ggml %s (built with %s)" % (gi["isa"], " ".join(gi["features"])))
    warn = []
    if args.isa == "avx2":
        if sdpa["isa"] != "avx2":
            warn.append("sdpa ran %s" % sdpa["isa"])
        if peers["torch_isa"].lower() != "avx2":
            warn.append("torch ran %s" % peers["torch_isa"])
        if "AVX512" in ni.get("numpy_simd", "") or ni.get("numpy_simd") == "X86_V4":
            warn.append("numpy ran %s" % ni["numpy_simd"])
        if gi and gi["isa"] == "avx512":
            warn.append("ggml was built with AVX-512")
    return "ISA level (--isa %s): %s" % (args.isa, "; ".join(parts)), warn


def print_table(args, sdpa, peers, peak, round_sdpa=None, round_peers=None):
    gi = peers.get("ggml_info")
    print()
    print("sdpa %s vs torch %s, numpy %s and ggml %s: %d thread%s, %s, %s" % (
        sdpa["sdpa_version"], peers["torch_version"], peers["numpy_version"],
        "%s (ggml-python %s)" % (gi["ggml_version"], gi["ggml_python_version"]) if gi
        else "(not run)",
        sdpa["threads"], "" if sdpa["threads"] == 1 else "s", sdpa["cpu_model"], sdpa["date"]))
    line, warn = isa_line(args, sdpa, peers)
    print(line)
    print_peak(sdpa, peak, round_sdpa, round_peers)
    print()
    row_fmt = "%-34s %9s %9s %9s %9s %9s %12s %10s %9s %8s %9s %9s %8s"
    print(row_fmt % ("shape (B,H,Lq,Lk,D[,mask][,dt])", "sdpa", "torch", "torch kv", "numpy",
                     "ggml", "ggml f16 K/V", "sdpa/torch", "sdpa/ggml", "sdpa %pk", "torch %pk",
                     "numpy %pk", "ggml %pk"))
    print("%-34s %9s %9s %9s %9s %9s %12s" % ("", "GFLOP/s", "GFLOP/s", "GFLOP/s", "GFLOP/s",
                                              "GFLOP/s", "GFLOP/s"))
    notes = []
    pct = (lambda x: None if x is None or not peak else 100.0 * x / peak)
    mixed_seen = False
    for s, p in zip(sdpa["shapes"], peers["shapes"]):
        a = s["gflops"]
        t, tkv, n, g, h = (p.get(peer, {}).get("gflops")
                           for peer in ("torch", "torch_kv", "numpy", "ggml", "ggml_f16"))
        mixed_seen = mixed_seen or "torch_kv" in p
        if "skipped" in p["numpy"]:
            notes.append("numpy skipped at %s: %s" % (s["spec"], p["numpy"]["skipped"]))
        for peer, label in (("ggml", "ggml"), ("ggml_f16", "ggml f16 K/V")):
            fig = p.get(peer, {})
            if "failed" in fig:
                notes.append("%s failed at %s: %s" % (label, s["spec"], fig["failed"]))
            elif peer == "ggml_f16" and fig.get("max_rel_err", 0) > 1e-3:
                notes.append("ggml f16 K/V at %s: error %.2g relative to the f16-input "
                             "reference (ggml accumulates P V in f16 there)"
                             % (s["spec"], fig["max_rel_err"]))
        print(row_fmt % (
            s["spec"], fmt(a), fmt(t), fmt(tkv), fmt(n), fmt(g), fmt(h),
            fmt(a / t if t else None, "%.3gx"), fmt(a / g if g else None, "%.3gx"),
            fmt(pct(a), "%.1f%%"), fmt(pct(t), "%.1f%%"), fmt(pct(n), "%.1f%%"),
            fmt(pct(g), "%.1f%%")))
        if s["Lq"] == 1:
            ms = (lambda peer: fmt(p.get(peer, {}).get("ms_median"), "%.2f"))
            gbs = (lambda peer: fmt(p.get(peer, {}).get("gbs")))
            rb = s.get("read_bw", {}).get("gbs")
            notes.append(
                "decode %s: ms (cache GB/s) sdpa %.2f (%.1f), torch %s (%s)%s, numpy %s (%s), "
                "ggml %s (%s), ggml f16 %s (%s); read bandwidth %s GB/s at this working set "
                "(%.1f MB, sdpa at %s of it), DRAM %.1f GB/s" % (
                    s["spec"], s["ms_median"], s["gbs"], ms("torch"), gbs("torch"),
                    ", torch in %s %s (%s)" % (p["torch_kv"]["dtype"], ms("torch_kv"),
                                               gbs("torch_kv")) if "torch_kv" in p else "",
                    ms("numpy"), gbs("numpy"), ms("ggml"), gbs("ggml"), ms("ggml_f16"),
                    gbs("ggml_f16"), fmt(rb), s.get("read_bw", {}).get("bytes", 0) / 1e6,
                    fmt(s.get("pct_bandwidth") if rb else None, "%.1f%%"),
                    sdpa["peak"]["read_gbs"]))
        if p.get("ggml_inputs_differ"):
            notes.append("ggml at %s: its worker drew other inputs than torch's (numpy versions "
                         "that draw differently?); same distribution, other values" % s["spec"])
        if p["torch"].get("gqa") == "expanded":
            notes.append("torch at %s: no enable_gqa in this torch, K and V expanded to Hq "
                         "heads before timing" % s["spec"])
    print()
    if peers.get("ggml_error"):
        notes.append("ggml: %s" % peers["ggml_error"])
    for line in notes:
        print(line)
    print("GFLOP/s = 4*B*Hq*D*(visible pairs) / median time, the same count for all of them.")
    print("dtypes: sdpa and torch run Q/O and K/V in the shape's dtypes (dt = Q/O[/K/V]); "
          "numpy in f32 and ggml with f32 Q and f32 or f16 K/V, on the same values rounded "
          "to the shape's dtypes.")
    if mixed_seen:
        print("torch: where Q/O and K/V differ, K and V are converted to Q's dtype inside the "
              "timed call; 'torch kv' runs all in the K/V dtype (Q converted before the clock).")
    print("cache GB/s: the bytes of K and V each one reads (sdpa and torch in the K/V dtype, "
          "numpy and ggml in f32, ggml f16 in f16) / median time.")
    for w in warn:
        print("WARNING: --isa avx2, but %s." % w)


def print_backward_table(args, sdpa, peers, peak, round_sdpa=None):
    """--backward: sdpa_backward and torch autograd through F.scaled_dot_product_attention."""
    print()
    print("backward: sdpa %s vs torch %s autograd: %d thread%s, %s, %s" % (
        sdpa["sdpa_version"], peers["torch_version"], sdpa["threads"],
        "" if sdpa["threads"] == 1 else "s", sdpa["cpu_model"], sdpa["date"]))
    line, warn = isa_line(args, sdpa, peers)
    print(line)
    kern = [ln.split(":", 1)[1].strip() for ln in sdpa.get("describe", "").splitlines()
            if ln.startswith("backward:")]
    if kern:
        print("sdpa_backward runs on: %s" % kern[0])
    print_peak(sdpa, peak, round_sdpa)
    print()
    row_fmt = "%-34s %9s %9s %9s %9s %10s %9s %9s %9s %9s"
    print(row_fmt % ("shape (B,H,Lq,Lk,D[,mask])", "sdpa bwd", "torch bwd", "sdpa bwd",
                     "torch bwd", "sdpa/torch", "sdpa", "torch", "sdpa %pk", "torch %pk"))
    print(row_fmt % ("", "ms", "ms", "GFLOP/s", "GFLOP/s", "(bwd)", "bwd/fwd", "bwd/fwd", "(bwd)",
                     "(bwd)"))
    notes = []
    pct = (lambda x: None if x is None or not peak else 100.0 * x / peak)
    for s, p in zip(sdpa["shapes"], peers["shapes"]):
        a, t = s["gflops"], p["torch"].get("gflops")
        print(row_fmt % (
            s["spec"], fmt(s["ms_median"], "%.3f"), fmt(p["torch"].get("ms_median"), "%.3f"),
            fmt(a), fmt(t), fmt(a / t if t else None, "%.3gx"),
            fmt(s.get("bwd_over_fwd"), "%.2f"), fmt(p["torch"].get("bwd_over_fwd"), "%.2f"),
            fmt(pct(a), "%.1f%%"), fmt(pct(t), "%.1f%%")))
        if p["torch"].get("gqa") == "expanded":
            notes.append("torch at %s: no enable_gqa in this torch, K and V expanded to Hq "
                         "heads before timing (their gradients are not summed over the group)"
                         % s["spec"])
    print()
    for line in notes:
        print(line)
    print("numpy and ggml: not timed for the backward (the seeds' numpy code is forward only; "
          "ggml_flash_attn_ext has no backward, and ggml_flash_attn_back is the old op).")
    print("GFLOP/s = 2.5 * 4*B*Hq*D*(visible pairs) / median backward time, the same count for "
          "both; bwd/fwd = median backward / median forward, each repetition a timed forward "
          "then the timed backward of its result (torch: the forward with requires_grad "
          "inputs, the backward torch.autograd.grad(out, (q, k, v), dout)).")
    for w in warn:
        print("WARNING: --isa avx2, but %s." % w)


def print_peak(sdpa, peak, round_sdpa, round_peers=None):
    """The header's FMA peak line; with --rounds, a second one with each round's; where sdpa's
    kernels run on an AMX unit, the unit's rate around sdpa's run and (round_peers) around the
    peers' in each round."""
    print("FP32 FMA peak measured by sdpa bench: %.1f GFLOP/s (start %.1f, end %.1f, %s loop)" % (
        peak, sdpa["peak"]["start"]["fma_gflops"], sdpa["peak"]["end"]["fma_gflops"],
        sdpa["peak"]["start"]["isa"]))
    if round_sdpa:
        print("FMA peak of each round's sdpa bench, start/end (the line above has their "
              "medians): %s" % ", ".join(
                  "%s/%s" % (fmt(x["peak"]["start"]["fma_gflops"]),
                             fmt(x["peak"]["end"]["fma_gflops"])) for x in round_sdpa))
    # the AMX unit's rate, which sdpa bench measures where its kernels run on the unit (it has
    # slow phases of its own, which the FMA peak does not show)
    runs = round_sdpa or [sdpa]
    if any(x["peak"][w].get("tile_gflops") is not None for x in runs for w in ("start", "end")):
        print("AMX tile peak of %s sdpa bench, start/end: %s" % (
            "each round's" if round_sdpa else "the", ", ".join(
                "%s/%s" % (fmt(x["peak"]["start"].get("tile_gflops"), "%.0f"),
                           fmt(x["peak"]["end"].get("tile_gflops"), "%.0f")) for x in runs)))
    if round_peers and any(x.get("tile_around") for x in round_peers):
        print("AMX tile peak right before and after each round's torch/numpy run: %s" % ", ".join(
            "%s/%s" % tuple(fmt(t, "%.0f") for t in x.get("tile_around") or (None, None))
            for x in round_peers))


def tiles_agree(x, spread=0.15):
    """Whether a round's four AMX tile peaks (sdpa's start and end, and right before and after
    the peers) were all measured and lie within `spread` of their highest: the unit ran at
    one rate for both sides (a unit has slow phases; docs/benchmarks.md)."""
    t = [x["sdpa"]["peak"][w].get("tile_gflops") for w in ("start", "end")]
    t += list(x["peers"].get("tile_around") or (None, None))
    return all(v for v in t) and min(t) >= (1.0 - spread) * max(t)


def print_round_ratios(rounds):
    """--rounds: per shape, each round's sdpa/torch (GFLOP/s) and their median; where sdpa ran
    on an AMX unit, also those of the rounds whose tile peaks agree (tiles_agree)."""
    print()
    unit = any(x["peers"].get("tile_around") for x in rounds)
    for i, s in enumerate(rounds[0]["sdpa"]["shapes"]):
        ratios = []
        for x in rounds:
            a = x["sdpa"]["shapes"][i].get("gflops")
            t = x["peers"]["shapes"][i].get("torch", {}).get("gflops")
            if not a or not t:
                break
            ratios.append(a / t)
        else:
            print("rounds sdpa/torch at %s: %s (median %.2f)" % (
                s["spec"], " ".join("%.2f" % q for q in ratios), statistics.median(ratios)))
            if unit and s.get("pct_tile_peak") is not None:  # a shape the unit takes
                kept = [(r + 1, q) for r, (x, q) in enumerate(zip(rounds, ratios))
                        if tiles_agree(x)]
                print("  of those, the rounds whose 4 AMX tile peaks agree within 15 %%: %s" % (
                    "%s (median %.2f)" % (" ".join("%.2f (round %d)" % (q, r) for r, q in kept),
                                          statistics.median(q for _, q in kept))
                    if kept else "none"))
