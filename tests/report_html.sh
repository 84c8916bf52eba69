#!/usr/bin/env bash
# `dtrain report` renders in a real browser: a 2-worker run with a slow rank
# (DTRAIN_SLOW_RANK), its report, then headless Chromium loads the report.
# A copy of the page with a probe script appended (the report itself has no
# script) measures every chart's drawn elements after layout; the dumped
# DOM must show each chart (loss, accuracy, throughput, breakdown,
# straggler) with data (lines, bars, dots) of non-zero size, and the flagged
# rank. A screenshot must come out as a PNG.
#   tests/report_html.sh BUILD_DIR
# Skipped (exit 77) when Chromium is not installed.
set -euo pipefail
build=$(cd "$1" && pwd)
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
    echo "SKIPPED: chromium is not installed (Debian package 'chromium'; scripts/install-deps.sh installs it)"
    exit 77
fi
src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$build/tests/make_images" "$tmp"
DTRAIN_SLOW_RANK=1:20 "$build/dtrain" train "$src/tests/fixtures/obs-mlp.ini" --workers 2 --quiet \
    --set data.dir="$tmp" --set train.epochs=2 --set train.straggler_steps=3 --run-dir "$tmp/run" >"$tmp/train.log" 2>&1 ||
    { cat "$tmp/train.log"; exit 1; }
"$build/dtrain" report "$tmp/run" -o "$tmp/report.html"

# The probe: the size of each chart's drawn elements, as the browser laid them out.
sed 's|</body>|<pre id="probe"></pre><script>{const out = {};for (const svg of document.querySelectorAll("svg.chart")) {  const sizes = [];  for (const e of svg.querySelectorAll("path.line, rect.bar, circle.dot")) {    const b = e.getBBox();    sizes.push([e.tagName, b.width, b.height]);  }  const r = svg.getBoundingClientRect();  out[svg.id] = {w: r.width, h: r.height, shapes: sizes};}document.getElementById("probe").textContent = JSON.stringify(out);}</script></body>|' \
    "$tmp/report.html" > "$tmp/probe.html"
flags=(--headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run --disable-extensions)
timeout 60 "$browser" "${flags[@]}" --dump-dom "file://$tmp/probe.html" >"$tmp/dom.html" 2>"$tmp/chromium.log" ||
    { cat "$tmp/chromium.log"; exit 1; }
timeout 60 "$browser" "${flags[@]}" --window-size=820,2600 --screenshot="$tmp/report.png" "file://$tmp/report.html" \
    >>"$tmp/chromium.log" 2>&1 || { cat "$tmp/chromium.log"; exit 1; }

python3 - "$tmp" <<'PY'
import html, json, re, sys
d = sys.argv[1]
dom = open(f"{d}/dom.html", encoding="utf-8").read()
report = open(f"{d}/report.html", encoding="utf-8").read()
failed = passed = 0
def check(ok, what):
    global failed, passed
    print(("ok   " if ok else "FAIL ") + what)
    failed += not ok
    passed += bool(ok)
m = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
check(m is not None, "the browser ran the probe")
charts = json.loads(html.unescape(m.group(1))) if m else {}
for cid in ("loss", "accuracy", "throughput", "breakdown", "straggler"):
    c = charts.get(cid)
    check(c is not None and c["w"] > 0 and c["h"] > 0, f"chart {cid} is laid out")
    if c is None:
        continue
    drawn = [s for s in c["shapes"] if s[1] > 0 and (s[2] > 0 or s[0] == "path")]
    check(len(drawn) >= 1, f"chart {cid}: {len(drawn)} data paths/bars/dots of non-zero size")
bars = [s for s in charts.get("breakdown", {}).get("shapes", []) if s[0] == "rect" and s[1] > 0 and s[2] > 0]
check(len(bars) >= 2 * 3, f"breakdown: {len(bars)} bars with area (2 ranks x phases)")
check("rank 1 (flagged)" in dom, "the straggler view flags rank 1")
check("<script" not in report and "src=" not in report and "href=" not in report, "the report loads nothing and runs no script")
png = open(f"{d}/report.png", "rb").read()
check(png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10000, f"screenshot: PNG of {len(png)} bytes")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
