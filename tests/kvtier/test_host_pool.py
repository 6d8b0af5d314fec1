import os
import stat
import subprocess
import sys
import uuid

import pytest

from services.kvtier.host_pool import HostPool, HostPoolLayout

LAYOUT = HostPoolLayout(dtype="bfloat16", num_layers=3, num_kv_heads=2, head_dim=8, page_size=4, num_host_pages=5)


@pytest.fixture
def name():
    segment = "dhs-test-" + uuid.uuid4().hex[:10]
    yield segment
    if os.path.exists(f"/dev/shm/{segment}"):
        os.unlink(f"/dev/shm/{segment}")


def test_layout_byte_strides():
    kv = 4 * 2 * 8 * 2  # page_size * heads * head_dim * bf16 bytes
    assert LAYOUT.kv_stride_bytes == kv
    assert LAYOUT.layer_stride_bytes == 2 * kv
    assert LAYOUT.host_page_bytes == 3 * 2 * kv
    assert LAYOUT.segment_bytes == 5 * 3 * 2 * kv


def test_created_owner_only_zeroed_and_reattached_intact(name):
    pool = HostPool.create(name, LAYOUT)
    st = os.stat(f"/dev/shm/{name}")
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()
    assert st.st_size == LAYOUT.segment_bytes
    assert pool.created and pool.read_page(4) == bytes(LAYOUT.host_page_bytes)
    data = bytes(range(256)) * (LAYOUT.host_page_bytes // 256)
    pool.write_page(3, data)
    pool.close()
    again = HostPool.attach(name, LAYOUT)
    assert not again.created and again.read_page(3) == data
    with pytest.raises(FileExistsError):
        HostPool.create(name, LAYOUT)
    again.unlink()
    assert not HostPool.exists(name)


def test_attach_refuses_wrong_size_and_loose_permissions(name):
    HostPool.create(name, LAYOUT).close()
    bigger = HostPoolLayout(**{**LAYOUT.to_dict(), "num_host_pages": 6})
    with pytest.raises(ValueError, match="bytes"):
        HostPool.attach(name, bigger)
    os.chmod(f"/dev/shm/{name}", 0o644)
    with pytest.raises(PermissionError):
        HostPool.attach(name, LAYOUT)


def test_a_process_that_maps_the_segment_and_exits_leaves_it(name):
    pool = HostPool.create(name, LAYOUT)
    code = (
        "from services.kvtier.host_pool import HostPool, HostPoolLayout\n"
        f"p = HostPool.attach({name!r}, HostPoolLayout(**{LAYOUT.to_dict()!r}))\n"
        f"p.write_page(1, b'\\x07' * {LAYOUT.host_page_bytes})\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert HostPool.exists(name)
    assert pool.read_page(1) == b"\x07" * LAYOUT.host_page_bytes
    pool.unlink()
