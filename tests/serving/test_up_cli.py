"""``dhisparse up``'s command line reaches the services it is meant for."""

import pytest

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
