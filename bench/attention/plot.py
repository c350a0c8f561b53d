#!/usr/bin/env python3
"""Plots an attention benchmark report (bench/attention/README.md): milliseconds per forward
against sequence length, one line per (variant, window), log-log. Needs gnuplot.

  python3 bench/attention/plot.py REPORT.json OUT.png
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        report = json.load(f)
    gnuplot = shutil.which("gnuplot")
    if not gnuplot:
        print("plot.py: gnuplot not found (apt-get install gnuplot-nox)", file=sys.stderr)
        return 1
    series = {}
    for r in report["rows"]:
        name = f"{r['variant']} {'window ' + str(r['window']) if r['window'] else 'global'}"
        series.setdefault(name, []).append((r["seq_len"], r["ms_per_forward"]))
    with tempfile.TemporaryDirectory() as tmp:
        plots = []
        for i, (name, points) in enumerate(sorted(series.items())):
            dat = os.path.join(tmp, f"{i}.dat")
            with open(dat, "w") as f:
                for x, y in sorted(points):
                    f.write(f"{x} {y}\n")
            plots.append(f"'{dat}' using 1:2 with linespoints title '{name}'")
        title = (f"attention {report['mode']}: {report['backend']} on {report['device']}, "
                 f"batch {report['batch']}, dim {report['dim']}, {report['n_head']} heads")
        script = "\n".join([
            "set terminal pngcairo size 900,600" if "cairo" in subprocess.run(
                [gnuplot, "-e", "set terminal"], capture_output=True, text=True).stderr
            else "set terminal png size 900,600",
            f"set output '{argv[2]}'",
            f"set title \"{title}\" noenhanced",
            "set xlabel 'sequence length'", "set ylabel 'ms per forward'",
            "set logscale xy", "set key left top", "set grid",
            "plot " + ", ".join(plots)])
        p = subprocess.run([gnuplot], input=script, text=True, capture_output=True)
        if p.returncode != 0:
            print("plot.py: gnuplot failed: " + p.stderr, file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
