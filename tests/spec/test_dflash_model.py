"""The DFlash / DFlash2 / DSpark draft network: the training forward equals the serving path,
checkpoints round-trip, and malformed checkpoints get clear errors."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.decoder.spec.dflash.checkpoint import load_checkpoint, save_checkpoint
from services.decoder.spec.dflash.config import DraftCheckpointError, DraftConfig
from services.decoder.spec.dflash.drafter import DFlashDrafter
from services.decoder.spec.dflash.model import DraftContext, DraftNet
from services.decoder.spec.drafter import DraftRequest
from tests.spec.dflash_fixtures import KIND_FIELDS, random_net, write_random_checkpoint

KINDS = sorted(KIND_FIELDS)


def small_config(kind: str) -> DraftConfig:
    fields = dict(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=48,
                  rms_norm_eps=1e-6, rope_theta=10000.0, vocab_size=50, block_size=5, mask_token_id=49,
                  target_layer_ids=(0, 2), context_window=6)
    fields.update({k: (min(v, 8) if isinstance(v, int) and not isinstance(v, bool) else v)
                   for k, v in KIND_FIELDS[kind].items()})
    return DraftConfig(**fields)


@pytest.mark.parametrize("kind", KINDS)
def test_training_forward_equals_the_serving_path(kind):
    """``sequence_blocks`` (many anchors, one pass, masks) vs the per-request ring context fed in
    pieces, wrapped around its window: the same hidden states, hence the same drafts."""
    cfg = small_config(kind)
    net = random_net(cfg, seed=1)
    torch.manual_seed(2)
    length = 24
    features = torch.randn(length, cfg.feature_size)
    ids = torch.randint(0, 49, (length,))
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size)
    anchors = torch.tensor([1, 4, 9, 17])  # context shorter than, equal to and past the window of 6
    drafter = DFlashDrafter(net, embed, embed)
    with torch.no_grad():
        expected = net.sequence_blocks(features, ids, anchors, embed)
        want_tokens, want_conf = net.choose(expected, ids[anchors], embed)
    for n, anchor in enumerate(anchors.tolist()):
        rid = f"r{n}"
        drafter.observe(rid, 0, features[: anchor // 2])
        drafter.observe(rid, anchor // 2, features[anchor // 2 : anchor])
        (draft,) = drafter.propose_batch([DraftRequest(rid, ids[: anchor + 1].tolist(), 10)])
        assert draft.tokens == want_tokens[n].tolist()
        torch.testing.assert_close(torch.tensor(draft.confidences), want_conf[n], rtol=1e-5, atol=1e-6)
    assert kind != "dspark" or not torch.equal(want_conf, torch.full_like(want_conf, 0.5))


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_a_drafter_without_a_confidence_head_scores_each_pick_by_its_softmax_probability(kind):
    """DFlash / DFlash2 confidences: the probability ``softmax`` of the drafter's logits gives the
    token it picked (DFlash2's selector may pick another than the argmax), in (0, 1]."""
    cfg = small_config(kind)
    net = random_net(cfg, seed=3)
    torch.manual_seed(4)
    hidden = torch.randn(2, cfg.block_size - 1, cfg.hidden_size)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size)
    with torch.no_grad():
        tokens, confidences = net.choose(hidden, torch.tensor([3, 7]), embed)
        probs = torch.softmax(net.base_logits(hidden, embed), dim=-1)
    torch.testing.assert_close(confidences, probs.gather(-1, tokens[..., None])[..., 0], rtol=1e-5, atol=1e-7)
    assert kind != "dflash" or torch.equal(tokens, probs.argmax(-1))


def test_a_batch_of_requests_drafts_what_each_drafts_alone():
    cfg = small_config("dflash")
    net = random_net(cfg, seed=3)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size)
    drafter = DFlashDrafter(net, embed, embed)
    torch.manual_seed(4)
    asks = []
    for n, length in enumerate([3, 7, 12]):
        drafter.observe(f"r{n}", 0, torch.randn(length, cfg.feature_size))
        asks.append(DraftRequest(f"r{n}", torch.randint(0, 49, (length + 1,)).tolist(), 2 + n))
    batched = drafter.propose_batch(asks)
    alone = [drafter.propose_batch([a])[0] for a in asks]
    assert [d.tokens for d in batched] == [d.tokens for d in alone]
    assert [len(d.tokens) for d in batched] == [2, 3, 4]
    drafter.release("r0")
    assert drafter.propose_batch([asks[0]])[0].tokens == []  # no context: no draft


