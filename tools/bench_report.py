#!/usr/bin/env python3
"""Turns the raw outputs of tools/bench.sh (a folder) into BENCHMARKS.md on stdout."""
import datetime
import json
import os
import platform
import re
import sys


def lines(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip().startswith("{")]


def run_record(d):
    """What tools/bench.sh recorded as it started (run.json): the commit the binaries were
    built from, whether the tree had uncommitted changes, the machine's cores (nproc)."""
    path = os.path.join(d, "run.json")
    if not os.path.exists(path):
        sys.exit(f"bench_report: no {path}: tools/bench.sh writes it as the bench starts")
    with open(path) as f:
        return json.load(f)


def cores_phrase(workers, cores):
    """'The 4 workers share 2 cores here' or 'each of the 4 workers has a core of its own
    here (8 cores)'."""
    if workers > cores:
        return f"the {workers} workers share {cores} core{'s' if cores != 1 else ''} here"
    return f"each of the {workers} workers has a core of its own here ({cores} cores)"


def machine(cores):
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for l in f:
                if l.startswith("model name"):
                    cpu = l.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cores} cores, {cpu}, {platform.system()} {platform.release()}"


def ops_tables(data):
    med = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        med[b["run_name"]] = b
    mm, bw = [], []
    for name, b in med.items():
        m = re.match(r"matmul/ops/(.+)/repeats", name)
        if m:
            raw = med.get(name.replace("matmul/ops/", "matmul/raw_sgemm/"))
            if raw:
                mm.append((m.group(1), raw["real_time"] / b["real_time"],
                           b.get("FLOP/s", b.get("flops", 0))))
        m = re.match(r"op/(\w+)/repeats", name)
        if m:
            op = m.group(1)
            ref = [v for k, v in med.items() if k.startswith("memcpy/") and f"for_{op}/" in k]
            base = med.get(name.replace("op/", "op_base/"))
            if ref:
                bw.append((op, ref[0]["real_time"] / b["real_time"],
                           base["real_time"] / b["real_time"] if base else None))
    out = ["| shape (M x N x K) | runtime / raw sgemm speed |", "| --- | --- |"]
    out += [f"| {s} | {r:.3f} |" for s, r, _ in mm]
    out += ["", "| op | bandwidth / memcpy of the same bytes | speed / base (SSE2) variant |",
            "| --- | --- | --- |"]
    out += [f"| {op} | {r:.2f} | {f'{v:.2f}' if v else 'n/a (base variant only)'} |"
            for op, r, v in bw]
    return "\n".join(out), {op: v for op, _, v in bw if v}


def yield_gain(path):
    """Median tokens/s of data parallel on 2 workers with 13 buckets overlapped, busy-polling
    against yielding (tools/bench.sh's alternating pairs), and the same for the default bucket."""
    if not os.path.exists(path):
        return None
    runs = lines(path)
    def sorted_runs(case, y):
        return sorted(r["tokens_per_second"] for r in runs
                      if r["case"] == case and r["yield_when_idle"] == y)
    out = {}
    for case, label in (("13 buckets, overlap", "13 buckets of 0.5 MB overlapped"),
                        ("overlap", "one 25 MB bucket (the default)")):
        busy, yielding = sorted_runs(case, 0), sorted_runs(case, 1)
        if busy and yielding:
            out[label] = (busy, yielding)
    return out


