"""benchmarks.spec_matrix: the matrix covers every cell issue #5 names, resumes only runs of the
same services/ tree and arguments, refuses a dirty tree, and names every failed target in matrix.md."""

import itertools
import json
import subprocess

import pytest

from benchmarks import spec as bench
from benchmarks import spec_matrix as sm


def _arg(run: sm.Run, flag: str, default: str) -> str:
    return run.args[run.args.index(flag) + 1] if flag in run.args else default


def test_every_attention_kind_and_concurrency_has_fixed_adaptive_and_an_aa_control():
    cells = {}
    for run in sm.matrix():
        if run.name.startswith("block8"):
            continue
        settings = bench.parse_settings(_arg(run, "--settings", bench.DEFAULT_SETTINGS))
        assert settings[-1] == ("none", 0, "fixed")  # the A/A control
        for cell in itertools.product([_arg(run, "--attention", "dense")], _arg(run, "--kinds", "").split(","),
                                      [int(c) for c in _arg(run, "--concurrency", "").split(",")]):
            cells.setdefault(cell, set()).update((spec, budget) for spec, _, budget in settings)
    assert set(cells) == set(itertools.product(("dense", "sparse"), ("chat", "code_edit", "long_doc_qa"), (1, 4, 16)))
    for cell, got in cells.items():
        for drafter in ("dspark", "dflash"):
            assert {(drafter, "fixed"), (drafter, "adaptive")} <= got, cell
        if cell[1] == "code_edit":
            assert {("ngram", "fixed"), ("ngram", "adaptive")} <= got
    block8 = next(r for r in sm.matrix() if r.name.startswith("block8"))
    assert {(s, k) for s, k, _ in bench.parse_settings(_arg(block8, "--settings", ""))} >= {("dspark", 7), ("dflash", 7)}


def _spec_json(targets: dict) -> dict:
    row = {"attention": "dense", "kind": "chat", "concurrency": 16, "spec": "dspark", "spec_tokens": 1,
           "verify_budget": "fixed", "tokens_per_s": 12.0, "speedup_vs_none": 1.2, "mean_acceptance_length": 1.5}
    # an adaptive k=7 row that drafted nothing: not a block-8 acceptance figure
    adaptive = dict(row, spec_tokens=7, verify_budget="adaptive", speedup_vs_none=1.0, mean_acceptance_length=0.0)
    return {"rows": [row, adaptive], "targets": targets}


def test_pending_reruns_missing_and_other_tree_runs_and_summary_names_failures(tmp_path):
    runs = sm.matrix()[:3]
    state = {"commit": "c" * 40, "services_tree": "a" * 40}
    (tmp_path / f"{runs[0].name}.json").write_text(json.dumps(_spec_json({"all_lossless": True})))
    (tmp_path / f"{runs[1].name}.json").write_text(json.dumps(_spec_json({"all_lossless": True, "x_target": False})))
    manifest = {runs[0].name: dict(state, wall_s=10.0, args=list(runs[0].args)),
                runs[1].name: dict(state, services_tree="b" * 40, args=list(runs[1].args))}
    assert sm.pending(runs, tmp_path, manifest, state) == runs[1:]  # other tree, then missing
    other_args = {**manifest, runs[0].name: dict(manifest[runs[0].name], args=["--kinds", "chat"])}
    assert sm.pending(runs, tmp_path, other_args, state) == runs  # the same tree with other arguments
    text = sm.summary(runs, tmp_path, manifest)
    assert f"| {runs[0].name} | unrecorded: not counted | | | |" in sm.summary(runs, tmp_path, {})
    assert f"| {runs[0].name} | cccccccccc | aaaaaaaaaa | 10.0 | 1/1 pass |" in text
    assert f"| {runs[2].name} | not run | | | |" in text
    assert f"Failed targets: {runs[1].name}: x_target." in text and "Services trees measured: 2" in text
    assert "speculation dspark k=1 fixed, chat c=16 vs none" in text  # the rows, in report's table
    assert "mean acceptance length" not in text and "| FAIL |" not in text


def test_a_dirty_services_tree_is_refused(tmp_path, monkeypatch):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q", str(tmp_path)], check=True)
    (tmp_path / "services").mkdir()
    (tmp_path / "services" / "a.py").write_text("x = 1\n")
    subprocess.run(git + ["-C", str(tmp_path), "add", "."], check=True)
    subprocess.run(git + ["-C", str(tmp_path), "commit", "-qm", "a"], check=True)
    monkeypatch.chdir(tmp_path)
    state = sm.services_state()
    assert len(state["commit"]) == 40 and len(state["services_tree"]) == 40
    (tmp_path / "services" / "a.py").write_text("x = 2\n")
    with pytest.raises(SystemExit, match="uncommitted"):
        sm.services_state()
