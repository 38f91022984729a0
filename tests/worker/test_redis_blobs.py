"""The Redis blob store: what machines that share no folder share, raw bytes beside the results with a TTL."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import pytest
import redis

from game.contract import RESULT_KEEP_SECONDS, BlobRef, HistoryTurn, TurnRequest, TurnResult
from game.state import StateDeltas
from relay.blob_store import REQUESTS, BlobError, FolderBlobStore, RedisBlobStore, result_scope, store_for
from relay.settings import Settings
from tests.results import turn_result

LINE = "Character: Qiqi; Motion: gently fly on broomstick; Background: night sky."
ZERO = StateDeltas(motion=0, social=0, entertainment=0, stamina=0)


@pytest.fixture
def store(redis_url: str) -> RedisBlobStore:
    return RedisBlobStore(redis_url, inline_max=1024, timeout=3.0)


@pytest.fixture
def client(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


@pytest.fixture
def big() -> bytes:
    """Bytes no other test writes: the shared Redis holds every test's blobs."""
    return Path(__file__).read_bytes() + uuid.uuid4().bytes * 1024


RESULT = result_scope("7")


def test_a_blob_reads_back_as_the_bytes_written(store, big):
    assert store.get(store.put(big, RESULT), RESULT) == big


def test_a_blob_is_kept_as_its_raw_bytes_with_a_ttl(store, client, big):
    ref = store.put(big, RESULT)
    key = store.key_for(ref.sha256, RESULT)
    assert client.get(key) == big  # not base64, not JSON
    assert 0 < client.ttl(key) <= RESULT_KEEP_SECONDS


def test_writing_the_same_bytes_again_restarts_its_ttl(store, client, big):
    ref = store.put(big, REQUESTS)
    key = store.key_for(ref.sha256, REQUESTS)
    client.expire(key, 5)
    assert store.put(big, REQUESTS) == ref
    assert client.ttl(key) > 5


def test_a_missing_or_expired_blob_is_refused_naming_the_key_and_what_was_expected(store):
    ref = BlobRef(sha256=hashlib.sha256(uuid.uuid4().bytes).hexdigest(), size=123)
    with pytest.raises(BlobError) as caught:
        store.get(ref, RESULT)
    message = str(caught.value)
    assert store.key_for(ref.sha256, RESULT) in message and "missing or expired" in message
    assert "123 B" in message and ref.sha256 in message


def test_a_damaged_blob_is_refused_and_removed_so_a_new_write_repairs_it(store, client, big):
    ref = store.put(big, RESULT)
    key = store.key_for(ref.sha256, RESULT)
    client.set(key, b"\x00" * len(big))
    with pytest.raises(BlobError, match="damaged"):
        store.get(ref, RESULT)
    assert not client.exists(key)
    assert store.get(store.put(big, RESULT), RESULT) == big


def test_a_refusal_never_shows_the_redis_password(redis_url):
    url = redis_url.replace("redis://", "redis://:hunter2@", 1)  # this Redis asks for none: the key is just absent
    store = RedisBlobStore(url, inline_max=0, timeout=1.0)
    with pytest.raises(BlobError) as caught:
        store.get(BlobRef(sha256="ab" * 32, size=1), RESULT)
    assert "hunter2" not in str(caught.value)


def test_dropping_a_recorded_result_keeps_a_request_that_refers_to_the_same_bytes(store, big):
    result = store.pack_result(turn_result(mp4=b"clip", representation=big))
    request = TurnRequest(
        job_id="2", instruction=LINE, seed=1, history=[HistoryTurn(instruction=LINE, representation=big, deltas=ZERO)]
    )
    sent = store.pack_request(request)
    store.drop_result(result)
    assert store.resolve_request(sent) == request
    with pytest.raises(BlobError):
        store.resolve_result(result)


def test_dropping_a_recorded_result_keeps_another_jobs_result_with_the_same_bytes(store, big):
    """The same instruction makes the same representation: two turns' results often hold the same bytes."""
    first = store.pack_result(turn_result(1, mp4=b"clip", representation=big))
    second = store.pack_result(turn_result(2, mp4=b"clip", representation=big))
    assert first.representation == second.representation  # the same reference
    store.drop_result(first)
    assert store.resolve_result(second).representation == big


def test_a_result_crosses_with_a_large_clip_by_reference_and_resolves_to_it(store, big):
    result = turn_result(mp4=big, representation=b"small")
    sent = TurnResult.model_validate(store.pack_result(result).model_dump(mode="json"))
    assert isinstance(sent.mp4, BlobRef)
    assert store.resolve_result(sent) == result


def test_results_in_redis_put_blobs_there_unless_a_folder_is_set(tmp_path):
    on_redis = Settings(data_dir=tmp_path, broker_url="redis://h:6379/0", result_backend="redis://h:6379/1")
    assert on_redis.blob_dir is None and isinstance(store_for(on_redis), RedisBlobStore)
    mounted = on_redis.model_copy(update={"blob_dir": tmp_path / "shared"})
    assert isinstance(store_for(mounted), FolderBlobStore)
    embedded = Settings(data_dir=tmp_path)
    assert embedded.blob_dir == tmp_path / "blobs" and isinstance(store_for(embedded), FolderBlobStore)
