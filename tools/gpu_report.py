#!/usr/bin/env python3
"""BENCHMARKS.md's GPU section from the output of dist/gpu_check/run.sh.

  python3 tools/gpu_report.py gpu_check.log                  prints the section
  python3 tools/gpu_report.py gpu_check.log --into BENCHMARKS.md
                                                             replaces the file's "## GPU"
                                                             section (atomically)

The log is the gpu_check.log that run.sh writes into its --out folder (what run.sh prints is
a summary of it). The section gives the GPU, the tests' results (each binary's counts), the
device's ceilings measured in the same run, gpt2-small bf16 training with standard and with
flash attention (and f16 with loss scaling) against PyTorch eager on the same GPU (tokens/s,
MFU and their ratio), each run's first losses and, in f16, the steps its loss scaler skipped,
each run's memory estimate against its allocator's peak, the top of each op table, and whether the targets (MFU at least 40%,
at least 1.0x PyTorch) were met. What the log lacks is said to be missing, never guessed.
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys

TOP_OPS = 8


def parse(text):
    """The figures of one gpu_check log."""
    r = {"gpu": None, "summary": None, "failed": [], "not_run": [], "ceilings": None,
         "binaries": [], "runs": {}, "pytorch": None, "pytorch_note": None}
    for line in text.splitlines():
        if line.startswith("gpu: ") and r["gpu"] is None:
            r["gpu"] = line[len("gpu: "):].strip()
        elif re.match(r"^\d+ passed, \d+ failed, \d+ skipped", line):
            r["summary"] = line.strip()
        elif re.match(r"^[\w.-]+: \d+ passed, \d+ failed, \d+ skipped \(\d+s\)$", line):
            r["binaries"].append(line.strip())
        elif line.startswith("FAIL "):
            r["failed"].append(line[len("FAIL "):].strip())
        elif line.startswith("NOT RUN "):
            r["not_run"].append(line[len("NOT RUN "):].strip())
        elif line.startswith("CEILINGS "):
            r["ceilings"] = line[len("CEILINGS "):].strip()
        elif line.startswith("PYTORCH "):
            rest = line[len("PYTORCH "):].strip()
            try:
                r["pytorch"] = json.loads(rest)
            except ValueError:
                r["pytorch_note"] = rest
        else:
            m = re.match(r"^(TANDEM(?:_FLASH|_F16)?) (.*)$", line)
            if not m:
                continue
            run = r["runs"].setdefault(m.group(1), {"ops": []})
            body = m.group(2)
            step = re.match(r"median step ([\d.]+) ms, (\d+) tokens/s over (\d+) steps", body)
            mfu = re.match(r"MFU ([\d.]+)% .* over ([\d.]+) TFLOP/s, (.*)\)$", body)
            syncs = re.match(r"host syncs per step (\d+)", body)
            losses = re.match(r"losses ([\d.naif -]+?)(?: \((.*)\))?$", body)
            scaler = re.match(r"loss scaler skipped (\d+) of (\d+) steps", body)
            if losses:
                run["losses"] = losses.group(1).split()
                run["losses_note"] = losses.group(2)
            elif scaler:
                run["scaler_skipped"] = (int(scaler.group(1)), int(scaler.group(2)))
            elif syncs:
                run["host_syncs"] = int(syncs.group(1))
            elif step:
                run["step_ms"] = float(step.group(1))
                run["tokens_per_second"] = float(step.group(2))
                run["steps"] = int(step.group(3))
            elif mfu:
                run["mfu"] = float(mfu.group(1)) / 100
                run["peak"] = f"{mfu.group(2)} TFLOP/s, {mfu.group(3)}"
            elif body.startswith("MFU unknown"):
                run["peak"] = body[len("MFU unknown: "):]
            elif body.startswith("memory "):
                run["memory"] = body[len("memory "):]
            elif body.startswith("allocator "):
                run["allocator"] = body[len("allocator "):]
                peak = re.search(r"peak allocated (\d+) B", body)
                if peak:
                    run["peak_bytes"] = int(peak.group(1))
            elif body.startswith("model "):
                run["model"] = body[len("model "):].strip()
            else:
                run["ops"].append(body)
    return r


def size(n):
    """Bytes in the launcher's units (model/memory.cc FormatBytes: 1 MB = 2^20 bytes)."""
    mb = n / 2**20
    if mb >= 1024:
        return f"{mb / 1024:.1f} GB"
    return f"{mb:.0f} MB" if mb >= 10 else f"{mb:.1f} MB"


