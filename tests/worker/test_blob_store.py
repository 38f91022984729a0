"""The blob store: large bytes as files named by their hash, checked when read, kept until the retention age."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from game.contract import BlobRef, HistoryTurn, TurnRequest, TurnResult
from game.state import StateDeltas
from relay.blob_store import REQUESTS, BlobError, FolderBlobStore
from tests.results import turn_result

LINE = "Character: Qiqi; Motion: gently fly on broomstick; Background: night sky."
ZERO = StateDeltas(motion=0, social=0, entertainment=0, stamina=0)
BIG = bytes(range(256)) * 64  # 16 KiB
SMALL = b"tiny"


@pytest.fixture
def store(tmp_path: Path) -> FolderBlobStore:
    return FolderBlobStore(tmp_path / "blobs", inline_max=1024)


def test_a_blob_reads_back_as_the_bytes_written(store):
    assert store.get(store.put(BIG)) == BIG


def test_a_blob_is_named_by_the_sha256_of_its_bytes(store):
    ref = store.put(BIG)
    assert ref == BlobRef(sha256=hashlib.sha256(BIG).hexdigest(), size=len(BIG))
    assert store.path_for(ref.sha256).read_bytes() == BIG


def test_writing_the_same_bytes_twice_keeps_one_file_and_no_temporary_ones(store):
    assert store.put(BIG) == store.put(BIG)
    assert [p.name for p in store.root.rglob("*") if p.is_file()] == [hashlib.sha256(BIG).hexdigest()]


def test_small_bytes_stay_inline_and_larger_ones_go_by_reference(store):
    assert store.pack(SMALL, REQUESTS) == SMALL
    assert isinstance(store.pack(BIG, REQUESTS), BlobRef)
    assert not any(p.is_file() and p.stat().st_size == len(SMALL) for p in store.root.rglob("*"))


def test_a_request_crosses_with_large_past_representations_by_reference_and_resolves_to_them(store):
    history = [HistoryTurn(instruction=LINE, representation=rep, deltas=ZERO) for rep in (BIG, SMALL)]
    request = TurnRequest(job_id="1", instruction=LINE, seed=1, history=history)
    sent = TurnRequest.model_validate(store.pack_request(request).model_dump(mode="json"))
    assert isinstance(sent.history[0].representation, BlobRef) and sent.history[1].representation == SMALL
    assert store.resolve_request(sent) == request


def test_a_result_crosses_with_a_large_clip_by_reference_and_resolves_to_it(store):
    result = turn_result(mp4=BIG, representation=SMALL)
    sent = TurnResult.model_validate(store.pack_result(result).model_dump(mode="json"))
    assert isinstance(sent.mp4, BlobRef) and sent.representation == SMALL
    assert store.resolve_result(sent) == result


def test_a_missing_blob_is_refused_naming_the_file_and_what_was_expected(store):
    ref = BlobRef(sha256="ab" * 32, size=123)
    with pytest.raises(BlobError) as caught:
        store.get(ref)
    message = str(caught.value)
    assert str(store.path_for(ref.sha256)) in message and "missing" in message
    assert "123 B" in message and ref.sha256 in message and "ANIMEGAMER_BLOB_DIR" in message


def test_a_damaged_blob_is_refused_naming_the_file_and_removed_so_a_new_write_repairs_it(store):
    ref = store.put(BIG)
    path = store.path_for(ref.sha256)
    path.write_bytes(b"\x00" * len(BIG))  # the right size, the wrong bytes
    with pytest.raises(BlobError, match="damaged") as caught:
        store.get(ref)
    assert str(path) in str(caught.value) and ref.sha256 in str(caught.value)
    assert not path.exists()
    assert store.get(store.put(BIG)) == BIG


def test_a_truncated_blob_is_refused(store):
    ref = store.put(BIG)
    store.path_for(ref.sha256).write_bytes(BIG[:100])
    with pytest.raises(BlobError, match=f"100 B with sha256 .*, expected {len(BIG)} B"):
        store.get(ref)


def test_blobs_older_than_the_retention_age_are_deleted_and_newer_ones_kept(store):
    old, new = store.put(BIG), store.put(BIG[::-1])
    two_days_ago = time.time() - 2 * 86400
    os.utime(store.path_for(old.sha256), (two_days_ago, two_days_ago))
    assert store.delete_older_than(timedelta(days=1)) == 1
    assert not store.path_for(old.sha256).exists() and store.get(new) == BIG[::-1]


def test_writing_a_blob_again_restarts_its_retention_age(store):
    ref = store.put(BIG)
    two_days_ago = time.time() - 2 * 86400
    os.utime(store.path_for(ref.sha256), (two_days_ago, two_days_ago))
    store.put(BIG)  # the bot sends a past turn's representation again
    assert store.delete_older_than(timedelta(days=1)) == 0


def test_retention_deletes_only_the_names_the_store_makes(store):
    ref = store.put(BIG)
    theirs = [store.root / "notes.txt", store.root / ref.sha256[:2] / "keep-me", store.root / "backup" / ("ab" * 32)]
    for path in theirs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"someone else's")
    leftover = store.root / ref.sha256[:2] / f".{ref.sha256}.0123abcd.tmp"  # a writer that died mid-write
    leftover.write_bytes(b"half")
    two_days_ago = time.time() - 2 * 86400
    for path in [*theirs, leftover, store.path_for(ref.sha256)]:
        os.utime(path, (two_days_ago, two_days_ago))
    assert store.delete_older_than(timedelta(days=1)) == 2
    assert all(path.exists() for path in theirs)


def test_retention_in_a_store_never_written_deletes_nothing(tmp_path):
    assert FolderBlobStore(tmp_path / "nowhere", inline_max=0).delete_older_than(timedelta(0)) == 0


def test_the_blob_store_does_not_import_torch():
    """The bot imports it, and the bot never imports torch."""
    code = "import sys, relay.blob_store; print('torch' in sys.modules)"
    assert subprocess.check_output([sys.executable, "-c", code], text=True).strip() == "False"
