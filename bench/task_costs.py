#!/usr/bin/env python3
"""task_costs.py -- where a forward task's time goes besides its slices.

Builds a copy of the library whose flash_task (src/attn/flash.c) counts TSC cycles around its
four parts -- task_begin (the rows set up, Q widened or gathered), the zeroing of the O
accumulator (none where the matrix unit's first P V writes it whole), the slices (the
kernels), and the end of the task (O / l stored, the LSE) --
runs `sdpa bench` on that copy with the arguments given after `--`, and prints the mean
cycles per task of each part. The copy is made from the working tree's tracked files in a
temporary directory; the library itself is not changed, and nothing here is a test.

    python3 bench/task_costs.py -- --threads 1 --shape 1,16,512,512,128,bf16 --min-time 0.5

x86-64 only (it reads the TSC). The counters are plain sums over every task of the process,
so give --threads 1 (with more, workers race on them). Pin it with taskset where the
machine's phases matter (docs/benchmarks.md). Each insertion is anchored on a line of
flash.c; if one is missing (flash.c changed), the script says which and stops.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

COUNTERS = """#include <stdio.h>
#include <x86intrin.h>
/* task_costs.py: cycles of flash_task's parts, summed over the tasks */
static unsigned long long tc_cycles[4];
static long tc_tasks;
__attribute__((destructor)) static void tc_report(void) {
    if (tc_tasks > 0)
        fprintf(stderr, "task_costs: %ld tasks; TSC cycles per task: begin %.0f, zeroing O %.0f, "
                "slices %.0f, end %.0f\\n", tc_tasks, (double)tc_cycles[0] / (double)tc_tasks,
                (double)tc_cycles[1] / (double)tc_tasks, (double)tc_cycles[2] / (double)tc_tasks,
                (double)tc_cycles[3] / (double)tc_tasks);
}
"""

# (anchor, replacement) pairs, each anchor found exactly once after the previous one
EDITS = [
    ("#include <string.h>\n", "#include <string.h>\n" + COUNTERS),
    ("static void flash_task(", "static void flash_task("),
    ("    task_begin(pl, task, worker, 0, &t, &tr);\n",
     "    const unsigned long long tc0 = __rdtsc();\n"
     "    task_begin(pl, task, worker, 0, &t, &tr);\n"
     "    const unsigned long long tc1 = __rdtsc();\n"
     "    tc_cycles[0] += tc1 - tc0;\n"
     "    tc_tasks++;\n"),
    # the zeroing: at the start for a vector table, else before the matrix unit's first P V
    # (none where it covers every row) or after no slice at all
    ("    int o_ready = pl->mx == NULL;\n    if (o_ready)\n        memset(o, 0, o_bytes);\n",
     "    int o_ready = pl->mx == NULL;\n    if (o_ready)\n        memset(o, 0, o_bytes);\n"
     "    const unsigned long long tc2 = __rdtsc();\n"
     "    unsigned long long tc_zero = 0;\n"),
    ("            memset(o, 0, o_bytes);\n",
     "        {\n"
     "            const unsigned long long z0 = __rdtsc();\n"
     "            memset(o, 0, o_bytes);\n"
     "            tc_zero += __rdtsc() - z0;\n"
     "        }\n"),
    ("    if (!o_ready) /* no slice: every row saw nothing */\n        memset(o, 0, o_bytes);\n",
     "    if (!o_ready) {\n"
     "        const unsigned long long z0 = __rdtsc();\n"
     "        memset(o, 0, o_bytes);\n"
     "        tc_zero += __rdtsc() - z0;\n"
     "    }\n"),
    ("    const sdpa_tensor *out = pl->out;\n",
     "    const unsigned long long tc3 = __rdtsc();\n"
     "    tc_cycles[1] += tc2 - tc1 + tc_zero;\n"
     "    tc_cycles[2] += tc3 - tc2 - tc_zero;\n"
     "    const sdpa_tensor *out = pl->out;\n"),
]


def instrument(src):
    """flash.c's text with the counters put in, or an exception naming the missing anchor."""
    at = 0
    for anchor, replacement in EDITS:
        i = src.find(anchor, at)
        if i >= 0 and src.find(anchor, i + 1) >= 0:
            raise SystemExit("task_costs: flash.c has changed: %r found twice" % anchor.strip())
        if i < 0:
            raise SystemExit("task_costs: flash.c has changed: no %r after offset %d"
                             % (anchor.strip(), at))
        src = src[:i] + replacement + src[i + len(anchor):]
        at = i + len(replacement)
    # the end of flash_task: the first line that closes a function after the last anchor
    end = src.find("\n}\n", at)
    body = src[at:end]
    if end < 0 or "return" in body:
        raise SystemExit("task_costs: flash.c has changed: flash_task's end is not where "
                         "expected (or it returns early)")
    return src[:end] + "\n    tc_cycles[3] += __rdtsc() - tc3;" + src[end:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", metavar="DIR",
                    help="build the copy in DIR and keep it (default: a temporary directory)")
    ap.add_argument("bench_args", nargs=argparse.REMAINDER,
                    help="-- then the arguments of sdpa bench")
    args = ap.parse_args()
    bench_args = args.bench_args[1:] if args.bench_args[:1] == ["--"] else args.bench_args
    if not bench_args:
        ap.error("give sdpa bench's arguments after --, e.g. -- --threads 1 --shape ...")
    if "--threads" not in bench_args:
        print("task_costs: no --threads given; the counters assume one thread",
              file=sys.stderr)
    work = args.keep or tempfile.mkdtemp(prefix="task_costs.")
    try:
        files = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], check=True,
                               capture_output=True).stdout.decode().split("\0")
        for f in files:
            if f and os.path.isfile(os.path.join(ROOT, f)):
                os.makedirs(os.path.join(work, os.path.dirname(f)), exist_ok=True)
                shutil.copy2(os.path.join(ROOT, f), os.path.join(work, f))
        path = os.path.join(work, "src", "attn", "flash.c")
        with open(path) as fh:
            text = instrument(fh.read())
        with open(path, "w") as fh:
            fh.write(text)
        build = os.path.join(work, "build")
        print("task_costs: building an instrumented copy in %s ..." % work, file=sys.stderr)
        subprocess.run(["cmake", "-S", work, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                        "-DSDPA_MPI=OFF"], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", build, "-j2", "--target", "sdpa"], check=True,
                       stdout=subprocess.DEVNULL)
        return subprocess.run([os.path.join(build, "cli", "sdpa"), "bench"] + bench_args
                              ).returncode
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
