"""report.md: headline rows from the benchmark JSONs, missing benchmarks listed as not run."""

import json

from benchmarks.report import build


def test_report_rows_ratios_and_verdicts(tmp_path):
    (tmp_path / "transfer.json").write_text(json.dumps({
        "gib_per_s": {"write_back": 9.0, "fetch": 6.0, "memcpy_to_shm": 10.0, "memcpy_from_shm": 10.0},
        "ratios": {"write_back_vs_memcpy": 0.9, "fetch_vs_memcpy": 0.6}}))
    (tmp_path / "residency.json").write_text(json.dumps({
        "settings": {"concurrency": [1, 2, 8]},
        "targets": {"adaptive_vs_full_at_low_load": {"1": 0.98, "2": 0.9}, "adaptive_vs_sparse_at_high_load": 1.2,
                    "full_admission_wall": 2}}))
    text = build(tmp_path)
    lines = text.splitlines()
    assert "| transfer | page write-back vs memcpy (CPU, shm) | GiB/s | 9 | 10 | 0.9 | >= 0.70 | PASS |" in lines
    assert "| transfer | page fetch vs memcpy (CPU, shm) | GiB/s | 6 | 10 | 0.6 | >= 0.70 | FAIL |" in lines
    assert any(line.startswith("| residency | adaptive vs always-full at concurrency 2 |") and line.endswith("FAIL |")
               for line in lines)
    assert "| decode | not run (no `decode.json`) | | | | | | |" in lines
    assert "gpu kernels" not in text  # no GPU folder given
