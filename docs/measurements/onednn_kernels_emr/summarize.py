"""Group the oneDNN verbose logs of run.sh: per width and precision, the convolutions' time by kernel
(implementation) and by whether their channels are multiples of 16, over the step's executions.

    python docs/measurements/onednn_kernels_emr/summarize.py > docs/measurements/onednn_kernels_emr/summary.txt
"""

import gzip
import re
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent


def rows(path: Path):
    """(primitive kind, implementation, ic, oc, milliseconds) of each executed primitive."""
    for line in gzip.open(path, "rt"):
        f = line.rstrip("\n").split(",")
        if "exec" not in f:
            continue
        i = f.index("exec")
        kind, impl = f[i + 2], f[i + 3]
        desc = next((x for x in f if re.search(r"\bmb\d+", x)), "")
        ic = re.search(r"ic(\d+)", desc)
        oc = re.search(r"oc(\d+)", desc)
        try:
            ms = float(f[-1])
        except ValueError:
            continue
        yield kind, impl, int(ic.group(1)) if ic else 0, int(oc.group(1)) if oc else 0, ms


def main() -> None:
    for path in sorted(HERE.glob("logs/*.csv.gz"), key=lambda p: (p.stem.split("_")[2], int(p.stem.split("_")[1]))):
        by_kind, by_conv = defaultdict(float), defaultdict(float)
        for kind, impl, ic, oc, ms in rows(path):
            by_kind[kind] += ms
            if kind in ("convolution", "deconvolution"):
                aligned = "on 16" if ic % 16 == 0 and oc % 16 == 0 else "off 16"
                by_conv[(kind, impl, aligned, ic, oc)] += ms
        total = sum(by_kind.values())
        print(f"\n== {path.name.removesuffix('.csv.gz')}: {total / 1000:.2f} s of primitives over the logged steps")
        for kind, ms in sorted(by_kind.items(), key=lambda kv: -kv[1])[:6]:
            print(f"   {ms / 1000:7.2f} s  {kind}")
        for (kind, impl, aligned, ic, oc), ms in sorted(by_conv.items(), key=lambda kv: -kv[1])[:10]:
            print(f"   {ms / 1000:7.2f} s  {kind:13s} {impl:32s} ic {ic:4d} oc {oc:4d}  {aligned}")


if __name__ == "__main__":
    main()
