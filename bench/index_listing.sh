#!/usr/bin/env bash
# Time of listing and indexing an img2dataset folder (the dataset index of mode 'process'):
# SAMPLES samples, each an empty .jpg, a caption .txt and a .json, in folders of 10000, indexed
# by `sdtool filter --max 1` (the whole listing, one sample's metadata judged). Each sdtool given
# is run REPS times, alternating, with a warm directory cache (the CPU cost of the listing: a cold
# one measures the file system). Prints the median, min and max of wall, user and system time per
# binary, and the ratio of the medians against the first. Comparing two builds of sdtool (say,
# before and after a change to the listing) needs the other one built beside.
# Usage: [WORK=DIR] bench/index_listing.sh [SAMPLES] [REPS] SDTOOL [SDTOOL...]
set -euo pipefail
samples=${1:-100000}
reps=${2:-10}
shift 2 || { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[ $# -gt 0 ] || { echo "index_listing: name at least one sdtool" >&2; exit 2; }
work=${WORK:-/tmp/sdtrain-index-listing}
data=$work/data-$samples
if [ ! -d "$data" ]; then
    python3 - "$data.tmp" "$samples" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(root, '%05d' % (i // 10000))
    if i % 10000 == 0:
        os.makedirs(d, exist_ok=True)
    b = os.path.join(d, '%09d' % i)
    open(b + '.jpg', 'wb').close()
    with open(b + '.txt', 'w') as f:
        f.write('a cat %d\n' % i)
    with open(b + '.json', 'w') as f:
        f.write('{"punsafe": 0.01}')
PY
    mv "$data.tmp" "$data"
fi
out=$work/times.txt
: >"$out"
for tool in "$@"; do "$tool" filter --filter 'punsafe < 1' --max 1 "$data" >/dev/null; done # warm
for ((r = 0; r < reps; r++)); do
    for i in $(seq 1 $#); do
        tool=${!i}
        /usr/bin/time -f "$i %e %U %S" -a -o "$out" "$tool" filter --filter 'punsafe < 1' --max 1 \
            "$data" >/dev/null
    done
done
python3 - "$out" "$samples" "$@" <<'PY'
import statistics as st, sys
out, n, tools = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
t = {}
for line in open(out):
    i, e, u, s = line.split()
    t.setdefault(int(i), []).append((float(e), float(u), float(s)))
print('%d samples (%d files), %d runs each' % (n, 3 * n, len(t[1])))
print('%-40s %22s %22s %22s %8s' % ('sdtool', 'wall s (min-max)', 'user s', 'sys s', 'ratio'))
base = st.median(x[0] for x in t[1])
for i, tool in enumerate(tools, 1):
    cols = []
    for k in range(3):
        c = [x[k] for x in t[i]]
        cols.append('%.3f (%.3f-%.3f)' % (st.median(c), min(c), max(c)))
    print('%-40s %22s %22s %22s %8.3f' % (tool[-40:], *cols, st.median(x[0] for x in t[i]) / base))
PY
