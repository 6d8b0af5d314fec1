"""Drafter training (``services/decoder/spec/training``): a tiny end-to-end run on real target
weights, overfitting, exact resume, checkpoint round trip, and the acceptance evaluator."""

import json

import pytest
import torch

from dhisparse import LLM
from services.decoder.spec.dflash.checkpoint import load_checkpoint
from services.decoder.spec.dflash.model import DraftNet
from services.decoder.spec.training.dataset import Sequence, load_dataset
from services.decoder.spec.training.distill import RecordWriter, distill, read_records
from services.decoder.spec.training.evaluate import (
    draft_acceptance,
)
from services.decoder.spec.training.features import (
    FeatureStore,
    extract_features,
    load_features,
)
from services.decoder.spec.training.pipeline import (
    PipelineOptions,
    default_config,
    run_pipeline,
)
from services.decoder.spec.training.prompts import build_prompts
from services.decoder.spec.training.target_init import init_from_target
from services.decoder.spec.training.trainer import (
    Trainer,
    TrainOptions,
    init_trainable,
    sequence_loss,
)
from services.decoder.spec.training.validation import (
    is_validation,
    split_validation,
    validation_bucket,
)

TINY = {"num_layers": 1, "intermediate_size": 128, "block_size": 8, "target_layers": (3, 20)}


def tiny_options(tmp, kind="dflash", **train):
    train = {"steps": 3, "seqs_per_step": 2, "anchors_per_seq": 4, "warmup_steps": 1, **train}
    return PipelineOptions(kind=kind, out=tmp / f"out-{kind}", data_dir=tmp / "data", distill_minutes=0, progress=False,
                           num_layers=1, intermediate_size=128, block_size=8, target_layers=(3, 20),
                           train=TrainOptions(**train))


@pytest.fixture(scope="module")
def llm(loaded_model):
    return LLM(loaded=loaded_model, max_num_seqs=4)


@pytest.fixture(scope="module")
def trained(llm, tmp_path_factory):
    """Three training prompts and one held-out prompt distilled (24 new tokens, features captured
    on the way), then the whole pipeline from the cache: 3 steps of a 1-layer DFlash,
    evaluation, checkpoint."""
    tmp = tmp_path_factory.mktemp("train")
    chat = [p for p in build_prompts(600) if p.kind == "chat"]
    prompts = [p for p in chat if p.split == "train"][:3] + [p for p in chat if p.split == "heldout"][:1]
    assert len(prompts) == 4
    opts = tiny_options(tmp)
    store = FeatureStore(opts.data_dir, opts.target_layers)
    stats = distill(llm, prompts, opts.data_dir, concurrency=4, max_new_tokens=24, progress=False, features=store)
    assert stats["prompts"] == 4 and len(store.index["sequences"]) == 4
    facts = run_pipeline(opts, llm=llm)
    return tmp, opts, facts


def test_distill_cache_is_resumable(llm, trained):
    _tmp, opts, _ = trained
    records = read_records(opts.data_dir)
    assert len(records) == 4 and {r.split for r in records} == {"train", "heldout"}
    assert all(0 < len(r.answer_ids) <= 24 and r.prompt_ids for r in records)
    prompts = [p for p in build_prompts(600) if p.key in {r.key for r in records}]
    again = distill(llm, prompts, opts.data_dir, concurrency=4, max_new_tokens=24, progress=False)
    assert again == {"prompts": 0, "answer_tokens": 0, "skipped": 4}
    # a torn last line (killed writer) is ignored, then cut off by the next writer
    path = opts.data_dir / "distill.jsonl"
    path.write_bytes(path.read_bytes() + b'{"key": "torn')
    assert len(read_records(opts.data_dir)) == 4
    RecordWriter(opts.data_dir).close()
    assert path.read_bytes().endswith(b"\n") and len(read_records(opts.data_dir)) == 4


def test_captured_features_equal_a_dense_prefill(llm, trained, tmp_path):
    _, opts, _ = trained
    records = read_records(opts.data_dir)[:2]
    stats = extract_features(llm.engine.model, records, tmp_path, opts.target_layers, progress=False)
    assert stats["sequences"] == 2
    captured = load_features(opts.data_dir, opts.target_layers)
    dense = load_features(tmp_path, opts.target_layers)
    for r in records:
        end = len(r.token_ids) - 2  # the engine never computes the last two positions' states
        assert captured[r.key].shape == dense[r.key].shape == (len(r.token_ids), 2 * 576)
        torch.testing.assert_close(captured[r.key][:end].float(), dense[r.key][:end].float(), rtol=1e-2, atol=2e-2)
    assert extract_features(llm.engine.model, records, tmp_path, opts.target_layers, progress=False)["sequences"] == 0


