"""``request_chunks``: how ``InspectionClient.predict_all`` cuts images into requests, against the obvious rule.

Consecutive chunks, each of at most ``per_request`` images and ``max_bytes`` bytes in all, an image
larger than ``max_bytes`` alone; every image once, in order; the input read lazily.
"""

from __future__ import annotations

import random

import pytest

from hetmm_ray.serve.grpc.client import request_chunks


def _obvious(images: list[tuple[str, bytes]], per_request: int, max_bytes: int) -> list[list[tuple[str, bytes]]]:
    """Greedy by definition: start a new chunk exactly when adding the image would break a limit."""
    chunks: list[list[tuple[str, bytes]]] = []
    for image in images:
        last = chunks[-1] if chunks else None
        fits = (
            last is not None
            and len(last) + 1 <= per_request
            and sum(len(d) for _, d in last) + len(image[1]) <= max_bytes
        )
        if fits:
            last.append(image)
        else:
            chunks.append([image])
    return chunks


@pytest.mark.parametrize("seed", range(30))
def test_chunks_follow_the_rule(seed: int) -> None:
    rng = random.Random(seed)
    images = [(f"i{k}", b"x" * rng.randint(0, 50)) for k in range(rng.randint(0, 40))]
    per_request, max_bytes = rng.randint(1, 9), rng.randint(1, 120)
    got = list(request_chunks(iter(images), per_request, max_bytes))
    assert got == _obvious(images, per_request, max_bytes)
    assert [im for chunk in got for im in chunk] == images
    for chunk in got:
        assert len(chunk) <= per_request
        assert len(chunk) == 1 or sum(len(d) for _, d in chunk) <= max_bytes


def test_images_are_read_as_chunks_are_taken() -> None:
    read = []

    def images():
        for k in range(10):
            read.append(k)
            yield f"i{k}", b"x"

    chunks = request_chunks(images(), 3, 100)
    assert next(chunks) == [(f"i{k}", b"x") for k in range(3)]
    assert read == [0, 1, 2, 3]  # one image ahead: the one that did not fit


@pytest.mark.parametrize(("per_request", "max_bytes"), [(0, 10), (3, 0)])
def test_limits_below_one_are_refused(per_request: int, max_bytes: int) -> None:
    with pytest.raises(ValueError, match=">= 1"):
        list(request_chunks([("a", b"x")], per_request, max_bytes))


def test_no_requests_in_flight_is_refused() -> None:
    from hetmm_ray.serve.grpc.client import InspectionClient

    with InspectionClient("127.0.0.1:1") as client:  # refused before any call is made
        with pytest.raises(ValueError, match="in_flight must be >= 1"):
            next(client.predict_all("gear", [("a", b"x")], in_flight=0))
