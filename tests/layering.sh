#!/usr/bin/env bash
# Every #include "..." of src/ goes down the layer order of docs/internals.md
# ("Layers"): never up, never sideways to a sibling, and into another
# layer's src/ headers only through the interfaces that section lists.
#   tests/layering.sh [ROOT]     (ROOT: the source tree, default: this one)
#   tests/layering.sh --self-test
# Prints one line per offending include, FILE:LINE: what is wrong, and
# exits 1 when there is one. --self-test plants one bad include at a time
# in a copy of this tree and checks that each is reported.
set -euo pipefail

if [ "${1:-}" = --self-test ]; then
    here=$(cd "$(dirname "$0")/.." && pwd)
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    fails=0
    # plant FILE LINE-TO-ADD EXPECTED: a copy with the line appended to FILE
    # must fail with EXPECTED among the messages.
    plant() {
        rm -rf "$tmp/t" && mkdir -p "$tmp/t/docs" && cp -r "$here/src" "$tmp/t/" &&
            cp "$here/docs/internals.md" "$tmp/t/docs/"
        mkdir -p "$(dirname "$tmp/t/$1")" && echo "$2" >> "$tmp/t/$1"
        if out=$(bash "$here/tests/layering.sh" "$tmp/t" 2>&1); then
            echo "FAIL: $1 + '$2' passed"; fails=$((fails + 1))
        elif ! grep -qF -- "$3" <<<"$out"; then
            echo "FAIL: $1 + '$2': expected '$3', got: $out"; fails=$((fails + 1))
        else
            echo "ok: $3"
        fi
    }
    n=$(($(wc -l < "$here/src/core/core.c") + 1))
    plant src/core/core.c '#include "obs/obs.h"' "src/core/core.c:$n: obs/obs.h: upward, from core to obs"
    plant src/nn/model.c '#include "dtrain/train.h"' 'dtrain/train.h: upward, from nn to obs'
    plant src/ckpt/checkpoint.c '#include "obs/json.h"' 'obs/json.h: upward, from ckpt to obs'
    plant src/comm/shm/shm.c '#include "comm/registry.h"' 'comm/registry.h: upward, from comm/shm to comm/registry'
    plant src/engine/worker.c '#include "engine/checkpoints.h"' \
        'engine/checkpoints.h: sideways, from engine/worker to its sibling engine/checkpoints'
    plant src/engine/codecs/codec.c '#include "engine/strategies/strategy.h"' \
        'engine/strategies/strategy.h: upward, from engine/codecs/codec to engine/strategies/strategy'
    plant src/run/launch.c '#include "comm/comm_impl.h"' \
        'comm/comm_impl.h: a private header of comm (not among the interfaces of docs/internals.md)'
    plant src/engine/loop.c '#include "nn/nn_impl.h"' 'nn/nn_impl.h: a private header of nn'
    plant src/data/idx.c '#include "stray.h"' 'stray.h: not a header of any layer in docs/internals.md'
    plant src/data/idx.c '#include "dtrain/extra.h"' 'dtrain/extra.h: a public header no layer owns'
    plant src/newlayer/x.c '#include "dtrain/core.h"' 'src/newlayer/x.c: in no layer of docs/internals.md'
    rm -rf "$tmp/t" && mkdir -p "$tmp/t/docs" && cp -r "$here/src" "$tmp/t/" && echo "# no block" > "$tmp/t/docs/internals.md"
    if out=$(bash "$here/tests/layering.sh" "$tmp/t" 2>&1) || ! grep -qF 'no ```layers block' <<<"$out"; then
        echo "FAIL: a missing layers block: $out"; fails=$((fails + 1))
    else
        echo "ok: a missing layers block"
    fi
    if ! out=$(bash "$here/tests/layering.sh" "$here" 2>&1); then
        echo "FAIL: this tree: $out"; fails=$((fails + 1))
    fi
    echo "$fails failed"
    exit $((fails > 0))
fi
root=$(cd "${1:-$(dirname "$0")/..}" && pwd)
doc="$root/docs/internals.md"

# The ```layers block: one rank a line, bottom first; the units of a line
# are siblings; "unit: headers" names the public headers a unit owns;
# "interfaces: ..." lists the src/ headers other layers may include.
block=$(awk '/^```layers$/ {on = 1; next} on && /^```$/ {exit} on' "$doc")
if [ -z "$block" ]; then
    echo "$doc: no \`\`\`layers block" >&2
    exit 1
fi

awk -F '\t' '
function die(msg) { print msg > "/dev/stderr"; bad = 1 }
# The unit of a path under src/ without its extension ("comm/shm/shm_host"):
# the longest unit that is the path or a directory above it.
function unit_of(p,    u, best) {
    best = ""
    for (u in rank)
        if ((p == u || index(p, u "/") == 1) && length(u) > length(best)) best = u
    return best
}
function top(u) { sub(/\/.*/, "", u); return u }
FNR == NR {  # the layers block
    line = $0
    sub(/#.*/, "", line)
    gsub(/^[ \t]+|[ \t]+$/, "", line)
    if (line == "") next
    n = split(line, w, /[ \t]+/)
    if (w[1] == "interfaces:") { for (i = 2; i <= n; i++) iface[w[i]] = 1; next }
    r++
    for (i = 1; i <= n; i++) {
        if (w[i] == ":") continue
        if (w[i] ~ /\.h$/) { hdr[w[i]] = owner; continue }  # owned by the unit before it
        owner = w[i]; sub(/:$/, "", owner)
        rank[owner] = r
    }
    next
}
{  # "FILE\tLINE\tHEADER" for every quoted include under src/
    file = $1; line = $2; h = $3
    if (h ~ /^dtrain\// || h in hdr) {
        if (!(h in hdr)) { die(file ":" line ": " h ": a public header no layer owns in docs/internals.md"); next }
        uh = hdr[h]; private = 0
    } else {
        p = h; sub(/\.h$/, "", p)
        uh = unit_of(p); private = 1
        if (uh == "") { die(file ":" line ": " h ": not a header of any layer in docs/internals.md"); next }
    }
    p = file; sub(/^src\//, "", p); sub(/\.[ch]$/, "", p)
    uf = unit_of(p)
    if (uf == "") { if (!(file in lost)) die(file ": in no layer of docs/internals.md"); lost[file] = 1; next }
    if (uf == uh) next
    if (rank[uh] > rank[uf]) die(file ":" line ": " h ": upward, from " uf " to " uh)
    else if (rank[uh] == rank[uf]) die(file ":" line ": " h ": sideways, from " uf " to its sibling " uh)
    else if (private && top(uh) != top(uf) && !(h in iface))
        die(file ":" line ": " h ": a private header of " top(uh) " (not among the interfaces of docs/internals.md)")
}
END { exit bad }
' <(printf '%s\n' "$block") <(cd "$root" && grep -rn --include='*.[ch]' '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' src |
    sed -E 's/^([^:]*):([0-9]*):[^"]*"([^"]*)".*/\1\t\2\t\3/') && exit 0
exit 1
