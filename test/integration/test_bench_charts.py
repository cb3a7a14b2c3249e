"""bench/lib/charts.py renders its PNG charts from a small bench result
(test/integration/data/bench_sample.json: the shape bench.py run --json writes), without
running a benchmark: each chart is a real PNG of sane size, the ratios are read from the table's
columns with their targets, and a result without a section's data makes no chart for it."""

import json
import pathlib
import struct
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from lib import charts  # noqa: E402

SAMPLE = pathlib.Path(__file__).resolve().parent / "data" / "bench_sample.json"


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "%s is no PNG" % path
    return struct.unpack(">II", head[16:24])


def test_ratio_rows_read_the_table_columns():
    res = json.loads(SAMPLE.read_text())
    assert charts.ratio_rows(res["rows"]) == [
        ("relay throughput (msg/s)", 0.79, ">=", 0.7),
        ("ingest throughput (msg/s)", 2.5, ">=", 2.0),
        ("e2e rate 40k vs 2k queued (msg/s)", 0.85, ">=", 0.9),
    ]
    assert [charts.met(*r[1:]) for r in charts.ratio_rows(res["rows"])] == [True, True, False]
    assert [n for n, _ in charts.latency_sets(res)] == ["latency", "latency_kafka"]


def test_charts_render_from_a_sample_result():
    res = json.loads(SAMPLE.read_text())
    with tempfile.TemporaryDirectory(prefix="eb-charts.") as d:
        made = charts.write_charts(res, d)
        assert sorted(pathlib.Path(p).name for p in made) == [
            "backlog.png", "latency.png", "ratios.png"]
        for p in made:
            w, h = png_size(p)
            assert 300 <= w <= 1200 and 100 <= h <= 1200, (p, w, h)
            assert pathlib.Path(p).stat().st_size < 200_000


def test_no_chart_without_its_data():
    with tempfile.TemporaryDirectory(prefix="eb-charts.") as d:
        assert charts.write_charts({"sections": ["ingest"], "rows": []}, d) == []