def percent(fraction):
    return "-" if fraction is None else f"{100 * fraction:.1f}%"


def describe_gpu(line):
    """"0, NVIDIA H200, 580.159.04, 143771 MiB" (nvidia-smi's csv) -> "one NVIDIA H200 (...)"."""
    if not line:
        return "a GPU the log does not name"
    f = [x.strip() for x in line.split(",")]
    if len(f) == 4:
        return f"one {f[1]} (driver {f[2]}, {f[3]})"
    return line


def section(r, date, commit):
    out = ["## GPU", ""]
    gpu = describe_gpu(r["gpu"])
    out.append(f"Measured {date} on {gpu}, commit {commit}, with `tools/gpu_check.sh build` here "
               "and `dist/gpu_check/run.sh` on the GPU machine (`tools/gpu_report.py` wrote this "
               "section from its output).")
    out.append("")
    out.append(f"Tests: {r['summary'] or 'no closing line in the log (the run did not finish)'}.")
    for b in r["binaries"]:
        out.append(f"- {b}")
    for f in r["failed"]:
        out.append(f"- failed: {f}")
    for n in r["not_run"]:
        out.append(f"- not run: {n}")
    out.append("")
    if r["ceilings"]:
        out.append(f"The device's ceilings in the same run (PyTorch): {r['ceilings']}.")
        out.append("")

    torch = r["pytorch"]
    torch_tps = torch.get("tokens_per_second") if torch else None
    rows = [("Tandem, standard attention", r["runs"].get("TANDEM")),
            ("Tandem, flash attention", r["runs"].get("TANDEM_FLASH"))]
    if "TANDEM_F16" in r["runs"]:
        rows.append(("Tandem, f16 with loss scaling, standard attention", r["runs"]["TANDEM_F16"]))
    peak = next((run["peak"] for _, run in rows if run and run.get("peak")), "unknown")
    out.append("gpt2-small (124M), bf16 (but the f16 row), batch 8 x 1024 tokens, AdamW; "
               "random tokens; median step after "
               "warm-up, timed by events on the compute stream; MFU = 6 x matmul parameters x "
               f"tokens/s over the GPU's peak ({peak}); host syncs: the median per step (the "
               "loss read each step).")
    out.append("")
    out.append("| run | median step ms | tokens/s | MFU | host syncs per step | "
               "tokens/s / PyTorch's |")
    out.append("| --- | --- | --- | --- | --- | --- |")
    best = None
    for label, run in rows:
        if not run or "tokens_per_second" not in run:
            out.append(f"| {label} | - | - | - | - | did not report a step time |")
            continue
        tps = run["tokens_per_second"]
        ratio = f"{tps / torch_tps:.2f}" if torch_tps else "-"
        syncs = run.get("host_syncs")
        out.append(f"| {label} | {run['step_ms']:.2f} | {tps:,.0f} | {percent(run.get('mfu'))} | "
                   f"{'-' if syncs is None else syncs} | {ratio} |")
        # The targets are bf16's: the f16 run is not the faster run they are judged by.
        if "f16" not in label and (best is None or tps > best[1]["tokens_per_second"]):
            best = (label, run)
    step = torch.get("step_seconds") if torch else None
    if step and torch_tps:
        out.append(f"| PyTorch eager ({torch.get('framework', 'pytorch')}, SDPA attention) | "
                   f"{1e3 * step:.2f} | {torch_tps:,.0f} | {percent(torch.get('mfu'))} | - | 1.00 |")
    elif torch:
        out.append("| PyTorch eager | - | - | - | - | no figures |")
    else:
        out.append(f"| PyTorch eager | - | - | - | {r['pytorch_note'] or 'not in the log'} |")
    out.append("")

    for label, run in rows:
        if not run:
            continue
        if run.get("losses"):
            note = f" ({run['losses_note']})" if run.get("losses_note") else ""
            out.append(f"- {label}: first losses {', '.join(run['losses'])}{note}.")
        if "scaler_skipped" in run:
            k, n = run["scaler_skipped"]
            out.append(f"- {label}: the loss scaler skipped {k} of {n} steps.")
        if "memory" in run and "peak_bytes" in run:
            out.append(f"- {label}: checked to need {run['memory'].split(';')[0]}; the "
                       f"allocator's peak was {size(run['peak_bytes'])}.")
        if run["ops"]:
            out.append(f"- {label}, the op table's top (each op timed by events around it on "
                       "the stream: where the device's time goes):")
            out.append("")
            out.append("  ```")
            out.extend("  " + o for o in run["ops"][:TOP_OPS + 2])
            out.append("  ```")
    out.append("")

    if best and torch_tps:
        label, run = best
        mfu = run.get("mfu")
        out.append("Targets (MFU at least 40%, at least 1.0x PyTorch eager), with the "
                   f"faster Tandem run ({label}): MFU {percent(mfu)} "
                   f"({'met' if mfu is not None and mfu >= 0.40 else 'not met'}), "
                   f"{run['tokens_per_second'] / torch_tps:.2f}x PyTorch "
                   f"({'met' if run['tokens_per_second'] >= torch_tps else 'not met'}).")
    else:
        out.append("Targets: not judged, the log lacks a Tandem or a PyTorch figure.")
    out.append("")
    return "\n".join(out)


