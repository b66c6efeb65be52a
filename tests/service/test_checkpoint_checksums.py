"""Every file of a checkpoint is checksummed, the manifest's own body included.

The attacks: one bit flipped in ``MANIFEST.json`` (``"batches": 90`` -> ``91`` in its
meta) was accepted and a resume silently skipped 512 examples; bit flips in a worker's
``*.state.npy`` and edits of a server's ``server<i>-of-<S>.json`` were accepted. Now the
manifest carries the sha256 of its body and of every file beside it, each generation
lists every file of its directory (the worker's state files included), and a mismatch
is refused naming the file.
"""

import json
import os

import numpy as np
import pytest
from support.service import ServerGroup

from pyfleet.errors import RemoteError
from pyfleet.service import checkpoint as ck
from pyfleet.service.client import Client

pytestmark = pytest.mark.timeout(120)

SPARSE = {"kind": "sparse", "name": "emb", "dim": 4,
          "optimizer": {"type": "SGD", "learning_rate": 0.1},
          "initializer": {"type": "Constant", "value": 0.0}, "seed": 0}


@pytest.fixture
def checkpoint(tmp_path):
    """A committed checkpoint ``root/ckpt`` of two servers, a worker's state file in
    its generation (as fleet.save_persistables writes it), another beside its
    manifest (as earlier versions wrote them) and ``{"batches": 90}`` as its meta;
    yields ``(root, client)``."""
    root = tmp_path / "root"
    root.mkdir()
    with ServerGroup(2, 1, checkpoint_dir=root) as g, \
            Client(g.endpoints, timeout=20, heartbeat_interval=0) as c:
        c.create_tables([SPARSE])
        c.push_sparse("emb", np.arange(1, 101, dtype=np.uint64), np.ones((100, 4), np.float32))
        replies = c.save("ckpt/g000001-full")
        np.save(root / "ckpt" / "g000001-full" / "auc.state.npy", np.arange(8, dtype=np.int64))
        np.save(root / "ckpt" / "old_auc.state.npy", np.arange(4, dtype=np.int64))
        m = ck.build_manifest(None, "g000001-full", "full", replies, [SPARSE], None, None,
                              meta={"batches": 90})
        m["state_dir"] = "g000001-full"
        ck.commit(str(root / "ckpt"), m)
        yield root, c


def _flip(path, old, new):
    data = path.read_bytes()
    assert data.count(old) == 1, (path, old)
    path.write_bytes(data.replace(old, new))


def _refused(root, c, match):
    with pytest.raises(ValueError, match=match):  # noqa: PT012 (reading or verifying refuses)
        ck.read_manifest(str(root / "ckpt"))
        for _, gen, path in ck.resolve(str(root), "ckpt"):
            ck.verify_generation(path, gen)
    with pytest.raises(RemoteError, match=match):  # what a server's LOAD says
        c.load("ckpt")


def test_an_intact_checkpoint_lists_every_file_and_loads(checkpoint):
    root, c = checkpoint
    m = ck.read_manifest(str(root / "ckpt"))
    gen = m["chain"][0]
    assert set(gen["files"]) == set(os.listdir(root / "ckpt" / gen["dir"]))
    assert {"server0-of-2.json", "server1-of-2.json"} <= set(gen["files"])
    assert set(m["beside"]) == {"old_auc.state.npy"} and "auc.state.npy" in gen["files"]
    assert ck.state_dir(str(root / "ckpt"), m) == str(root / "ckpt" / gen["dir"])
    assert m[ck.BODY_KEY] == ck.body_digest(m)
    assert sum(c.load("ckpt")[i]["rows"]["emb"] for i in range(2)) == 100


def test_a_bit_flip_in_the_manifest_is_refused(checkpoint):
    root, c = checkpoint
    _flip(root / "ckpt" / ck.MANIFEST_NAME, b'"batches": 90', b'"batches": 91')
    _refused(root, c, r"MANIFEST.json is damaged: its body does not match its body_sha256")


def _flip_bit(path):
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10
    path.write_bytes(bytes(data))


def test_a_bit_flip_in_a_state_file_beside_the_manifest_is_refused(checkpoint):
    root, c = checkpoint
    _flip_bit(root / "ckpt" / "old_auc.state.npy")
    _refused(root, c, r"file old_auc.state.npy is damaged")


def test_a_bit_flip_in_a_state_file_of_the_generation_is_refused(checkpoint):
    root, c = checkpoint
    _flip_bit(root / "ckpt" / "g000001-full" / "auc.state.npy")
    path = str(root / "ckpt")
    with pytest.raises(ValueError, match=r"file g000001-full/auc.state.npy is damaged"):
        ck.state_dir(path, ck.read_manifest(path))   # what a worker reads its counters by
    _refused(root, c, r"file g000001-full/auc.state.npy is damaged")


def test_an_edited_server_json_is_refused(checkpoint):
    root, c = checkpoint
    path = root / "ckpt" / "g000001-full" / "server1-of-2.json"
    desc = json.loads(path.read_text())
    desc["tables"][0]["dim"] = 8
    path.write_text(json.dumps(desc))
    _refused(root, c, r"file g000001-full/server1-of-2.json")


def test_a_manifest_without_its_checksum_loads_only_when_asked(checkpoint):
    root, c = checkpoint
    path = root / "ckpt" / ck.MANIFEST_NAME
    m = json.loads(path.read_text())
    del m[ck.BODY_KEY]
    path.write_text(json.dumps(m))
    _refused(root, c, r"carries no checksums")
    assert ck.read_manifest(str(root / "ckpt"), unchecked_ok=True)["meta"] == {"batches": 90}


def test_an_unlisted_file_in_a_generation_is_refused(checkpoint):
    root, c = checkpoint
    (root / "ckpt" / "g000001-full" / "server2-of-2.json").write_text("{}")
    _refused(root, c, r"files \['server2-of-2.json'\] in g000001-full are not in the manifest")