def test_distillation_can_take_one_kind_of_the_built_in_prompts():
    from services.decoder.spec.training.pipeline import distill_prompts

    every = build_prompts(300)
    chat = distill_prompts(300, ("chat",))
    assert chat == [p for p in every if p.kind == "chat"] and 100 < len(chat) < 300
    assert distill_prompts(300) == every
    with pytest.raises(ValueError, match="unknown prompt kinds"):
        distill_prompts(300, ("poetry",))


def test_prompt_set_is_deterministic_with_a_fixed_split():
    first, second = build_prompts(300), build_prompts(300)
    assert [p.text for p in first] == [p.text for p in second]
    assert [p.key for p in build_prompts(100)] == [p.key for p in first[:100]]
    assert {p.kind for p in first} == {"chat", "code", "doc"}
    train_groups = {p.group for p in first if p.split == "train"}
    assert not train_groups & {p.group for p in first if p.split == "heldout"}


def test_pipeline_writes_a_loadable_checkpoint_that_proposes_identically(llm, trained):
    _tmp, opts, facts = trained
    raw = json.loads((opts.out / "config.json").read_text())
    assert raw["dhisparse"]["steps"] == 3 and raw["dflash_config"]["block_size"] == 8
    assert (opts.out / "README.md").read_text().startswith("# DFLASH drafter")
    assert not list(opts.out.glob("*.pt")), "training state stays out of the checkpoint folder"
    net = load_checkpoint(opts.out)
    embed = llm.engine.model.embed_tokens.float()
    _, heldout = load_dataset(opts.data_dir, net.cfg.target_layer_ids, net.cfg.block_size)
    again = draft_acceptance(net, embed, heldout)
    assert again == facts["heldout_acceptance"]["draft"]
    assert 1.0 <= again["mean_acceptance_length"] <= 8.0 and again["anchors"] > 0


def test_rescoring_a_checkpoint_rewrites_its_figures_and_keeps_hand_written_card_sections(llm, trained, tmp_path):
    import shutil

    from services.decoder.spec.dflash.checkpoint import read_facts, write_facts
    from services.decoder.spec.training.rescore import (
        rescore_checkpoint,
        write_rescored,
    )

    _tmp, opts, facts = trained
    ckpt = tmp_path / "ckpt"
    shutil.copytree(opts.out, ckpt)
    embed = llm.engine.model.embed_tokens
    assert rescore_checkpoint(ckpt, opts.data_dir, embed) == facts["heldout_acceptance"]
    # an older card: a stale figure in config.json and a hand-written section after the table
    stale = read_facts(ckpt)
    stale["heldout_acceptance"]["draft"]["mean_acceptance_length"] = 7.5
    write_facts(ckpt, stale)
    card = (ckpt / "README.md").read_text()
    (ckpt / "README.md").write_text(card + "\n## Training history\n\nStage 1: by hand.\n")
    write_rescored(ckpt, rescore_checkpoint(ckpt, opts.data_dir, embed))
    assert read_facts(ckpt)["heldout_acceptance"] == facts["heldout_acceptance"]
    assert read_facts(ckpt)["steps"] == facts["steps"]  # the other facts stay
    new_card = (ckpt / "README.md").read_text()
    assert new_card.startswith(card) and new_card.count("## Held-out acceptance") == 1
    assert new_card.endswith("## Training history\n\nStage 1: by hand.\n")
    assert load_checkpoint(ckpt).cfg == load_checkpoint(opts.out).cfg
    with pytest.raises(ValueError, match="no held-out sequence"):
        rescore_checkpoint(ckpt, tmp_path / "empty", embed)


def test_loss_decreases_on_a_fixed_batch(llm, trained):
    _tmp, opts, _ = trained
    train, _ = load_dataset(opts.data_dir, opts.target_layers, 8)
    cfg = default_config("dflash", llm.engine.model.config, **TINY)
    torch.manual_seed(0)
    net = DraftNet(cfg)
    embed = llm.engine.model.embed_tokens.float()
    seq = train[0]
    anchors = torch.arange(seq.answer_start, seq.answer_start + 6)
    options = TrainOptions(steps=20)
    optim = torch.optim.AdamW(net.parameters(), lr=3e-3)
    losses = []
    for _ in range(12):
        optim.zero_grad()
        loss, _ = sequence_loss(net, embed, seq, anchors, options)
        loss.backward()
        optim.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0], losses


