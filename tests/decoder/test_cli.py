"""The ``dhisparse`` CLI as a user runs it (a subprocess), checked against the in-process engine."""

import json
import subprocess
import sys

from dhisparse import SamplingParams


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dhisparse", *args], capture_output=True, text=True, timeout=300)


def test_generate_json_matches_in_process_engine(llm):
    proc = run_cli("generate", "--prompt", "The capital of France is", "--max-tokens", "12", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    expected = llm.generate("The capital of France is", SamplingParams(max_tokens=12))[0]
    assert out["token_ids"] == expected.token_ids
    assert out["text"] == expected.text
    assert out["finish_reason"] == expected.finish_reason
    assert out["prompt_token_ids"] == expected.prompt_token_ids
    assert {"prefill_s", "decode_s", "decode_tokens_per_s"} <= set(out["stats"])
    assert out["stats"]["decode_tokens_per_s"] > 0


def test_chat_generate_uses_the_chat_template(llm):
    proc = run_cli("generate", "--chat", "--prompt", "Say hello.", "--max-tokens", "8", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    tok = llm.tokenizer
    templated = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Say hello."}]), add_special_tokens=False)
    assert out["prompt_token_ids"] == templated
    assert tok.decode(templated[-4:], skip_special_tokens=False).endswith("<|im_start|>assistant\n")


def test_models_pull_is_idempotent_and_prints_the_path(gguf_path):
    proc = run_cli("models", "pull")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == str(gguf_path)


def test_bad_input_exits_2_with_a_clear_message(tmp_path):
    proc = run_cli("generate", "--model", str(tmp_path / "missing.gguf"), "--prompt", "hi")
    assert proc.returncode == 2 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_cli("generate", "--prompt", "hi", "--max-tokens", "0")
    assert proc.returncode == 2 and "max_tokens" in proc.stderr
    proc = run_cli("generate", "--prompt", "hi", "--temperature", "-1")
    assert proc.returncode == 2 and "temperature" in proc.stderr
    proc = run_cli("generate", "--prompt", "", "--max-tokens", "4")
    assert proc.returncode == 2 and "empty" in proc.stderr


def test_sparse_flags_reach_the_engine(llm):
    # a budget covering the context: sparse must give the dense tokens
    proc = run_cli("generate", "--prompt", "The capital of France is", "--max-tokens", "8", "--json",
                   "--attention", "sparse", "--top-k-tokens", "4096")
    assert proc.returncode == 0, proc.stderr
    expected = llm.generate("The capital of France is", SamplingParams(max_tokens=8))[0]
    assert json.loads(proc.stdout)["token_ids"] == expected.token_ids
    proc = run_cli("generate", "--prompt", "hi", "--attention", "sparse", "--recent-pages", "0")
    assert proc.returncode == 2 and "recent_pages" in proc.stderr


def test_spec_flags_and_json_stats(llm):
    prompt = "1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2,"
    proc = run_cli("generate", "--prompt", prompt, "--max-tokens", "16", "--json", "--spec", "ngram", "--spec-tokens", "5")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["token_ids"] == llm.generate(prompt, SamplingParams(max_tokens=16))[0].token_ids
    stats = out["stats"]
    assert stats["drafted_tokens"] >= stats["accepted_tokens"] > 0
    assert stats["mean_acceptance_length"] > 1.0
