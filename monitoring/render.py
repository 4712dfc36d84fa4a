#!/usr/bin/python3
"""Draws the panels of a Grafana dashboard (monitoring/grafana-dashboard.json)
from a Prometheus server: each panel's queries are run over a time range
with /api/v1/query_range and drawn with matplotlib, in the dashboard's
order and grid, as a picture of what an operator sees.

usage: render.py DASHBOARD PROMETHEUS_URL START END OUT.png
"""
import json
import math
import sys
import urllib.parse
import urllib.request

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from datetime import datetime, timezone  # noqa: E402

UNITS = {"ops": "/s", "percentunit": "share", "s": "s", "ms": "ms", "short": ""}


def query_range(url, expr, start, end, step):
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{url}/api/v1/query_range?{params}", timeout=30) as answer:
        body = json.load(answer)
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


def legend(template, labels):
    out = template
    for name, value in labels.items():
        out = out.replace("{{" + name + "}}", value)
    return out


def main():
    dashboard_path, url, start, end, out = sys.argv[1:6]
    start, end = float(start), float(end)
    step = max(2.0, (end - start) / 300)
    dashboard = json.load(open(dashboard_path, encoding="utf-8"))
    panels = sorted(dashboard["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]))
    columns = 3
    rows = math.ceil(len(panels) / columns)
    plt.style.use("dark_background")
    figure, axes = plt.subplots(rows, columns, figsize=(18, 3.6 * rows), squeeze=False)
    figure.patch.set_facecolor("#111217")
    for index, panel in enumerate(panels):
        ax = axes[index // columns][index % columns]
        ax.set_facecolor("#181b1f")
        ax.set_title(panel["title"], loc="left", fontsize=11, color="#d8d9da")
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        drawn = 0
        for target in panel["targets"]:
            for series in query_range(url, target["expr"], start, end, step):
                points = [(float(t), float(v)) for t, v in series["values"] if v not in ("NaN", "+Inf", "-Inf")]
                if not points:
                    continue
                times = [datetime.fromtimestamp(t, tz=timezone.utc) for t, _ in points]
                ax.plot(times, [v for _, v in points], linewidth=1.4,
                        label=legend(target.get("legendFormat", ""), series["metric"]))
                drawn += 1
        if drawn == 0:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="#8e8e8e")
        ax.set_ylim(bottom=0)
        ax.set_ylabel(UNITS.get(unit, unit), fontsize=9, color="#8e8e8e")
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M"))
        ax.tick_params(labelsize=8, colors="#8e8e8e")
        ax.grid(color="#2c3235", linewidth=0.6)
        for spine in ax.spines.values():
            spine.set_color("#2c3235")
        if drawn:
            ax.legend(fontsize=7, loc="upper left", framealpha=0.3)
    for index in range(len(panels), rows * columns):
        axes[index // columns][index % columns].axis("off")
    figure.suptitle(f"{dashboard['title']} (Grafana dashboard monitoring/grafana-dashboard.json, "
                    "drawn from a real run's Prometheus series)", fontsize=13, color="#d8d9da")
    figure.tight_layout(rect=(0, 0, 1, 0.97))
    figure.savefig(out, dpi=80, facecolor=figure.get_facecolor())


if __name__ == "__main__":
    main()
