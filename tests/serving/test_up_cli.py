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