def test_resume_continues_from_the_saved_step_with_identical_state(llm, trained, tmp_path):
    _, opts, _ = trained
    train, _ = load_dataset(opts.data_dir, opts.target_layers, 8)
    cfg = default_config("dspark", llm.engine.model.config, **TINY, markov_rank=8)
    embed = llm.engine.model.embed_tokens.float()
    options = TrainOptions(steps=4, seqs_per_step=2, anchors_per_seq=3, warmup_steps=2)

    def fresh():
        torch.manual_seed(1)
        net = DraftNet(cfg)
        init_trainable(net, 1)
        return net

    straight = Trainer(fresh(), embed, train, options, tmp_path / "a")
    straight.train(progress=False)
    interrupted = Trainer(fresh(), embed, train, options, tmp_path / "b")
    interrupted.train(progress=False, stop_after=2)
    assert torch.load(tmp_path / "b" / "train_state.pt", weights_only=False)["step"] == 2
    resumed = Trainer(fresh(), embed, train, options, tmp_path / "b", resume=True)
    assert resumed.step == 2
    metrics = resumed.train(progress=False)
    assert resumed.step == straight.step == 4 and "bce" in metrics
    for (name, a), b in zip(straight.net.state_dict().items(), resumed.net.state_dict().values()):
        assert torch.equal(a, b), name
    assert straight.gen.get_state().equal(resumed.gen.get_state())


def test_dspark_warm_starts_from_the_dflash_checkpoint(llm, trained):
    tmp, dflash_opts, _ = trained
    opts = tiny_options(tmp, kind="dspark", steps=1)
    opts.init_from = dflash_opts.out
    facts = run_pipeline(opts, llm=llm)
    net = load_checkpoint(opts.out)
    assert net.cfg.kind == "dspark" and net.markov_head is not None and net.confidence_head is not None
    assert facts["init_from"] == str(dflash_opts.out)


def test_dflash2_trains_from_the_dflash_checkpoint_and_its_extras_learn(llm, trained):
    tmp, dflash_opts, _ = trained
    opts = tiny_options(tmp, kind="dflash2", steps=2)
    opts.init_from = dflash_opts.out
    run_pipeline(opts, llm=llm)
    net = load_checkpoint(opts.out)
    assert net.cfg.kind == "dflash2" and net.candidate_selector is not None
    # the selector's successor codebook and the convolutions' dynamic part start at zero
    assert net.candidate_selector.successor_codebook.abs().sum() > 0
    assert all(layer.attention_conv.kernel_projection.weight.abs().sum() > 0 for layer in net.layers)
    source = load_checkpoint(dflash_opts.out)
    assert not torch.equal(net.layers[0].mlp.up_proj.weight, source.layers[0].mlp.up_proj.weight)


def test_draft_layers_start_as_copies_of_the_target_top_layers(llm):
    model = llm.engine.model
    cfg = default_config("dflash", model.config, num_layers=2, intermediate_size=1536, target_layers=(3, 20))
    net = DraftNet(cfg)
    assert init_from_target(net, model) == [28, 29]
    top = model.layers[29]
    torch.testing.assert_close(net.layers[1].mlp.down_proj.weight, top.down.weight.float())
    torch.testing.assert_close(net.layers[1].self_attn.v_proj.weight, top.qkv.weight.float()[-192:])
    torch.testing.assert_close(net.norm.weight, model.final_norm.float())
    features = torch.randn(5, 2 * 576)
    torch.testing.assert_close(net.fc(features), features[:, 576:])  # the deepest feature layer (20)
    with pytest.raises(ValueError, match="intermediate_size=1536"):
        init_from_target(DraftNet(default_config("dflash", model.config, **TINY)), model)


def test_the_draft_vocabulary_is_seen_tokens_by_frequency_then_low_ids():
    from services.decoder.spec.training.draft_vocab import draft_vocabulary

    seqs = [[9, 5, 9, 7], [5, 9]]
    assert draft_vocabulary(seqs, 6, 20) == [9, 5, 7, 0, 1, 2]
    assert draft_vocabulary(seqs, 2, 20) == [9, 5]
    with pytest.raises(ValueError, match="size"):
        draft_vocabulary(seqs, 21, 20)


def test_validation_split_is_stable_disjoint_and_sized_by_percent():
    seqs = [Sequence(f"chat-{i:05d}", "chat", "train", torch.arange(4), torch.zeros(4, 2), 1) for i in range(4000)]
    train, validation = split_validation(seqs, 5.0)
    assert {s.key for s in train}.isdisjoint(s.key for s in validation)
    assert len(train) + len(validation) == len(seqs)
    assert 150 <= len(validation) <= 250  # 5% of 4,000 keys by a hash
    again = split_validation(list(reversed(seqs)), 5.0)[1]
    assert sorted(s.key for s in again) == sorted(s.key for s in validation)
    assert split_validation(seqs, 0.0)[1] == []
    with pytest.raises(ValueError, match="percent"):
        split_validation(seqs, 100.0)