def performance_work(variant, op_gain, train_text, yields):
    """The profile-driven changes still in the code, each with its gain measured in this run
    (what they were measured at when made is in the commit log)."""
    step_gain = re.findall(r"^(\S+) \(batch \d+\).* ([\d.]+)x$", train_text, re.M)
    ops = ", ".join(f"{op} {op_gain[op]:.2f}x" for op in
                    ("GeluForward", "GeluBackward", "SoftmaxForward", "LayerNormForward",
                     "AdamWUpdate") if op in op_gain)
    steps = ", ".join(f"{m} {g}x" for m, g in step_gain)
    print("## Performance work\n")
    print("Changes a profile called for, and their gain against a baseline measured in the "
          "same run.\n")
    print("1. The CPU ops are compiled for the base instruction set, AVX2 and AVX-512 in one "
          "binary, and the widest one the CPU runs is chosen at start, as ATen's CPU "
          "capability dispatch does (when the change was made, a profile named GELU, softmax "
          "and layernorm loops compiled 4 lanes wide; the commit log has it). The variants give the same bits (no multiply-add "
          "contraction, reductions in fixed lanes; `//runtime:cpu_isa_test` compares every "
          "op's bytes), so the base variant stays in the binary as a baseline any run can "
          "measure.")
    if ops or steps:
        print(f"   Gain in this run ({variant} over base): per op, {ops or 'n/a'} (ops table); "
              f"per training step, {steps or 'n/a'} (one-worker table, `vs base`).")
    else:
        print("   Gain in this run: none to measure, the CPU runs the base variant only.")
    print("2. The launcher starts CPU data-parallel workers with Open MPI's "
          "`mpi_yield_when_idle` (a value the user set stands), so the communication thread, "
          "waiting inside `MPI_Allreduce`, yields its core to backward instead of polling on it "
          "(when the change was made, a profile found overlapped all-reduces making the step "
          "slower than `--no-overlap`; the commit log has it, this run's figures follow). "
          "Point-to-point transfers (the pipeline's) never busy-poll: the communication thread "
          "sleeps between polls on its process's doorbell, which the peer rings "
          "(docs/DESIGN.md, section 3).")
    if yields:
        med = lambda v: v[len(v) // 2]
        parts = [f"{case}: median {med(y):.0f} tokens/s (slowest {y[0]:.0f}) yielding against "
                 f"{med(b):.0f} (slowest {b[0]:.0f}) busy-polling, {med(y) / med(b):.2f}x at the "
                 f"median and {y[0] / b[0]:.2f}x at the slowest"
                 for case, (b, y) in yields.items()]
        n = max(len(b) for b, _ in yields.values())
        print(f"   Gain in this run (2 workers, {n} alternating runs each): " + "; ".join(parts) +
              ".")
    print()


def streams_section(d, ops):
    """CPU streams: a stream's cost per op (ops_bench) and tokens/s, asynchronous against
    immediate, in alternating runs (tools/bench.sh)."""
    path = os.path.join(d, "streams.jsonl")
    if not os.path.exists(path):
        return
    med = {b["run_name"]: b for b in ops["benchmarks"] if b.get("aggregate_name") == "median"}
    def per_op_us(name):
        b = med.get(f"stream/{name}/repeats:5")
        if not b:
            return None
        return b["real_time"] / 256 * (1e-3 if b.get("time_unit") == "ns" else 1)
    immediate, queued, issue = per_op_us("op/immediate"), per_op_us("op/async"), per_op_us("issue/async")
    print("## CPU streams: asynchronous against immediate\n")
    print("A CPU stream is a queue its own thread runs (asynchronous: the default, "
          "`TANDEM_CPU_STREAMS=async`), or runs each op on the calling thread when it is "
          "issued (`immediate`). `runtime/ops_bench`, a one-element op 256 times then a "
          "synchronization, median of 5 repetitions:\n")
    if immediate and queued and issue:
        print("| per op | immediate | asynchronous |")
        print("| --- | --- | --- |")
        print(f"| issued and run (us) | {immediate:.2f} | {queued:.2f} |")
        print(f"| the host's time to issue it (us) | {immediate:.2f} | {issue:.2f} |")
        print()
    runs = lines(path)
    rows = {}
    for r in runs:
        rows.setdefault((r["strategy"], r["workers"]), {}).setdefault(r["cpu_streams"], []).append(
            r["tokens_per_second"])
    print("Tokens/s of gpt-tiny (`parallel/strategy_bench streams`: data parallel, batch 16; "
          "1F1B, batch 32 in 8 micro-batches), each mode's median over alternating runs:\n")
    print("| strategy | workers | runs | immediate tokens/s | asynchronous tokens/s | "
          "asynchronous / immediate |")
    print("| --- | --- | --- | --- | --- | --- |")
    ratios = []
    mid = lambda v: sorted(v)[len(v) // 2]
    for (strategy, workers), modes in sorted(rows.items()):
        imm, asy = modes.get("immediate"), modes.get("async")
        if not imm or not asy:
            continue
        ratio = mid(asy) / mid(imm)
        ratios.append(ratio)
        print(f"| {strategy} | {workers} | {min(len(imm), len(asy))} | {mid(imm):.0f} | "
              f"{mid(asy):.0f} | {ratio:.3f} |")
    if ratios:
        lo, hi = min(ratios), max(ratios)
        verdict = ("never more than 3% slower than immediate's" if lo >= 0.97 else
                   f"down to {lo:.2f} of immediate's, more than 3% slower")
        print(f"\nIn this run asynchronous streams give {lo:.3f} to {hi:.3f} of immediate "
              f"streams' tokens/s: {verdict}. Asynchronous is the default because it runs the "
              "GPU's orderings (the communication thread after the compute stream's event, a "
              "forward after its receive, memory reused only after the work that used it) in "
              "every run and test; immediate streams stay available "
              "(`TANDEM_CPU_STREAMS=immediate`) and are the reference `//parallel:ordering_test` "
              "holds the asynchronous ones to, bit for bit.")
    print()


def doorbells_section(d):
    """MPI doorbells: tokens/s with them (the default) against without
    (TANDEM_MPI_DOORBELLS=off), in alternating runs (tools/bench.sh)."""
    path = os.path.join(d, "doorbells.jsonl")
    if not os.path.exists(path):
        return
    rows = {}
    for r in lines(path):
        if r.get("bench") == "hybrid":
            key = (4, r["case"], r["schedule"] or "-", r["micro_batches"], r["zero"])
        else:
            pipe = r["strategy"] == "pipeline"
            key = (r["workers"], f"{r['workers']} stages" if pipe else "data parallel",
                   "1f1b" if pipe else "-", 8 if pipe else 1, 0)
        rows.setdefault(key, {}).setdefault(r["doorbells"], []).append(r["tokens_per_second"])
    mid = lambda v: sorted(v)[len(v) // 2]
    print("## MPI doorbells: on against off\n")
    print("A transfer's wait on the MPI communicator sleeps on its process's doorbell, a futex "
          "in memory the host's ranks share, which the peer rings when it posts or finishes a "
          "transfer with it (the default); off (`TANDEM_MPI_DOORBELLS=off`), it sleeps on a "
          "timer, up to 50 us between polls (docs/DESIGN.md, section 3); both send messages "
          "up to 128 KB eagerly. Tokens/s of gpt-tiny "
          "(`parallel/strategy_bench streams` on 2 workers: data parallel, batch 16, and 1F1B, "
          "batch 32 in 8 micro-batches; `hybrid` on 4 workers, global batch 32), each case's "
          "median over its runs, the two settings in alternating runs:\n")
    print("| workers | layout | schedule | micro-batches | ZeRO-1 | runs | off tokens/s | "
          "on tokens/s | on / off |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    ratios = []
    for (workers, case, schedule, m, zero), modes in rows.items():
        off, on = modes.get("off"), modes.get("on")
        if not off or not on:
            continue
        ratio = mid(on) / mid(off)
        ratios.append((ratio, workers, case, schedule))
        print(f"| {workers} | {case} | {schedule} | {m} | {'yes' if zero else 'no'} | "
              f"{min(len(off), len(on))} | {mid(off):.0f} | {mid(on):.0f} | {ratio:.3f} |")
    if ratios:
        lo, hi = min(ratios), max(ratios)
        print(f"\nIn this run doorbells give {lo[0]:.3f} ({lo[1]} workers, {lo[2]}, {lo[3]}) to "
              f"{hi[0]:.3f} ({hi[1]} workers, {hi[2]}, {hi[3]}) of the timers' tokens/s.")
    print()


def collectives_section(d):
    """Tandem's MPI communicator against the raw MPI call (comm/allreduce_bench, one run per
    collective): all-reduce, then ZeRO-1's all-gather and reduce-scatter where measured, and
    their ratios side by side."""
    ratios = {}
    for name, title, what in (
            ("allreduce", "All-reduce: Tandem's MPI communicator against raw `MPI_Allreduce`",
             "f32 sum in place"),
            ("allgather", "All-gather: Tandem's MPI communicator against raw `MPI_Allgatherv`",
             "f32 in place, each rank's even part of the buffer to every rank (`AllGatherParts`, "
             "ZeRO-1's gather of the updated parameters)"),
            ("reducescatter",
             "Reduce-scatter: Tandem's MPI communicator against raw `MPI_Reduce_scatter`",
             "f32 sum in place, each rank keeping its even part (`ReduceScatterParts`, ZeRO-1's "
             "reduction of the gradients)")):
        path = os.path.join(d, name + ".txt")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            text = f.read().rstrip()
        print(f"## {title}\n")
        print(f"2 ranks, shared memory, {what}, median of 9 repetitions; bytes is the whole "
              "buffer and busbw as nccl-tests defines it. `ratio` is Tandem's busbw over raw "
              "MPI's, measured in pairs (1.000 = no overhead).\n")
        print("```")
        print(text)
        print("```\n")
        # bytes, then the queued ratio (the 9th number of a row).
        ratios[name] = {int(m.group(1)): float(m.group(2)) for m in re.finditer(
            r"^\s*(\d+)\s+\d+ \|(?:\s+[\d.]+){3} \|(?:\s+[\d.]+){3}\s+([\d.]+) \|", text,
            re.M)}
    if len(ratios) < 2:
        return
    names = {"allreduce": "all-reduce", "allgather": "all-gather",
             "reducescatter": "reduce-scatter"}
    sizes = sorted(set().union(*ratios.values()))
    print("## Collectives side by side: Tandem against raw MPI\n")
    print("Tandem's busbw over raw MPI's (the queued ratio of each table above), measured in "
          "the same run:\n")
    print("| bytes | " + " | ".join(names[n] for n in ratios) + " |")
    print("| --- |" + " --- |" * len(ratios))
    for b in sizes:
        cells = [f"{r[b]:.3f}" if b in r else "-" for r in ratios.values()]
        print(f"| {b} | " + " | ".join(cells) + " |")
    print()


def zero_section(d):
    """Optimizer state bytes per rank, data parallel on D workers, without ZeRO-1 and with it
    (parallel/strategy_bench zero), against D = 1 without ZeRO-1 in the same run."""
    path = os.path.join(d, "zero.jsonl")
    if not os.path.exists(path):
        return
    runs = sorted(lines(path), key=lambda r: (r["workers"], r["zero"]))
    base = next((r for r in runs if r["workers"] == 1 and r["zero"] == 0), None)
    print("## ZeRO-1: optimizer state per rank\n")
    print("gpt-tiny, data parallel on D workers: the bytes of the optimizer state tensors each "
          "rank holds (AdamW's m and v, f32; `DistributedTrainer::optimizer_state_bytes` after "
          "one step). ZeRO-1 gives each rank an even shard of the flat parameter buffer, so the "
          "textbook figure is 1/D of the whole, the largest shard rounded up to a whole "
          "element.\n")
    print("| workers D | ZeRO-1 | bytes per rank | MB per rank | / D = 1 without ZeRO-1 | "
          "expected |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in runs:
        per_rank = r["optimizer_state_bytes"]
        lo, hi = min(per_rank), max(per_rank)
        shown = f"{hi}" if lo == hi else f"{lo} to {hi}"
        ratio = f"{hi / base['optimizer_state_bytes'][0]:.4f}" if base else "n/a"
        d_ = r["workers"]
        shards = d_ if r["zero"] else 1
        expected = -(-r["params"] // shards) / r["params"]
        print(f"| {d_} | {'yes' if r['zero'] else 'no'} | {shown} | {hi / 2**20:.2f} | {ratio} | "
              f"{expected:.4f}{f' (1/{d_})' if shards > 1 else ''} |")
    four = next((r for r in runs if r["workers"] == 4 and r["zero"] == 1), None)
    if base and four:
        got = max(four["optimizer_state_bytes"]) / base["optimizer_state_bytes"][0]
        want = -(-four["params"] // 4) / four["params"]
        print(f"\nAt D = 4 ZeRO-1 keeps {got:.4f} of one worker's optimizer state per rank "
              f"against {want:.4f} expected: "
              + ("as expected." if abs(got - want) <= 0.01 * want else
                 "not what sharding should give."))
    print()


def tensor_section(d, cores):
    """Tokens/s of tensor parallelism against data parallel on the same workers (each case's
    ratio the median over rounds of its ratio in the same round), and rank 0's activation peak
    against the memory check's estimate (parallel/strategy_bench tensor)."""
    path = os.path.join(d, "tensor.jsonl")
    if not os.path.exists(path):
        return
    runs = lines(path)
    mid = lambda v: sorted(v)[len(v) // 2]
    print("## Tensor parallelism (gpt-tiny, global batch 32)\n")
    print("`--tensor-parallel=T` over every worker, with `--sequence-parallel` and without, and "
          "on 4 workers T=2 beside 2 replicas and beside 2 stages (1F1B, 4 micro-batches), "
          "against data parallel on the same workers; `parallel/strategy_bench tensor` runs "
          "each case in turn, in rounds, in one job. `vs data parallel` is the median over "
          "rounds of the case's tokens/s over data parallel's in the same round. Activations: "
          "rank 0's peak of the allocator's requested bytes over a step above its model state, "
          "against the memory check's estimate (activations and temporaries). "
          "Every layer's collectives sit on its critical path, over shared memory here; "
          f"{cores_phrase(4, cores)}.\n")
    for workers in sorted({r["workers"] for r in runs}):
        rs_w = [r for r in runs if r["workers"] == workers]
        data = {r["round"]: r["tokens_per_second"] for r in rs_w if r["case"] == "data parallel"}
        cases = {}
        for r in rs_w:
            cases.setdefault(r["case"], []).append(r)
        print(f"{workers} workers:\n")
        print("| layout | rounds | tokens/s (median) | vs data parallel | activations (peak) | "
              "estimate | peak vs estimate |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for case, rs in cases.items():
            ratios = [r["tokens_per_second"] / data[r["round"]] for r in rs if r["round"] in data]
            peak = mid([r["peak_activation_bytes"] for r in rs])
            est = rs[0]["estimated_activation_bytes"]
            print(f"| {case} | {len(rs)} | {mid([r['tokens_per_second'] for r in rs]):.0f} | "
                  f"{mid(ratios):.2f} | {peak / 2**20:.1f} MB | {est / 2**20:.1f} MB | "
                  f"{100 * (peak - est) / est:+.1f}% |")
        print()


def hybrid_section(d, cores):
    """Tokens/s of hybrid layouts on 4 workers against data parallel on the same 4, each case's
    ratio the median over rounds of its ratio to data parallel in the same round
    (parallel/strategy_bench hybrid)."""
    path = os.path.join(d, "hybrid.jsonl")
    if not os.path.exists(path):
        return
    runs = lines(path)
    data = {r["round"]: r["tokens_per_second"] for r in runs if r["case"] == "data parallel"}
    cases = {}
    for r in runs:
        cases.setdefault((r["case"], r["schedule"]), []).append(r)
    mid = lambda v: sorted(v)[len(v) // 2]
    print("## Hybrid parallelism on 4 workers (gpt-tiny, global batch 32)\n")
    print("Data parallel on 4 workers, a 4-stage pipeline, and 2 replicas of a 2-stage pipeline "
          "(`--data-parallel=2`), every pipeline in micro-batches of 4 rows; "
          "`parallel/strategy_bench hybrid` runs each case in turn, in rounds, in one job. "
          "`vs data parallel` is the median over rounds of the case's tokens/s over data "
          f"parallel's in the same round. {cores_phrase(4, cores).capitalize()}"
          + (", so the absolute figures say little" if cores < 4 else "") +
          ", and every case's collectives run with Open MPI's busy polling "
          "(the launcher yields the core only under plain data parallelism; the pipelines' "
          "point-to-point transfers never busy-poll).\n")
    print("| layout | schedule | micro-batches | ZeRO-1 | rounds | tokens/s (median) | "
          "vs data parallel | measured bubble |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for (case, schedule), rs in cases.items():
        ratios = [r["tokens_per_second"] / data[r["round"]] for r in rs if r["round"] in data]
        print(f"| {case} | {schedule or '-'} | {rs[0]['micro_batches']} | "
              f"{'yes' if rs[0]['zero'] else 'no'} | {len(rs)} | "
              f"{mid([r['tokens_per_second'] for r in rs]):.0f} | "
              f"{mid(ratios):.2f} | {mid([r['bubble_measured'] for r in rs]):.3f} |")
    print()


def pipeline_facts(rows, cores):
    """The pipeline section's sentences that depend on the run: which rows the replay with
    handovers overshoots, whether the steps were traced, GPipe at M = 16's rounds, and where
    the stages outnumber the cores."""
    name = lambda s: f"{s['schedule']} K={s['stages']} M={s['micro_batches']}"
    below = [s for s in rows if s.get("bubble_ratio_with_handovers", 1) < 1]
    crowded = sorted({s["stages"] for s in rows if s["stages"] > cores})
    out = []
    if below:
        out.append(
            "Below 1 (here " + ", ".join(name(s) for s in below) + "), the replay with the "
            "handover waits longer than the steps did: the handover's median was longer than "
            "most of the waits it stands for" +
            (f"; with {crowded[-1]} stages on {cores} cores a stream's wait for a receive also "
             "covers earlier groups held up by time-slicing, so the replay overshoots. "
             if any(s["stages"] > cores for s in below) else ". "))
    traced = [s.get("traced") for s in rows if "traced" in s]
    out.append("GPipe's waits include each receive's issue: its communication thread, woken as "
               "the stream passes the previous compute action (the receive's buffer is ready "
               "only in the stream's order), runs on the stream's core, so even a receive whose "
               "data came long before waits for that wake-up, which the model has no place for "
               "(docs/DESIGN.md, section 5); this run does not time those waits apart. ")
    if traced:
        out.append("This run's pipeline steps were " +
                   ("traced (`STRATEGY_BENCH_TRACE`), which adds to every wait. " if all(traced)
                    else "not traced (tracing, `STRATEGY_BENCH_TRACE`, adds to every wait). "))
    g16 = next((s for s in rows if s["schedule"] == "gpipe" and s["micro_batches"] == 16), None)
    if g16 and g16.get("bubble_ratio_with_handovers_rounds"):
        r = g16["bubble_ratio_with_handovers_rounds"]
        out.append(f"GPipe at M = 16 on {g16['stages']} stages measured "
                   + ", ".join(f"{x:.2f}" for x in r)
                   + f" with handovers in its {len(r)} round{'s' if len(r) != 1 else ''} here. ")
    if crowded:
        k = ", ".join(str(c) for c in crowded)
        out.append(f"With {k} stages on {cores} cores the workers share cores, so waiting "
                   f"includes time-slicing; the rows of at most {cores} stages are the clean "
                   "ones. ")
    elif rows:
        out.append(f"Every stage has a core of its own here ({cores} cores). ")
    return "".join(out)


def pipeline_section(rows, base, cores):
    rounds = max((s.get("rounds", 1) for s in rows), default=1)
    print("## Pipeline (gpt-tiny, global batch 32)\n")
    print("Measured bubble: the time a stage waits on another (for an activation or gradient, "
          "for its sends to be taken, and at the step's end for the last stage) over the "
          "step's time but the optimizer's, averaged over stages. Expected: the same figure "
          "for the schedule simulated (`SimulateSchedule`) replaying each measured step with "
          "every forward (with its input wait), B and W taking its own measured time and "
          "transfers taking no time, the median over the steps; measured / without handovers is the "
          "median over the steps of each step's measured bubble over its own replay (so a "
          "step slowed by the rest of the machine is set against itself), and near 1 it "
          "says the runtime adds little waiting of its own. From medians: one simulation with "
          "each stage's median F, B and W instead, which leaves out what the actions' spread "
          "costs (a slow forward on one stage idles the other: the machine's cost, not the "
          "runtime's), so on a busy machine it falls short of the measured bubble more. "
          "Handover: the time from a stage's compute action ending to the neighbour's stream, "
          "already waiting for what it sends, resuming: the bytes moved and, on CPU workers, "
          "the threads woken on the way (the sender's communication thread, the receiver's, "
          "the receiving stream's); the median over every such receive in the measured steps "
          "(each rank's times on the host's one monotonic clock), with how many there were. "
          "With handovers: the replay again with each exchange group taking the handover, and "
          "the median over the steps of each step's measured bubble over that replay. " +
          (f"Each case ran in {rounds} rounds, every case once a round (so that a slow spell "
           "of the host falls on one round of a case, not on all): its row is the round with "
           "the median ratio with handovers, and that column lists every round's. "
           if rounds > 1 else "") +
          "GPipe "
          "sends while it computes, but 1F1B, ZB-H1 and interleaved 1F1B put each "
          "micro-batch's transfers on the critical path (on 2 stages, stage 1 needs the next "
          "activation right after each backward), so their bubbles carry a handover per "
          "micro-batch that the replay without them leaves out; with them, the remaining "
          "ratio is what the runtime waits beyond its transfers. " + pipeline_facts(rows, cores) +
          "The MPI communication "
          "thread waits for its transfers asleep on its process's doorbell, which the peer "
          "rings when it posts or finishes a transfer, rather than busy-polling, and runs on "
          "the shortest scheduler slice (docs/DESIGN.md, section 3), so that it leaves the "
          "cores to the compute streams and starts a transfer as soon as it is woken; a "
          "handover still takes a few wake-ups, each "
          "taking longer the busier the machine. Textbook: each schedule's bubble with equal "
          "stages and F = B = W: GPipe's and 1F1B's (K-1)/(M+K-1), interleaved 1F1B's with v "
          "model chunks a stage (K-1)/(vM+K-1) (Narayanan et al.; here v = 2, with M a "
          "multiple of K), ZB-H1's (K-1)/(3M+K-1) (Qi et "
          "al., from M = K on). Interleaving cuts the bubble for twice the transfers, each on "
          "the critical path, so on CPU workers its measured bubble gains least. The handover "
          "is taken from the same steps the replay replays, so measured / with handovers is "
          "near 1 partly by construction: beside it stand the measured bubble over the replay "
          "without handovers and over the textbook formula. Throughput is against one worker (data table above). Activation "
          "peak: each stage's peak of the allocator's requested bytes above its model state "
          "during a step (the requests, not the cached blocks that served them, so that a "
          "case does not depend on the cases before it), stage 0 first; under ZB-H1 it "
          "includes what the deferred Ws keep, so its later stages hold more than 1F1B's, and "
          "Qi et al.'s claim is that no stage holds more than 1F1B's largest (docs/DESIGN.md, "
          "section 5).\n")
    print("| schedule | stages K | micro-batches M | measured bubble | expected | from medians "
          "| handover ms (count), from the same steps | expected with handovers "
          "| measured / with handovers (handover from the same steps) "
          "| measured / without handovers | measured / textbook | textbook "
          "| tokens/s vs 1 worker | activation peak per stage MB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for s in rows:
        rel = s["tokens_per_second"] / base["tokens_per_second"] if base else float("nan")
        expected = s.get("bubble_expected")
        by_step = s.get("bubble_ratio_by_step")
        ratio = (f"{by_step:.2f}" if by_step else
                 f"{s['bubble_measured'] / expected:.2f}" if expected else "-")
        peaks = " / ".join(f"{b / 2**20:.1f}" for b in s.get("peak_activation_bytes",
                                                             [s["stage0_peak_activation_bytes"]]))
        opt = lambda key, fmt: format(s[key], fmt) if key in s else "-"
        name = s["schedule"] + (f" v={s['virtual_stages']}" if s.get("virtual_stages", 1) > 1 else "")
        textbook = s.get("bubble_textbook", s["bubble_gpipe"])
        textbook = f"{textbook:.3f}" if textbook is not None else "-"
        handover = (f"{s['handover_ms']:.2f} ({s['handovers']})" if "handover_ms" in s
                    else "-")
        if s.get("bubble_ratio_textbook") is not None:
            by_textbook = f"{s['bubble_ratio_textbook']:.2f}"
        elif s.get("bubble_textbook"):
            by_textbook = f"{s['bubble_measured'] / s['bubble_textbook']:.2f}"
        else:
            by_textbook = "-"
        with_handovers = opt('bubble_ratio_with_handovers', '.2f')
        if len(s.get("bubble_ratio_with_handovers_rounds", [])) > 1:
            with_handovers += " (" + ", ".join(
                f"{r:.2f}" for r in s["bubble_ratio_with_handovers_rounds"]) + ")"
        print(f"| {name} | {s['stages']} | {s['micro_batches']} | "
              f"{s['bubble_measured']:.3f} | {opt('bubble_expected', '.3f')} | "
              f"{opt('bubble_expected_medians', '.3f')} | {handover} | "
              f"{opt('bubble_expected_with_handovers', '.3f')} | "
              f"{with_handovers} | {ratio} | {by_textbook} | {textbook} | {rel:.2f} | {peaks} |")
    print()
    # Qi et al.'s bubble times from ZB-H1's measured F, B (input gradient) and W, each the
    # mean over the stages that ran it (B and W: the stages that split their backward).
    zb = [s for s in rows if s["schedule"] == "zb-h1" and s["stages"] > 1]
    if zb:
        print("ZB-H1 against 1F1B in time (Qi et al.): with F the forward, B the input "
              "gradient and W the weight gradient of a stage, 1F1B waits (K-1)(F+B+W) and "
              "ZB-H1 (K-1)(F+B-W), here from each ZB-H1 run's measured times (means over "
              "the stages; B and W over the stages that split their backward), beside the "
              "waiting measured, per stage.\n")
        print("| K | M | F ms | B ms | W ms | 1F1B (K-1)(F+B+W) ms | ZB-H1 (K-1)(F+B-W) ms "
              "| 1F1B measured ms | ZB-H1 measured ms |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        mean = lambda v: sum(v) / len(v) if v else float("nan")
        for s in zb:
            k = s["stages"]
            f = mean(s["forward_ms"])
            b = mean(s["backward_ms"][1:])
            w = mean(s["weight_ms"][1:])
            ofob = next((o for o in rows if o["schedule"] == "1f1b" and o["stages"] == k and
                         o["micro_batches"] == s["micro_batches"]), None)
            waited = lambda r: f"{r['bubble_ms']:.1f}" if r and "bubble_ms" in r else "-"
            print(f"| {k} | {s['micro_batches']} | {f:.2f} | {b:.2f} | {w:.2f} | "
                  f"{(k - 1) * (f + b + w):.1f} | {(k - 1) * (f + b - w):.1f} | "
                  f"{waited(ofob)} | {waited(s)} |")
        print()
        print("ZB-H1 against 1F1B in memory (Qi et al.: a stage holds at most K micro-batches, "
              "in flight or with their W pending, as 1F1B's first stage does, so no stage holds "
              "more than 1F1B's largest where the stages hold alike): each stage's activation "
              "peak (MB, from the table above) and ZB-H1's largest over 1F1B's largest.\n")
        print("| K | M | 1F1B per stage | ZB-H1 per stage | ZB-H1 largest / 1F1B largest |")
        print("| --- | --- | --- | --- | --- |")
        mb = lambda r: " / ".join(f"{b / 2**20:.1f}" for b in r["peak_activation_bytes"])
        for s in zb:
            ofob = next((o for o in rows if o["schedule"] == "1f1b" and
                         o["stages"] == s["stages"] and
                         o["micro_batches"] == s["micro_batches"]), None)
            if (not ofob or not s.get("peak_activation_bytes") or
                    not max(ofob.get("peak_activation_bytes") or [0])):
                continue
            ratio = max(s["peak_activation_bytes"]) / max(ofob["peak_activation_bytes"])
            print(f"| {s['stages']} | {s['micro_batches']} | {mb(ofob)} | {mb(s)} | {ratio:.3f} |")
        print()


# compare --plan's runs in tools/bench.sh: (folder, what it is). gpt-tiny at batch 16 on 2 and 4
# workers is the configuration every term of the model was developed on; the other two were
# written into the bench once, as an evaluation held out from that development, and their
# errors are shown as they come.
PLAN_RUNS = (("plan2", "development"), ("plan4", "development"),
             ("heldout-gpt4", "held out"), ("heldout-mlp2", "held out"))


def planner_section(d):
    """compare --plan's predictions against the runs it checks itself on (plan.json): the
    development configuration and the held-out ones, and how long planning 64 H200s took."""
    runs = [(name, kind, os.path.join(d, name, "plan.json")) for name, kind in PLAN_RUNS]
    if not any(os.path.exists(p) for _, _, p in runs):
        return
    plans = {}
    for name, _, path in runs:
        if os.path.exists(path):
            with open(path) as f:
                plans[name] = json.load(f)
    repeats = sorted({len(c.get("measured_step_runs_seconds", []))
                      for p in plans.values() for c in p["checks"] if c.get("ran")})
    print("## Planner: predicted against measured\n")
    print("`bazel run //tools:compare -- --plan ...` (each configuration's command below): "
          "block times and the workers' finish spread measured here, the link timed with as "
          "many workers as the plan has (2 to 8), where the workers outnumber the cores the "
          "share of a core a waiting pipeline worker keeps fitted to the fastest of --repeats "
          "runs of 1F1B over every rank, every layout predicted; then its top 3 layouts and the "
          "best pure strategy they leave out run through the launcher, none of the shape the "
          "waiting share was fitted on (the lines below name those held out). The development "
          "configuration (gpt-tiny, global batch 16, on 2 and 4 workers) is the one every term "
          "of the model was added on after a miss; the held-out configurations were written "
          "into the bench once and never tuned against, and their errors stand as they come. "
          "Error is (predicted - measured) / measured, against the fastest run (a slower run "
          "met the host's other work) and against the median run; spread is (slowest - "
          "fastest) / median of a layout's runs ("
          + (" or ".join(str(r) for r in repeats) if repeats else "no")
          + " runs of each, the layouts taken in turns); the step is the slowest rank's mean "
          "after warm-up, the memory the largest rank's allocator peak against the launcher's "
          "estimate. Targets: step 15%, memory 10%, the layout ranked first within 5% of the "
          "fastest measured.\n")
    print("| configuration | model, batch, workers | layout | predicted step ms | fastest run ms "
          "| median run ms | spread | runs ms | error against fastest | against median "
          "| predicted memory MB | measured peak MB | memory error |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    verdicts = []
    for name, kind, _ in runs:
        plan = plans.get(name)
        if plan is None:
            print(f"| {kind} | did not run (see {name}.txt) | | | | | | | | | | | |")
            continue
        batch = re.search(r"--batch=(\d+)", plan.get("command", ""))
        what = (f"{plan['model']}; batch {batch.group(1) if batch else '?'}, "
                f"{plan['gpus']} workers")
        label = f"{kind}: {what}"
        checks = plan["checks"]
        if "waiting_share" in plan:
            waiting = plan["waiting_share"]
            verdicts.append(f"{label}: a waiting pipeline worker takes "
                            f"{waiting['share']:.2f} of a computing one's turn on the cores "
                            f"({waiting['source']}).")
        for h in plan.get("held_out", []):
            verdicts.append(f"{label}: held out of the check: {h}.")
        ran = [c for c in checks if c.get("ran")]
        for c in checks:
            if not c.get("ran"):
                print(f"| {kind} | {what} | {c['layout']} | {1e3 * c['step_seconds']:.1f} | "
                      "did not run | | | | | | | | |")
                continue
            each = ", ".join(f"{1e3 * s:.1f}" for s in c.get("measured_step_runs_seconds", []))
            median = c.get("measured_median_step_seconds")
            median_error = c.get("median_step_error")
            spread = c.get("measured_step_spread")
            print(f"| {kind} | {what} | {c['layout']} | {1e3 * c['step_seconds']:.1f} | "
                  f"{1e3 * c['measured_step_seconds']:.1f} | "
                  f"{f'{1e3 * median:.1f}' if median is not None else '-'} | "
                  f"{f'{100 * spread:.1f}%' if spread is not None else '-'} | {each} | "
                  f"{100 * c['step_error']:+.1f}% | "
                  f"{f'{100 * median_error:+.1f}%' if median_error is not None else '-'} | "
                  f"{c['memory_bytes'] / 2**20:.1f} | {c['measured_peak_bytes'] / 2**20:.1f} | "
                  f"{100 * c['memory_error']:+.1f}% |")
        if ran:
            fastest = min(c["measured_step_seconds"] for c in ran)
            first = checks[0]
            behind = (first["measured_step_seconds"] / fastest - 1) if first.get("ran") else float("nan")
            worst_step = max(abs(c["step_error"]) for c in ran)
            worst_median = max(abs(c.get("median_step_error", float("nan"))) for c in ran)
            worst_mem = max(abs(c["memory_error"]) for c in ran)
            verdicts.append(
                f"{label}: largest step error {100 * worst_step:.1f}% against the fastest run "
                f"({'within' if worst_step <= 0.15 else 'over'} 15%), {100 * worst_median:.1f}% "
                f"against the median ({'within' if worst_median <= 0.15 else 'over'} 15%); "
                f"largest memory error {100 * worst_mem:.1f}% "
                f"({'within' if worst_mem <= 0.10 else 'over'} 10%); the layout ranked first "
                f"of those checked {100 * behind:.1f}% behind the fastest measured "
                f"({'within' if behind <= 0.05 else 'over'} 5%).")
    print()
    for v in verdicts:
        print(f"- {v}")
    commands = [(kind, plans[name]["command"]) for name, kind, _ in runs if name in plans]
    for kind, command in commands:
        print(f"- {kind}: `{command}`")
    timing = os.path.join(d, "plan64.json")
    if os.path.exists(timing):
        with open(timing) as f:
            seconds = json.load(f)["milliseconds"] / 1e3
        print(f"- Planning gpt2-small on 64 H200s from the example block times "
              f"(`examples/plan_h200_cluster.sh`, no GPU, `--no-run`) took {seconds:.1f} s.")
    print()


def main():
    d = sys.argv[1]
    now = datetime.date.today().isoformat()
    record = run_record(d)
    cores = int(record["cores"])
    rev = record.get("commit", "")[:7]
    if not rev:
        sys.exit("bench_report: run.json names no commit: the bench ran outside a git checkout")
    stamp = f"commit {rev}"
    if record.get("dirty"):
        if os.environ.get("TANDEM_BENCH_DIRTY") != "1":
            sys.exit(f"bench_report: the tree at {rev} had uncommitted changes when the bench "
                     "started; commit them, or set TANDEM_BENCH_DIRTY=1 to stamp it dirty")
        stamp += " with uncommitted changes (dirty; TANDEM_BENCH_DIRTY=1)"
    strat = lines(os.path.join(d, "strategy.jsonl"))
    torch = lines(os.path.join(d, "pytorch.jsonl"))
    print("# Benchmarks\n")
    print(f"Measured {now} on {machine(cores)}, {stamp} (read as the bench started), with "
          "`bazel run //tools:bench` (it rewrites this file). CPU workers, one BLAS thread "
          "each. These machines are noisy: compare the ratios, each measured against its "
          "baseline in the same run, rather than absolute figures.\n")
    collectives_section(d)
    print("## Runtime ops against raw OpenBLAS and memcpy\n")
    with open(os.path.join(d, "ops.json")) as f:
        ops = json.load(f)
    variant = ops["context"].get("cpu_ops_variant", "base")
    print("`runtime/ops_bench` (Google Benchmark, medians of 5 repetitions, 1 thread). The CPU "
          f"ops run the widest instruction-set variant this CPU supports, `{variant}` here; the "
          "last column is its speed over the base (SSE2) variant of the same op, in the same "
          "run (every variant gives the same bits). Add and BiasAdd move as many bytes in "
          "either variant and stay bound by memory: their last column is noise around 1.\n")
    ops_md, op_gain = ops_tables(ops)
    print(ops_md + "\n")
    print("## One-worker training\n")
    print("`model/train_bench`: step time median of 7 steps after 2 warm-up steps; model "
          "FLOP/s = 6 x matmul parameters (all but the embedding tables) x tokens/s; the matmul share is from the op profiler.\n")
    print("```")
    with open(os.path.join(d, "train.txt")) as f:
        train_text = f.read().rstrip()
    print(train_text)
    print("```\n")
    print("## Data parallelism (gpt-tiny, global batch 16 x 64 tokens)\n")
    data = [s for s in strat if s["bench"] == "data"]
    base = next((s for s in data if s["workers"] == 1 and s["case"] == "overlap"), None)
    print("| workers | case | bucket MB | tokens/s | speed-up | scaling efficiency |")
    print("| --- | --- | --- | --- | --- | --- |")
    for s in data:
        sp = s["tokens_per_second"] / base["tokens_per_second"] if base else float("nan")
        print(f"| {s['workers']} | {s['case']} | {s['bucket_mb']:g} | "
              f"{s['tokens_per_second']:.0f} | {sp:.2f} | {sp / s['workers']:.2f} |")
    two = {(s["case"], s["bucket_mb"]): s for s in data if s["workers"] == 2}
    zero_path = os.path.join(d, "zero.jsonl")
    params = next((r["params"] for r in (lines(zero_path) if os.path.exists(zero_path) else [])),
                  0)
    gradient_mb = 4 * params / 2**20
    ov, no = two.get(("13 buckets, overlap", 0.5)), two.get(("13 buckets, no-overlap", 0.5))
    if ov and no:
        hidden = lambda s: max(0.0, 1 - s["exposed_comm_seconds"] / s["comm_seconds"]) if s["comm_seconds"] else 0
        print(f"\nOverlap at 2 workers with 13 buckets of 0.5 MB: step time "
              f"{1e3 * ov['step_seconds']:.1f} ms overlapped against {1e3 * no['step_seconds']:.1f} ms "
              f"with `--no-overlap` (ratio {ov['step_seconds'] / no['step_seconds']:.3f}); "
              f"communication hidden behind backward: {100 * hidden(ov):.0f}% "
              f"(1 - exposed / busy). "
              + (f"The same figure without overlap is {100 * hidden(no):.0f}% where it should be "
                 f"near 0, so on all-reduces this short it overstates what is hidden: the "
                 f"step-time ratio is the reliable figure. " if hidden(no) > 0.05 else
                 f"The same figure without overlap is {100 * hidden(no):.0f}%, as it should be. ")
              + f"Communication is the "
              f"communicator's busy time, exposed is the time the step waited for it. On CPU "
              f"workers with one core each, the communication thread that hides the all-reduce "
              f"runs on the same cores as backward, so hiding it cannot make the step much "
              f"shorter here (and, polling busily, it made it longer when the launcher's "
              f"yielding was added: performance work below has this run's figures); "
              f"on GPUs the all-reduce runs on the device beside the compute stream. "
              + (f"At the default 25 MB, gpt-tiny's {gradient_mb:.1f} MB of gradients (f32, from "
                 f"the ZeRO-1 runs' parameter count) are "
                 + ("one bucket, all-reduced after backward." if gradient_mb <= 25 else
                    f"{-(-gradient_mb // 25):.0f} buckets.") if gradient_mb else "")
              + "\n")
    pipeline_section([s for s in strat if s["bench"] == "pipeline"], base, cores)
    hybrid_section(d, cores)
    tensor_section(d, cores)
    zero_section(d)
    planner_section(d)
    print("## Against PyTorch on the same model\n")
    print("`tools/bench_pytorch.py`: the same GPT (gpt-tiny sizes), batch, sequence length and "
          "AdamW, random tokens, f32, one thread per process; DDP over Gloo for 2 processes.\n")
    two_dp = two.get(("overlap", 25))
    print("| processes | Tandem tokens/s | PyTorch tokens/s | Tandem / PyTorch |")
    print("| --- | --- | --- | --- |")
    for t in torch:
        if "skipped" in t:
            print(f"| - | - | - | skipped: {t['skipped']} |")
            continue
        ours = base if t["procs"] == 1 else two_dp
        if ours:
            print(f"| {t['procs']} | {ours['tokens_per_second']:.0f} | "
                  f"{t['tokens_per_second']:.0f} | {ours['tokens_per_second'] / t['tokens_per_second']:.2f} |")
    if torch and "framework" in torch[0]:
        print(f"\n({torch[0]['framework']})")
    print()
    streams_section(d, ops)
    doorbells_section(d)
    performance_work(variant, op_gain, train_text, yield_gain(os.path.join(d, "yield.jsonl")))
    # The GPU section comes from another machine (tools/gpu_report.py): a measured one in the
    # file this run replaces is kept as it is, with its own date.
    previous = ""
    if len(sys.argv) > 2 and os.path.exists(sys.argv[2]):
        with open(sys.argv[2]) as f:
            previous = f.read()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpu_report import measured_section
    kept = measured_section(previous)
    if kept:
        print(kept.rstrip("\n"))
        return
    print("## GPU\n")
    print("Not measured: the GPU figures (CUDA ops against the CPU, gpt2-small bf16 tokens/s "
          "and MFU with standard and with flash attention, PyTorch on the same GPU) come from "
          "`tools/gpu_check.sh` on a GPU machine, written here by `tools/gpu_report.py`; none "
          "have been measured yet.")


if __name__ == "__main__":
    main()