def test_a_context_that_jumps_back_is_rebuilt():
    """A preempted request is recomputed from position 0: the ring drops what it held."""
    cfg = small_config("dflash")
    net = random_net(cfg)
    ctx = DraftContext(cfg, torch.float32)
    ctx.append(net, 0, torch.randn(9, cfg.feature_size))
    assert sorted(ctx.slot_pos.tolist()) == [3, 4, 5, 6, 7, 8]
    ctx.append(net, 0, torch.randn(2, cfg.feature_size))
    assert sorted(p for p in ctx.slot_pos.tolist() if p >= 0) == [0, 1] and ctx.end == 2


def test_observation_is_projected_only_when_the_request_drafts(monkeypatch):
    """``observe`` keeps features; the ring is filled at the next draft (one projection for the
    pending requests) and ends as an eager ring would: jumps rebuild it, old rows leave it."""
    cfg = small_config("dflash")
    net = random_net(cfg, seed=6)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size)
    lazy, eager = DFlashDrafter(net, embed, embed), DFlashDrafter(net, embed, embed)
    calls = []
    real = net.context_kv
    monkeypatch.setattr(net, "context_kv", lambda rows, pos: calls.append(len(rows)) or real(rows, pos))
    torch.manual_seed(7)
    features = torch.randn(40, cfg.feature_size)
    steps = [(0, 3), (3, 4), (4, 5), (5, 9), (2, 4), (4, 30), (30, 31)]  # (2, 4): a jump back
    for start, end in steps:
        lazy.observe("r", start, features[start:end])
    assert calls == [] and len(lazy._unstored) == len(steps)  # fewer than OBSERVE_EVERY: kept whole
    lazy._store()
    assert calls == [] and lazy.pending.num_rows("r") == cfg.context_window
    for start, end in steps:
        eager.observe("r", start, features[start:end])
        eager.context("r")
    calls.clear()
    ask = [DraftRequest("r", list(range(32)), 3)]
    assert lazy.propose_batch(ask)[0].tokens == eager.propose_batch(ask)[0].tokens
    assert calls == [cfg.context_window]  # the last window rows, in one pass
    a, b = lazy.context("r"), eager.context("r")
    assert a.end == b.end == 31 and torch.equal(a.slot_pos, b.slot_pos)
    torch.testing.assert_close(a.k, b.k, rtol=0, atol=1e-6)  # GEMM over 6 rows vs 1: rounding only
    lazy.release("r")
    assert lazy.pending.held == {} and lazy.contexts == {}


def test_steps_observed_together_equal_observing_each_alone():
    """``observe_batch`` keeps a few steps whole and stores their rows for all their requests in
    one copy: the rings end as observing request by request, step by step, would (a chunk longer
    than the window, a jump back inside the kept steps, a read before the kept steps were stored)."""
    cfg = small_config("dflash")
    net = random_net(cfg, seed=8)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size)
    batched, alone = DFlashDrafter(net, embed, embed), DFlashDrafter(net, embed, embed)
    batched.OBSERVE_EVERY = 3
    torch.manual_seed(9)
    window = cfg.context_window
    steps = [[("a", 0, 3), ("b", 0, window + 5)], [("a", 3, 1), ("b", window + 5, 2), ("c", 0, 1)],
             [("a", 4, 2), ("b", 2, 3), ("c", 1, 1)],  # b jumps back to position 2
             [("a", 6, 1), ("b", 5, 1)], [("a", 7, 1), ("c", 2, 2)]]
    for number, step in enumerate(steps):
        features = torch.randn(sum(n for *_, n in step) + 1, cfg.feature_size)  # + a rejected draft's row
        items, row = [], 0
        for request_id, start, n in step:
            items.append((request_id, start, row, n))
            row += n
        batched.observe_batch(features, items)
        for request_id, start, row, n in items:
            alone.observe(request_id, start, features[row : row + n])
        assert len(batched._unstored) == (number + 1) % batched.OBSERVE_EVERY
    assert batched.pending.num_rows("a") == 6  # the first three steps' rows; the last two wait
    for request_id, end in (("a", 8), ("b", 6), ("c", 4)):
        a, b = batched.context(request_id), alone.context(request_id)
        assert a.end == b.end == end and torch.equal(a.slot_pos, b.slot_pos)
        assert torch.equal(a.k, b.k) and torch.equal(a.v, b.v)
    batched.release("a")
    assert batched.contexts.keys() == {"b", "c"} and batched.pending.held == {}


