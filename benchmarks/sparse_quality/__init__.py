"""Quality of sparse (Quest-style top-k page) attention against dense attention, on real weights.

Three measurements, dense vs sparse at several top-k budgets (sink and recent pages fixed):

1. **Perplexity under teacher-forced decode.** Sparse attention applies to decode tokens only
   (prefill is dense), so perplexity must be measured the way sparse decoding sees the context:
   one token per step. For each document window of ``n`` tokens we add a request whose prompt is
   ``doc[: n - S - 1]`` (prefilled densely, in chunks) with ``max_tokens = S + 1``. After every
   ``Engine.step`` the token the engine sampled is overwritten with the true next document token
   (``request.output_ids[-1] = doc[...]``), so the next decode step feeds the real text. The
   logits are captured by wrapping ``engine.model.forward`` (as ``tests/decoder/test_sparse_engine.py``
   does) and the rows are mapped to requests by wrapping ``engine.runner.build_inputs`` (which
   returns the batch in logit-row order). A logit row is scored only when its input position is
   at or beyond the prompt end, i.e. when it came from a decode step: exactly the last ``S``
   tokens of the window are scored, each predicted by a one-token (sparse) decode step. This
   drives the ordinary engine (scheduler, page tables, digests, page-list sparse path, batching
   of several documents) unchanged; nothing in ``services/`` is patched beyond instance wrappers.
2. **Greedy agreement.** 256 greedy tokens (fewer with ``--quick``) from the same prompt, dense vs
   sparse: the length of the common prefix and the position-wise agreement.
3. **Passkey retrieval** at several context lengths and depths: repeated filler sentences with
   "The pass key is NNNNN. Remember it." inserted at a depth, then the question, in the chat
   template. Greedy 12 tokens; correct when the key's digits appear in the answer.

Documents: large modules of the CPython standard library shipped with this interpreter (a fixed,
sorted list of file names; the files actually used are recorded in the JSON), each file's first
``window`` tokens, nothing stripped.

Writes ``results/<date>-<machine>/sparse_quality.json`` and ``sparse_quality.png``.

Run: ``python -m benchmarks.sparse_quality [--quick]`` (``--quick``: tiny settings, < 60 s).

Modules: ``tasks`` (documents, passkey prompts, metrics), ``driver`` (engines per budget,
teacher-forced decode), ``report`` (targets, printout, plot), ``run`` (the whole run, CLI).
"""
