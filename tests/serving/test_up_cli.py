"""``dhisparse up``'s command line reaches the services it is meant for."""

import pytest
import torch

from dhisparse.stack import parse_options


def test_resumable_requests_reach_the_decoder_and_need_kvtier(capsys):
    options = parse_options(["--resumable-requests", "--attention", "sparse", "--api-key", "sk-1"])
    assert "--resumable-requests" in options.decoder_args
    assert options.decoder_args[-2:] == ["--attention", "sparse"] and options.api_keys == ["sk-1"]
    assert "--resumable-requests" not in parse_options([]).decoder_args
    with pytest.raises(SystemExit) as exc:
        parse_options(["--resumable-requests", "--no-kvtier"])
    assert exc.value.code == 2 and "cannot go with --no-kvtier" in capsys.readouterr().err


def test_page_score_reaches_the_decoder_config():
    from services.decoder.config import DecoderConfig
    from services.decoder.service.__main__ import build_parser

    options = parse_options(["--attention", "sparse", "--page-score", "quest"])
    assert options.decoder_args == ["--attention", "sparse", "--page-score", "quest"]
    args = build_parser("decoder").parse_args(options.decoder_args)
    assert DecoderConfig(attention=args.attention, page_score=args.page_score).page_score == "quest"
    assert DecoderConfig().page_score == "center"  # the default: estimated attention mass
    with pytest.raises(SystemExit):
        parse_options(["--page-score", "max"])


def test_speculation_and_bf16_projections_reach_the_decoder_config():
    from services.decoder.config import DecoderConfig
    from services.decoder.service.__main__ import build_parser

    options = parse_options(["--gemm-dtype", "bfloat16", "--spec", "dspark", "--spec-tokens", "7",
                             "--verify-budget", "adaptive"])
    args = build_parser("decoder").parse_args(options.decoder_args)
    fields = {k: v for k, v in vars(args).items() if v is not None and k != "probe"}
    config = DecoderConfig(**fields)
    assert (config.gemm_dtype, config.spec, config.spec_tokens, config.verify_budget) == \
        ("bfloat16", "dspark", 7, "adaptive")
    assert config.torch_gemm_dtype == torch.bfloat16 and config.torch_dtype == torch.float32
    assert DecoderConfig().torch_gemm_dtype == torch.float32  # the default: fp32 matmuls, the oracle's numbers
    with pytest.raises(SystemExit):
        parse_options(["--spec", "eagle"])


def test_free_port_stays_out_of_the_kernels_ephemeral_range():
    """Ports the kernel hands to outgoing connections (gRPC channels, Redis clients) must not be
    the ones our services are told to listen on: CI once lost a gateway to such a collision."""
    import socket
    from pathlib import Path

    from dhisparse.stack import free_port

    low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = [free_port() for _ in range(50)]
    assert all(1024 <= p < low or p > high for p in ports), ports
    assert len(set(ports)) > 40  # drawn at random, not one port again and again
    with socket.socket() as s:  # and it is free
        s.bind(("127.0.0.1", ports[0]))