@pytest.mark.parametrize("kind", KINDS)
def test_checkpoint_round_trip_gives_identical_proposals(tmp_path, kind):
    cfg = small_config(kind)
    net = random_net(cfg, seed=5)
    save_checkpoint(net, tmp_path / "ck")
    raw = json.loads((tmp_path / "ck" / "config.json").read_text())
    assert raw["dflash_config"]["target_layer_ids"] == [0, 2] and raw["dflash_config"]["block_size"] == 5
    loaded = load_checkpoint(tmp_path / "ck")
    assert loaded.cfg == cfg
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size)
    features = torch.randn(10, cfg.feature_size)
    ids = torch.randint(0, 49, (10,))
    anchors = torch.tensor([3, 8])
    with torch.no_grad():
        a = net.choose(net.sequence_blocks(features, ids, anchors, embed), ids[anchors], embed)
        b = loaded.choose(loaded.sequence_blocks(features, ids, anchors, embed), ids[anchors], embed)
    assert torch.equal(a[0], b[0])


def test_dflash2_checkpoint_names_follow_z_lab():
    names = set(DraftNet(small_config("dflash2")).state_dict())
    for name in ("fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_norm.weight",
                 "layers.0.attention_conv.base_kernel", "layers.0.mlp_conv.kernel_projection.weight",
                 "candidate_selector.predecessor_codebook", "candidate_selector.hidden_projection.weight"):
        assert name in names


