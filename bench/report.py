#!/usr/bin/env python3
"""bench/report.py: kiln-bench's plots, drawn with matplotlib from results.json.

usage: report.py RESULTS_JSON OUT_DIR

Writes one PNG per section and unit into OUT_DIR and prints, for kiln-bench,
one line per plot "PLOT<TAB>section<TAB>file<TAB>title", or a single
"SKIP<TAB>reason" when plots cannot be drawn (matplotlib missing, no rows).
"""
import json
import os
import re
import sys


def skip(reason):
    print("SKIP\t%s" % reason)
    return 0


def label(row):
    parts = [row["device"], row["provider"] + (" *" if row.get("fastest_chose") else "")]
    text = "%s  %s  %s" % (row["name"], row["params"], " ".join(parts))
    return text if len(text) <= 70 else text[:67] + "..."


def main(argv):
    if len(argv) != 3:
        return skip("report.py needs RESULTS_JSON and OUT_DIR")
    json_path, out_dir = argv[1], argv[2]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        return skip("matplotlib is not available to %s (%s); on Debian: apt install python3-matplotlib, or run "
                    "scripts/bench.sh, which installs it"
                    % (sys.executable, exc))
    with open(json_path, encoding="utf-8") as f:
        results = json.load(f)
    made = 0
    for section in results.get("sections", []):
        rows = [r for r in section.get("rows", []) if r.get("measured") and r["stats"].get("median") is not None]
        units = []
        for r in rows:
            if r["unit"] not in units:
                units.append(r["unit"])
        for unit in units:
            group = [r for r in rows if r["unit"] == unit]
            if not group:
                continue
            height = max(2.5, 0.32 * len(group) + 1.2)
            fig, ax = plt.subplots(figsize=(10, height))
            names = [label(r) for r in group]
            med = [r["stats"]["median"] for r in group]
            lo = [max(0.0, m - (r["stats"]["min"] if r["stats"]["min"] is not None else m)) for m, r in zip(med, group)]
            hi = [max(0.0, (r["stats"]["max"] if r["stats"]["max"] is not None else m) - m) for m, r in zip(med, group)]
            colors = ["#999999" if r.get("peer") else ("#e07b39" if r.get("fastest_chose") else "#3b75af")
                      for r in group]
            ypos = list(range(len(group)))
            ax.barh(ypos, med, xerr=[lo, hi], color=colors, capsize=2)
            ax.set_yticks(ypos)
            ax.set_yticklabels(names, fontsize=7)
            ax.invert_yaxis()
            better = "higher is better" if group[0].get("higher_is_better") else "lower is better"
            ax.set_xlabel("%s (median, whiskers min..max; %s)" % (unit, better))
            positive = [m for m in med if m and m > 0]
            if positive and max(positive) / min(positive) > 200:
                ax.set_xscale("log")
            title = "%s: %s" % (section["title"], unit)
            ax.set_title(title + "  (grey: peers, blue: kiln, orange: fastest's choice)", fontsize=9)
            fig.tight_layout()
            file = "%s_%s.png" % (section["id"], re.sub(r"[^A-Za-z0-9]+", "_", unit).strip("_") or "value")
            fig.savefig(os.path.join(out_dir, file), dpi=90)
            plt.close(fig)
            print("PLOT\t%s\t%s\t%s" % (section["id"], file, title))
            made += 1
    if made == 0:
        return skip("no measured rows to plot")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
