"""Drafter training on a GPU (``train-drafter --device cuda``) against the same run on the CPU:
the target's features, and the whole pipeline (features, training steps, validation, held-out
evaluation, checkpoint) on a tiny random-weight target, so no model file is needed."""

from types import SimpleNamespace

import pytest
import torch

from benchmarks import gpu_decode
from services.decoder.model.llama import LlamaModel
from services.decoder.model.loader import expected_weight_shapes
from services.decoder.model.safetensors_loader import config_from_hf
from services.decoder.spec.dflash.checkpoint import load_checkpoint
from services.decoder.spec.training.distill import Record, RecordWriter
from services.decoder.spec.training.pipeline import PipelineOptions, run_pipeline
from services.decoder.spec.training.target_features import target_features
from services.decoder.spec.training.trainer import TrainOptions

pytestmark = pytest.mark.gpu

TARGET = {**gpu_decode.SMOLLM2_COMMON, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
          "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 10000.0}
LAYERS = (1, 3)
STEPS, LR = 3, 6e-4


def random_target(device: str) -> LlamaModel:
    cfg = config_from_hf(TARGET)
    gen = torch.Generator().manual_seed(0)
    weights = {name: torch.ones(shape) if name.endswith("norm.weight") else torch.randn(shape, generator=gen) * 0.05
               for name, shape in expected_weight_shapes(cfg).items()}
    return LlamaModel(cfg, weights, gemm_plan="default", device=device)


def test_features_extracted_on_the_gpu_equal_the_cpus():
    ids = torch.randint(0, 2000, (700,), generator=torch.Generator().manual_seed(1)).tolist()  # 2 chunks of 512
    on_cpu = target_features(random_target("cpu"), ids, LAYERS)
    on_gpu = target_features(random_target("cuda"), ids, LAYERS)
    assert on_gpu.device.type == "cpu" and on_gpu.shape == on_cpu.shape == (700, 2 * TARGET["hidden_size"])
    assert torch.allclose(on_gpu, on_cpu, atol=1e-4)  # fp32 both (no TF32), reductions ordered differently


def write_records(data_dir) -> None:
    """12 sequences (9 train, 3 held out) that repeat short phrases, so a drafter can learn some."""
    gen = torch.Generator().manual_seed(2)
    writer = RecordWriter(data_dir)
    for i in range(12):
        phrase = torch.randint(0, 300, (5,), generator=gen).tolist()
        prompt = torch.randint(0, 300, (20,), generator=gen).tolist()
        writer.write(Record(f"chat/{i}", "chat", "heldout" if i % 4 == 3 else "train", prompt, phrase * 12, "length"))
    writer.close()


def run_on(device: str, tmp_path) -> tuple[dict, dict]:
    data_dir = tmp_path / device
    write_records(data_dir)
    opts = PipelineOptions(kind="dflash", out=tmp_path / f"out-{device}", data_dir=data_dir, distill_minutes=0,
                           progress=False, num_layers=1, intermediate_size=128, block_size=8, target_layers=LAYERS,
                           validation_percent=30.0, device=device,
                           train=TrainOptions(steps=STEPS, lr=LR, seqs_per_step=2, anchors_per_seq=4, warmup_steps=1,
                                              dtype="float32", validate_every_s=0.0))
    llm = SimpleNamespace(engine=SimpleNamespace(model=random_target(device)), tokenizer=None)
    facts = run_pipeline(opts, llm=llm)
    return facts, load_checkpoint(opts.out).state_dict()


def test_the_pipeline_on_the_gpu_matches_the_cpu(tmp_path):
    cpu_facts, cpu_weights = run_on("cpu", tmp_path)
    gpu_facts, gpu_weights = run_on("cuda", tmp_path)
    assert gpu_facts["device"] == torch.cuda.get_device_name()
    assert cpu_facts["device"].startswith("CPU")
    assert gpu_facts["validation"]["sequences"] == cpu_facts["validation"]["sequences"] > 0
    assert gpu_facts["steps"] == cpu_facts["steps"] == STEPS
    for name, weight in cpu_weights.items():
        # the same seeded batches; AdamW's first steps move each weight by about lr * sign(grad),
        # so a gradient within rounding of zero may flip one step: at most 2 * lr per step
        assert torch.allclose(gpu_weights[name].float(), weight.float(), atol=2 * LR * STEPS), name
    for part in ("draft", "ngram"):
        gpu, cpu = gpu_facts["heldout_acceptance"][part], cpu_facts["heldout_acceptance"][part]
        assert gpu["anchors"] == cpu["anchors"] > 0
        assert gpu["mean_acceptance_length"] == pytest.approx(cpu["mean_acceptance_length"], abs=0.05)