def _corrupt(directory, edit):
    tensors = load_file(str(directory / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(directory / "model.safetensors"))


@pytest.mark.parametrize("case, match", [
    ("no_config", "no config.json"),
    ("bad_json", "not valid JSON"),
    ("no_layer_ids", "target_layer_ids"),
    ("missing_tensor", "missing \\['fc.weight'\\]"),
    ("extra_tensor", "unexpected \\['rogue'\\]"),
    ("wrong_shape", "fc.weight has shape"),
    ("nan", "non-finite"),
    ("truncated", "unreadable safetensors"),
])
def test_malformed_checkpoints_are_refused_clearly(tmp_path, case, match):
    directory = tmp_path / "ck"
    save_checkpoint(random_net(small_config("dflash")), directory)
    config = directory / "config.json"
    weights = directory / "model.safetensors"
    if case == "no_config":
        config.unlink()
    elif case == "bad_json":
        config.write_text("{not json")
    elif case == "no_layer_ids":
        raw = json.loads(config.read_text())
        del raw["dflash_config"]["target_layer_ids"]
        config.write_text(json.dumps(raw))
    elif case == "missing_tensor":
        _corrupt(directory, lambda t: t.pop("fc.weight"))
    elif case == "extra_tensor":
        _corrupt(directory, lambda t: t.__setitem__("rogue", torch.zeros(1)))
    elif case == "wrong_shape":
        _corrupt(directory, lambda t: t.__setitem__("fc.weight", torch.zeros(3, 3)))
    elif case == "nan":
        _corrupt(directory, lambda t: t["fc.weight"].__setitem__((0, 0), float("nan")))
    elif case == "truncated":
        weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(DraftCheckpointError, match=match):
        load_checkpoint(directory)


def test_a_checkpoint_for_another_target_or_kind_is_refused(tmp_path, loaded_model):
    from dhisparse import LLM

    write_random_checkpoint(tmp_path / "wide", hidden_size=640, num_heads=10, num_kv_heads=5)
    with pytest.raises(DraftCheckpointError, match="hidden_size=640 != target hidden_size=576"):
        LLM(loaded=loaded_model, spec="dflash", draft_model=str(tmp_path / "wide"))
    write_random_checkpoint(tmp_path / "deep", target_layer_ids=(2, 30))
    with pytest.raises(DraftCheckpointError, match="\\[30\\] do not exist in a 30-layer target"):
        LLM(loaded=loaded_model, spec="dflash", draft_model=str(tmp_path / "deep"))
    write_random_checkpoint(tmp_path / "plain", kind="dflash")
    with pytest.raises(DraftCheckpointError, match="holds a dflash drafter, not dspark"):
        LLM(loaded=loaded_model, spec="dspark", draft_model=str(tmp_path / "plain"))
    with pytest.raises(DraftCheckpointError, match="holds a dflash drafter, not dflash2"):
        LLM(loaded=loaded_model, spec="dflash2", draft_model=str(tmp_path / "plain"))
    write_random_checkpoint(tmp_path / "two", kind="dflash2")
    with pytest.raises(DraftCheckpointError, match="holds a dflash2 drafter, not dspark"):
        LLM(loaded=loaded_model, spec="dspark", draft_model=str(tmp_path / "two"))
    # --spec dflash serves the DFlash family: a DFlash2 checkpoint's config switches its additions on
    family = LLM(loaded=loaded_model, spec="dflash", draft_model=str(tmp_path / "two"))
    assert family.engine.speculator.drafter.net.cfg.kind == "dflash2"


@pytest.mark.parametrize("kind", KINDS)
def test_a_draft_vocabulary_that_holds_the_picks_drafts_the_same_tokens(kind):
    """Restricting the head to a subset of token ids changes nothing when the subset holds what
    the full head picks (and the Markov/selector scores, which see real token ids)."""
    cfg = small_config(kind)
    net = random_net(cfg, seed=8)
    torch.manual_seed(9)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size)
    features = torch.randn(12, cfg.feature_size)
    ids = torch.randint(0, 49, (12,))
    anchors = torch.tensor([4, 10])
    with torch.no_grad():
        hidden = net.sequence_blocks(features, ids, anchors, embed)
        full, _ = net.choose(hidden, ids[anchors], embed)
        everything = torch.randperm(cfg.vocab_size)
        assert torch.equal(net.choose(hidden, ids[anchors], embed[everything], everything)[0], full)
        if kind == "dflash":  # argmax drafts: any subset holding the picks gives them
            keep = torch.unique(torch.cat([full.flatten(), torch.tensor([0, 7, 30])]))
            assert torch.equal(net.choose(hidden, ids[anchors], embed[keep], keep)[0], full)
        drop = torch.tensor([t for t in range(cfg.vocab_size) if t != int(full[0, 0])])
        restricted, _ = net.choose(hidden, ids[anchors], embed[drop], drop)
        assert int(restricted[0, 0]) != int(full[0, 0]) and set(restricted.flatten().tolist()) <= set(drop.tolist())


def test_draft_vocabulary_files_are_checked(tmp_path):
    from services.decoder.spec.dflash.checkpoint import (
        read_draft_vocab,
        write_draft_vocab,
    )

    assert read_draft_vocab(tmp_path, 50) is None
    write_draft_vocab(tmp_path, [3, 1, 2])
    assert read_draft_vocab(tmp_path, 50).tolist() == [3, 1, 2]
    for bad in ([], [1, 1], [50], ["a"]):
        write_draft_vocab(tmp_path, bad) if all(isinstance(t, int) for t in bad) else \
            (tmp_path / "draft_vocab.json").write_text(json.dumps({"token_ids": bad}))
        with pytest.raises(DraftCheckpointError, match="token_ids"):
            read_draft_vocab(tmp_path, 50)