def section_span(doc):
    """(start, end) of doc's "## GPU" section, to the next "## " heading or the end; None."""
    m = re.search(r"^## GPU\n", doc, flags=re.M)
    if not m:
        return None
    nxt = re.search(r"^## ", doc[m.end():], flags=re.M)
    return m.start(), (m.end() + nxt.start() if nxt else len(doc))


def measured_section(doc):
    """doc's GPU section where it holds measurements (written by this script), else None."""
    span = section_span(doc)
    if span is None:
        return None
    text = doc[span[0]:span[1]]
    return text if "`tools/gpu_report.py` wrote this section" in text else None


def replace_section(doc, new):
    """doc with its GPU section replaced by new (appended where it has none)."""
    span = section_span(doc)
    if span is None:
        return doc.rstrip("\n") + "\n\n" + new
    start, end = span
    return doc[:start] + new + ("\n" + doc[end:] if end < len(doc) else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", help="what dist/gpu_check/run.sh printed")
    ap.add_argument("--into", help="a BENCHMARKS.md whose GPU section to replace")
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--commit", help="the commit the binaries were built at (default: HEAD)")
    args = ap.parse_args()
    try:
        with open(args.log) as f:
            text = f.read()
    except OSError as e:
        sys.exit(f"gpu_report: cannot read {args.log}: {e.strerror}")
    r = parse(text)
    if r["summary"] is None and not r["runs"]:
        sys.exit(f"gpu_report: {args.log} holds no gpu_check results (no closing line, no "
                 "training figures)")
    commit = args.commit or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
        cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "unknown"
    new = section(r, args.date, commit)
    if not args.into:
        sys.stdout.write(new)
        return
    with open(args.into) as f:
        doc = f.read()
    tmp = args.into + ".tmp"
    with open(tmp, "w") as f:
        f.write(replace_section(doc, new))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, args.into)
    print(f"gpu_report: wrote the GPU section of {args.into}")


if __name__ == "__main__":
    main()
