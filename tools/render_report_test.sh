#!/bin/bash
# Renders a real comparison report in headless Chromium: compare runs a tiny model on 2 CPU
# workers under every strategy (no hybrid layout on 2; tensor parallelism over both), then report.html is screenshotted and the screenshot checked
# (exists, the page's size, the charts' colours present). Usage: render_report_test.sh COMPARE
set -u
. "$(dirname "$0")/junit.sh"  # check, fail, skip; the checks as JUnit XML
browser=""
for b in chromium chromium-browser; do
  if command -v "$b" >/dev/null 2>&1; then
    browser="$b"
    break
  fi
done
[ -n "$browser" ] || skip "chromium is not installed (tools/setup.sh installs it); nothing rendered"

compare="$(cd "$(dirname "$1")" && pwd -P)/$(basename "$1")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
export TMPDIR="$tmp"  # Open MPI's session files stay inside the test's directory
out="$tmp/report"
png="$tmp/report.png"

check "compare runs every strategy"
start=$(date +%s)
timeout 300 "$compare" --gpus=2 --model=gpt --n-layer=2 --d-model=32 --n-head=2 --seq-len=16 \
  --batch=8 --steps=4 --out="$out" >"$tmp/compare.txt" 2>&1
rc=$?
cat "$tmp/compare.txt"
[ "$rc" -eq 0 ] || fail "compare exited $rc"
echo "compare took $(( $(date +%s) - start )) s"

check "the report's files, merged traces, op tables and inlined charts"

for f in report.md report.html report.json throughput.svg step-time.svg memory.svg \
  timeline-baseline.svg timeline-data.svg timeline-data-zero1.svg timeline-model.svg \
  timeline-gpipe.svg timeline-1f1b.svg timeline-zb-h1.svg timeline-interleaved.svg \
  timeline-tp2.svg; do
  [ -s "$out/$f" ] || fail "no $f"
done
# The launcher's --profile ending: one merged trace with a lane per rank, the op tables printed.
for s in baseline data data-zero1 model gpipe 1f1b zb-h1 interleaved; do
  [ -s "$out/runs/$s/trace.json" ] || fail "no merged trace for $s"
  grep -q "op table, rank 0:" "$out/logs/$s.log" || fail "the launcher printed no op table for $s"
done
for r in 0 1; do
  grep -q "\"pid\": $r, \"tid\": 0" "$out/runs/gpipe/trace.json" || fail "no lane for rank $r"
done
grep -q "op table, rank 1:" "$out/logs/1f1b.log" || fail "no op table for rank 1"
# 3 charts and 8 timelines (interleaved: 2 chunks of one block a stage), inlined; 2 workers
# have no hybrid layout, which the report says.
svgs="$(grep -o '<svg' "$out/report.html" | wc -l)"
closed="$(grep -o '</svg>' "$out/report.html" | wc -l)"
[ "$svgs" -eq 12 ] || fail "report.html has $svgs <svg> elements, not 12"
[ "$closed" -eq 12 ] || fail "report.html closes $closed <svg> elements, not 12"
ran="$(grep -c '"ran": true' "$out/report.json")"
[ "$ran" -eq 9 ] || fail "report.json: $ran strategies ran, not 9"
grep -qF "<li>No hybrid layout: 2 workers" "$out/report.html" || fail "report.html lacks the note"
grep -q 'rank 1' "$out/timeline-gpipe.svg" || fail "the GPipe timeline has no row for rank 1"
if grep -q -E '<script|<link|src=' "$out/report.html"; then
  fail "report.html refers to something outside itself"
fi

check "headless Chromium's screenshot: a 1200x2000 PNG"
# Chromium's profile and sockets need a short path (a Unix socket path has at most 107
# bytes; the test's own directory is longer).
short="$(mktemp -d /tmp/tandem-render.XXXXXX)" || fail "cannot make a directory under /tmp"
on_exit 'rm -rf "$short"'
HOME="$short" TMPDIR="$short" timeout 120 "$browser" --headless --no-sandbox --disable-gpu \
  --user-data-dir="$short/profile" --screenshot="$png" --window-size=1200,2000 \
  "file://$out/report.html" >"$tmp/chromium.txt" 2>&1
rc=$?
[ -s "$png" ] || { cat "$tmp/chromium.txt"; fail "no screenshot (chromium exited $rc)"; }
size=$(stat -c %s "$png")
[ "$size" -gt 30000 ] || fail "the screenshot is only $size bytes"
# PNG signature, then IHDR's width and height.
[ "$(head -c 8 "$png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] || fail "not a PNG"
dims="$(od -An -tu1 -j16 -N8 "$png" | tr -s ' ' | sed 's/^ //')"
[ "$dims" = "0 0 4 176 0 0 7 208" ] || fail "the screenshot is not 1200x2000 (IHDR: $dims)"

# The charts' colours must be on screen: data parallel's throughput bar, the compute share of
# the step-time bars, pipeline 1F1B's bar, the optimizer segments.
check "the charts' colours on the screenshot"
if command -v python3 >/dev/null 2>&1; then
  python3 - "$png" <<'EOF' || fail "the screenshot lacks the charts' colours"
import struct, sys, zlib
data = open(sys.argv[1], 'rb').read()
pos, idat = 8, b''
while pos < len(data):
    n, = struct.unpack('>I', data[pos:pos + 4])
    kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
    pos += 12 + n
    if kind == b'IHDR':
        w, h, depth, ctype = struct.unpack('>IIBB', body[:10])
    elif kind == b'IDAT':
        idat += body
bpp = {2: 3, 6: 4}[ctype]
raw, stride = zlib.decompress(idat), w * bpp
prev, i, counts = bytearray(stride), 0, {}
want = {(0x4e, 0x79, 0xa7): 'data parallel bar', (0x2b, 0x6c, 0xb0): 'compute',
        (0xb0, 0x7a, 0xa1): 'pipeline 1F1B bar', (0x2f, 0x9e, 0x44): 'optimizer'}
for y in range(h):
    f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
    i += 1 + stride
    for x in range(stride):
        a = line[x - bpp] if x >= bpp else 0
        b = prev[x]
        c = prev[x - bpp] if x >= bpp else 0
        if f == 1: line[x] = (line[x] + a) & 255
        elif f == 2: line[x] = (line[x] + b) & 255
        elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    for x in range(0, stride, bpp):
        px = tuple(line[x:x + 3])
        if px in want:
            counts[px] = counts.get(px, 0) + 1
    prev = line
ok = True
for px, name in want.items():
    n = counts.get(px, 0)
    print('%-18s %6d pixels' % (name, n))
    if n < 100:
        ok = False
sys.exit(0 if ok else 1)
EOF
else
  skip_check "python3 not found: the screenshot's colours are not checked"
fi

if [ -n "${TEST_UNDECLARED_OUTPUTS_DIR:-}" ]; then
  cp "$png" "$out/report.html" "$TEST_UNDECLARED_OUTPUTS_DIR/" 2>/dev/null || true
fi
echo "PASSED: report.html rendered to a ${size}-byte 1200x2000 screenshot with its charts"
