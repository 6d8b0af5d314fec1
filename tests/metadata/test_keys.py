import pytest

from services.metadata.keys import Keys


def test_keys_are_namespaced_and_kvtier_keys_share_the_instance_prefix():
    k = Keys("ns1")
    assert k.request("r1") == "ns1:req:r1"
    assert k.decoder_heartbeat("d0") == "ns1:decoder:d0:heartbeat"
    assert k.residency("r1") == "ns1:residency:r1"
    prefix = k.kvtier_prefix("a")
    for key in (k.kvtier_info("a"), k.kvtier_requests("a"), k.kvtier_page_table("a", "r1"),
                k.kvtier_page_list("a", "r1"), k.kvtier_leases("a")):
        assert key.startswith(prefix)
    # one instance's prefix never covers another's ("a" vs "ab")
    assert not k.kvtier_info("ab").startswith(prefix)
    assert Keys("ns2").request("r1") != k.request("r1")


@pytest.mark.parametrize("bad", ["", "a:b", "a b", "x" * 129, "a*"])
def test_bad_names_are_rejected(bad):
    with pytest.raises(ValueError):
        Keys().request(bad)
