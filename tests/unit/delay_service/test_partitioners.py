"""Delivery partitions match what librdkafka and the Java client compute for the same key."""

from __future__ import annotations

import zlib

import pytest

from delayq.delay_service.partitioners import murmur2, partition_for


@pytest.mark.parametrize("data,expected", [
    # Vectors from Kafka's own UtilsTest.testMurmur2.
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (bytes([ord("a"), ord("b"), ord("c")]), 479470107),
])
def test_murmur2_matches_the_java_client(data, expected):
    assert murmur2(data) == expected


def test_consistent_partitioners_hash_with_crc32():
    key = b"order-42"
    assert partition_for(key, 12, "consistent_random") == zlib.crc32(key) % 12
    assert partition_for(key, 12, None) == zlib.crc32(key) % 12


def test_java_default_uses_positive_murmur2():
    assert partition_for(b"21", 7, "murmur2_random") == (-973932308 & 0x7FFFFFFF) % 7


def test_null_keys_and_random_leave_the_choice_to_the_producer():
    assert partition_for(None, 5, "consistent_random") == -1
    assert partition_for(None, 5, "murmur2_random") == -1
    assert partition_for(b"k", 5, "random") == -1
    assert partition_for(None, 5, "consistent") == zlib.crc32(b"") % 5
