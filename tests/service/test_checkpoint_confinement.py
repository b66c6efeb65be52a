"""A checkpoint's damage check stays inside the checkpoint: a generation that
is a symbolic link to another directory, or a listed file that is a link, is refused
before anything there is hashed or stat'ed, and the error reveals nothing of it."""

import os

import pytest

from pyfleet._atomic import write_json
from pyfleet.service import checkpoint as ck

GEN = "g000001-full"
SECRET = b"s" * 12345


def _checkpoint(root, link_gen=False, link_file=False):
    """A committed checkpoint ``root/ckpt`` whose one file is listed with the size and
    sha256 of ``SECRET``; its generation (or file) may be a link to ``root/outside``."""
    outside = root / "outside"
    outside.mkdir()
    (outside / "emb.shard0-of-1.bin").write_bytes(SECRET)
    ckpt = root / "ckpt"
    ckpt.mkdir()
    if link_gen:
        os.symlink(outside, ckpt / GEN)
    else:
        (ckpt / GEN).mkdir()
        if link_file:
            os.symlink(outside / "emb.shard0-of-1.bin", ckpt / GEN / "emb.shard0-of-1.bin")
    info = ck.file_info(str(outside / "emb.shard0-of-1.bin"))
    reply = {"file_info": [{"file": "emb.shard0-of-1.bin", "rows": 1, "table": "emb",
                            **{k: v + 1 if k == "bytes" else v for k, v in info.items()}}],
             "rows": {"emb": 1}}
    manifest = ck.build_manifest(None, GEN, "full", [reply], [], None, None)
    manifest[ck.BODY_KEY] = ck.body_digest(manifest)  # sealed, without listing the links
    write_json(str(ckpt / ck.MANIFEST_NAME), manifest)
    return str(ckpt), manifest


@pytest.mark.parametrize("link", ["generation", "file"])
def test_a_linked_generation_or_file_is_refused_unread(tmp_path, monkeypatch, link):
    path, manifest = _checkpoint(tmp_path, link_gen=link == "generation",
                                 link_file=link == "file")
    read = []
    real_info = ck.file_info
    monkeypatch.setattr(ck, "file_info", lambda p: read.append(p) or real_info(p))
    real_listdir = os.listdir
    monkeypatch.setattr(ck.os, "listdir", lambda p: read.append(p) or real_listdir(p))
    with pytest.raises(ValueError, match="symbolic link") as e:
        ck.verify_generation(path, manifest["chain"][0])
    assert read == []  # nothing hashed or listed through the link
    assert str(len(SECRET)) not in str(e.value) and "bytes" not in str(e.value)
    with pytest.raises(ValueError, match="symbolic link"):
        ck.load_server(None, str(tmp_path), "ckpt")
    assert read == []


def test_a_real_generation_is_still_checked_against_its_manifest(tmp_path):
    path, manifest = _checkpoint(tmp_path)
    (tmp_path / "ckpt" / GEN / "emb.shard0-of-1.bin").write_bytes(SECRET)
    with pytest.raises(ValueError, match=r"has 12345 bytes, the manifest says 12346"):
        ck.verify_generation(path, manifest["chain"][0])


def test_a_linked_generation_is_refused_unread_when_reading_the_workers_state(
        tmp_path, monkeypatch):
    path, manifest = _checkpoint(tmp_path, link_gen=True)
    (tmp_path / "outside" / "auc.state.npy").write_bytes(SECRET)
    manifest["state_dir"] = GEN
    manifest["chain"][0]["files"]["auc.state.npy"] = {"sha256": "0" * 64, "bytes": 1}
    read = []
    real_info = ck.file_info
    monkeypatch.setattr(ck, "file_info", lambda p: read.append(p) or real_info(p))
    with pytest.raises(ValueError, match="symbolic link") as e:
        ck.state_dir(path, manifest)
    assert read == []
    assert str(len(SECRET)) not in str(e.value)
