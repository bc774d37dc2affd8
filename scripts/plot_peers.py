#!/usr/bin/env python3
"""Tokens/s by shape for l2l, torch eager and torch.compile, from bench_peers.sh's output.

  python3 scripts/plot_peers.py PEERS_LOG [OUT.svg]

PEERS_LOG is what `bash scripts/bench_peers.sh` printed (tee it to a file). For each
"---- worker step, SHAPE: ..." section the script reads l2l's median (the
l2l-bench-train line "median tok/s X") and the peers' ("RESULT torch_eager_median = X",
"RESULT torch_compile_median = X"), and writes a grouped bar chart as SVG (default
docs/img/tokens_per_s.svg), written by hand: no plotting library needed. The header
lines (date, machine, load) go into the chart's caption. Exit status 1 with a message
when the log has no worker-step section.
"""
import html
import re
import sys

SERIES = [("l2l", "#1f77b4"), ("torch eager", "#ff7f0e"), ("torch.compile", "#2ca02c")]


def parse(text):
    """Returns (header lines, [(shape, description, {series: tok/s})])."""
    header = [l for l in text.splitlines() if re.match(r"^(date|machine):", l)]
    shapes = []
    cur = None
    for line in text.splitlines():
        m = re.match(r"^---- worker step, (\S+): (.*) ----$", line)
        if m:
            cur = (m.group(1), m.group(2), {})
            shapes.append(cur)
            continue
        if line.startswith("----"):
            cur = None
            continue
        if cur is None:
            continue
        m = re.search(r"median tok/s ([0-9.eE+-]+)", line)
        if m and "RESULT" not in line and "l2l" not in cur[2]:
            cur[2]["l2l"] = float(m.group(1))  # older logs: the one l2l-bench-train run
        m = re.match(r"^l2l worker tok/s, mean of the medians before and after the peer = ([0-9.eE+-]+)", line)
        if m:
            cur[2]["l2l"] = float(m.group(1))
        m = re.match(r"^RESULT torch_(eager|compile)_median = ([0-9.eE+-]+)", line)
        if m:
            cur[2]["torch eager" if m.group(1) == "eager" else "torch.compile"] = float(m.group(2))
    return header, [s for s in shapes if s[2]]


def svg(header, shapes):
    W, H = 720, 420
    left, right, top, bottom = 70, 20, 64, 95
    pw, ph = W - left - right, H - top - bottom
    vmax = max(v for _, _, d in shapes for v in d.values())
    # A round axis top: 1, 2 or 5 times a power of ten.
    base = 10.0 ** (len(str(int(vmax))) - 2)
    step = next(m * base for m in (1, 2, 5, 10, 20, 50, 100) if vmax / (m * base) <= 6)
    top_v = step * (int(vmax / step) + 1)
    y = lambda v: top + ph - ph * v / top_v
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="15">'
           'Training throughput (forward + backward), tokens/s, higher is better</text>']
    v = 0.0
    while v <= top_v + 1e-9:
        out.append(f'<line x1="{left}" y1="{y(v):.1f}" x2="{W - right}" y2="{y(v):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
        v += step
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="black"/>')
    out.append(f'<line x1="{left}" y1="{top + ph}" x2="{W - right}" y2="{top + ph}" stroke="black"/>')
    out.append(f'<text transform="translate(16,{top + ph / 2}) rotate(-90)" text-anchor="middle">tokens/s</text>')
    group = pw / len(shapes)
    bar = group * 0.8 / len(SERIES)
    for i, (shape, desc, d) in enumerate(shapes):
        x0 = left + i * group + group * 0.1
        for k, (name, color) in enumerate(SERIES):
            if name not in d:
                continue
            x = x0 + k * bar
            out.append(f'<rect x="{x:.1f}" y="{y(d[name]):.1f}" width="{bar - 2:.1f}" '
                       f'height="{top + ph - y(d[name]):.1f}" fill="{color}"/>')
            out.append(f'<text x="{x + bar / 2 - 1:.1f}" y="{y(d[name]) - 4:.1f}" text-anchor="middle" '
                       f'font-size="11">{d[name]:.0f}</text>')
        cx = left + (i + 0.5) * group
        out.append(f'<text x="{cx:.1f}" y="{top + ph + 16}" text-anchor="middle">{html.escape(shape)}</text>')
        out.append(f'<text x="{cx:.1f}" y="{top + ph + 30}" text-anchor="middle" font-size="10">'
                   f'{html.escape(desc)}</text>')
    lx = left + 10
    for name, color in SERIES:
        out.append(f'<rect x="{lx}" y="{top - 18}" width="12" height="12" fill="{color}"/>')
        out.append(f'<text x="{lx + 16}" y="{top - 8}">{html.escape(name)}</text>')
        lx += 30 + 8 * len(name)
    for j, line in enumerate(header[:2]):
        out.append(f'<text x="{left}" y="{H - 28 + 14 * j}" font-size="10">{html.escape(line)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv):
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 64
    try:
        text = open(argv[1]).read()
    except OSError as e:
        print(f"plot_peers.py: cannot read {argv[1]}: {e}", file=sys.stderr)
        return 1
    header, shapes = parse(text)
    if not shapes:
        print(f"plot_peers.py: {argv[1]}: no '---- worker step, SHAPE: ...' section with figures "
              "(is it bench_peers.sh's output?)", file=sys.stderr)
        return 1
    out = argv[2] if len(argv) == 3 else "docs/img/tokens_per_s.svg"
    with open(out, "w") as f:
        f.write(svg(header, shapes))
    for shape, _, d in shapes:
        print(f"{shape}: " + ", ".join(f"{k} {d[k]:.0f}" for k, _ in SERIES if k in d))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