def test_trainer_ships_the_best_validated_weights_and_resumes_the_choice(llm, trained, tmp_path):
    """A scripted scorer (2nd of 4 steps best): ``select_best`` restores exactly the step-2
    weights; an interrupted run resumed from its state makes the same choice."""
    _, opts, _ = trained
    train, _ = load_dataset(opts.data_dir, opts.target_layers, 8)
    cfg = default_config("dflash", llm.engine.model.config, **TINY)
    embed = llm.engine.model.embed_tokens.float()
    options = TrainOptions(steps=4, seqs_per_step=2, anchors_per_seq=3, warmup_steps=1, validate_every_s=0.0)
    scores = {1: 1.5, 2: 2.0, 3: 1.2, 4: 1.9}

    def run(run_dir, seen, stop_after=None, resume=False):
        torch.manual_seed(2)
        trainer = Trainer(DraftNet(cfg), embed, train, options, run_dir, resume=resume)

        def scripted(net):  # remembers the weights it scored
            seen[trainer.step] = {k: v.clone() for k, v in net.state_dict().items()}
            return scores[trainer.step]

        trainer.validate = scripted
        trainer.train(progress=False, stop_after=stop_after)
        return trainer

    seen = {}
    last = run(tmp_path / "last", {})
    kept = last.keep_last()  # --ship-weights last: the last step's weights, their score recorded
    assert kept["step"] == 4 and kept["score"] == 1.9 and len(kept["history"]) == 4
    trainer = run(tmp_path / "a", seen)
    for name, value in last.net.state_dict().items():
        assert torch.equal(value, seen[4][name]), name
    choice = trainer.select_best()
    assert choice["step"] == 2 and choice["score"] == 2.0 and [h["step"] for h in choice["history"]] == [1, 2, 3, 4]
    for name, value in trainer.net.state_dict().items():
        assert torch.equal(value, seen[2][name]), name
    assert not torch.equal(seen[2]["fc.weight"], seen[4]["fc.weight"])  # the choice mattered

    run(tmp_path / "b", {}, stop_after=2)
    resumed = run(tmp_path / "b", {}, resume=True)
    assert resumed.select_best()["step"] == 2
    for name, value in resumed.net.state_dict().items():
        assert torch.equal(value, seen[2][name]), name


def test_pipeline_validates_on_training_sequences_it_does_not_train_on(llm, trained, tmp_path):
    tmp, opts, _ = trained
    train, _ = load_dataset(opts.data_dir, opts.target_layers, 8)
    first = min(validation_bucket(s.key) for s in train)
    percent = (first + 1) / 100  # exactly the sequences in the lowest bucket move to validation
    validation = [s for s in train if is_validation(s.key, percent)]
    assert 1 <= len(validation) < len(train)
    options = tiny_options(tmp, steps=2, validate_every_s=0.0)
    options.out, options.run_dir, options.validation_percent = tmp_path / "out", tmp_path / "run", percent
    facts = run_pipeline(options, llm=llm)
    assert facts["train_sequences"] == len(train) - len(validation)
    v = facts["validation"]
    assert v["sequences"] == len(validation) and [h["step"] for h in v["history"]] == [1, 2]
    assert v["step"] in (1, 2) and v["score"] == max(h["score"] for h in v["history"])
    assert f"step {v['step']} of 2, the best of 2 validation scores" in (tmp_path / "out" / "README.md").read_text()
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dhisparse"]["validation"]["step"] == v["step"]
    assert v["init_may_have_trained_on_it"] is False


def test_a_warm_start_that_may_have_trained_on_the_validation_sequences_is_flagged(llm, trained, tmp_path):
    """The split is a hash of each key: a warm start trained with the same percent never saw the
    validation sequences; one trained without a split (an older checkpoint) may have."""
    import shutil

    from services.decoder.spec.dflash.checkpoint import read_facts, write_facts

    tmp, opts, _ = trained
    train, _ = load_dataset(opts.data_dir, opts.target_layers, 8)
    percent = (min(validation_bucket(s.key) for s in train) + 1) / 100
    first = tiny_options(tmp, steps=1)
    first.out, first.run_dir, first.validation_percent = tmp_path / "first", tmp_path / "run1", percent
    run_pipeline(first, llm=llm)
    older = tmp_path / "older"
    shutil.copytree(first.out, older)
    facts = read_facts(older)
    del facts["validation"]
    write_facts(older, facts)
    for init, flagged in ((first.out, False), (older, True)):
        options = tiny_options(tmp, steps=1)
        options.out, options.run_dir = tmp_path / f"from-{init.name}", tmp_path / f"run-{init.name}"
        options.validation_percent = percent
        options.init_from = init
        options.ship_weights = "last" if flagged else "best"
        facts = run_pipeline(options, llm=llm)
        assert facts["validation"]["init_may_have_trained_on_it"] is flagged
        card = (options.out / "README.md").read_text()
        assert ("may have seen them" in card) is flagged
        assert facts["validation"]["shipped"] == options.ship_weights and facts["validation"]["step"] == 1
        assert ("the last step's, as asked" in card) is flagged