def test_one_pass_for_a_steps_requests_equals_appending_each():
    """``DraftContext.append_all`` (the step's requests in one projection) leaves every ring exactly
    as appending request by request would: contiguous starts, a start that resets the ring (a
    resumed request), a chunk longer than the window."""
    cfg = small_config("dflash")
    net = random_net(cfg, seed=3)
    torch.manual_seed(4)
    batched = [DraftContext(cfg, torch.float32) for _ in range(3)]
    single = [DraftContext(cfg, torch.float32) for _ in range(3)]
    with torch.no_grad():
        for step in ([(0, 3), (0, 2), (0, 9)], [(3, 1), (7, 2), (9, 1)], [(4, 2), (9, 1), (10, 8)]):
            items = [(start, torch.randn(count, cfg.feature_size)) for start, count in step]
            DraftContext.append_all(net, [(c, s, f) for c, (s, f) in zip(batched, items, strict=True)])
            for c, (s, f) in zip(single, items, strict=True):
                c.append(net, s, f)
    for a, b in zip(batched, single, strict=True):
        assert torch.equal(a.slot_pos, b.slot_pos) and a.end == b.end
        assert torch.allclose(a.k, b.k, atol=1e-6) and torch.allclose(a.v, b.v, atol=1e-6)


def test_packed_linears_serve_in_the_gemm_dtype_and_train_exactly():
    """``pack_linears(net, bf16)``: a no-grad call runs on a bf16 copy of the weight (result in
    the input's dtype, equal to the bf16-rounded reference); a call needing gradients still takes
    the fp32 weight itself, and an in-place weight update rebuilds the copy."""
    import torch.nn as nn
    import torch.nn.functional as F

    from services.decoder.spec.dflash.layers import pack_linears

    g = torch.Generator().manual_seed(3)
    holder = nn.Sequential(nn.Linear(24, 40, bias=False))
    pack_linears(holder, torch.bfloat16)
    layer = holder[0]
    x = torch.randn(8, 24, generator=g)
    with torch.no_grad():
        fast = layer(x)
    assert fast.dtype == torch.float32 and layer.fast.linear.weight.dtype == torch.bfloat16
    ref = F.linear(x.bfloat16().float(), layer.weight.detach().bfloat16().float())
    torch.testing.assert_close(fast, ref, rtol=2**-8, atol=1e-4)  # the bf16 kernel rounds its result to bf16
    exact = layer(x)  # with autograd: the fp32 weight, no rounding
    assert exact.requires_grad and torch.equal(exact.detach(), F.linear(x, layer.weight.detach()))
    with torch.no_grad():
        layer.weight.mul_(2.0)
        torch.testing.assert_close(layer(x), 2 * ref, rtol=2**-8, atol=2e-4)


def test_fused_projections_equal_the_separate_ones_and_leave_the_checkpoint_alone():
    """Serving joins each draft layer's q / k / v, gate / up, and every layer's context k / v
    into one matmul each (``FusedLinear``): their outputs equal the separate linears' (fp32
    kernels: exactly the same dot products), the state dict keeps its names and tensors, and a
    call needing gradients stays exact (``F.linear`` on the joined weights)."""
    from services.decoder.spec.dflash.layers import pack_linears

    cfg = small_config("dspark")
    net = random_net(cfg, seed=5)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    pack_linears(net)
    after = net.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    attn, mlp = net.layers[1].self_attn, net.layers[1].mlp
    x = torch.randn(3, cfg.hidden_size, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        q, k, v = attn.qkv(x)
        gate, up = mlp.gate_up(x)
        context = net.context_projection(x)
        separate = [x @ p.weight.T for p in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj)]
        per_layer = [x @ p.weight.T for layer in net.layers for p in (layer.self_attn.k_proj, layer.self_attn.v_proj)]
    for fused, alone in zip([q, k, v, gate, up, *context], separate + per_layer, strict=True):
        torch.testing.assert_close(fused, alone, rtol=1e-5, atol=1e-6)
    trained = attn.qkv(x)[2]  # with autograd: the weights themselves
    trained.sum().backward()
    assert attn.v_proj.weight.grad is not None and torch.equal(trained.detach(), x @ attn.v_proj.weight.detach().T)
